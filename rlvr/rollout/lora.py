"""LoRA adapters shared by the learner and the engines (issue 20): their settings, names and on-disk form.

Invariants:
- One adapter, named `ADAPTER_NAME` inside peft, with the settings of `LoraSpec` (built from `learner.lora_*`), so the
  learner's and every engine's adapted model compute the same function from the same tensors.
- Adapter tensors cross process boundaries and sit on disk under PEFT's on-disk names
  (`base_model.model.<module>.lora_A.weight`, no adapter name): what `peft.get_peft_model_state_dict` returns, what
  `adapter_model.safetensors` holds and what vLLM reads. `module_name` maps one to the live peft model's parameter;
  `AdapterParams` resolves that mapping once per model, so a sync reads the live parameters without a state dict.
- An adapter directory is data only: `adapter_config.json` (JSON) and `adapter_model.safetensors`, read without
  unpickling anything. `write_adapter_dir` writes one into a temporary sibling and renames it, so a reader (vLLM)
  never sees half of one; a checkpoint's adapter files are made atomic by the checkpoint's own rename.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import torch

ADAPTER_NAME = "default"
CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"


@dataclasses.dataclass(frozen=True)
class LoraSpec:
    """The adapter's shape and scaling (PEFT LoraConfig fields of the same meaning)."""

    rank: int
    alpha: float  # an int in rlvr's own adapters; a float from an exported one is kept as it is
    dropout: float
    target_modules: tuple[str, ...]

    @classmethod
    def from_config(cls, cfg: Any) -> LoraSpec | None:
        """From an `ExperimentConfig`; None when `learner.lora_rank` is 0 (LoRA off)."""
        lc = cfg.learner
        if lc.lora_rank <= 0:
            return None
        return cls(int(lc.lora_rank), int(lc.lora_alpha), float(lc.lora_dropout), tuple(lc.lora_target_modules))

    def peft_config(self, base_model_path: str | None = None) -> Any:
        peft = require_peft()
        return peft.LoraConfig(
            r=self.rank,
            lora_alpha=self.alpha,
            lora_dropout=self.dropout,
            target_modules=list(self.target_modules),
            bias="none",
            task_type="CAUSAL_LM",
            base_model_name_or_path=base_model_path,
        )


def require_peft() -> Any:
    """Import peft or fail with the install hint."""
    try:
        import peft
    except ImportError as exc:
        raise ImportError("LoRA (--learner.lora-rank > 0) needs peft: pip install 'rlvr[lora]'") from exc
    return peft


def wrap(model: torch.nn.Module, spec: LoraSpec, base_model_path: str | None = None, seed: int = 0) -> Any:
    """The model with adapters on `spec.target_modules` (a peft `PeftModel`). The adapter init (lora_A random,
    lora_B zero: the adapted model starts equal to the base) draws from a generator seeded with `seed`, so every
    data-parallel rank starts from the same adapter. Only adapter parameters require grad."""
    peft = require_peft()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        try:
            wrapped = peft.get_peft_model(model, spec.peft_config(base_model_path), adapter_name=ADAPTER_NAME)
        except ValueError as e:  # peft: "Target modules {...} not found in the base model"
            raise ValueError(f"--learner.lora-target-modules {' '.join(spec.target_modules)}: {e}") from None
    return wrapped


def module_name(peft_name: str, adapter: str = ADAPTER_NAME) -> str:
    """PEFT on-disk name -> the live model's parameter name (`...lora_A.weight` -> `...lora_A.<adapter>.weight`)."""
    for part in ("lora_A", "lora_B"):
        marker = f".{part}."
        if marker in peft_name:
            head, tail = peft_name.rsplit(marker, 1)
            return f"{head}.{part}.{adapter}.{tail}"
    return peft_name


def adapter_tensors(model: Any) -> dict[str, torch.Tensor]:
    """The adapter's tensors under PEFT on-disk names, in the model's parameter order (live, detached views)."""
    peft = require_peft()
    return peft.get_peft_model_state_dict(model, adapter_name=ADAPTER_NAME, save_embedding_layers=False)


