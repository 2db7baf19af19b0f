"""Every Markdown file the code, scripts, configs and tests name exists in the repository.

A name is resolved against the repository root, then against the naming file's directory; a bare file name
(`ROOT / "docs" / "rewards.md"` in code) passes when some Markdown file of the repository has that name. Two
interface documents and a sibling "shared" folder outside the repo were once named; docs/design.md replaced them.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("rlvr", "bench", "scripts", "configs", "tests", "docker", ".ci")
SUFFIXES = {".py", ".sh", ".yaml", ".yml", ".toml", ".txt", ".html", ".js", ""}
MD_REF = re.compile(r"(?<![\w./-])((?:\.\./|[\w-]+/)*[\w.-]+\.md)\b")


def _files() -> list[Path]:
    out = []
    for top in SCANNED:
        for p in sorted((ROOT / top).rglob("*")):
            if p.is_file() and p.suffix in SUFFIXES and "__pycache__" not in p.parts and p.name != Path(__file__).name:
                out.append(p)
    return out


def test_every_named_markdown_file_exists() -> None:
    names = {p.name for p in ROOT.rglob("*.md") if not any(part.startswith(".") for part in p.relative_to(ROOT).parts)}
    missing = []
    for path in _files():
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        for ref in set(MD_REF.findall(text)):
            if not ((ROOT / ref).is_file() or (path.parent / ref).is_file() or ("/" not in ref and ref in names)):
                missing.append(f"{path.relative_to(ROOT)}: {ref}")
    assert not missing, sorted(missing)


def test_no_reference_points_outside_the_repository() -> None:
    outside = "../" + "shared"  # spelled in two pieces so that this file does not match itself
    bad = [f"{p.relative_to(ROOT)}" for p in _files() if outside in p.read_text(encoding="utf-8", errors="ignore")]
    assert not bad, bad
