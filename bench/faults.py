"""Fault-injection suite: each scenario runs real `rlvr train` drivers on CPU, injects faults or attacks, and
checks the run survived (or refused bad input with exit 2 and changed nothing) and lost no data (prompt
accounting by prompt_id from the final checkpoint).

Prints ONE JSON line: {"faults_injected", "survived", "attacks_tried", "attacks_contained", "data_lost",
"scenarios": {name: {...}}, "wall_s"}. An attack is one crafted input (a checkpoint file that would run code,
corrupt checkpoints, a giant dataset row); it is contained when it is refused with exit 2, runs nothing and
changes nothing. The tests in tests/orchestration/ call the same scenario functions.
Run: python bench/faults.py [--only NAME ...] [--signals N]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
FAST = [
    "--eval.every-n-steps",
    "0",
    "--eval.at-step-0",
    "False",
    "--logging.console-progress",
    "False",
    "--rollout.prompts-per-step",
    "4",
    "--generation.num-samples",
    "4",
    "--learner.lr",
    "1e-3",
    "--checkpoint.every-n-steps",
    "2",
    "--checkpoint.keep-last",
    "5",
]


def train_cmd(out: Path, name: str, steps: int, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "rlvr.cli",
        "train",
        "--checkpoint.output-dir",
        str(out),
        "--logging.run-name",
        name,
        "--num-steps",
        str(steps),
        *FAST,
        *extra,
    ]


def run(cmd: list[str], env: dict[str, str] | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=full_env, cwd=ROOT)


def signal_when(
    cmd: list[str], ready: Callable[[], bool], sig: int, env: dict[str, str] | None = None, timeout: float = 600
) -> tuple[int, str]:
    """Start a driver, send `sig` to it when `ready()` turns true, return (exit status, stderr)."""
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        start_new_session=True,
    )
    deadline = time.time() + timeout
    while not ready():
        if proc.poll() is not None:
            return proc.returncode, proc.stderr.read()
        if time.time() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)
            raise TimeoutError("the condition to signal never came")
        time.sleep(0.05)
    if sig == signal.SIGKILL:
        os.killpg(proc.pid, signal.SIGKILL)
    else:
        os.kill(proc.pid, sig)
    _, err = proc.communicate(timeout=timeout)
    return proc.returncode, err


def metrics(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def ledger(run_dir: Path) -> dict[str, Any]:
    latest = (run_dir / "checkpoints" / "latest").read_text().strip()
    return json.loads((run_dir / "checkpoints" / latest / "trainer_state" / "driver.json").read_text())["ledger"]


def data_lost(run_dir: Path) -> int:
    """Prompts lost or double-counted: pulled ids must be exactly the stream's first N ids, each in one state."""
    from transformers import AutoTokenizer

    from rlvr.config import from_dict, read_yaml
    from rlvr.data import PromptStream

    led = ledger(run_dir)
    states, in_flight = led["state"], set(led["in_flight"])
    overlap = len(set(states) & in_flight)
    pulled = set(states) | in_flight
    cfg = from_dict(read_yaml(str(run_dir / "config.yaml")))  # the run's own config: its stream
    stream = PromptStream(cfg, AutoTokenizer.from_pretrained(run_dir / "builtin_model"))
    expected = {stream.next_request().prompt_id for _ in range(len(pulled))}
    return overlap + len(pulled ^ expected)