class AdapterParams:
    """The adapter's live parameters under PEFT on-disk names, resolved once per model (peft's
    `get_peft_model_state_dict` names and order, mapped to the parameters by `module_name`): a sync reads them
    without rebuilding a state dict. Holds the `Parameter` objects, so it follows an optimizer or DeepSpeed that
    swaps a parameter's `.data`. `dtype`: the frozen base's dtype, what engines compute the adapter in and what
    crosses the wire."""

    def __init__(self, model: torch.nn.Module) -> None:
        params = dict(model.named_parameters())
        names = list(adapter_tensors(model))
        missing = [n for n in names if module_name(n) not in params]
        assert not missing, f"adapter tensors without a parameter: {missing[:3]}"
        self.items = [(n, params[module_name(n)]) for n in names]
        frozen = next((p for p in model.parameters() if not p.requires_grad), None)
        self.dtype = frozen.dtype if frozen is not None else self.items[0][1].dtype

    def live(self) -> list[tuple[str, torch.Tensor]]:
        """(PEFT name, the parameter's live tensor, detached): valid until the next optimizer step."""
        return [(n, p.detach()) for n, p in self.items]

    def host_copy(self) -> list[tuple[str, torch.Tensor]]:
        """Fresh CPU copies in `dtype`, as views into one host tensor: one device-to-host copy for the whole adapter
        instead of one per tensor (hundreds)."""
        live = self.live()
        flat = torch.cat([t.reshape(-1).to(self.dtype) for _, t in live]).cpu()
        parts = torch.split(flat, [t.numel() for _, t in live])
        return [(n, part.view(t.shape)) for (n, t), part in zip(live, parts)]

    def snapshot(self) -> AdapterSnapshot:
        return AdapterSnapshot(self)


class AdapterSnapshot:
    """One sync's adapter, handed to a weight sender (`rlvr.weight_sync.transport`): iterating it yields fresh host
    copies (`AdapterParams.host_copy`, made at the first `next`), what the gloo and shm senders move; a sender that
    reads device memory itself (the CUDA IPC one) takes `live()` instead, which ends the iteration, so that draining
    the snapshot afterwards (`send_all`) copies nothing."""

    def __init__(self, params: AdapterParams) -> None:
        self.params, self.dtype = params, params.dtype
        self._items: Iterator[tuple[str, torch.Tensor]] | None = None
        self._taken = False

    def __iter__(self) -> AdapterSnapshot:
        return self

    def __next__(self) -> tuple[str, torch.Tensor]:
        if self._taken:
            raise StopIteration
        if self._items is None:
            self._items = iter(self.params.host_copy())
        return next(self._items)

    def live(self) -> list[tuple[str, torch.Tensor]]:
        self._taken = True
        return self.params.live()


def adapter_parameter_names(model: torch.nn.Module) -> list[str]:
    """Live names of the adapter parameters (the ones that train)."""
    return [n for n, _ in model.named_parameters() if ".lora_A." in n or ".lora_B." in n]


