"""Screenshot of `rlvr dashboard` over run directories, in headless chromium (what docs/dashboard.png shows).

    python bench/dashboard_screenshot.py OUT.png RUN_DIR [RUN_DIR ...]

Needs chromium, chromedriver and selenium (the `test` extra), as tests/telemetry/test_dash_browser.py does.
"""

from __future__ import annotations

import shutil
import sys
import threading
import time
from pathlib import Path

from rlvr.telemetry.dashboard import make_server


def screenshot(out: Path, run_dirs: list[str], width: int = 1400, height: int = 2600) -> None:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    server = make_server(run_dirs, port=0, refresh_s=1.0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    opts = webdriver.ChromeOptions()
    opts.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
    flags = (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        f"--window-size={width},{height}",
    )
    for flag in flags:
        opts.add_argument(flag)
    driver = webdriver.Chrome(service=Service(shutil.which("chromedriver") or "/usr/bin/chromedriver"), options=opts)
    try:
        driver.get(f"http://127.0.0.1:{server.server_address[1]}/")
        deadline = time.monotonic() + 30
        while driver.execute_script("return document.body.dataset.ready") != "1":
            if time.monotonic() > deadline:
                raise TimeoutError("the dashboard did not render within 30 s")
            time.sleep(0.2)
        driver.execute_script("document.getElementById('config-panel').open = false")
        out.parent.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(out))
    finally:
        driver.quit()
        server.shutdown()
        server.server_close()


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    screenshot(Path(sys.argv[1]), sys.argv[2:])
