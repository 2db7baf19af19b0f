"""The dashboard in a real headless browser (Debian chromium + chromium-driver, driven by selenium).

Checks what a person would: every chart has data points in the DOM, runs overlay, the completions table
filters, the page picks up records appended while it is open (a partial last line included), and the
exported HTML renders with the network unreachable. Screenshots go to test-artifacts/.

Without chromium these tests skip with the reason, except under CI (CI=true), where .ci/run installs it and a
missing browser is a failure.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from rlvr.telemetry.dashboard import export_html, make_server

REPO = Path(__file__).resolve().parents[2]
FIXTURE = REPO / "tests" / "fixtures" / "run_tiny"
ARTIFACTS = Path(os.environ.get("RLVR_TEST_ARTIFACTS", REPO / "test-artifacts"))
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
CHARTS = [
    "reward",
    "correct",
    "eval",
    "eval-breakdown",
    "length",
    "kl",
    "entropy",
    "clip",
    "policy-loss",
    "lr",
    "grad-norm",
    "drift",
    "advantage",
    "staleness",
    "throughput",
    "time",
    "packing",
    "explore",
]
HEADLESS_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1400,2400",
]
OFFLINE_FLAGS = ["--proxy-server=127.0.0.1:9", "--host-resolver-rules=MAP * ~NOTFOUND"]


def _need_browser() -> None:
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not os.path.exists(p)]
    reason = None
    try:
        import selenium  # noqa: F401
    except ImportError:
        reason = "selenium not installed (pip install -e '.[test]')"
    if missing:
        reason = f"{', '.join(missing)} missing: apt-get install -y chromium chromium-driver (.ci/run does this)"
    if reason and os.environ.get("CI"):
        pytest.fail(f"CI must run the browser tests: {reason}")
    if reason:
        pytest.skip(reason)


def _driver(tmp: Path, extra: list[str] = ()) -> Any:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in [*HEADLESS_FLAGS, *extra, f"--user-data-dir={tmp}"]:
        opts.add_argument(flag)
    return webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=opts)


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    _need_browser()
    driver = _driver(tmp_path_factory.mktemp("chrome-profile"))
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture()
def served(tmp_path: Path) -> Iterator[Callable[..., str]]:
    servers = []

    def start(*run_dirs: Path) -> str:
        server = make_server([str(d) for d in run_dirs], port=0, refresh_s=0.3)
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}/"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def _wait(cond: Callable[[], Any], timeout: float = 15.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def _points(driver: Any, chart: str) -> int:
    return int(driver.execute_script(f"return document.querySelectorAll('#chart-{chart} svg .pt').length"))


def _rows(driver: Any) -> list[str]:
    return driver.execute_script(
        "return [...document.querySelectorAll('#samples-table tbody tr')].map(r => r.innerText)"
    )


def _select(driver: Any, element_id: str, value: str) -> None:
    driver.execute_script(
        f"const s = document.getElementById('{element_id}'); s.value = '{value}'; s.dispatchEvent(new Event('input'))"
    )


def _copy_run(tmp: Path, name: str) -> Path:
    run = tmp / name
    shutil.copytree(FIXTURE, run)
    return run


def _count(records: list[dict[str, Any]], key_filter: Callable[[str], bool]) -> int:
    """Data points a chart should draw: numeric values of matching keys over all records."""
    return sum(isinstance(v, (int, float)) and key_filter(k) for r in records for k, v in r.items())


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_live_page_charts_table_filters_and_refresh(browser: Any, served: Callable[..., str], tmp_path: Path) -> None:
    run = _copy_run(tmp_path, "run_tiny")
    metrics, samples = _lines(run / "metrics.jsonl"), _lines(run / "samples.jsonl")
    browser.get(served(run))
    _wait(lambda: browser.execute_script("return document.body.dataset.ready === '1'"), what="first poll")
    for chart in CHARTS:
        assert _points(browser, chart) > 0, f"chart {chart} has no data points"
    evals = _lines(run / "eval.jsonl")
    assert _points(browser, "reward") == _count(
        metrics, lambda k: k.startswith("reward/") and k.endswith("_mean")
    ) + _count(evals, lambda k: k == "eval/reward_mean")
    assert _points(browser, "kl") == _count(metrics, lambda k: k == "loss/kl")
    assert browser.execute_script("return document.querySelectorAll('#chart-kl path.series').length") == 1
    assert browser.execute_script("return document.querySelectorAll('#chart-length .sample-dot').length") == sum(
        "completion_len" in s for s in samples
    )
    assert browser.execute_script("return document.querySelectorAll('#chart-time rect.bar').length") == _count(
        metrics, lambda k: k.startswith("time/") and k != "time/step"
    )

    eval_samples = _lines(run / "eval_samples.jsonl")
    assert len(_rows(browser)) == len(samples) + len(eval_samples)
    _select(browser, "f-source", "train")
    _wait(lambda: len(_rows(browser)) == len(samples), what="source filter")
    box = browser.find_element("id", "f-text")
    needle = samples[-1]["prompt_id"]
    box.send_keys(needle)
    hits = [s for s in samples if needle in s["prompt"] + s["completion"] + s["prompt_id"]]
    _wait(lambda: len(_rows(browser)) == len(hits), what="text filter")
    assert 0 < len(hits) < len(samples) and all(needle in r for r in _rows(browser))
    box.clear()
    browser.execute_script("document.getElementById('f-text').dispatchEvent(new Event('input'))")
    browser.execute_script(
        "const s = document.getElementById('f-correct'); s.value = '1'; s.dispatchEvent(new Event('input'))"
    )
    _wait(lambda: len(_rows(browser)) == sum(bool(s["correct"]) for s in samples), what="outcome filter")
    browser.execute_script(
        "const s = document.getElementById('f-correct'); s.value = ''; s.dispatchEvent(new Event('input'))"
    )
    step = samples[0]["step"]
    browser.execute_script(
        f"const s = document.getElementById('f-step'); s.value = '{step}'; s.dispatchEvent(new Event('input'))"
    )
    _wait(lambda: len(_rows(browser)) == sum(s["step"] == step for s in samples), what="step filter")
    assert 0 < len(_rows(browser)) < len(samples)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    browser.save_screenshot(str(ARTIFACTS / "dashboard_live.png"))

    # The trainer appends a step: half a line first (must be ignored), then the rest and a new sample.
    num_kl = _points(browser, "kl")
    new = dict(metrics[-1], step=metrics[-1]["step"] + 1, **{"loss/kl": 0.5})
    text = json.dumps(new) + "\n"
    with (run / "metrics.jsonl").open("a") as f:
        f.write(text[:40])
        f.flush()
        time.sleep(1.0)
        assert _points(browser, "kl") == num_kl
        f.write(text[40:])
    with (run / "samples.jsonl").open("a") as f:
        f.write(json.dumps(dict(samples[-1], step=new["step"], prompt="a fresh prompt")) + "\n")
    _wait(lambda: _points(browser, "kl") == num_kl + 1, what="live refresh of metrics")
    assert _points(browser, "reward") == _count(
        metrics + [new], lambda k: k.startswith("reward/") and k.endswith("_mean")
    ) + _count(evals, lambda k: k == "eval/reward_mean")
    browser.execute_script(
        "const s = document.getElementById('f-step'); s.value = ''; s.dispatchEvent(new Event('input'))"
    )
    _wait(lambda: len(_rows(browser)) == len(samples) + 1, what="live refresh of samples")


def test_two_runs_overlay(browser: Any, served: Callable[..., str], tmp_path: Path) -> None:
    run_a = _copy_run(tmp_path / "a", "run_tiny")
    run_b = _copy_run(tmp_path / "b", "run_tiny")
    metrics = _lines(run_a / "metrics.jsonl")
    browser.get(served(run_a, run_b))
    _wait(lambda: browser.execute_script("return document.body.dataset.ready === '1'"), what="first poll")
    assert browser.execute_script("return document.querySelectorAll('#chart-kl path.series').length") == 2
    legend = browser.execute_script("return document.querySelector('#chart-kl .legend').innerText")
    assert "a/run_tiny" in legend and "b/run_tiny" in legend
    num_entropy = _count(metrics, lambda k: k == "loss/entropy")
    assert num_entropy > 0 and _points(browser, "entropy") == 2 * num_entropy
    dashes = browser.execute_script(
        "return [...document.querySelectorAll('#chart-kl path.series')].map(p => p.getAttribute('stroke-dasharray'))"
    )
    assert len(set(dashes)) == 2
    # Hiding a run removes its series.
    browser.execute_script("document.querySelector('#runs input').click()")
    _wait(lambda: _points(browser, "entropy") == num_entropy, what="run toggle")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    browser.save_screenshot(str(ARTIFACTS / "dashboard_overlay.png"))


def test_export_opens_with_no_network(tmp_path: Path) -> None:
    _need_browser()
    report = export_html([str(FIXTURE)], tmp_path / "report.html")
    driver = _driver(tmp_path / "profile", OFFLINE_FLAGS)
    try:
        driver.get(report.as_uri())
        _wait(lambda: driver.execute_script("return document.body.dataset.ready === '1'"), what="export render")
        for chart in CHARTS:
            assert _points(driver, chart) > 0, f"exported chart {chart} has no data points"
        num_rows = len(_lines(FIXTURE / "samples.jsonl")) + len(_lines(FIXTURE / "eval_samples.jsonl"))
        assert len(_rows(driver)) == num_rows
        # Nothing was requested besides the page itself, and it never polls a server.
        assert driver.execute_script("return performance.getEntriesByType('resource').length") == 0
        assert "static export" in driver.find_element("id", "status-text").text
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(ARTIFACTS / "dashboard_export.png"))
    finally:
        driver.quit()


def _js(driver: Any, script: str) -> Any:
    return driver.execute_script("return " + script)


def test_panels_config_axes_smoothing_and_eval_completions(
    browser: Any, served: Callable[..., str], tmp_path: Path
) -> None:
    """The panels a wandb GRPO page has, with the fixture run's data: LR, grad norm, drift/TIS, advantages, eval
    overlaid on the train reward, axis labels, a step / wall-time toggle, smoothing, the config, eval completions."""
    run = _copy_run(tmp_path, "run_tiny")
    metrics, evals = _lines(run / "metrics.jsonl"), _lines(run / "eval.jsonl")
    eval_samples = _lines(run / "eval_samples.jsonl")
    browser.get(served(run))
    _wait(lambda: browser.execute_script("return document.body.dataset.ready === '1'"), what="first poll")
    expected = {
        "lr": lambda k: k == "learner/lr",
        "grad-norm": lambda k: k == "learner/grad_norm",
        "drift": lambda k: k.startswith(("loss/logprob_drift", "loss/tis_")),
        "advantage": lambda k: k.startswith("data/advantage"),
    }
    for chart, keys in expected.items():
        assert _count(metrics, keys) > 0 and _points(browser, chart) == _count(metrics, keys), chart
    assert "learner/lr" not in _js(browser, "document.querySelector('#chart-drift .legend').innerText")
    # eval on the training reward: its own dashed series with one point per eval
    eval_path = "document.querySelector('#chart-reward path[data-key=\"eval reward\"]')"
    assert _js(browser, f"{eval_path}.getAttribute('d').split('L').length") == len(evals)
    assert _js(browser, f"{eval_path}.getAttribute('stroke-dasharray')") == "5 3"
    # axis labels on every chart that has data
    for chart in CHARTS:
        labels = _js(browser, f"[...document.querySelectorAll('#chart-{chart} .axis-label')].map(t => t.textContent)")
        assert len(labels) == 2 and labels[1], (chart, labels)
        assert labels[0] == "step", chart
    # wall-clock x axis: same points, minutes since the run's first record
    before = _js(browser, "document.querySelector('#chart-kl path.series').getAttribute('d')")
    num_kl = _points(browser, "kl")
    _select(browser, "x-axis", "wall")
    _wait(
        lambda: _js(browser, "document.querySelector('#chart-kl .x-label').textContent") == "wall time (min)",
        what="wall-time axis",
    )
    assert _points(browser, "kl") == num_kl
    assert _js(browser, "document.querySelector('#chart-kl path.series').getAttribute('d')") != before
    _select(browser, "x-axis", "step")
    _wait(
        lambda: _js(browser, "document.querySelector('#chart-kl .x-label').textContent") == "step",
        what="step axis again",
    )
    assert _points(browser, "kl") == num_kl
    # smoothing bends the line, keeps the raw points
    path = "document.querySelector('#chart-entropy path.series').getAttribute('d')"
    raw, num_entropy = _js(browser, path), _points(browser, "entropy")
    _select(browser, "smoothing", "0.9")
    _wait(lambda: _js(browser, path) != raw, what="smoothed line")
    assert _points(browser, "entropy") == num_entropy
    assert _js(browser, path).split("L")[0] == raw.split("L")[0]  # bias-corrected: the first point is unchanged
    assert _js(browser, "document.querySelector('#chart-entropy circle.pt').getAttribute('fill-opacity')") == "0.35"
    _select(browser, "smoothing", "0")
    opacity = "document.querySelector('#chart-entropy circle.pt').getAttribute('fill-opacity')"
    _wait(lambda: _js(browser, opacity) == "1", what="smoothing off")
    # the config panel shows the run's config.yaml
    config_text = _js(browser, "document.querySelector('#config-body .config-text').textContent")
    assert config_text == (run / "config.yaml").read_text() and "kl_beta: 0.01" in config_text
    # eval completions next to the training samples
    _select(browser, "f-source", "eval")
    _wait(lambda: len(_rows(browser)) == len(eval_samples), what="eval completions")
    assert eval_samples and all("· eval" in r for r in _rows(browser))
    # rounding: tokens/s without decimals
    cards = _js(browser, "[...document.querySelectorAll('.card')].map(c => c.innerText)")
    (tps,) = [c for c in cards if c.startswith("tokens/s")]
    value = tps.split("\n")[1]
    assert value.isdigit() and abs(int(value) - metrics[-1]["perf/tokens_per_s"]) <= 0.5
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    browser.save_screenshot(str(ARTIFACTS / "dashboard_panels.png"))


def test_kl_panel_says_kl_off(browser: Any, served: Callable[..., str], tmp_path: Path) -> None:
    run = _copy_run(tmp_path, "run_tiny")
    text = (run / "config.yaml").read_text()
    assert "kl_beta: 0.01" in text
    (run / "config.yaml").write_text(text.replace("kl_beta: 0.01", "kl_beta: 0.0"))
    rows = [{k: v for k, v in r.items() if not k.startswith("loss/kl")} for r in _lines(run / "metrics.jsonl")]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    browser.get(served(run))
    _wait(lambda: browser.execute_script("return document.body.dataset.ready === '1'"), what="first poll")
    assert _points(browser, "kl") == 0
    assert _js(browser, "document.querySelector('#chart-kl .empty').textContent") == "KL off (algorithm.kl_beta 0)"
    assert _js(browser, "document.querySelector('#chart-lr .empty')") is None
    cards = _js(browser, "[...document.querySelectorAll('.card')].map(c => c.innerText)")
    assert "KL\noff" in cards


def test_episode_samples_show_turns_by_role(browser: Any, served: Callable[..., str], tmp_path: Path) -> None:
    """A multi-turn sample's completion cell lists its turns, the policy's and the tool's told apart, and why the
    episode ended; single-turn rows keep their plain completion."""
    run = _copy_run(tmp_path, "run_tiny")
    episode = {
        "step": 1, "prompt_id": "lookup:0:0", "prompt": "B", "completion": "?Bdbe", "completion_len": 9,
        "scores": {"copy": 1.0}, "total": 1.0, "correct": True, "advantage": 0.5, "end_reason": "done",
        "turns": [{"role": "assistant", "text": "?B"}, {"role": "tool", "text": "=dbe"},
                  {"role": "assistant", "text": "dbe"}],
    }  # fmt: skip
    with open(run / "samples.jsonl", "a") as f:
        f.write(json.dumps(episode) + "\n")
    browser.get(served(run))
    _wait(lambda: browser.execute_script("return document.body.dataset.ready === '1'"), what="first poll")
    turns = _wait(
        lambda: browser.execute_script(
            "return [...document.querySelectorAll('#samples-table .turn')].map(t => [t.className, t.innerText])"
        ),
        what="the episode's turns",
    )
    assert [c for c, _ in turns] == ["turn turn-assistant", "turn turn-tool", "turn turn-assistant"]
    assert "=dbe" in turns[1][1] and "TOOL" in turns[1][1].upper()
    ended = browser.execute_script("return document.querySelector('#samples-table .end-reason').innerText")
    assert ended == "ended: done"
    plain = browser.execute_script(
        "return [...document.querySelectorAll('#samples-table tbody tr')].filter(r => !r.querySelector('.turns')).length"
    )
    assert plain > 0  # the fixture's single-turn samples still render as before