def to_module_names(named: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
    for name, tensor in named:
        yield module_name(name), tensor


def adapter_config_dict(spec: LoraSpec, base_model_path: str | None) -> dict[str, Any]:
    """adapter_config.json as peft writes it (what vLLM's PEFTHelper and `peft.LoraConfig` read)."""
    return spec.peft_config(base_model_path).to_dict()


def plain_adapter_config(spec: LoraSpec, base_model_path: str | None) -> dict[str, Any]:
    """`adapter_config_dict` as plain JSON data (what adapter_config.json holds; what the "lora_ipc" transport
    hands the engines instead of the file)."""
    return _jsonable(adapter_config_dict(spec, base_model_path))


def write_adapter_dir(named: Iterable[tuple[str, torch.Tensor]], config: dict[str, Any], out_dir: str | Path) -> Path:
    """Write an adapter directory (PEFT format) atomically: into `<out_dir>.tmp`, then renamed to `out_dir`."""
    out = Path(out_dir)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    write_adapter_files(named, config, tmp)
    if out.exists():
        shutil.rmtree(out)
    os.replace(tmp, out)
    return out


def write_adapter_files(named: Iterable[tuple[str, torch.Tensor]], config: dict[str, Any], directory: Path) -> None:
    """`adapter_model.safetensors` and `adapter_config.json` into an existing directory."""
    write_safetensors([(n, t.detach().to("cpu").contiguous()) for n, t in named], directory / WEIGHTS_FILE)
    (directory / CONFIG_FILE).write_text(json.dumps(_jsonable(config), indent=2, sort_keys=True))


_SAFETENSORS_DTYPES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16", torch.float64: "F64"}


def write_safetensors(named: list[tuple[str, torch.Tensor]], path: Path) -> None:
    """A safetensors file (format: 8-byte little-endian header size, JSON header padded with spaces to 8 bytes,
    then the tensors' bytes at their `data_offsets`) written straight from the tensors' memory: the safetensors
    library first copies every tensor into a bytes object (and refuses, in some versions, views that share a buffer,
    which is what a gloo bucket or the learner's one-copy adapter hands out). Tensors must be contiguous, on CPU."""
    import struct

    header: dict[str, Any] = {}
    offset = 0
    for name, t in named:
        if t.dtype not in _SAFETENSORS_DTYPES or t.dim() == 0:
            raise ValueError(f"{name}: cannot write a {t.dtype} tensor of shape {tuple(t.shape)} as an adapter")
        size = t.numel() * t.element_size()
        header[name] = {
            "dtype": _SAFETENSORS_DTYPES[t.dtype],
            "shape": list(t.shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    header["__metadata__"] = {"format": "pt"}
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for _, t in named:
            f.write(memoryview(t.view(torch.uint8).numpy()))


def check_adapter_config(config: Any, where: str | Path) -> dict[str, Any]:
    """`config` (adapter_config.json as parsed) when it is a LoRA config rlvr can use, else ValueError naming
    `where` and the field: `r` a positive integer (never a bool or a float), `lora_alpha` (optional, default
    `r`) a finite positive number, `target_modules` (optional) a non-empty list of strings or one pattern string,
    `lora_dropout` (optional) a finite number in [0, 1), `base_model_name_or_path` a string or null, `peft_type`
    (optional) "LORA", and `rank_pattern` / `alpha_pattern` (optional) empty: per-module ranks are not rlvr's."""

    def bad(field: str, want: str) -> ValueError:
        got = config.get(field)
        text = json.dumps(got) if isinstance(got, (bool, int, float, str, type(None))) else type(got).__name__
        return ValueError(f"{where}: {field} must be {want}, got {text[:60]}")

    if not isinstance(config, dict):
        raise ValueError(f"{where}: not a LoRA adapter config (a JSON object), got {type(config).__name__}")
    if "r" not in config:
        raise ValueError(f"{where}: not a LoRA adapter config (no r)")
    r = config["r"]
    if type(r) is not int or r <= 0:
        raise bad("r", "a positive integer")
    if "lora_alpha" in config:
        a = config["lora_alpha"]
        if type(a) not in (int, float) or not math.isfinite(a) or a <= 0:
            raise bad("lora_alpha", "a finite positive number")
    targets = config.get("target_modules")
    if targets is not None:  # absent or null: peft's defaults (`rlvr export` needs it and says so)
        if isinstance(targets, str):
            ok = bool(targets)
        else:
            ok = isinstance(targets, list) and bool(targets) and all(isinstance(t, str) and t for t in targets)
        if not ok:
            raise bad("target_modules", "a non-empty list of module names")
    if "lora_dropout" in config:
        d = config["lora_dropout"]
        if type(d) not in (int, float) or not math.isfinite(d) or not 0 <= d < 1:
            raise bad("lora_dropout", "a number in [0, 1)")
    if config.get("base_model_name_or_path") is not None and not isinstance(config["base_model_name_or_path"], str):
        raise bad("base_model_name_or_path", "a path (a string)")
    if config.get("peft_type", "LORA") != "LORA":
        raise bad("peft_type", '"LORA"')
    for field in ("rank_pattern", "alpha_pattern"):
        if config.get(field) not in (None, {}):
            raise bad(field, "empty (rlvr adapters have one rank and alpha)")
    return config


def read_adapter_config(path: str | Path) -> dict[str, Any]:
    """The adapter directory's adapter_config.json, checked by `check_adapter_config`; ValueError naming the file
    (and the field) when it is missing, unreadable or not a usable LoRA config."""
    f = Path(path) / CONFIG_FILE
    try:
        config = json.loads(f.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        reason = "nested too deeply" if isinstance(e, RecursionError) else e
        raise ValueError(
            f"{f}: not a LoRA adapter config ({CONFIG_FILE} of a LoRA adapter directory): {reason}"
        ) from None
    return check_adapter_config(config, f)


def read_adapter_dir(path: str | Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """(adapter_config.json, tensors) of an adapter directory: JSON and safetensors, nothing unpickled.
    ValueError when either is missing or unreadable, or the config is not one `check_adapter_config` takes."""
    from safetensors.torch import load_file

    p = Path(path)
    config = read_adapter_config(p)
    try:
        tensors = load_file(str(p / WEIGHTS_FILE))
    except OSError as e:
        raise ValueError(f"{p}: not a LoRA adapter directory ({CONFIG_FILE} + {WEIGHTS_FILE}): {e}") from None
    except Exception as e:  # trust boundary: safetensors raises its own error types on a malformed file
        raise ValueError(f"{p / WEIGHTS_FILE}: unreadable safetensors file: {e}") from None
    return config, tensors


@torch.no_grad()
def load_adapter_tensors(model: torch.nn.Module, tensors: dict[str, torch.Tensor]) -> int:
    """Copy PEFT-named adapter tensors into a wrapped model in place; every adapter parameter must be given,
    with its shape (ValueError otherwise, naming the first mismatch). Returns how many were copied."""
    from rlvr.rollout.weights import copy_named_tensors

    want = set(adapter_parameter_names(model))
    got = {module_name(n) for n in tensors}
    if want != got:
        missing, extra = sorted(want - got), sorted(got - want)
        raise ValueError(
            f"adapter does not match the model's LoRA settings: missing {missing[:3]}, "
            f"unexpected {extra[:3]} (compare --learner.lora-rank / --learner.lora-target-modules)"
        )
    params = dict(model.named_parameters())
    for name, t in tensors.items():
        if tuple(params[module_name(name)].shape) != tuple(t.shape):
            raise ValueError(
                f"adapter tensor {name} has shape {tuple(t.shape)}, the model's LoRA settings give "
                f"{tuple(params[module_name(name)].shape)} (compare --learner.lora-rank)"
            )
    return copy_named_tensors(model, to_module_names(tensors.items()))


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        items = [_jsonable(v) for v in value]
        return sorted(items, key=str) if isinstance(value, set) else items
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)  # enums (task_type, peft_type) and anything else peft puts in its dict


def sweep_dead(root: Path) -> int:
    """Remove the adapter stores (`rlvr-lora-<pid>-...`) of processes that no longer run: a killed run leaves its
    shared memory behind (RAM, until reboot). Returns how many were removed."""
    removed = 0
    for p in root.glob("rlvr-lora-*-*"):
        pid = p.name.split("-")[2]
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:  # gone: its store is garbage
            shutil.rmtree(p, ignore_errors=True)
            removed += 1
        except PermissionError:  # alive, another user's
            continue
    return removed


def vllm_engine_args(spec: LoraSpec) -> dict[str, Any]:
    """AsyncEngineArgs for serving one rlvr adapter: LoRA on, the smallest `max_lora_rank` vLLM takes that holds
    the rank, one adapter slot on the GPU and one in vLLM's CPU cache (the policy's, replaced in place), and rlvr's
    worker extension (`rlvr.rollout.vllm_lora_ipc`: the CUDA IPC load)."""
    from rlvr.config.validation import VLLM_LORA_RANKS

    fits = [r for r in VLLM_LORA_RANKS if r >= spec.rank]
    if not fits:
        raise ValueError(
            f"--learner.lora-rank {spec.rank} exceeds the largest rank vLLM serves ({max(VLLM_LORA_RANKS)})"
        )
    return {
        "enable_lora": True,
        "max_lora_rank": fits[0],
        "max_loras": 1,
        "max_cpu_loras": 1,
        # the worker method that loads an adapter from the learner's GPU memory (transport "lora_ipc")
        "worker_extension_cls": "rlvr.rollout.vllm_lora_ipc.LoraIpcWorkerExtension",
    }


class SharedMemoryAdapters:
    """Adapter directories for vLLM to load: PEFT directories in shared memory (/dev/shm, a RAM file system; the
    system temp directory where there is none), one per update, written by learner rank 0 when the engines share its
    host (transport `shm`), else by each vLLM engine from what it received over gloo. vLLM 0.26's `add_lora` loads
    adapters only from a path (`LoRARequest.lora_path`); engines colocated with the learners skip the directory
    (transport `lora_ipc`: rlvr's worker extension loads the tensors from the learner's GPU memory, without patching
    vLLM's `_load_adapter` as verl's TensorLoRARequest does). The engine's workers run on the engine's node, so they
    read the same memory."""

    def __init__(self, spec: LoraSpec, base_model_path: str, tag: str) -> None:
        import tempfile

        shm = Path("/dev/shm")
        root = shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())
        sweep_dead(root)
        self.root = Path(tempfile.mkdtemp(prefix=f"rlvr-lora-{os.getpid()}-{tag}-", dir=root))
        self.config = adapter_config_dict(spec, base_model_path)
        self.written: list[Path] = []
        self._count = 0

    def write(self, named: Iterable[tuple[str, torch.Tensor]], version: int, keep: int = 2) -> Path:
        """A new adapter directory holding these tensors (a version may be written twice: an engine replaced).
        Only the newest `keep` stay: updates are synchronous, so by the time a directory is written the one before
        it was loaded everywhere and the ones before that are no longer read."""
        self._count += 1
        path = write_adapter_dir(named, self.config, self.root / f"v{version}-{self._count}")
        self.written.append(path)
        while len(self.written) > keep:
            shutil.rmtree(self.written.pop(0), ignore_errors=True)
        return path

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
