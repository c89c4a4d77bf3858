"""``torchrun``: torch's elastic launcher resizing a DDP job on one machine.

Two torchrun agents take the roles of two nodes (``--nnodes=1:2``, two
workers each, a c10d rendezvous on this machine). Grow 2 -> 4: the second
agent starts; the first sees a node waiting and restarts its workers, and the
four resume from the newest checkpoint. Shrink 4 -> 2: the second agent is
terminated (a node taken away); the first's workers fail in their next
all-reduce and it restarts them, alone, from the checkpoint. That is
torchrun's documented elasticity: membership changes restart every worker.
``last_call_timeout`` is 1 s instead of its default 30 s (less waiting for
late nodes at each rendezvous), which favours torchrun.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from elasticps.bench.peers.common import free_port
from elasticps.bench.peers.resize import Timeline, read_step_log, wait_for_workers
from elasticps.bench.peers.workloads import Workload

PER_AGENT = 2
HOW = (
    "torchrun --nnodes=1:2, two agents of 2 workers on this machine (c10d rendezvous, last_call_timeout=1): "
    "grow = a second agent joins, shrink = it is terminated; every worker restarts from the newest checkpoint "
    "(written every 16 steps)"
)


def resize(
    workload: Workload,
    sizes: tuple[int, ...],
    hold_s: float,
    threads: int = 1,
    say: Callable[[str], None] = lambda _: None,
) -> Timeline:
    """Start at ``sizes[0]`` workers and change to each later size (multiples of 2)."""
    if any(s % PER_AGENT or s > 2 * PER_AGENT for s in sizes):
        raise ValueError(f"torchrun here runs 2 or 4 workers (1 or 2 agents of {PER_AGENT}), got {sizes}")
    with tempfile.TemporaryDirectory(prefix="peers-torchrun-") as tmp:
        directory = Path(tmp)
        log = directory / "steps.txt"
        port = free_port()
        agents: list[subprocess.Popen] = []
        changes: list[tuple[float, int]] = []
        try:
            for _ in range(sizes[0] // PER_AGENT):
                agents.append(_agent(workload, directory, port, threads, host=not agents))
            wait_for_workers(log, sizes[0], 0.0, lambda: _check(agents, directory), "torchrun")
            for workers in sizes[1:]:
                time.sleep(hold_s)
                t_req = time.time()
                changes.append((t_req, workers))
                say(f"torchrun: {len(agents)} -> {workers // PER_AGENT} agents")
                while len(agents) < workers // PER_AGENT:
                    agents.append(_agent(workload, directory, port, threads, host=False))
                while len(agents) > workers // PER_AGENT:
                    _stop(agents.pop())
                wait_for_workers(log, workers, t_req, lambda: _check(agents, directory), "torchrun")
            time.sleep(hold_s)
        finally:
            for agent in reversed(agents):
                _stop(agent)
        rows = read_step_log(log)
    m = workload.program().batch_size
    timeline = Timeline.from_steps("torchrun", rows, m)
    timeline.changes, timeline.how = changes, HOW
    return timeline


def train_args(workload: Workload, directory: Path, threads: int) -> list[str]:
    """The command line of :mod:`~elasticps.bench.peers.torchrun_train` for ``workload``."""
    return [f"--workload={json.dumps(dataclasses.asdict(workload))}", f"--dir={directory}", f"--threads={threads}"]


def _agent(workload: Workload, directory: Path, port: int, threads: int, host: bool) -> subprocess.Popen:
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes=1:2",
        f"--nproc-per-node={PER_AGENT}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{port}",
        "--rdzv-id=peers",
        f"--rdzv-conf=is_host={int(host)},last_call_timeout=1",
        "--max-restarts=10",
        "--monitor-interval=0.5",
        "-m",
        "elasticps.bench.peers.torchrun_train",
        *train_args(workload, directory, threads),
    ]
    # torch 2.13's shared rendezvous store does not give a node that joins later the
    # master address (it waits forever): every rendezvous builds its own, as before 2.4
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1")
    log = (directory / f"agent-{time.monotonic_ns()}.log").open("w")
    return subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def _stop(agent: subprocess.Popen) -> None:
    if agent.poll() is None:
        os.killpg(agent.pid, signal.SIGTERM)
        try:
            agent.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(agent.pid, signal.SIGKILL)
            agent.wait()


def _check(agents: list[subprocess.Popen], directory: Path) -> None:
    dead = [a.returncode for a in agents if a.poll() is not None]
    if dead:
        logs = sorted(directory.glob("agent-*.log"))
        tail = logs[-1].read_text()[-2000:] if logs else ""
        raise RuntimeError(f"a torchrun agent exited ({dead}):\n{tail}")