def why(run_dir: Path, *procs: subprocess.CompletedProcess | tuple[int, str]) -> dict[str, Any]:
    """What a failed scenario needs to be diagnosed from a CI log: exit codes, the run's warnings and errors
    (events.log), per-step engine restarts, and each driver's last traceback (Ray's log lines come after it)."""
    codes, tracebacks = [], []
    for p in procs:
        code, err = (p.returncode, p.stderr) if isinstance(p, subprocess.CompletedProcess) else p
        codes.append(code)
        if "Traceback" in err:
            tracebacks.append(err[err.rindex("Traceback") :][:2500])
    events = run_dir / "events.log"
    noted = (
        [ln[:400] for ln in events.read_text().splitlines() if " E [" in ln or " W [" in ln] if events.exists() else []
    )
    restarts = (
        [m.get("health/engine_restarts") for m in metrics(run_dir)] if (run_dir / "metrics.jsonl").exists() else None
    )
    return {
        "exit_codes": codes,
        "events": noted[-20:],
        "engine_restarts": restarts,
        "tracebacks": tracebacks,
        "stderr_tail": [p.stderr[-600:] if isinstance(p, subprocess.CompletedProcess) else p[1][-600:] for p in procs],
    }


# ----------------------------------------------------------------------------------------------- scenarios
def kill_engine(out: Path, at: str = "collect") -> dict[str, Any]:
    """An engine actor is killed before step 3 (`at="collect"`: found dead while collecting rollouts) or just
    before step 3's weight sync (`at="sync"`: found dead by the sync): replaced, re-synced, its prompts
    re-queued; the run finishes with one engine restart."""
    name = "kill_engine" if at == "collect" else "kill_engine_sync"
    p = run(
        train_cmd(out, name, 5, "--rollout.async-steps", "1", "--cluster.num-engines", "2"),
        env={"RLVR_INJECT_FAULTS": f"{name}@3"},
    )
    rd = out / name
    ok = p.returncode == 0 and metrics(rd)[-1]["health/engine_restarts"] == 1
    return {"survived": ok, "data_lost": data_lost(rd) if ok else None, **({} if ok else {"why": why(rd, p)})}


def kill_engine_eval(out: Path) -> dict[str, Any]:
    """An engine is killed while the eval of step 2 (overlapped with step 3's rollouts) and that of the last
    step (blocking) generate: the first is dropped with a warning, the last runs again on the replacement; the
    run ends with 2 restarts, evals of steps 4 and 5, and no prompt lost."""
    name = "kill_engine_eval"
    p = run(
        train_cmd(
            out,
            name,
            5,
            "--rollout.async-steps",
            "1",
            "--cluster.num-engines",
            "2",
            "--eval.every-n-steps",
            "2",
            "--eval.overlap",
            "True",
            "--eval.max-prompts",
            "4",
        ),
        env={"RLVR_INJECT_FAULTS": f"{name}@2,{name}@5"},
    )
    rd = out / name
    records = (
        [json.loads(line) for line in (rd / "eval.jsonl").read_text().splitlines() if line.strip()]
        if (rd / "eval.jsonl").exists()
        else []
    )
    evals = [r["step"] for r in records]
    # the retried eval of step 5 counts each (prompt, sample) once, like the undisturbed eval of step 4
    sizes = sorted({(r["eval/num_prompts"], r["eval/num_samples"]) for r in records})
    ok = p.returncode == 0 and metrics(rd)[-1]["health/engine_restarts"] == 2 and evals == [4, 5] and len(sizes) == 1
    return {
        "survived": ok,
        "evals": evals,
        "eval_sizes": sizes,
        "data_lost": data_lost(rd) if ok else None,
        **({} if ok else {"why": why(rd, p)}),
    }


def kill_learner(out: Path, async_steps: int = 1) -> dict[str, Any]:
    """Learner rank 0 is killed during step 5: the run restarts from checkpoint step_4 and finishes."""
    name = f"kill_learner_async{async_steps}"
    p = run(
        train_cmd(out, name, 6, "--rollout.async-steps", str(async_steps), "--cluster.num-engines", "1"),
        env={"RLVR_INJECT_FAULTS": "kill_learner@5"},
    )
    rd = out / name
    events = (rd / "events.log").read_text() if (rd / "events.log").exists() else ""
    ok = p.returncode == 0 and "restarting the run from its last complete checkpoint" in events
    steps = [m["step"] for m in metrics(rd) if "loss/total" in m] if ok else []
    ok = ok and steps == [1, 2, 3, 4, 5, 6]
    return {"survived": ok, "data_lost": data_lost(rd) if ok else None, **({} if ok else {"why": why(rd, p)})}


