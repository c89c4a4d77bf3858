"""SIGKILL the manager mid-job, restart it: the job resumes from its checkpoint and finishes."""

from __future__ import annotations

import contextlib
import os
import signal
import time

import httpx
import pytest

from elasticps.manager import Store
from elasticps.runtime import CheckpointStore
from tests.helpers import server_url, spawn_elasticps

pytestmark = pytest.mark.slow

SPEC = """name: survivor
program: elasticps.examples.digits:program
ps: {min: 1, max: 1, cpu: 0.5}
workers: {min: 1, max: 2, cpu: 0.5}
checkpoint_every_steps: 50
"""


def _server(workdir, log):
    # port 0: the server takes a free port and prints it once it listens (no port probed here and lost meanwhile)
    args = ["server", "--workdir", str(workdir), "--port", "0", "--num-cpus", "8", "--interval-s", "2"]
    return spawn_elasticps(args, log)


def _wait_up(url, proc, log, workdir, timeout_s=90):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text()
        try:
            r = httpx.get(f"{url}/jobs", headers=_auth(workdir), timeout=2)
            r.raise_for_status()
            return r.json()
        except (httpx.HTTPError, FileNotFoundError):
            time.sleep(0.3)
    pytest.fail("manager did not come up")


def _auth(workdir):
    return {"Authorization": f"Bearer {(workdir / 'token').read_text().strip()}"}


def test_manager_sigkill_and_restart(tmp_path):
    first = _server(tmp_path, tmp_path / "first.log")
    url = server_url(tmp_path / "first.log", first)
    _wait_up(url, first, tmp_path / "first.log", tmp_path)
    # the secrets are the owner's alone, and the API wants the token
    assert (tmp_path / "token").stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "ray-token").stat().st_mode & 0o777 == 0o600
    assert httpx.get(f"{url}/jobs", timeout=5).status_code == 401
    headers = {**_auth(tmp_path), "Content-Type": "application/yaml"}
    assert httpx.post(f"{url}/jobs", content=SPEC, headers=headers, timeout=30).status_code == 201
    # a second manager on the same workdir refuses, naming the first
    other = _server(tmp_path, tmp_path / "other.log")
    assert other.wait(timeout=180) == 2
    assert f"pid {first.pid}" in (tmp_path / "other.log").read_text()
    ckpts = CheckpointStore(tmp_path / "jobs.d" / "survivor" / "checkpoints")
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        latest = ckpts.latest()
        if latest is not None and latest.step >= 100:
            break
        time.sleep(0.3)
    else:
        pytest.fail((tmp_path / "first.log").read_text())
    os.killpg(first.pid, signal.SIGKILL)  # the manager, its Ray cluster and the job's tasks
    first.wait()
    killed_at = ckpts.latest().step

    second = _server(tmp_path, tmp_path / "second.log")
    try:
        url = server_url(tmp_path / "second.log", second)
        jobs = _wait_up(url, second, tmp_path / "second.log", tmp_path)
        assert [j["name"] for j in jobs] == ["survivor"]  # acknowledged before the kill: still there
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            if httpx.get(f"{url}/jobs/survivor", headers=_auth(tmp_path), timeout=5).json()["state"] == "finished":
                break
            time.sleep(1)
        else:
            pytest.fail((tmp_path / "second.log").read_text())
        events = httpx.get(f"{url}/events", params={"job": "survivor"}, headers=_auth(tmp_path), timeout=5).json()
        messages = [e["message"] for e in events]
        assert any("restarted from its latest checkpoint" in m for m in messages), messages
    finally:
        second.terminate()  # as a user stops it: the server cleans up and exits by itself
        try:
            assert second.wait(timeout=120) in (0, signal.SIGTERM)  # Ray's handler exits with the signal's number
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(second.pid, signal.SIGKILL)
    assert ckpts.latest().step == 440 and killed_at >= 100
    assert Store(tmp_path / "manager.db").get_job("survivor").state == "finished"
