"""`rlvr dashboard RUN_DIR [RUN_DIR ...]`: a live local web page over run directories (docs/design.md, Metrics).

A stdlib `http.server` on 127.0.0.1 serves one self-contained page (dashboard_assets/page.html: inline JS and
SVG charts, no CDN, nothing fetched from the network) and a JSON endpoint `/api/data` that the page polls.
`--export report.html` writes the same page with every record embedded, for viewing with no server at all; it
replaces an existing file only when that is an earlier report (a *.html file outside any run directory, not a
symlink), and writes it atomically.

Invariants:
- The run files are read incrementally: each file's byte offset advances only past complete lines, so a
  partially written last line (the trainer is mid-write) is read on a later poll, never half-parsed. A line
  that is complete but not a JSON object is skipped and counted (`bad_lines`).
- A file that shrinks (rewritten, e.g. a run restarted from scratch) is re-read from the start and its
  `epoch` bumps, telling the page to drop what it had for that file.
- `/api/data?cursor=...` returns, per run and file, only the records past the page's cursor; a run the cursor
  does not know yet also gets its config.yaml (the text, and parsed for the page's "KL off").
- The server binds 127.0.0.1 only and serves nothing but the page and the run records. It answers only
  requests whose Host header names this machine's loopback (localhost, 127.0.0.1, [::1] or the bound address)
  with any port (a forwarded port, `ssh -L 9000:localhost:8765`, arrives as `localhost:9000`): any other Host
  gets 403, so a web page on another origin cannot read the run records through
  DNS rebinding (its name resolving to 127.0.0.1 does not change the Host header the browser sends).
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import threading
import urllib.parse
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from pathlib import Path
from typing import Any

from tyro.conf import Positional

from rlvr.cli.outpaths import check_output_file, write_text_atomic

RUN_FILES: dict[str, str] = {
    "metrics": "metrics.jsonl",
    "eval": "eval.jsonl",
    "samples": "samples.jsonl",
    "eval_samples": "eval_samples.jsonl",
}
"""Page data key -> file name in the run directory."""
DATA_PLACEHOLDER = "/*__RLVR_DATA__*/null"
"""Replaced in the page by the embedded data on export (live pages keep null and poll the server)."""
MAX_TEXT_CHARS = 4000
"""Prompt/completion text sent to the page is cut to this many characters (the JSONL keeps all of it)."""


class JsonlTail:
    """Incremental reader of one growing JSONL file (module invariants)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.epoch = 0
        self.bad_lines = 0
        self.records: list[dict[str, Any]] = []
        self._lock = threading.Lock()

    def refresh(self) -> None:
        """Read whatever complete lines were appended since the last call."""
        with self._lock:
            try:
                size = self.path.stat().st_size
            except FileNotFoundError:
                size = 0
            if size < self.offset:
                self.offset, self.records, self.epoch = 0, [], self.epoch + 1
            if size == self.offset:
                return
            with self.path.open("rb") as f:
                f.seek(self.offset)
                chunk = f.read(size - self.offset)
            end = chunk.rfind(b"\n")
            if end < 0:
                return  # only a partial line so far
            self.offset += end + 1
            for line in chunk[:end].split(b"\n"):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except ValueError:
                    self.bad_lines += 1
                    continue
                if isinstance(record, dict):
                    self.records.append(_trim(record))
                else:
                    self.bad_lines += 1

    def since(self, index: int, epoch: int) -> tuple[int, list[dict[str, Any]], bool]:
        """(epoch, records from `index` on, reset): everything from 0 when the page's epoch is stale."""
        with self._lock:
            if epoch != self.epoch:
                return self.epoch, list(self.records), True
            return self.epoch, self.records[max(0, index) :], False


def _trim(record: dict[str, Any]) -> dict[str, Any]:
    for key in ("prompt", "completion"):
        value = record.get(key)
        if isinstance(value, str) and len(value) > MAX_TEXT_CHARS:
            record[key] = value[:MAX_TEXT_CHARS] + f" …[{len(value) - MAX_TEXT_CHARS} more chars]"
    return record