def kill_learner_exact(out: Path) -> dict[str, Any]:
    """async_steps=0, seeded sampling: a learner killed during step 5 (restart from step_4) ends with the same
    weights as an uninterrupted run (float32 CPU, 1e-6)."""
    from safetensors.torch import load_file

    result = kill_learner(out, async_steps=0)
    straight = run(train_cmd(out, "straight_async0", 6, "--rollout.async-steps", "0", "--cluster.num-engines", "1"))
    if not result["survived"] or straight.returncode != 0:
        return {**result, "survived": False, "why_straight": why(out / "straight_async0", straight)}
    a = load_file(str(out / "straight_async0" / "checkpoints" / "step_6" / "model.safetensors"))
    b = load_file(str(out / "kill_learner_async0" / "checkpoints" / "step_6" / "model.safetensors"))
    max_diff = max(float((a[k] - b[k]).abs().max()) for k in a)
    return {**result, "max_weight_diff": max_diff, "survived": result["survived"] and max_diff <= 1e-6}


def sigterm(out: Path, during: str = "generation") -> dict[str, Any]:
    """SIGTERM during generation (after step 2) or during a checkpoint write: exit 75, then resume to the end."""
    name = f"sigterm_{during}"
    rd = out / name
    cmd = train_cmd(out, name, 5, "--rollout.async-steps", "1")
    if during == "generation":

        def ready() -> bool:
            return (rd / "metrics.jsonl").exists() and any(m["step"] == 2 for m in metrics(rd))

        code, err = signal_when(cmd, ready, signal.SIGTERM)
    else:

        def ready() -> bool:
            return (rd / "checkpoints" / ".tmp_step_2").exists()

        code, err = signal_when(cmd, ready, signal.SIGTERM, env={"RLVR_INJECT_FAULTS": "slow_checkpoint@2"})
    first_ok = code == 75 and "preempted, resumable" in err
    p = run(cmd)
    steps = [m["step"] for m in metrics(rd) if "loss/total" in m]
    ok = first_ok and p.returncode == 0 and steps == [1, 2, 3, 4, 5]
    return {
        "survived": ok,
        "exit_on_signal": code,
        "data_lost": data_lost(rd) if ok else None,
        **({} if ok else {"why": why(rd, (code, err), p)}),
    }


def hostile_verifiers(out: Path) -> dict[str, Any]:
    """A reward that hangs forever and one that segfaults: the run proceeds, both are counted."""
    import yaml

    preset = out / "hostile.yaml"
    base = yaml.safe_load((ROOT / "configs" / "tiny-cpu.yaml").read_text())  # the demo, plus hostile rewards
    base["rewards"].update(
        {
            "custom": ["fault_rewards"],
            "timeout_s": 1.0,
            "functions": [{"name": "hang_sometimes", "weight": 0.0}, {"name": "segfault_sometimes", "weight": 0.0}],
        }
    )
    preset.write_text(yaml.safe_dump(base))
    env = {
        "PYTHONPATH": f"{ROOT / 'tests' / 'orchestration'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
        "RAY_ADDRESS": "",
    }  # own Ray cluster: its workers inherit PYTHONPATH
    p = run(train_cmd(out, "hostile", 3, "--config", str(preset)) + FAST, env=env)
    rd = out / "hostile"
    m = metrics(rd) if (rd / "metrics.jsonl").exists() else []
    timeouts = sum(x.get("reward/pool/timeouts", 0) for x in m)
    crashes = sum(x.get("reward/pool/crashes", 0) for x in m)
    ok = p.returncode == 0 and timeouts > 0 and crashes > 0
    return {
        "survived": ok,
        "timeouts": timeouts,
        "crashes": crashes,
        "data_lost": data_lost(rd) if ok else None,
        **({} if ok else {"why": why(rd, p)}),
    }


