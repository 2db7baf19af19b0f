"""`rlvr reward`: score completions from the command line, to try reward functions before training.

Two modes:
- one completion: `--fn math --reference "42" --completion "... \\boxed{42}"`;
- a JSONL file: `--input rows.jsonl [--output scored.jsonl]`; each row has `completion` and the metadata fields
  (`ground_truth`, the verifier column, `tests`, ..., optionally `completion_token_ids`).

`--list` prints every reward function: its parameters, what it scores, and an example with its score.

Output (docs/design.md, Reward functions): one JSON object per completion, `{"scores": {...}, "total": ...,
"correct": ..., "status": "ok", "error": ..., "elapsed_s": ...}`, on stdout; with `--output`, the rows extended with those
fields go to the file and stdout gets one summary object. Exit code 0 when every row scored; 2 for a usage
error, or when rows failed to score (status `error` or `timeout`): every result is still written, and stderr
counts the failed rows and names each (its input line) with the error. `run_reward` is what `rlvr reward` calls.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from dataclasses import dataclass, field
from typing import Annotated, Any

import tyro

from rlvr.cli.outpaths import atomic_writer, check_output_file
from rlvr.rewards.scorer import RewardFunctionSpec, RewardScorer, RewardsSettings
from rlvr.types import RewardResult


@dataclass
class RewardArgs:
    """Score completions with rlvr's reward functions."""

    list_functions: Annotated[bool, tyro.conf.arg(name="list")] = False
    """Print every reward function (parameters, what it scores, an example with its score) and exit."""
    fn: list[str] = field(default_factory=list)
    """Reward functions applied to every completion (registered names or 'pkg.module:fn'), e.g. --fn math."""
    reference: str | None = None
    """Ground truth for a single --completion (becomes metadata['ground_truth'])."""
    completion: str | None = None
    """One completion to score (needs --fn)."""
    input: str | None = None
    """JSONL file of rows, each with 'completion' plus metadata fields (ground_truth, verifier, tests, ...)."""
    output: str | None = None
    """Where to write the scored rows (JSONL; a new file, or an earlier *.jsonl output, never --input or a run's
    records); without it, one result object per row is printed."""
    weights: list[float] = field(default_factory=list)
    """Weights of the --fn functions, in the same order (default 1.0 each)."""
    params: list[str] = field(default_factory=list)
    """Function params as fn.key=value, e.g. --params cosine_length.max_tokens=512 (value parsed as JSON)."""
    verifier_column: str = "verifier"
    """Row field naming the row's verifier(s), scored in addition to --fn."""
    primary: str | None = None
    """Function deciding 'correct' (default: the first --fn, else the row's first routed verifier)."""
    custom: list[str] = field(default_factory=list)
    """Import paths of modules registering custom reward functions ('pkg.module' or 'pkg.module:fn')."""
    timeout_s: float = 10.0
    """Per-completion time limit in seconds (enforced when num_workers >= 1)."""
    num_workers: int = 1
    """Verifier worker processes; 0 scores in this process without time limits."""


def help_description() -> str:
    """The description `rlvr reward --help` shows: what it does and the registered function names."""
    from rlvr.rewards.registry import known_rewards

    return (
        "Score completions with rlvr's reward functions (one JSON object per completion). Functions: "
        f"{', '.join(known_rewards())}. `rlvr reward --list` shows each one's parameters, what it scores and "
        "an example; docs/rewards.md holds the same list."
    )


def _parse_params(args: RewardArgs) -> dict[str, dict[str, Any]]:
    params: dict[str, dict[str, Any]] = {}
    for item in args.params:
        target, eq, raw = item.partition("=")
        fn, dot, key = target.rpartition(".")
        if not eq or not dot or not fn:
            raise ValueError(f"--params {item!r}: expected fn.key=value")
        try:
            value = json.loads(raw)
        except ValueError:
            value = raw
        params.setdefault(fn, {})[key] = value
    unknown = set(params) - set(args.fn)
    if unknown:
        raise ValueError(f"--params for {sorted(unknown)}, which are not in --fn {args.fn}")
    return params


def _settings(args: RewardArgs) -> RewardsSettings:
    if args.weights and len(args.weights) != len(args.fn):
        raise ValueError(f"--weights has {len(args.weights)} values for {len(args.fn)} --fn functions")
    params = _parse_params(args)
    weights = args.weights or [1.0] * len(args.fn)
    functions = [RewardFunctionSpec(name, w, params.get(name, {})) for name, w in zip(args.fn, weights)]
    primary = args.primary or (args.fn[0] if args.fn else None)
    return RewardsSettings(
        functions=functions,
        verifier_column=args.verifier_column,
        num_workers=max(1, args.num_workers),
        timeout_s=args.timeout_s,
        primary=primary,
        custom=list(args.custom),
    )


