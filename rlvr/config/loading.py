"""Building an `ExperimentConfig` from YAML presets and dicts, and dumping it back.

Invariants: every key is checked against the dataclass fields (unknown keys name the closest field),
every value against its annotation (a wrong type names the dotted key, the expected and the given type),
and `from_dict(to_dict(cfg)) == cfg` for every valid config.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import types
import typing
from pathlib import Path
from typing import Any, Literal, Union, cast, get_args, get_origin

import yaml

from rlvr.config.errors import ConfigError
from rlvr.config.presets import default_config
from rlvr.config.sections import ExperimentConfig
from rlvr.config.validation import validate

__all__ = ["ConfigError", "from_dict", "load_config", "read_yaml", "to_dict", "to_yaml"]

T = typing.TypeVar("T")


def _describe(tp: Any) -> str:
    origin = get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in get_args(tp))
    if origin in (Union, types.UnionType):
        return " or ".join(_describe(a) for a in get_args(tp))
    if tp is type(None):
        return "null"
    return getattr(tp, "__name__", str(tp))


def _convert(value: Any, tp: Any, key: str) -> Any:
    origin = get_origin(tp)
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping of {tp.__name__} fields, got {type(value).__name__}")
        return _build(tp, value, key)
    if origin is Literal:
        if value not in get_args(tp):
            raise ConfigError(f"{key}: {value!r} is not allowed; expected {_describe(tp)}")
        return value
    if origin in (Union, types.UnionType):
        args = get_args(tp)
        if value is None:
            if type(None) in args:
                return None
            raise ConfigError(f"{key}: null is not allowed; expected {_describe(tp)}")
        errors = []
        # try exact-type members first so that 1 stays an int in `float | int | str | bool`
        for arg in sorted((a for a in args if a is not type(None)), key=lambda a: a is not type(value)):
            try:
                return _convert(value, arg, key)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(f"{key}: {value!r} does not match {_describe(tp)}")
    if origin is list:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key}: expected a list, got {type(value).__name__} {value!r}")
        (item_tp,) = get_args(tp)
        return [_convert(v, item_tp, f"{key}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping, got {type(value).__name__}")
        k_tp, v_tp = get_args(tp)
        return {_convert(k, k_tp, key): _convert(v, v_tp, f"{key}.{k}") for k, v in value.items()}
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key}: expected true/false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key}: expected an integer, got {type(value).__name__} {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            if isinstance(value, str):
                try:  # YAML 1.1 reads "1e-6" as a string
                    value = float(value)
                except ValueError:
                    pass
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ConfigError(f"{key}: expected a number, got {type(value).__name__} {value!r}")
        try:
            number = float(value)
        except OverflowError:  # an int too large for a float
            raise ConfigError(f"{key}: {value!r} is out of range") from None
        if not math.isfinite(number):  # no setting means anything at inf or nan; range checks miss both
            raise ConfigError(f"{key}: expected a finite number, got {value!r}")
        return number
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{key}: expected a string, got {type(value).__name__} {value!r}")
        return value
    raise ConfigError(f"{key}: unsupported annotation {tp!r}")  # pragma: no cover - programming error


def _build(cls: type[T], data: dict[str, Any], prefix: str) -> T:
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cast(Any, cls))]
    kwargs = {}
    for k, v in data.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        if k not in names:
            close = difflib.get_close_matches(str(k).replace("-", "_"), names, n=1, cutoff=0.5)
            hint = f"; did you mean `{(prefix + '.') if prefix else ''}{close[0]}`?" if close else ""
            raise ConfigError(f"unknown config key `{key}`{hint} (fields of {cls.__name__}: {', '.join(names)})")
        kwargs[k] = _convert(v, hints[k], key)
    return cls(**kwargs)


def from_dict(data: dict[str, Any] | None, base: ExperimentConfig | None = None) -> ExperimentConfig:
    """Build a config from a nested dict, layered over `base` (defaults when None); nothing is validated
    beyond keys and types (call `validate`)."""
    merged = to_dict(base) if base is not None else {}
    _deep_update(merged, data or {})
    return _build(ExperimentConfig, merged, "")


def _deep_update(dst: dict[str, Any], src: dict[str, Any]) -> None:
    for k, v in src.items():
        if isinstance(v, dict) and isinstance(dst.get(k), dict) and k != "params":
            _deep_update(dst[k], v)
        else:
            dst[k] = v


def to_dict(cfg: Any) -> dict[str, Any]:
    """Plain nested dict of a config (YAML-safe)."""
    return dataclasses.asdict(cfg)


def to_yaml(cfg: ExperimentConfig) -> str:
    """The resolved config as YAML (what `--dry-run` prints and `config.yaml` holds)."""
    return yaml.safe_dump(to_dict(cfg), sort_keys=False, default_flow_style=False)


def read_yaml(path: str | Path) -> dict[str, Any]:
    """Read a YAML preset into a dict, with the file named in any error."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file {str(p)!r} does not exist")
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        raise ConfigError(f"config file {str(p)!r} is not valid YAML: {e}") from e
    except UnicodeDecodeError as e:
        raise ConfigError(f"config file {str(p)!r} is not UTF-8 text (byte {e.start}: {e.reason})") from e
    except OSError as e:
        raise ConfigError(f"config file {str(p)!r} cannot be read: {e.strerror or e}") from e
    except RecursionError:
        raise ConfigError(f"config file {str(p)!r} nests too deeply") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {str(p)!r} must hold a mapping of sections, got {type(data).__name__}")
    return data


def load_config(
    path: str | Path | None = None, overrides: dict[str, Any] | None = None, validate_config: bool = True
) -> ExperimentConfig:
    """Load a YAML preset (or the built-in tiny CPU default when `path` is None), apply a nested dict of
    overrides, and validate. The public entry point: `from rlvr import load_config`."""
    cfg = from_dict(read_yaml(path)) if path is not None else default_config()
    if overrides:
        try:
            cfg = from_dict(overrides, base=cfg)
        except ConfigError as e:
            raise ConfigError(f"{e} (in overrides)") from e
    if validate_config:
        validate(cfg)
    return cfg
