"""`rlvr submit`: golden specs for every preset, schema validation (Kubernetes 1.30, KubeRay RayJob CRD,
Beaker spec v2, all stored under tests/fixtures/schemas/), and the errors users meet (missing CLI, budget).

Regenerate the golden files after an intended change with `RLVR_UPDATE_GOLDEN=1 pytest tests/cluster`.
"""

from __future__ import annotations

import copy
import glob
import json
import os
import shlex
from pathlib import Path

import jsonschema
import pytest
import yaml

from rlvr.launch import submit

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "fixtures" / "golden" / "specs"
SCHEMAS = ROOT / "tests" / "fixtures" / "schemas"
PRESETS = sorted(os.path.relpath(p, ROOT) for p in glob.glob(str(ROOT / "configs" / "*.yaml")))
KINDS = {
    "beaker": ["beaker", "--beaker-budget", "ai2/example"],
    "kuberay": ["k8s"],
    "k8s-job": ["k8s", "--k8s-flavor", "job"],
    "sbatch": ["slurm"],
}
CUSTOM = [
    "--num-nodes",
    "3",
    "--gpus-per-node",
    "4",
    "--image",
    "registry.example/rlvr:dev",
    "--env",
    "NCCL_SOCKET_IFNAME=eth0",
    "GLOO_SOCKET_IFNAME=eth0",
    "--secret",
    "WANDB_API_KEY=wandb:api-key",
    "HF_TOKEN=hf-token",
    "--namespace",
    "research",
    "--partition",
    "gpu",
    "--account",
    "rl",
    "--time",
    "24:00:00",
    "--beaker-cluster",
    "ai2/jupiter",
    "--beaker-workspace",
    "ai2/rlvr",
    "--mount",
    "host:/mnt/datasets:/data",
    "host:/mnt/shared/runs:/opt/rlvr/runs",
    "--slurm-container",
    "--command",
    "rlvr train --config configs/gpu-2node.yaml --num-steps 10",
]


@pytest.fixture(autouse=True)
def _repo_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)  # preset paths in the specs are relative to the repository, as in the image


