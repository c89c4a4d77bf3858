"""The manager under test: ``elasticps server`` in a process of its own, joined to the cluster."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from elasticps.cli.server import listening_at
from elasticps.manager.workdir import ray_token_auth

ENDED = ("finished", "failed", "cancelled")


def ray_auth(work: Path) -> str:
    """Turn on Ray's token authentication for the cluster we start, if Ray has
    not been imported here yet (it reads the mode once, at import)."""
    if "ray" in sys.modules:
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
        return os.environ["RAY_AUTH_MODE"]
    ray_token_auth(work)
    return "token"


class ManagerProcess:
    def __init__(self, workdir: Path, address: str, interval_s: float) -> None:
        self.workdir = workdir
        self.address = address
        self.interval_s = interval_s
        self.url = ""  # the server takes a free port each start (--port 0) and prints it once it listens
        self.proc: subprocess.Popen | None = None
        self.pids: list[int] = []
        self.slow_reads = 0

    def start(self, timeout_s: float = 180.0) -> None:
        cmd = [sys.executable, "-m", "elasticps", "server", "--workdir", str(self.workdir), "--port", "0"]
        cmd += ["--ray-address", self.address, "--interval-s", str(self.interval_s), "--rescale-cost-s", "1"]
        cmd += ["--shutdown-timeout-s", "10"]
        self.workdir.mkdir(parents=True, exist_ok=True)
        log = (self.workdir.parent / f"server-{len(self.pids) + 1}.log").open("w")
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.pids.append(self.proc.pid)
        self.url = ""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the manager exited; see {log.name}")
            self.url = self.url or listening_at(Path(log.name).read_text())
            with contextlib.suppress(httpx.HTTPError, OSError):
                if self.url and self.request("GET", "/jobs", timeout=2).status_code == 200:
                    return
            time.sleep(0.3)
        raise TimeoutError(f"the manager did not come up in {timeout_s:g} s; see {log.name}")

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def request(self, method: str, path: str, timeout: float = 30.0, **kw: Any) -> httpx.Response:
        token = (self.workdir / "token").read_text().strip()
        headers = {"Authorization": f"Bearer {token}", **kw.pop("headers", {})}
        return httpx.request(method, self.url + path, headers=headers, timeout=timeout, **kw)

    def jobs(self) -> dict[str, dict[str, Any]]:
        """Every job by name. A 503 (the store busy after a fault) is waited out,
        and so is a request that takes longer than 30 s (counted in ``slow_reads``:
        the API reads what the manager's round holds, and a round may wait on a
        job's process), for three minutes at most."""
        deadline = time.monotonic() + 180
        while True:
            try:
                r = self.request("GET", "/jobs")
            except httpx.TimeoutException:
                self.slow_reads += 1
                if time.monotonic() > deadline:
                    raise
                continue
            if r.status_code != 503 or time.monotonic() > deadline:
                r.raise_for_status()
                return {j["name"]: j for j in r.json()}
            time.sleep(float(r.headers.get("Retry-After", "1")))