def _rows(args: RewardArgs) -> list[dict[str, Any]]:
    if args.completion is not None:
        if args.input is not None:
            raise ValueError("give either --completion or --input, not both")
        if not args.fn:
            raise ValueError("--completion needs at least one --fn")
        row: dict[str, Any] = {"completion": args.completion}
        if args.reference is not None:
            row["ground_truth"] = args.reference
        return [row]
    if args.input is None:
        raise ValueError("give --completion (with --fn) or --input rows.jsonl")
    rows = []
    with open(args.input, encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as e:
                raise ValueError(f"{args.input}:{line_no}: not valid JSON ({e})") from e
            if not isinstance(row, dict) or not isinstance(row.get("completion"), str):
                raise ValueError(f"{args.input}:{line_no}: each row needs a string 'completion'")
            rows.append({**row, _LINE: line_no})
    return rows


OUTPUT_SUFFIXES = (".jsonl",)
"""An existing --output file is replaced only with one of these suffixes (an earlier output, outside any run
directory, not a symlink and not the --input file; rlvr.cli.outpaths); anything else exits 2 before scoring."""

_LINE = "\x00line"  # a row's input line number, kept beside the row while scoring (never written out)


def _score(args: RewardArgs, settings: RewardsSettings, rows: list[dict[str, Any]]) -> list[RewardResult]:
    items = [
        (
            r["completion"],
            {k: v for k, v in r.items() if k not in ("completion", "completion_token_ids", _LINE)},
            r.get("completion_token_ids"),
        )
        for r in rows
    ]
    if args.num_workers <= 0:
        scorer = RewardScorer(settings)
        return [scorer.score(*item) for item in items]
    from rlvr.rewards.pool import VerifierPool

    with VerifierPool(settings, max_queue=max(1, min(len(items), settings.max_queue))) as pool:
        return pool.score_many(items)


def run_reward(args: RewardArgs) -> int:
    """Score the completions `args` names and print the results (module docstring); returns the exit code."""
    if args.list_functions:
        from rlvr.rewards.catalog import catalog_lines

        print("\n".join(catalog_lines()))
        return 0
    try:
        out = (
            None
            if args.output is None
            else check_output_file(
                args.output, "--output", replace_suffixes=OUTPUT_SUFFIXES, inputs=[args.input] if args.input else []
            )
        )
        settings = _settings(args)
        rows = _rows(args)
        results = _score(args, settings, rows)
    except (ValueError, OSError) as e:
        print(f"rlvr reward: {e}", file=sys.stderr)
        return 2
    if out is None:
        for result in results:
            print(json.dumps(result.to_json(), ensure_ascii=False))
        return _report_failures(args, rows, results)
    try:
        with atomic_writer(out) as f:
            for row, result in zip(rows, results):
                plain = {k: v for k, v in row.items() if k != _LINE}
                f.write(json.dumps({**plain, **result.to_json()}, ensure_ascii=False) + "\n")
    except OSError as e:
        print(f"rlvr reward: --output {out}: {e}", file=sys.stderr)
        return 2
    totals = [r.total for r in results if r.total is not None]
    corrects = [r.correct for r in results if r.correct is not None]
    print(
        json.dumps(
            {
                "rows": len(results),
                "output": args.output,
                "mean_total": sum(totals) / len(totals) if totals else None,
                "correct_rate": sum(corrects) / len(corrects) if corrects else None,
                "status": dict(Counter(r.status for r in results)),
            }
        )
    )
    return _report_failures(args, rows, results)


def _report_failures(
    args: RewardArgs, rows: list[dict[str, Any]], results: list[RewardResult], max_named: int = 20
) -> int:
    """0 when every row scored; else 2, with the count and the failed rows (first `max_named`) on stderr."""
    failed = [(row, r) for row, r in zip(rows, results) if r.status != "ok"]
    if not failed:
        return 0
    counts = ", ".join(f"{k} {v}" for k, v in sorted(Counter(r.status for _, r in failed).items()))
    print(f"rlvr reward: {len(failed)} of {len(results)} rows failed to score ({counts})", file=sys.stderr)
    for row, r in failed[:max_named]:
        where = f"{args.input}:{row[_LINE]}" if _LINE in row else "--completion"
        print(f"  {where}: {r.status}: {r.error}", file=sys.stderr)
    if len(failed) > max_named:
        print(f"  ... and {len(failed) - max_named} more (the scored rows say which)", file=sys.stderr)
    return 2


def main() -> None:
    from rlvr.cli.flags import parse

    sys.exit(run_reward(parse(RewardArgs, sys.argv[1:], "python -m rlvr.rewards.cli", help_description())))


if __name__ == "__main__":
    main()