class RunReader:
    """The three record files of one run directory, read incrementally."""

    def __init__(self, run_dir: str | os.PathLike[str], name: str) -> None:
        self.dir = Path(run_dir)
        self.name = name
        self.tails = {key: JsonlTail(self.dir / fname) for key, fname in RUN_FILES.items()}

    def refresh(self) -> None:
        for tail in self.tails.values():
            tail.refresh()

    def config(self) -> tuple[str, Any]:
        """config.yaml of the run: (text, parsed mapping or None)."""
        import yaml

        try:
            text = (self.dir / "config.yaml").read_text(encoding="utf-8", errors="replace")
        except OSError:
            return "", None
        try:
            parsed = yaml.safe_load(text)
        except yaml.YAMLError:
            parsed = None
        return text, parsed if isinstance(parsed, dict) else None


def run_names(run_dirs: list[str]) -> list[str]:
    """Display names: the directory name, extended with parents while two runs would share one."""
    paths = [Path(d).resolve() for d in run_dirs]
    depth = 1
    while True:
        names = ["/".join(p.parts[-depth:]) for p in paths]
        if len(set(names)) == len(names) or depth > max(len(p.parts) for p in paths):
            return names
        depth += 1


class Dashboard:
    """The data side of the dashboard: run readers and the `/api/data` payload."""

    def __init__(self, run_dirs: list[str]) -> None:
        missing = [d for d in run_dirs if not Path(d).is_dir()]
        if missing:
            raise ValueError(f"not a run directory: {', '.join(missing)} (pass <checkpoint.output_dir>/<run_name>)")
        self.runs = [RunReader(d, n) for d, n in zip(run_dirs, run_names(run_dirs))]

    def payload(self, cursor: dict[str, Any] | None = None) -> dict[str, Any]:
        """New records per run and file past `cursor` ({run index: {file: [epoch, count]}})."""
        cursor = cursor or {}
        out = []
        for i, run in enumerate(self.runs):
            run.refresh()
            files = {}
            for key, tail in run.tails.items():
                epoch, count = (cursor.get(str(i)) or {}).get(key, [-1, 0])
                new_epoch, records, reset = tail.since(int(count), int(epoch))
                files[key] = {"epoch": new_epoch, "reset": reset, "records": records, "bad_lines": tail.bad_lines}
            entry = {"id": i, "name": run.name, "dir": str(run.dir), "files": files}
            if str(i) not in cursor:
                entry["config_text"], entry["config"] = run.config()
            out.append(entry)
        return {"runs": out}


def page_template() -> str:
    """The page's HTML (package data)."""
    return resources.files("rlvr.telemetry").joinpath("dashboard_assets/page.html").read_text(encoding="utf-8")


def render_page(data: dict[str, Any] | None, refresh_s: float = 2.0) -> str:
    """The page; with `data` embedded (export) it never polls, else it polls `/api/data`."""
    page = page_template().replace("/*__RLVR_REFRESH_MS__*/2000", str(int(refresh_s * 1000)))
    if data is None:
        return page
    # "</" inside a <script> would end it early; JSON allows the escaped form.
    blob = json.dumps(data, separators=(",", ":")).replace("</", "<\\/").replace("\u2028", "\\u2028")
    return page.replace(DATA_PLACEHOLDER, blob.replace("\u2029", "\\u2029"), 1)


EXPORT_SUFFIXES = (".html", ".htm")
"""An existing file at the export path is replaced only when it has one of these suffixes (an earlier report)."""


def export_html(run_dirs: list[str], path: str | os.PathLike[str]) -> Path:
    """Write a self-contained static report of the runs to `path`, atomically. The path is checked first
    (rlvr.cli.outpaths): its directory exists, and it is new or an earlier report (a regular *.html file, not a
    symlink, outside any run directory); anything else raises OutputPathError (a ValueError) and nothing is written."""
    out = check_output_file(path, "--export", replace_suffixes=EXPORT_SUFFIXES)
    data = Dashboard(run_dirs).payload()
    write_text_atomic(out, render_page(data))
    return out


LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "[::1]")


