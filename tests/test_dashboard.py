"""The dashboard in a real headless Chromium, with real jobs on a local Ray cluster."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest
import uvicorn

from elasticps.manager import Store, parse_spec
from elasticps.manager.api import create_app
from elasticps.manager.service import Manager

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
if CHROMIUM is None and not os.environ.get("CI"):
    pytest.skip("chromium is not installed (CI installs it)", allow_module_level=True)

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--virtual-time-budget=6000",
    "--window-size=1280,900",
]
SPEC = (
    "name: {name}\nprogram: elasticps.examples.digits:program\n"
    "workers: {{min: 1, max: 2, cpu: 0.5}}\nps: {{cpu: 0.5}}\n"
)


def test_dashboard_shows_nodes_jobs_and_curves(ray_local, tmp_path):
    assert CHROMIUM is not None, "CI must install chromium"
    manager = Manager(Store(tmp_path / "m.db"), tmp_path / "work", report_interval_s=0.5)
    for name in ("alpha", "beta"):
        manager.submit(parse_spec(SPEC.format(name=name)))
    manager.step()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # until both jobs have reported a few windows
        time.sleep(1.0)
        manager.step()
        if all((r := manager.report(name)) and len(r.windows) >= 3 for name in ("alpha", "beta")):
            break
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(create_app(manager, token="tok"), host="127.0.0.1", port=port, log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    url = f"http://127.0.0.1:{port}/#token=tok"
    try:
        profile = tmp_path / "profile"
        dom = subprocess.run(
            [CHROMIUM, *FLAGS, f"--user-data-dir={profile}", "--dump-dom", url],
            capture_output=True,
            text=True,
            timeout=120,
        ).stdout
        shot = tmp_path / "dashboard.png"
        subprocess.run(
            [CHROMIUM, *FLAGS, f"--user-data-dir={profile}", f"--screenshot={shot}", url],
            capture_output=True,
            timeout=120,
            check=True,
        )
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        manager.shutdown()
    assert 'data-job="alpha"' in dom and 'data-job="beta"' in dom  # the page fetched and rendered the jobs
    nodes = dom[dom.find("<tbody>") : dom.find("</tbody>")]
    assert nodes.count('<tr class="node">') == 1  # one Ray node here
    jobs = dom[dom.find('<div class="jobs" id="jobs">') :]
    assert jobs.count("<path d=") >= 6  # tasks, throughput and loss curves for both jobs
    assert '<div id="error"></div>' in dom  # no load error shown
    assert shot.stat().st_size > 20_000
    keep = Path(os.environ.get("ELASTICPS_ARTIFACTS", "out"))
    keep.mkdir(parents=True, exist_ok=True)
    shutil.copy(shot, keep / "dashboard.png")
