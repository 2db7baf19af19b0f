"""Generate the config reference (markdown tables) from the dataclasses and their field docstrings.

`python -m rlvr.config.reference --write README.md` rewrites the block between the README's
`<!-- config-reference:start -->` and `<!-- config-reference:end -->` markers; a test fails when it is stale.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import sys
import typing
from pathlib import Path

from rlvr.config import sections
from rlvr.config.sections import ExperimentConfig

START, END = "<!-- config-reference:start -->", "<!-- config-reference:end -->"


def field_docs(cls: type) -> dict[str, str]:
    """Field name -> the docstring under it in the class body."""
    tree = ast.parse(inspect.getsource(cls))
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs: dict[str, str] = {}
    for prev, node in zip(body, body[1:]):
        if (
            isinstance(prev, ast.AnnAssign)
            and isinstance(prev.target, ast.Name)
            and isinstance(node, ast.Expr)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            docs[prev.target.id] = " ".join(node.value.value.split())
    return docs


def _type_name(tp: object) -> str:
    s = str(tp).replace("typing.", "")
    return s.replace("<class '", "").replace("'>", "").replace("rlvr.config.sections.", "")


def _default(f: dataclasses.Field) -> str:
    if f.default is not dataclasses.MISSING:
        return repr(f.default)
    if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        return repr(f.default_factory())  # type: ignore[misc]
    return "required"


def render() -> str:
    """The reference as markdown: one table per section, plus the root fields."""
    out: list[str] = []
    root_hints = typing.get_type_hints(ExperimentConfig)
    root_docs = field_docs(ExperimentConfig)
    out.append("| flag | type | default | description |\n|---|---|---|---|")
    for f in dataclasses.fields(ExperimentConfig):
        if not dataclasses.is_dataclass(root_hints[f.name]):
            out.append(
                f"| `--{f.name.replace('_', '-')}` | `{_type_name(root_hints[f.name])}` | `{_default(f)}` "
                f"| {root_docs.get(f.name, '')} |"
            )
    for f in dataclasses.fields(ExperimentConfig):
        cls = root_hints[f.name]
        if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
            continue
        docs, hints = field_docs(cls), typing.get_type_hints(cls)
        out.append(f"\n**`{f.name}`**: {(cls.__doc__ or '').strip()}\n")
        out.append("| flag | type | default | description |\n|---|---|---|---|")
        for sf in dataclasses.fields(cls):
            flag = f"--{f.name}.{sf.name.replace('_', '-')}"
            desc = docs.get(sf.name, "").replace("|", "\\|")
            tp = _type_name(hints[sf.name]).replace("|", "\\|")
            out.append(f"| `{flag}` | `{tp}` | `{_default(sf)}`".replace("|`", "| `") + f" | {desc} |")
    return "\n".join(out) + "\n"


def splice(text: str) -> str:
    """Return `text` with the block between the markers replaced by the current reference."""
    if START not in text or END not in text:
        raise ValueError(f"markers {START} / {END} not found")
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{START}\n{render()}{END}{tail}"


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "--write":
        p = Path(argv[1])
        p.write_text(splice(p.read_text()))
        return 0
    sys.stdout.write(render())
    return 0


_ = sections  # the module whose classes are documented

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
