"""The dashboard answers only requests addressed to the loopback (DNS-rebinding defence): another Host gets 403.
Any port is accepted with a loopback name, so forwarded ports (ssh -L 9000:localhost:8765, VS Code) work."""

from __future__ import annotations

import http.client
import threading

import pytest

from rlvr.telemetry.dashboard import host_allowed, make_server


@pytest.fixture()
def server(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 1, "reward/total_mean": 0.5}\n')
    srv = make_server([str(run)], port=0)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def _get(port: int, path: str, host: str | None) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.putrequest("GET", path, skip_host=True)
    if host is not None:
        conn.putheader("Host", host)
    conn.endheaders()
    status = conn.getresponse().status
    conn.close()
    return status


def test_dashboard_serves_loopback_hosts(server):
    port = server.server_address[1]
    for host in (
        "127.0.0.1",
        f"127.0.0.1:{port}",
        "localhost",
        f"LOCALHOST:{port}",
        f"[::1]:{port}",
        "[::1]",
        f"localhost:{port + 1}",
        "localhost:9000",
        "127.0.0.1:9000",
        "[::1]:9000",
    ):  # forwarded ports
        assert _get(port, "/api/data", host) == 200, host
        assert _get(port, "/", host) == 200, host


def test_dashboard_refuses_other_hosts(server):
    port = server.server_address[1]
    for host in (
        "evil.example",
        f"evil.example:{port}",
        f"127.0.0.1.evil.example:{port}",
        "localhost.evil.example:9000",
        "evil.example:9000",
        "localhost:",
        "localhost:abc",
        "[::1]x",
        "[::1",
        "",
        None,
    ):
        assert _get(port, "/api/data", host) == 403, host
        assert _get(port, "/", host) == 403, host


def test_host_allowed_rules():
    assert host_allowed("127.0.0.1:8765") and host_allowed("localhost") and host_allowed("localhost:9000")
    assert host_allowed("[::1]:9000") and host_allowed("127.0.0.1:1")
    assert host_allowed("10.0.0.5:9000", "10.0.0.5")  # the bound address, whatever it is
    assert not host_allowed("10.0.0.5:9000") and not host_allowed("attacker.test:8765")
    assert not host_allowed("attacker.test:9000") and not host_allowed(None)