def host_allowed(host: str | None, bound_host: str = "127.0.0.1") -> bool:
    """Whether a request's Host header names the loopback (or the address the server is bound to), with any port.

    The port is not checked: a forwarded port (`ssh -L 9000:localhost:8765`, VS Code's port forwarding) makes the
    browser send `Host: localhost:9000`. DNS rebinding is about the hostname, which stays the attacker's."""
    if not host:
        return False
    host = host.strip().lower()
    if host.startswith("["):  # an IPv6 literal: "[addr]" or "[addr]:port"
        end = host.find("]")
        if end < 0:
            return False
        name, rest = host[: end + 1], host[end + 1 :]
        if rest and not rest.startswith(":"):
            return False
        port = rest[1:]
        if rest and not port:
            return False
    else:
        name, _, port = host.partition(":")
        if _ and not port:
            return False
    if port and not (port.isdigit() and len(port) <= 5):
        return False
    return name in {*LOOPBACK_HOSTS, bound_host.lower()}


def _handler(dash: Dashboard, page: bytes) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # http.server's name (not snake_case)
            if not host_allowed(self.headers.get("Host"), str(self.server.server_address[0])):
                self._send(HTTPStatus.FORBIDDEN, "text/plain", b"forbidden: unknown Host header")
                return
            url = urllib.parse.urlsplit(self.path)
            if url.path in ("/", "/index.html"):
                self._send(HTTPStatus.OK, "text/html; charset=utf-8", page)
            elif url.path == "/api/data":
                query = urllib.parse.parse_qs(url.query)
                try:
                    cursor = json.loads(query.get("cursor", ["{}"])[0])
                    body = json.dumps(dash.payload(cursor if isinstance(cursor, dict) else {}))
                except (ValueError, TypeError, AttributeError) as e:
                    self._send(HTTPStatus.BAD_REQUEST, "text/plain", f"bad cursor: {e}".encode())
                    return
                self._send(HTTPStatus.OK, "application/json", body.encode())
            else:
                self._send(HTTPStatus.NOT_FOUND, "text/plain", b"not found")

        def _send(self, status: HTTPStatus, ctype: str, body: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # quiet: polled every few s (`format`: the base's name)
            pass

    return Handler


def make_server(run_dirs: list[str], port: int = 8765, refresh_s: float = 2.0) -> ThreadingHTTPServer:
    """A server bound to 127.0.0.1:`port` (0 = any free port); call `serve_forever()` / `shutdown()`."""
    dash = Dashboard(run_dirs)
    server = ThreadingHTTPServer(("127.0.0.1", port), _handler(dash, render_page(None, refresh_s).encode()))
    server.daemon_threads = True
    return server


@dataclasses.dataclass
class DashboardArgs:
    """Serve a live local dashboard of one or more run directories (several are overlaid)."""

    run_dirs: Positional[list[str]]
    """Run directories (<checkpoint.output_dir>/<run_name>) holding metrics.jsonl / eval.jsonl / samples.jsonl."""
    port: int = 8765
    """Port on 127.0.0.1 (0 = any free port)."""
    export: str | None = None
    """Write a self-contained static HTML report to this path and exit instead of serving (a new file, or an
    earlier *.html report outside the run directories: nothing else is overwritten)."""
    refresh_s: float = 2.0
    """Seconds between the page's polls for new records."""


def main(argv: list[str]) -> int:
    """`rlvr dashboard` entry point."""
    from rlvr.cli.flags import parse

    args = parse(DashboardArgs, argv, "rlvr dashboard", DashboardArgs.__doc__)
    if not args.run_dirs:
        print("rlvr dashboard: give at least one run directory", file=sys.stderr)
        return 2
    try:
        if args.export:
            path = export_html(args.run_dirs, args.export)
            print(f"wrote {path}")
            return 0
        server = make_server(args.run_dirs, args.port, args.refresh_s)
    except (ValueError, OSError) as e:
        print(f"rlvr dashboard: {e}", file=sys.stderr)
        return 2
    host, port = server.server_address[:2]
    print(f"rlvr dashboard: http://{host}:{port}/  ({len(args.run_dirs)} run(s); Ctrl-C to stop)", flush=True)
    try:
        server.serve_forever(poll_interval=0.5)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0
