"""One way to give booleans in every `rlvr` subcommand, and the parser call they all share.

Every boolean flag takes a value (`--dry-run True`, `--rollout.active-sampling False`), which is what `--help`
shows (`{True,False}`), and two short forms are accepted everywhere: a bare `--x` means `--x True`, and
`--no-x` (for a nested field `--section.no-x`) means `--x False`. `normalize_bool_flags` rewrites the short
forms before tyro parses, so each subcommand's dataclass needs nothing special.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, TypeVar, Union, get_args, get_origin

T = TypeVar("T")
BOOL_VALUES = ("True", "False", "true", "false", "None")
BOOL_NOTE = "Booleans: `--x True` or `--x False`; a bare `--x` means True and `--no-x` means False."


def _is_bool(tp: Any) -> bool:
    if tp is bool:
        return True
    if get_origin(tp) in (Union, types.UnionType):
        args = [a for a in get_args(tp) if a is not type(None)]
        return args == [bool]
    return False


def _unwrap(tp: Any) -> tuple[Any, str | None]:
    """(the type inside `Annotated`, the tyro `arg(name=...)` given there, if any)."""
    if get_origin(tp) is typing.Annotated:
        inner, *meta = get_args(tp)
        names = [m.name for m in meta if type(m).__name__ == "_ArgConfig" and getattr(m, "name", None) is not None]
        return inner, (names[0] if names else None)
    return tp, None


def bool_flags(cls: type, prefix: str = "") -> set[str]:
    """The `--flag` names of every boolean field of dataclass `cls`, nested dataclasses included."""
    hints = typing.get_type_hints(cls, include_extras=True)
    out: set[str] = set()
    for f in dataclasses.fields(cls):
        tp, name = _unwrap(hints[f.name])
        name = f.name.replace("_", "-") if name is None else name
        if isinstance(tp, type) and dataclasses.is_dataclass(tp):
            out |= bool_flags(tp, f"{prefix}{name}." if name else prefix)
        elif _is_bool(tp):
            out.add(f"--{prefix}{name}")
    return out


def _negated(arg: str) -> str | None:
    """`--no-x` -> `--x`, `--a.no-x` -> `--a.x`; None for anything else."""
    if not arg.startswith("--"):
        return None
    head, dot, last = arg[2:].rpartition(".")
    if not last.startswith("no-"):
        return None
    return f"--{head}{dot}{last[3:]}"


def normalize_bool_flags(argv: list[str], flags: set[str]) -> list[str]:
    """`argv` with the short boolean forms (module docstring) written out as `--x True` / `--x False`."""
    out: list[str] = []
    for i, arg in enumerate(argv):
        nxt = argv[i + 1] if i + 1 < len(argv) else None
        if arg in flags:
            out += [arg] if nxt in BOOL_VALUES else [arg, "True"]
        elif _negated(arg) in flags and nxt not in BOOL_VALUES:
            out += [_negated(arg) or arg, "False"]
        else:
            out.append(arg)
    return out


def parse(cls: type[T], argv: list[str], prog: str, description: str | None, **kwargs: Any) -> Any:
    """`tyro.cli` for an `rlvr` subcommand: booleans as the module docstring says, the note in `--help`."""
    import tyro

    flags = bool_flags(cls)
    text = (description or "").rstrip() + (f"\n\n{BOOL_NOTE}" if flags else "")
    return tyro.cli(
        cls,
        args=normalize_bool_flags(list(argv), flags),
        prog=prog,
        description=text,
        config=(tyro.conf.FlagConversionOff,),
        **kwargs,
    )


def reward_function_spec(item: str, flag: str = "--rewards.functions") -> dict[str, Any]:
    """One `--rewards.functions` item, `NAME[,weight=W][,PARAM=VALUE]...`, as a `RewardFunctionConfig` mapping.
    Values are read as JSON when they parse (512, 0.5, true), else kept as strings. ValueError names the item."""
    import json

    name, *pairs = [p.strip() for p in item.split(",")]
    if not name or "=" in name:
        raise ValueError(
            f"{flag} {item!r}: expected NAME[,weight=W][,PARAM=VALUE]... (e.g. "
            "soft_overlong,weight=0.5,max_tokens=512); `rlvr reward --list` shows names and params"
        )
    out: dict[str, Any] = {"name": name, "weight": 1.0, "params": {}}
    for pair in pairs:
        key, eq, raw = pair.partition("=")
        if not eq or not key:
            raise ValueError(f"{flag} {item!r}: {pair!r} is not KEY=VALUE")
        try:
            value = json.loads(raw)
        except ValueError:
            value = raw
        if key == "weight":
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"{flag} {item!r}: weight must be a number, got {raw!r}")
            out["weight"] = float(value)
        elif isinstance(value, (list, dict)) or value is None:
            raise ValueError(f"{flag} {item!r}: {key} must be a number, string or true/false, got {raw!r}")
        else:
            out["params"][key] = value
    return out