def corrupt_checkpoint(out: Path) -> dict[str, Any]:
    """The newest checkpoint is corrupted: resume skips it with a warning and uses the previous one."""
    rd = out / "corrupt"
    first = run(train_cmd(out, "corrupt", 4))
    weights = rd / "checkpoints" / "step_4" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0xFF
    weights.write_bytes(bytes(data))
    p = run(train_cmd(out, "corrupt", 6))
    events = (rd / "events.log").read_text()
    ok = (
        first.returncode == 0
        and p.returncode == 0
        and "skipping checkpoint" in events
        and "resumed from" in events
        and "step_2" in events.split("resumed from")[-1].splitlines()[0]
    )
    return {"survived": ok, "data_lost": data_lost(rd) if ok else None, **({} if ok else {"why": why(rd, first, p)})}


# ------------------------------------------------------------------------------------ attacks on the inputs
MARKER_ENV = "RLVR_BENCH_MARKER"


class _Payload:
    """Unpickling this runs code: it creates the file named in the payload (the proof an attack worked)."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self) -> tuple:
        return (exec, (f"open({self.marker!r}, 'w').write('pwned')",))


def _plant(ckpt: Path, target: str, marker: Path) -> None:
    """Put a code-running pickle into one file of a checkpoint and regenerate its manifest (as an attacker who
    can write the run directory would)."""
    import torch

    from rlvr.orchestration.checkpoint import write_manifest

    state = ckpt / "trainer_state"
    if target == "driver_state":  # the old format: a pickled driver state beside (or instead of) the JSON one
        (state / "driver.json").unlink()
        (state / "driver.pkl").write_bytes(__import__("pickle").dumps(_Payload(marker)))
    elif target == "optimizer":
        torch.save({"optimizer": _Payload(marker), "scheduler": {}}, state / "optimizer.pt")
    elif target == "rng":
        torch.save(
            {"torch": torch.get_rng_state(), "python": _Payload(marker), "version": 1, "skipped": 0},
            state / "rng_rank0.pt",
        )
    elif target == "driver_json_as_pickle":
        (state / "driver.json").write_bytes(__import__("pickle").dumps(_Payload(marker)))
    else:
        raise ValueError(target)
    write_manifest(ckpt, int(ckpt.name.split("_")[1]))


def malicious_checkpoint(out: Path) -> dict[str, Any]:
    """A code-running pickle in each checkpoint file (driver state, optimizer, RNG; manifest regenerated): every
    resume is refused with exit 2 naming the file, nothing runs (no marker file), nothing of the run changes."""
    import hashlib

    base = out / "malicious_base"
    first = run(train_cmd(out, "malicious_base", 2))
    if first.returncode != 0:
        return {"survived": False, "attacks": 0, "contained": 0, "data_lost": None, "why": why(base, first)}
    results = {}
    for target in ("driver_state", "optimizer", "rng", "driver_json_as_pickle"):
        name = f"malicious_{target}"
        rd = out / name
        shutil.copytree(base, rd)
        marker = out / f"{name}.marker"
        _plant(rd / "checkpoints" / "step_2", target, marker)
        before = {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in rd.rglob("*") if p.is_file()}
        p = run(train_cmd(out, name, 4))
        after = {
            p: hashlib.sha256(p.read_bytes()).hexdigest()
            for p in rd.rglob("*")
            if p.is_file() and p.name != "events.log"
        }
        changed = sorted(
            str(k.relative_to(rd))
            for k in set(before) | set(after)
            if k.name != "events.log" and before.get(k) != after.get(k)
        )
        contained = p.returncode == 2 and "refused" in p.stderr and not marker.exists() and not changed
        results[target] = {
            "contained": contained,
            "exit": p.returncode,
            "ran_code": marker.exists(),
            "changed": changed[:5],
            "message": p.stderr.strip().splitlines()[-1][:300] if p.stderr.strip() else "",
        }
    contained = sum(r["contained"] for r in results.values())
    return {
        "survived": contained == len(results),
        "attacks": len(results),
        "contained": contained,
        "data_lost": 0,
        "targets": results,
    }


def all_checkpoints_corrupt(out: Path) -> dict[str, Any]:
    """Every checkpoint of a run is corrupt: the resume stops with exit 2 naming them and the fresh-start flag,
    and metrics.jsonl and the checkpoints are left exactly as they were."""
    rd = out / "all_corrupt"
    first = run(train_cmd(out, "all_corrupt", 4))
    if first.returncode != 0:
        return {"survived": False, "attacks": 1, "contained": 0, "data_lost": None, "why": why(rd, first)}
    for ckpt in (rd / "checkpoints").glob("step_*"):
        weights = ckpt / "model.safetensors"
        data = bytearray(weights.read_bytes())
        data[len(data) // 2] ^= 0xFF
        weights.write_bytes(bytes(data))
    metrics_before = (rd / "metrics.jsonl").read_bytes()
    ckpts_before = sorted(p.name for p in (rd / "checkpoints").iterdir())
    p = run(train_cmd(out, "all_corrupt", 6))
    ok = (
        p.returncode == 2
        and "none is usable" in p.stderr
        and "step_2" in p.stderr
        and "step_4" in p.stderr
        and "--checkpoint.resume never" in p.stderr
        and (rd / "metrics.jsonl").read_bytes() == metrics_before
        and sorted(q.name for q in (rd / "checkpoints").iterdir()) == ckpts_before
    )
    return {
        "survived": ok,
        "attacks": 1,
        "contained": int(ok),
        "exit": p.returncode,
        "data_lost": 0 if ok else None,
        **({} if ok else {"why": why(rd, p)}),
    }


def huge_row(out: Path, megabytes: int = 40) -> dict[str, Any]:
    """A dataset with one row of `megabytes` MB (line 3): `rlvr train` refuses it with exit 2 naming file:line,
    before Ray starts, and leaves no run directory behind."""
    import json as _json

    data = out / "huge_row.jsonl"
    with open(data, "w") as f:
        for i in range(5):
            prompt = "ab" * (megabytes << 19) if i == 2 else "ab="
            f.write(_json.dumps({"prompt": prompt, "ground_truth": "ab", "verifier": "copy"}) + "\n")
    p = run(train_cmd(out, "huge_row", 2, "--data.datasets", "builtin:copy", str(data)))
    ok = p.returncode == 2 and "huge_row.jsonl:3" in p.stderr and "MiB" in p.stderr and not (out / "huge_row").exists()
    data.unlink()
    return {
        "survived": ok,
        "attacks": 1,
        "contained": int(ok),
        "exit": p.returncode,
        "data_lost": 0 if ok else None,
        "message": [ln for ln in p.stderr.splitlines() if "huge_row.jsonl" in ln][:1],
    }


# ---------------------------------------------------------------------------------- signals at random moments
def _stress_cmd(out: Path, steps: int) -> list[str]:
    """One command for every launch, no run name: each launch must find and continue the unfinished run."""
    return [
        sys.executable,
        "-m",
        "rlvr.cli",
        "train",
        "--checkpoint.output-dir",
        str(out),
        "--num-steps",
        str(steps),
        "--logging.console-progress",
        "False",
        "--rollout.prompts-per-step",
        "8",
        "--generation.num-samples",
        "4",
        "--learner.lr",
        "1e-3",
        "--checkpoint.every-n-steps",
        "5",
        "--checkpoint.keep-last",
        "3",
        "--eval.every-n-steps",
        "5",
        "--eval.at-step-0",
        "True",
        "--eval.overlap",
        "False",
        "--eval.max-prompts",
        "32",
        "--rollout.async-steps",
        "1",
    ]


def _new_text(path: Path, offset: int) -> str:
    if not path.exists():
        return ""
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read().decode(errors="replace")


def _size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


def _moment(name: str, out: Path, rng: random.Random) -> Callable[[], bool]:
    """A ready() condition that turns true at the moment named: `startup` (a random time in the first seconds:
    parsing, preparing the data, starting Ray), `eval` (an eval has started), `training` (a step finished since
    this launch), `checkpoint` (a checkpoint is being written, slowly: slow_checkpoint)."""
    runs = [d for d in out.iterdir() if d.is_dir()] if out.exists() else []
    root = max(runs, key=lambda d: d.stat().st_mtime) if runs else None
    t0 = time.time()
    if name == "startup" or root is None:
        # from 0.5 s: before that the interpreter is still starting and rlvr's handlers are not installed yet
        # (a signal then gets Python's default: SIGTERM kills the process with nothing written, SIGINT raises
        # KeyboardInterrupt); after it, parsing, preparing the data, starting Ray and the actors
        wait = rng.uniform(0.5, 10.0)
        return lambda: time.time() - t0 > wait
    events, metrics_file = root / "events.log", root / "metrics.jsonl"
    ev0, m0 = _size(events), _size(metrics_file)
    extra = {"eval": rng.uniform(0.0, 0.05), "training": rng.uniform(0.0, 0.5)}.get(name, rng.uniform(0.0, 2.0))
    seen: list[float] = []

    def after(cond: bool) -> bool:
        if cond and not seen:
            seen.append(time.time())
        return bool(seen) and time.time() - seen[0] >= extra

    if name == "eval":
        return lambda: after("eval of step" in _new_text(events, ev0))
    if name == "training":
        return lambda: after('"loss/total"' in _new_text(metrics_file, m0))
    if name == "checkpoint":
        return lambda: after(any((root / "checkpoints").glob(".tmp_step_*")))
    raise ValueError(name)


def _launch_and_signal(
    cmd: list[str], ready: Callable[[], bool], sig: int, env: dict[str, str], log: Path, timeout: float = 600
) -> int:
    """Start a driver in its own process group, send `sig` to the WHOLE group (as Ctrl-C or Slurm do) when ready()
    turns true; its exit status. A driver that finishes first returns its status unsignalled."""
    with open(log, "w") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, cwd=ROOT, env=env, start_new_session=True)
        deadline = time.time() + timeout
        while proc.poll() is None and not ready():
            if time.time() > deadline:
                os.killpg(proc.pid, signal.SIGKILL)
                raise TimeoutError("the moment to signal never came")
            time.sleep(0.05)
        if proc.poll() is None:
            os.killpg(proc.pid, sig)
        return proc.wait(timeout=timeout)


def signal_stress(
    out: Path, moments: list[str] | None = None, num_signals: int = 20, steps: int = 100, seed: int = 0
) -> dict[str, Any]:
    """SIGTERM or SIGINT to the whole process group of `rlvr train` at chosen or random moments (start-up, eval,
    training, checkpoint write), relaunching the same command (no run name) after each: every signal ends in
    exit 75, every relaunch continues the same run, and a last launch finishes it with every step trained once
    and no prompt lost. The driver starts its own Ray head (no RAY_ADDRESS), as `rlvr train` alone does."""
    rng = random.Random(seed)
    out = out / "signal_stress"
    out.mkdir(parents=True, exist_ok=True)
    moments = moments or [rng.choice(["startup", "eval", "training", "checkpoint"]) for _ in range(num_signals)]
    cmd = _stress_cmd(out, steps)
    base_env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    base_env.setdefault("RAY_AUTH_MODE", "disabled")
    signals, codes = [], []
    for i, moment in enumerate(moments):
        sig = signal.SIGINT if i % 3 == 2 else signal.SIGTERM
        env = dict(base_env)
        if moment == "checkpoint":
            env["RLVR_INJECT_FAULTS"] = ",".join(f"slow_checkpoint@{s}" for s in range(5, steps + 1, 5))
        code = _launch_and_signal(cmd, _moment(moment, out, rng), sig, env, out / f"launch{i}.err")
        signals.append(f"{moment}:{signal.Signals(sig).name}")
        codes.append(code)
        if code != 75:
            break
    last = run(cmd, env=base_env)
    runs = [d for d in out.iterdir() if d.is_dir()]
    rd = runs[0] if runs else out
    steps_trained = [m["step"] for m in metrics(rd) if "loss/total" in m] if (rd / "metrics.jsonl").exists() else []
    state = json.loads((rd / "run.json").read_text()) if (rd / "run.json").exists() else {}
    ok = (
        all(c == 75 for c in codes)
        and last.returncode == 0
        and len(runs) == 1
        and steps_trained == list(range(1, steps + 1))
        and state.get("status") == "finished"
    )
    errors = {}
    if not ok:
        errors = {f"launch{i}": (out / f"launch{i}.err").read_text()[-1500:] for i, c in enumerate(codes) if c != 75}
    return {
        "survived": ok,
        "signals": len(codes),
        "exit_codes": codes,
        "moments": signals,
        "final_exit": last.returncode,
        "run_dirs": len(runs),
        "data_lost": data_lost(rd) if ok else None,
        **({} if ok else {"why": {**errors, **why(rd, last)}}),
    }


SCENARIOS: dict[str, Callable[[Path], dict[str, Any]]] = {
    "kill_engine": kill_engine,
    "kill_engine_sync": lambda out: kill_engine(out, "sync"),
    "kill_engine_eval": kill_engine_eval,
    "kill_learner": kill_learner,
    "kill_learner_exact": kill_learner_exact,
    "sigterm_generation": lambda out: sigterm(out, "generation"),
    "sigterm_checkpoint": lambda out: sigterm(out, "checkpoint"),
    "hostile_verifiers": hostile_verifiers,
    "corrupt_checkpoint": corrupt_checkpoint,
    "all_checkpoints_corrupt": all_checkpoints_corrupt,
    "malicious_checkpoint": malicious_checkpoint,
    "huge_row": huge_row,
    "signal_stress": signal_stress,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--only", nargs="*", default=list(SCENARIOS))
    parser.add_argument("--signals", type=int, default=20, help="signals sent by signal_stress")
    args = parser.parse_args()
    t0 = time.time()
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.only:
            t = time.time()
            fn = SCENARIOS[name]
            results[name] = (
                signal_stress(Path(tmp), num_signals=args.signals) if name == "signal_stress" else fn(Path(tmp))
            )
            results[name]["wall_s"] = round(time.time() - t, 1)
    lost = sum(r["data_lost"] or 0 for r in results.values())
    attacks = {k: r for k, r in results.items() if "attacks" in r}
    faults = {k: r for k, r in results.items() if "attacks" not in r}
    stress = results.get("signal_stress", {})
    print(
        json.dumps(
            {
                "bench": "faults",
                "scenarios_run": len(results),
                "scenarios_total": len(SCENARIOS),
                "faults_injected": len(faults),
                "survived": sum(bool(r["survived"]) for r in faults.values()),
                "signals_sent": stress.get("signals", 0),
                "signals_exit_75": sum(c == 75 for c in stress.get("exit_codes", [])),
                "attacks_tried": sum(r["attacks"] for r in attacks.values()),
                "attacks_contained": sum(r["contained"] for r in attacks.values()),
                "data_lost": lost,
                "scenarios": results,
                "wall_s": round(time.time() - t0, 1),
            }
        )
    )


if __name__ == "__main__":
    main()
