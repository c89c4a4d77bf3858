"""Builders and small drivers shared by the runtime tests."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import ray
import torch

from elasticps.examples import digits
from elasticps.runtime import JobConfig, JobController, TaskResources, tasks

SMALL_TASKS = {"ps_resources": TaskResources(cpu=0.5), "worker_resources": TaskResources(cpu=0.5)}


def make_config(**kw) -> JobConfig:
    base = {"report_interval_s": 0.5, "placement_timeout_s": 60.0, **SMALL_TASKS}
    base.update(kw)
    return JobConfig(**base)


def make_job(num_ps=1, num_workers=1, program=None, **config) -> JobController:
    return JobController(program or digits.program(epochs=3), make_config(**config), num_ps, num_workers)


def run_until_applied(job: JobController, request_id: int) -> None:
    """Apply rescale request ``request_id`` at the next step boundary, training
    no steps while its new tasks start (so tests control how many steps run)."""
    job.prepare()
    job.run(max_steps=1)
    if not any(r.request_id == request_id for r in job.report().rescales):
        raise AssertionError(f"rescale {request_id} not applied: {job.report().events[-3:]}")


def kill_task(handle) -> None:
    """Kill a task's actor and wait until Ray says it is dead."""
    ray.kill(handle)
    wait_for(lambda: not tasks.is_alive(handle, 5.0), 60, "the killed task to be dead")


def kill_before(monkeypatch, owner, method: str, victim, once: bool = True) -> None:
    """Kill the task ``victim(*args)`` names right before ``owner.method(*args)`` runs."""
    original = getattr(owner, method)

    def wrapped(*args, **kwargs):
        if once:
            monkeypatch.setattr(owner, method, original)
        kill_task(victim(*args))
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, method, wrapped)


def wait_for(predicate, timeout_s: float = 60.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def spawn_elasticps(args: list[str], log_path) -> subprocess.Popen:
    """``python -m elasticps ARGS`` in its own session (so a test can SIGKILL the
    process group: the driver and its embedded Ray cluster), output to ``log_path``."""
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    cmd = [sys.executable, "-m", "elasticps", *args]
    return subprocess.Popen(cmd, stdout=open(log_path, "w"), stderr=subprocess.STDOUT, env=env, start_new_session=True)


class _Locked(torch.utils.data.TensorDataset):
    """A TensorDataset that cannot be pickled (it holds a lock)."""

    def __init__(self, *tensors) -> None:
        super().__init__(*tensors)
        self.lock = threading.Lock()


def counted_digits(log_dir: str, picklable: bool = True):
    """The digits training set, each build logged as a file named by the
    building process's pid in ``log_dir`` (a factory for a program's dataset)."""
    with open(os.path.join(log_dir, f"{os.getpid()}-{time.monotonic_ns()}"), "w"):
        pass
    data = digits.train_set()
    return data if picklable else _Locked(*data.tensors)


def gated_mlp(gate: str):
    """The digits MLP, built once no file ``gate`` exists (a factory for a
    program's model: a task started while it exists waits in its constructor)."""
    while os.path.exists(gate):
        time.sleep(0.01)
    return digits.mlp()


def mount_tiny_tmpfs(path, size: str = "64k") -> bool:
    """Mount a tmpfs of ``size`` on ``path`` (a real full disk for a test); False
    where this machine does not let us mount (not root, no CAP_SYS_ADMIN)."""
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(path)], capture_output=True
    )
    return done.returncode == 0


def unmount(path) -> None:
    subprocess.run(["umount", "-l", str(path)], check=False)


@contextlib.contextmanager
def serve_app(app, timeout_s: float = 60.0):
    """``app`` over real HTTP on loopback (uvicorn in a thread) for the ``with``
    block; yields its URL. The socket is bound and listening before uvicorn
    starts, so no other process can take the port in between."""
    import socket

    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    port = sock.getsockname()[1]
    srv = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=srv.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        wait_for(lambda: srv.started or not thread.is_alive(), timeout_s, "the API server to start")
        assert srv.started, "the API server stopped before it started"
        yield f"http://127.0.0.1:{port}"
    finally:
        srv.should_exit = True
        thread.join(timeout=10)
        sock.close()


@contextlib.contextmanager
def serve_api(manager, token: str = "s3cret"):
    """The manager's REST API over real HTTP on loopback for the ``with`` block; yields its URL."""
    from elasticps.manager.api import create_app

    with serve_app(create_app(manager, token=token)) as url:
        yield url


def stop_session(proc: subprocess.Popen, timeout_s: float = 60.0) -> None:
    """SIGTERM the process group of ``proc`` (started with ``start_new_session``), SIGKILL it after ``timeout_s``."""
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def server_url(log_path, proc: subprocess.Popen, timeout_s: float = 120.0) -> str:
    """The URL an ``elasticps server`` started with ``--port 0`` printed to
    ``log_path`` (it prints it once its socket listens: a client may connect at once)."""
    from elasticps.cli.server import listening_at

    found: list[str] = []

    def printed() -> bool:
        assert proc.poll() is None, Path(log_path).read_text()
        found[:] = [listening_at(Path(log_path).read_text())]
        return bool(found[0])

    wait_for(printed, timeout_s, f"the server's address in {log_path}")
    return found[0]
