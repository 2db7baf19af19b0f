"""Fault-injection suite: each scenario runs real `rlvr train` drivers on CPU, injects one fault, and checks
the run survived and lost no data (prompt accounting by prompt_id from the final checkpoint).

Prints ONE JSON line: {"faults_injected", "survived", "data_lost", "scenarios": {name: {...}}, "wall_s"}.
The tests in tests/orchestration/test_orch_faults.py call the same scenario functions.
Run: python bench/faults.py [--only NAME ...]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
FAST = ["--eval.every-n-steps", "0", "--eval.at-step-0", "False", "--logging.console-progress", "False",
        "--rollout.prompts-per-step", "4", "--generation.num-samples", "4", "--learner.lr", "1e-3",
        "--checkpoint.every-n-steps", "2", "--checkpoint.keep-last", "5"]


def train_cmd(out: Path, name: str, steps: int, *extra: str) -> list[str]:
    return [sys.executable, "-m", "rlvr.cli", "train", "--checkpoint.output-dir", str(out), "--logging.run-name",
            name, "--num-steps", str(steps), *FAST, *extra]


def run(cmd: list[str], env: dict[str, str] | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=full_env, cwd=ROOT)


def signal_when(cmd: list[str], ready: Callable[[], bool], sig: int, env: dict[str, str] | None = None,
                timeout: float = 600) -> tuple[int, str]:
    """Start a driver, send `sig` to it when `ready()` turns true, return (exit status, stderr)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                            env={**os.environ, **(env or {})}, start_new_session=True)
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


def data_lost(run_dir: Path, num_samples: int = 4) -> int:
    """Prompts lost or double-counted: pulled ids must be exactly the stream's first N ids, each in one state."""
    from transformers import AutoTokenizer

    from rlvr.config import default_config, from_dict
    from rlvr.data import PromptStream

    led = ledger(run_dir)
    states, in_flight = led["state"], set(led["in_flight"])
    overlap = len(set(states) & in_flight)
    pulled = set(states) | in_flight
    cfg = from_dict({"generation": {"num_samples": num_samples}}, base=default_config())
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
            tracebacks.append(err[err.rindex("Traceback"):][:2500])
    events = run_dir / "events.log"
    noted = [ln[:400] for ln in events.read_text().splitlines() if " E [" in ln or " W [" in ln] if events.exists() else []
    restarts = ([m.get("health/engine_restarts") for m in metrics(run_dir)]
                if (run_dir / "metrics.jsonl").exists() else None)
    return {"exit_codes": codes, "events": noted[-20:], "engine_restarts": restarts, "tracebacks": tracebacks,
            "stderr_tail": [p.stderr[-600:] if isinstance(p, subprocess.CompletedProcess) else p[1][-600:]
                            for p in procs]}


# ----------------------------------------------------------------------------------------------- scenarios
def kill_engine(out: Path, at: str = "collect") -> dict[str, Any]:
    """An engine actor is killed before step 3 (`at="collect"`: found dead while collecting rollouts) or just
    before step 3's weight sync (`at="sync"`: found dead by the sync): replaced, re-synced, its prompts
    re-queued; the run finishes with one engine restart."""
    name = "kill_engine" if at == "collect" else "kill_engine_sync"
    p = run(train_cmd(out, name, 5, "--rollout.async-steps", "1", "--cluster.num-engines", "2"),
            env={"RLVR_INJECT_FAULTS": f"{name}@3"})
    rd = out / name
    ok = p.returncode == 0 and metrics(rd)[-1]["health/engine_restarts"] == 1
    return {"survived": ok, "data_lost": data_lost(rd) if ok else None, **({} if ok else {"why": why(rd, p)})}