def _spec(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert submit.main(argv + ["--dry-run"]) == 0
    return capsys.readouterr().out


def _check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("RLVR_UPDATE_GOLDEN"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"missing golden file {path}: run with RLVR_UPDATE_GOLDEN=1"
    assert text == path.read_text(), f"{name} differs from its golden file (RLVR_UPDATE_GOLDEN=1 to accept)"


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("preset", PRESETS)
def test_cluster_golden_preset_specs(preset: str, kind: str, capsys: pytest.CaptureFixture[str]) -> None:
    text = _spec(KINDS[kind] + ["--config", preset], capsys)
    _check_golden(f"{Path(preset).stem}.{kind}", text)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_cluster_golden_custom_specs(kind: str, capsys: pytest.CaptureFixture[str]) -> None:
    _check_golden(f"custom-3node.{kind}", _spec(KINDS[kind] + ["--config", "configs/gpu-2node.yaml"] + CUSTOM, capsys))


# --- schema validation ------------------------------------------------------------------------------------


def _k8s_validator(name: str) -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(json.loads((SCHEMAS / "k8s-v1.30.0" / name).read_text()))


def _strict(schema: dict) -> tuple[dict, list[tuple[str, ...]]]:
    """The CRD schema with unknown keys rejected, and the paths of its pod templates (validated apart)."""
    templates: list[tuple[str, ...]] = []

    def walk(node: dict, path: tuple[str, ...]) -> None:
        if node.pop("x-rlvr-pod-template", False):
            templates.append(path)
            return
        if "properties" in node:
            node.setdefault("additionalProperties", False)
            for key, sub in node["properties"].items():
                walk(sub, path + (key,))
        if isinstance(node.get("items"), dict):
            walk(node["items"], path + ("*",))

    schema = copy.deepcopy(schema)
    walk(schema, ())
    return schema, templates


def _at(doc: object, path: tuple[str, ...]) -> list[object]:
    if not path:
        return [doc]
    head, rest = path[0], path[1:]
    if head == "*":
        return [x for item in (doc or []) for x in _at(item, rest)]
    return _at(doc[head], rest) if isinstance(doc, dict) and head in doc else []


def _errors(validator: jsonschema.Validator, doc: object) -> list[str]:
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(doc)]


def validate_rayjob(doc: dict) -> list[str]:
    """Errors of a RayJob against the trimmed CRD schema plus PodTemplateSpec v1.30 for its pod templates."""
    crd, templates = _strict(yaml.safe_load((SCHEMAS / "kuberay" / "rayjob-v1-openapi.yaml").read_text()))
    errors = _errors(jsonschema.Draft202012Validator(crd), doc)
    pod = _k8s_validator("podtemplatespec-v1.json")
    for path in templates:
        for template in _at(doc, path):
            errors += [f"{'/'.join(path)}: {e}" for e in _errors(pod, template)]
    return errors


@pytest.mark.parametrize("extra", [[], CUSTOM], ids=["default", "custom"])
@pytest.mark.parametrize("preset", PRESETS)
def test_cluster_k8s_manifests_match_schemas(preset: str, extra: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    rayjob = yaml.safe_load(_spec(["k8s", "--config", preset] + extra, capsys))
    assert rayjob["kind"] == "RayJob" and rayjob["apiVersion"] == "ray.io/v1"
    assert validate_rayjob(rayjob) == []
    service, job = yaml.safe_load_all(_spec(["k8s", "--k8s-flavor", "job", "--config", preset] + extra, capsys))
    assert _errors(_k8s_validator("service-v1.json"), service) == []
    assert _errors(_k8s_validator("job-batch-v1.json"), job) == []
    pod = job["spec"]["template"]["spec"]
    assert pod["subdomain"] == service["metadata"]["name"]  # pod 0 resolves as <job>-0.<service>
    assert job["spec"]["completionMode"] == "Indexed"
    assert job["spec"]["completions"] == job["spec"]["parallelism"] == (3 if extra else rayjob_nodes(rayjob))


def rayjob_nodes(rayjob: dict) -> int:
    workers = rayjob["spec"]["rayClusterSpec"].get("workerGroupSpecs", [])
    return 1 + sum(g["replicas"] for g in workers)


def test_cluster_schemas_reject_mistakes(capsys: pytest.CaptureFixture[str]) -> None:
    """The validators are not vacuous: typical mistakes in each manifest are caught."""
    rayjob = yaml.safe_load(_spec(["k8s", "--config", "configs/gpu-2node.yaml"], capsys))
    bad = copy.deepcopy(rayjob)
    bad["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["rayStartParams"]["num-gpus"] = 8  # must be a string
    assert validate_rayjob(bad)
    bad = copy.deepcopy(rayjob)
    bad["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["imagePullPolicy"] = 3
    assert validate_rayjob(bad)
    bad = copy.deepcopy(rayjob)
    bad["spec"]["entrypont"] = bad["spec"].pop("entrypoint")
    assert validate_rayjob(bad)
    _, job = yaml.safe_load_all(_spec(["k8s", "--k8s-flavor", "job", "--config", "configs/gpu-2node.yaml"], capsys))
    job["spec"]["template"]["spec"]["containers"][0]["envs"] = []
    assert _errors(_k8s_validator("job-batch-v1.json"), job)
    beaker = yaml.safe_load(_spec(KINDS["beaker"] + ["--config", "configs/gpu-2node.yaml"], capsys))
    beaker["tasks"][0]["replica"] = 2
    assert _errors(_beaker_validator(), beaker)


def _beaker_validator() -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(json.loads((SCHEMAS / "beaker" / "experiment-spec-v2.json").read_text()))


@pytest.mark.parametrize("extra", [[], CUSTOM], ids=["default", "custom"])
@pytest.mark.parametrize("preset", PRESETS)
def test_cluster_beaker_spec_matches_documented_fields(
    preset: str, extra: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    spec = yaml.safe_load(_spec(KINDS["beaker"] + ["--config", preset] + extra, capsys))
    assert _errors(_beaker_validator(), spec) == []
    (task,) = spec["tasks"]
    assert task["leaderSelection"] is True and task["hostNetworking"] is True
    assert task["command"][:2] == ["bash", "scripts/ray_node_setup.sh"]
    if extra:
        assert {"name": "HF_TOKEN", "secret": "hf-token"} in task["envVars"]
        assert task["replicas"] == 3 and task["resources"]["gpuCount"] == 4


def test_cluster_sbatch_script_is_valid_bash(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    import subprocess

    text = _spec(["slurm", "--config", "configs/gpu-2node.yaml"] + CUSTOM, capsys)
    (tmp_path / "job.sbatch").write_text(text)
    assert subprocess.run(["bash", "-n", str(tmp_path / "job.sbatch")]).returncode == 0
    assert "#SBATCH --nodes=3" in text and "#SBATCH --gpus-per-node=4" in text
    srun = shlex.split(text.strip().splitlines()[-1])
    assert srun[0] == "srun" and srun[srun.index("--") + 1 :] == shlex.split(CUSTOM[-1])


@pytest.mark.parametrize("scheduler,cli", [("beaker", "beaker"), ("k8s", "kubectl"), ("slurm", "sbatch")])
def test_cluster_submit_names_missing_cli(
    scheduler: str, cli: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty directory: no scheduler CLI anywhere
    argv = [scheduler, "--config", "configs/gpu-2node.yaml", "--beaker-budget", "ai2/example"]
    assert submit.main(argv) == 2
    err = capsys.readouterr().err
    assert f"`{cli}` is not on PATH" in err and "--dry-run" in err


def test_cluster_submit_runs_scheduler_cli(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """With the CLI on PATH the spec file is handed to it (a stub sbatch records its argument)."""
    stub = tmp_path / "sbatch"
    stub.write_text(f'#!/bin/sh\ncp "$1" {tmp_path}/submitted\necho Submitted batch job 42\n')
    stub.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    out = tmp_path / "job.sbatch"
    assert submit.main(["slurm", "--config", "configs/gpu-2x.yaml", "--output", str(out)]) == 0
    assert (tmp_path / "submitted").read_text() == out.read_text()
    assert "sbatch" in capsys.readouterr().err


def test_cluster_beaker_needs_budget(capsys: pytest.CaptureFixture[str]) -> None:
    assert submit.main(["beaker", "--config", "configs/gpu-2node.yaml"]) == 2
    assert "--beaker-budget" in capsys.readouterr().err


HOSTILE = "a b 'single' \"double\" $(touch PWNED) `touch PWNED2` ${HOME}\nsecond line; touch PWNED3 \\"


def test_cluster_sbatch_env_values_reach_the_job_verbatim(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """--env values with spaces, quotes, $(), backticks and newlines are exported exactly and run nothing."""
    import subprocess

    text = _spec(["slurm", "--env", f"TRICKY={HOSTILE}", "--command", "true"], capsys)
    exports = "\n".join(line for line in text.splitlines(keepends=False) if not line.startswith(("srun", "#")))
    # the export lines may span lines (a quoted newline): run everything but the srun line
    script = text[: text.rindex("srun")] + 'printf %s "$TRICKY"\n'
    p = subprocess.run(["bash", "-c", script], capture_output=True, text=True, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert p.stdout == HOSTILE
    assert not list(tmp_path.iterdir()), "the value ran a command"
    assert "export TRICKY=" in exports


@pytest.mark.parametrize(
    "flags,needle",
    [
        (["--env", "A;touch X=1"], "--env"),
        (["--secret", "B C=s"], "--secret"),
        (["--partition", "gpu\ntouch X"], "--partition"),
        (["--time", "1:00 --wrap=x"], "--time"),
    ],
)
def test_cluster_sbatch_refuses_names_that_would_be_code(
    flags: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert submit.main(["slurm", *flags, "--dry-run"]) == 2
    assert needle in capsys.readouterr().err


# --- storage, requests, signals, pyxis image form, no anchors ---------------------------------------------


def _containers_and_volumes(pod: dict) -> tuple[list[dict], dict[str, dict]]:
    return pod["containers"], {v["name"]: v for v in pod["volumes"]}


def test_cluster_k8s_mounts_pvc_and_host_path_on_every_pod(capsys: pytest.CaptureFixture[str]) -> None:
    mounts = ["--mount", "pvc:rlvr-runs:/opt/rlvr/runs", "host:/mnt/datasets:/data"]
    rayjob = yaml.safe_load(_spec(["k8s", "--config", "configs/gpu-2node.yaml"] + mounts, capsys))
    assert validate_rayjob(rayjob) == []
    cluster = rayjob["spec"]["rayClusterSpec"]
    pods = [cluster["headGroupSpec"]["template"]["spec"]] + [g["template"]["spec"] for g in cluster["workerGroupSpecs"]]
    _, job = yaml.safe_load_all(
        _spec(["k8s", "--k8s-flavor", "job", "--config", "configs/gpu-2node.yaml"] + mounts, capsys)
    )
    assert _errors(_k8s_validator("job-batch-v1.json"), job) == []
    pods.append(job["spec"]["template"]["spec"])
    for pod in pods:
        (container,), volumes = _containers_and_volumes(pod)
        where = {m["mountPath"]: volumes[m["name"]] for m in container["volumeMounts"]}
        assert where["/opt/rlvr/runs"]["persistentVolumeClaim"] == {"claimName": "rlvr-runs"}
        assert where["/data"]["hostPath"] == {"path": "/mnt/datasets", "type": "DirectoryOrCreate"}
        assert where["/dev/shm"]["emptyDir"]["medium"] == "Memory"
        assert container["resources"]["requests"] == {"cpu": "64", "memory": "256Gi", "nvidia.com/gpu": "8"}
    assert "warning" not in capsys.readouterr().err  # the run directory (/opt/rlvr/runs) is on the claim


def test_cluster_k8s_warns_when_runs_are_on_no_mount(capsys: pytest.CaptureFixture[str]) -> None:
    assert submit.main(["k8s", "--config", "configs/gpu-2x.yaml", "--mount", "host:/mnt/d:/data", "--dry-run"]) == 0
    err = capsys.readouterr().err
    assert "the run directory /opt/rlvr/runs is on no --mount" in err and "--mount pvc:CLAIM:/opt/rlvr/runs" in err
    assert (
        submit.main(
            ["k8s", "--config", "configs/gpu-2x.yaml", "--output-dir", "/ckpt", "--mount", "pvc:c:/ckpt", "--dry-run"]
        )
        == 0
    )
    out, err = capsys.readouterr()
    assert "warning" not in err and "--checkpoint.output-dir /ckpt" in out


def test_cluster_cpu_node_requests(capsys: pytest.CaptureFixture[str]) -> None:
    rayjob = yaml.safe_load(
        _spec(["k8s", "--config", "configs/tiny-cpu.yaml", "--cpus-per-node", "6", "--memory-gib", "24"], capsys)
    )
    (container,) = rayjob["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"]
    assert container["resources"] == {"requests": {"cpu": "6", "memory": "24Gi"}}
    assert validate_rayjob(rayjob) == []


def test_cluster_beaker_results_and_datasets(capsys: pytest.CaptureFixture[str]) -> None:
    argv = KINDS["beaker"] + [
        "--config",
        "configs/gpu-2x.yaml",
        "--mount",
        "beaker:ai2/gsm8k-rows:/data",
        "host:/net/weka/models:/models",
    ]
    spec = yaml.safe_load(_spec(argv, capsys))
    assert _errors(_beaker_validator(), spec) == []
    (task,) = spec["tasks"]
    assert task["result"] == {"path": "/results"}
    assert task["command"][-2:] == ["--checkpoint.output-dir", "/results/runs"]  # runs kept with the result
    assert task["datasets"] == [
        {"source": {"beaker": "ai2/gsm8k-rows"}, "mountPath": "/data"},
        {"source": {"hostPath": "/net/weka/models"}, "mountPath": "/models"},
    ]
    assert task["resources"] == {"gpuCount": 2, "cpuCount": 16, "memory": "64GiB", "sharedMemory": "64GiB"}
    assert "warning" not in capsys.readouterr().err


def test_cluster_sbatch_signal_pyxis_image_and_mounts(capsys: pytest.CaptureFixture[str]) -> None:
    text = _spec(
        [
            "slurm",
            "--config",
            "configs/gpu-2x.yaml",
            "--slurm-container",
            "--mount",
            "host:/lustre/runs:/opt/rlvr/runs",
            "--signal-lead-s",
            "600",
        ],
        capsys,
    )
    assert "#SBATCH --signal=TERM@600" in text.splitlines()
    srun = shlex.split(text.strip().splitlines()[-1])
    assert "--container-image=ghcr.io#rlvr/rlvr:0.1.0-cu130" in srun
    assert "--container-mounts=/lustre/runs:/opt/rlvr/runs" in srun
    text = _spec(["slurm", "--config", "configs/gpu-2x.yaml", "--signal-lead-s", "0"], capsys)
    assert "--signal" not in text and "--container" not in text


@pytest.mark.parametrize(
    "image,pyxis",
    [
        ("ghcr.io/rlvr/rlvr:0.1.0-cu130", "ghcr.io#rlvr/rlvr:0.1.0-cu130"),
        ("registry.example:5000/a/b:1", "registry.example:5000#a/b:1"),
        ("localhost/rlvr:dev", "localhost#rlvr:dev"),
        ("nvcr.io#nvidia/pytorch:25.01-py3", "nvcr.io#nvidia/pytorch:25.01-py3"),
        ("ubuntu:24.04", "ubuntu:24.04"),
        ("rlvr/rlvr:1", "rlvr/rlvr:1"),
    ],
)
def test_cluster_pyxis_image_form(image: str, pyxis: str) -> None:
    from rlvr.launch.specs import pyxis_image

    assert pyxis_image(image) == pyxis


@pytest.mark.parametrize(
    "argv,words",
    [
        (["k8s", "--mount", "beaker:ds:/data"], "k8s takes pvc:SOURCE:/path, host:SOURCE:/path"),
        (["k8s", "--mount", "pvc:Bad_Name:/data"], "not a valid claim name"),
        (["k8s", "--mount", "host:relative:/data"], "absolute path"),
        (["beaker", "--mount", "host:/a:relative"], "an absolute path in the container"),
        (["slurm", "--mount", "host:/a:/b"], "needs --slurm-container"),
        (["slurm", "--slurm-container", "--mount", "host:/a,b:/c"], "no commas"),
    ],
)
def test_cluster_bad_mounts_exit_2(argv: list[str], words: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert submit.main(argv + ["--beaker-budget", "ai2/x", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert words in err and ("--mount" in err or "slurm-container" in err)


@pytest.mark.parametrize("extra", [[], CUSTOM], ids=["default", "custom"])
@pytest.mark.parametrize("kind", ["beaker", "kuberay", "k8s-job"])
def test_cluster_specs_have_no_yaml_anchors(kind: str, extra: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    for preset in PRESETS:
        text = _spec(KINDS[kind] + ["--config", preset] + extra, capsys)
        events = list(yaml.parse(text))
        assert len(events) > 10
        assert not [e for e in events if isinstance(e, yaml.AliasEvent) or getattr(e, "anchor", None)], preset


def test_cluster_anchor_check_is_not_vacuous() -> None:
    shared = {"a": 1}
    events = list(yaml.parse(yaml.safe_dump({"x": shared, "y": shared})))
    assert [e for e in events if isinstance(e, yaml.AliasEvent)]
