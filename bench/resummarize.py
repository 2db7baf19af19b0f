"""Recompute the figures of `bench/gpu_grpo.py` output from the metrics files beside it, with the current
`grpo_summary`: after a change to how a run is summarized, earlier bench files are brought up to date instead of
being compared across two methods.

    python3 bench/resummarize.py docs/gpu-results/w2_lean_split2_1.5b_2xH200.jsonl            # print the new lines
    python3 bench/resummarize.py --write docs/gpu-results/w2_lean_split2_1.5b_2xH200.jsonl    # rewrite in place

Each `rlvr` line is summarized again from `<run_name>.metrics.jsonl` in the same folder (older files without
`run_name`: the one `<config>-<tag>-*.metrics.jsonl` there; renamed files: `--metrics CONFIG:TAG=FILE`); a line whose metrics file is missing is kept as it is
and listed on stderr. The `summary` line is rebuilt from the new lines (its `elapsed_s` kept); every other line is
kept. Model facts and the peak FLOP/s come from the `setup` line, else from the shape's definition. Exit 2 on a
file that is not bench output.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import re
import shlex
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from grpo_summary import summarize_run, summary_line

FIGURE_KEYS_KEPT = ("rc", "timed_out", "wall_s", "peak_mem_gib", "timeout_s", "log_tail")


def _facts(setup: dict[str, Any] | None, shape: str) -> dict[str, Any]:
    if setup and "N_matmul" in setup:
        return {k: setup[k] for k in ("N_matmul", "L", "d", "heads", "kv_heads", "vocab") if k in setup}
    from gpu_grpo import model_facts_from

    from rlvr.models.shaped import SHAPES, VOCAB_SIZE

    return model_facts_from(SHAPES[shape], VOCAB_SIZE)


def _async_steps(rec: dict[str, Any]) -> int:
    """The run's async_steps: the config's, unless its extra flags set another (the last one counts)."""
    found = re.findall(r"--rollout\.async-steps(?:=|\s+)(\d+)", " ".join(shlex.split(rec.get("extra") or "")))
    return int(found[-1]) if found else int(rec.get("async_steps", 1))


def metrics_file(folder: Path, rec: dict[str, Any], given: dict[str, Path] | None = None) -> Path | None:
    key = f"{rec.get('config')}:{rec.get('tag', 'base')}"
    if given and key in given:
        return given[key]
    if rec.get("run_name"):
        p = folder / f"{rec['run_name']}.metrics.jsonl"
        return p if p.is_file() else None
    found = sorted(folder.glob(f"{rec.get('config')}-{rec.get('tag')}-*.metrics.jsonl"))
    return found[0] if len(found) == 1 else None


def resummarize(path: Path, given: dict[str, Path] | None = None) -> list[dict[str, Any]]:
    lines: list[dict[str, Any]] = []
    for n, raw in enumerate(path.read_text().splitlines(), 1):
        if not raw.strip():
            continue
        try:
            lines.append(json.loads(raw))
        except json.JSONDecodeError as e:
            raise SystemExit(f"resummarize: {path}:{n}: not a JSON line ({e.msg})") from None
    if not any(isinstance(r, dict) and r.get("kind") in ("rlvr", "summary", "setup") for r in lines):
        raise SystemExit(f"resummarize: {path}: no setup/rlvr/summary line: not bench/gpu_grpo.py output")
    setup = next((r for r in lines if r.get("kind") == "setup"), None)
    old_summary = next((r for r in lines if r.get("kind") == "summary"), None)
    shape = (setup or old_summary or {}).get("shape") or next(r["shape"] for r in lines if r.get("shape"))
    peak = (setup or old_summary or {}).get("peak_flops")
    facts = _facts(setup, shape)
    results: dict[Any, Any] = {}
    out: list[dict[str, Any]] = []
    for r in lines:
        kind = r.get("kind")
        if kind == "rlvr" and not r.get("skipped"):
            mf = metrics_file(path.parent, r, given)
            if mf is None:
                print(
                    f"resummarize: {path}: no metrics file for {r.get('config')}:{r.get('tag')}; kept", file=sys.stderr
                )
            else:
                rows = [json.loads(x) for x in mf.read_text().splitlines() if x.strip()]
                c = {
                    "gpus": r["gpus"],
                    "learners": r.get("learners", 1),
                    "engines": r.get("engines", 1),
                    "colocate": r.get("colocate", r["gpus"] == 1),
                    "async_steps": _async_steps(r),
                }
                kept = {k: r[k] for k in FIGURE_KEYS_KEPT if k in r}
                meta = {k: v for k, v in r.items() if not k.startswith("_")}
                r = {**meta, **summarize_run(rows, c, facts, peak), **kept, "resummarized_from": mf.name}
            results[(r["config"], r.get("tag", "base"))] = r
        elif kind == "trl":
            results["trl"] = r
        elif kind == "standalone_vllm":
            results.setdefault("standalone", []).append(r)
        elif kind == "learner_microbench":
            results.setdefault("learner", []).append(r)
        if kind not in ("summary", "full_vs_lora"):
            out.append(r)
    a = argparse.Namespace(shape=shape)
    card = (old_summary or setup or {}).get("card", "unknown")
    scratch = path.parent / f".{path.name}.full_vs_lora.tmp"
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # summary_line also prints what it emits
            summary = summary_line(a, results, card, peak, 0.0, scratch)
        if scratch.is_file():
            out += [json.loads(x) for x in scratch.read_text().splitlines() if x.strip()]
    finally:
        scratch.unlink(missing_ok=True)
    if old_summary is not None:
        summary["elapsed_s"] = old_summary.get("elapsed_s")
    out.append(summary)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("files", nargs="+", type=Path)
    p.add_argument("--write", action="store_true", help="rewrite each file in place (default: print)")
    p.add_argument(
        "--metrics",
        action="append",
        default=[],
        metavar="CONFIG:TAG=FILE",
        help="the metrics file of one run (repeatable), for files renamed after the bench wrote them",
    )
    a = p.parse_args(argv)
    given: dict[str, Path] = {}
    for spec in a.metrics:
        key, sep, file = spec.partition("=")
        if not sep or ":" not in key or not Path(file).is_file():
            print(f"resummarize: --metrics {spec!r}: want CONFIG:TAG=FILE with an existing FILE", file=sys.stderr)
            return 2
        given[key] = Path(file)
    for f in a.files:
        if not f.is_file():
            print(f"resummarize: {f}: no such file", file=sys.stderr)
            return 2
        try:
            new = resummarize(f, given)
        except SystemExit as e:
            print(e, file=sys.stderr)
            return 2
        text = "".join(json.dumps(r, default=str) + "\n" for r in new)
        if a.write:
            f.write_text(text)
        else:
            sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