def kill_engine_eval(out: Path) -> dict[str, Any]:
    """An engine is killed while the eval of step 2 (overlapped with step 3's rollouts) and that of the last
    step (blocking) generate: the first is dropped with a warning, the last runs again on the replacement; the
    run ends with 2 restarts, evals of steps 4 and 5, and no prompt lost."""
    name = "kill_engine_eval"
    p = run(train_cmd(out, name, 5, "--rollout.async-steps", "1", "--cluster.num-engines", "2",
                      "--eval.every-n-steps", "2", "--eval.overlap", "True", "--eval.max-prompts", "4"),
            env={"RLVR_INJECT_FAULTS": f"{name}@2,{name}@5"})
    rd = out / name
    records = ([json.loads(line) for line in (rd / "eval.jsonl").read_text().splitlines() if line.strip()]
               if (rd / "eval.jsonl").exists() else [])
    evals = [r["step"] for r in records]
    # the retried eval of step 5 counts each (prompt, sample) once, like the undisturbed eval of step 4
    sizes = sorted({(r["eval/num_prompts"], r["eval/num_samples"]) for r in records})
    ok = (p.returncode == 0 and metrics(rd)[-1]["health/engine_restarts"] == 2 and evals == [4, 5]
          and len(sizes) == 1)
    return {"survived": ok, "evals": evals, "eval_sizes": sizes, "data_lost": data_lost(rd) if ok else None,
            **({} if ok else {"why": why(rd, p)})}


def kill_learner(out: Path, async_steps: int = 1) -> dict[str, Any]:
    """Learner rank 0 is killed during step 5: the run restarts from checkpoint step_4 and finishes."""
    name = f"kill_learner_async{async_steps}"
    p = run(train_cmd(out, name, 6, "--rollout.async-steps", str(async_steps), "--cluster.num-engines", "1"),
            env={"RLVR_INJECT_FAULTS": "kill_learner@5"})
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
    return {"survived": ok, "exit_on_signal": code, "data_lost": data_lost(rd) if ok else None,
            **({} if ok else {"why": why(rd, (code, err), p)})}


def hostile_verifiers(out: Path) -> dict[str, Any]:
    """A reward that hangs forever and one that segfaults: the run proceeds, both are counted."""
    import yaml

    preset = out / "hostile.yaml"
    base = yaml.safe_load((ROOT / "configs" / "tiny-cpu.yaml").read_text())  # the demo, plus hostile rewards
    base["rewards"].update({"custom": ["fault_rewards"], "timeout_s": 1.0, "functions": [
        {"name": "hang_sometimes", "weight": 0.0}, {"name": "segfault_sometimes", "weight": 0.0}]})
    preset.write_text(yaml.safe_dump(base))
    env = {"PYTHONPATH": f"{ROOT / 'tests' / 'orchestration'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "RAY_ADDRESS": ""}  # own Ray cluster: its workers inherit PYTHONPATH
    p = run(train_cmd(out, "hostile", 3, "--config", str(preset)) + FAST, env=env)
    rd = out / "hostile"
    m = metrics(rd) if (rd / "metrics.jsonl").exists() else []
    timeouts = sum(x.get("reward/pool/timeouts", 0) for x in m)
    crashes = sum(x.get("reward/pool/crashes", 0) for x in m)
    ok = p.returncode == 0 and timeouts > 0 and crashes > 0
    return {"survived": ok, "timeouts": timeouts, "crashes": crashes,
            "data_lost": data_lost(rd) if ok else None, **({} if ok else {"why": why(rd, p)})}


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
    ok = (first.returncode == 0 and p.returncode == 0 and "skipping checkpoint" in events
          and "resumed from" in events and "step_2" in events.split("resumed from")[-1].splitlines()[0])
    return {"survived": ok, "data_lost": data_lost(rd) if ok else None,
            **({} if ok else {"why": why(rd, first, p)})}


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
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--only", nargs="*", default=list(SCENARIOS))
    args = parser.parse_args()
    t0 = time.time()
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.only:
            t = time.time()
            results[name] = SCENARIOS[name](Path(tmp))
            results[name]["wall_s"] = round(time.time() - t, 1)
    lost = sum(r["data_lost"] or 0 for r in results.values())
    print(json.dumps({"bench": "faults", "faults_injected": len(results),
                      "survived": sum(bool(r["survived"]) for r in results.values()), "data_lost": lost,
                      "scenarios": results, "wall_s": round(time.time() - t0, 1)}))


if __name__ == "__main__":
    main()
