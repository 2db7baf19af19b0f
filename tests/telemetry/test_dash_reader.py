"""The dashboard's data side without a browser: incremental JSONL reading, cursors, the HTTP API, export."""

from __future__ import annotations

import json
import threading
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from rlvr.cli import main as rlvr_main
from rlvr.telemetry.dashboard import Dashboard, JsonlTail, make_server, render_page, run_names

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "run_tiny"


def test_tail_reads_complete_lines_only(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    tail = JsonlTail(path)
    tail.refresh()  # missing file: nothing, no error
    assert tail.records == []
    path.write_text('{"step": 1}\n{"step": 2, "loss/kl": 0.')
    tail.refresh()
    assert [r["step"] for r in tail.records] == [1]
    with path.open("a") as f:
        f.write('5}\nnot json\n[1, 2]\n\n{"step": 3}\n')
    tail.refresh()
    assert [r["step"] for r in tail.records] == [1, 2, 3] and tail.records[1]["loss/kl"] == 0.5
    assert tail.bad_lines == 2
    epoch, new, reset = tail.since(2, tail.epoch)
    assert (new, reset) == ([{"step": 3}], False)
    path.write_text('{"step": 9}\n')  # rewritten shorter: start over under a new epoch
    tail.refresh()
    epoch2, records, reset = tail.since(3, epoch)
    assert epoch2 == epoch + 1 and reset and records == [{"step": 9}]


def test_payload_cursor_returns_only_new_records(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2}\n')
    (run / "samples.jsonl").write_text(json.dumps({"step": 1, "completion": "x" * 10000}) + "\n")
    dash = Dashboard([str(run)])
    first = dash.payload()["runs"][0]
    assert first["name"] == "run" and len(first["files"]["metrics"]["records"]) == 2
    assert first["files"]["eval"]["records"] == []
    assert len(first["files"]["samples"]["records"][0]["completion"]) < 4100  # long text is cut for the page
    cursor = {"0": {k: [f["epoch"], len(f["records"])] for k, f in first["files"].items()}}
    with (run / "metrics.jsonl").open("a") as f:
        f.write('{"step": 3}\n')
    again = dash.payload(cursor)["runs"][0]["files"]
    assert again["metrics"]["records"] == [{"step": 3}] and not again["metrics"]["reset"]
    assert again["samples"]["records"] == []


def test_run_names_disambiguate_and_missing_dir_is_an_error(tmp_path: Path) -> None:
    assert run_names([str(tmp_path / "a" / "run"), str(tmp_path / "b" / "run")]) == ["a/run", "b/run"]
    assert run_names([str(tmp_path / "x"), str(tmp_path / "y")]) == ["x", "y"]
    with pytest.raises(ValueError, match="not a run directory"):
        Dashboard([str(tmp_path / "nope")])


def test_http_server_serves_page_and_api() -> None:
    server = make_server([str(FIXTURE)], port=0)
    assert server.server_address[0] == "127.0.0.1"
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        page = urllib.request.urlopen(base + "/", timeout=10).read().decode()
        assert "/*__RLVR_DATA__*/null" in page  # live page: no embedded data, polls the API
        data = json.load(urllib.request.urlopen(base + "/api/data", timeout=10))
        counts = {
            k: len((FIXTURE / f"{k}.jsonl").read_text().splitlines())
            for k in ("metrics", "eval", "samples", "eval_samples")
        }
        assert {k: len(f["records"]) for k, f in data["runs"][0]["files"].items()} == counts
        # the first poll also gets the run's config (the config panel, "KL off"); later polls do not
        assert data["runs"][0]["config_text"] == (FIXTURE / "config.yaml").read_text()
        assert data["runs"][0]["config"]["algorithm"]["kl_beta"] == 0.01
        cursor = urllib.parse.quote(json.dumps({"0": {k: [0, n] for k, n in counts.items()}}))
        data = json.load(urllib.request.urlopen(f"{base}/api/data?cursor={cursor}", timeout=10))
        assert all(not f["records"] for f in data["runs"][0]["files"].values())
        assert "config_text" not in data["runs"][0]
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(base + "/etc/passwd", timeout=10)
        assert err.value.code == 404
    finally:
        server.shutdown()
        server.server_close()


def test_export_is_self_contained(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "report.html"
    assert rlvr_main(["dashboard", str(FIXTURE), "--export", str(out)]) == 0
    html = out.read_text()
    assert "/*__RLVR_DATA__*/null" not in html
    for bad in ("<script src", "<link", "@import", "url("):
        assert bad not in html
    urls = {w for w in html.replace('"', " ").split() if w.startswith(("http://", "https://"))}
    assert urls == {"http://www.w3.org/2000/svg"}  # the SVG namespace name, never fetched
    # Text that would close the script tag is escaped.
    page = render_page(
        {
            "runs": [
                {
                    "id": 0,
                    "name": "r",
                    "dir": "d",
                    "files": {
                        "samples": {
                            "epoch": 0,
                            "reset": False,
                            "bad_lines": 0,
                            "records": [{"completion": "</script><b>"}],
                        }
                    },
                }
            ]
        }
    )
    assert "</script><b>" not in page and "<\\/script><b>" in page


def test_cli_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert rlvr_main(["dashboard", str(tmp_path / "missing"), "--export", str(tmp_path / "r.html")]) == 2
    assert "not a run directory" in capsys.readouterr().err
    assert rlvr_main(["dashboard"]) == 2
