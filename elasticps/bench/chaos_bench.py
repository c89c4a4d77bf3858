"""``elasticps bench chaos``: faults against a live manager on a real multi-node Ray cluster.

A Ray cluster of ``nodes`` raylets runs on this machine (``ray.cluster_utils.Cluster``,
with Ray's token authentication on when this process has not imported Ray yet),
the manager runs as its own process (``elasticps server --ray-address``), and
jobs (the digits MLP, ``sync`` mode, checkpoints every 25 steps) are submitted
through the REST API so that ``jobs_at_once`` of them are active. Every
fault, once every active job has trained ``settle_steps`` steps since the
last one (so that each fault hits a job that recovered), one fault is drawn
at random among those that have a target at that moment:

- ``kill_worker`` / ``kill_ps``: SIGKILL one worker / PS process of a running job;
- ``kill_server``: SIGKILL the manager process, then start it again on the same
  workdir (its jobs' tasks die with it, owned by its Ray driver);
- ``kill_node``: SIGKILL a whole Ray node (raylet, object store, every task on
  it), then add a fresh node in its place;
- ``corrupt_checkpoint``: overwrite 64 bytes in the middle of a job's newest
  checkpoint (bit rot; the CRC of the archive catches it);
- ``cancel_race``: submit a job and cancel it 0-2 s later, while it is starting.

When the faults are done no more jobs are submitted; every job is waited for,
and the invariants are checked:

- ``acknowledged_submits``: every job whose submit was answered 201 is listed;
- ``cancels_final``: every job whose cancel was acknowledged ends cancelled;
- ``all_terminal``: every job ended within ``drain_timeout_s``;
- ``none_failed``: no job failed (every fault injected here is recoverable);
- ``accuracy``: every finished job's final accuracy is within 0.5 point of the
  same program trained fault-free in one process.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from elasticps.manager.workdir import ray_token_auth

FAULTS = ("kill_worker", "kill_ps", "kill_server", "kill_node", "corrupt_checkpoint", "cancel_race")
PROGRAM = "elasticps.examples.digits:program"
ACCURACY_TOLERANCE = 0.005
ENDED = ("finished", "failed", "cancelled")


@dataclass(frozen=True)
class ChaosConfig:
    faults: int = 50
    seed: int = 0
    nodes: int = 3
    cpus_per_node: int = 4
    jobs_at_once: int = 3
    epochs: int = 30
    fault_every_s: float = 3.0  # at least this long between faults
    settle_steps: int = 10  # and until every active job trained this many steps (or settle_timeout_s)
    settle_timeout_s: float = 45.0
    interval_s: float = 3.0
    drain_timeout_s: float = 900.0
    kinds: tuple[str, ...] = FAULTS

    def spec(self, name: str, seed: int) -> dict[str, Any]:
        return {
            "name": name,
            "program": PROGRAM,
            "args": {"epochs": self.epochs, "seed": seed},
            "ps": {"min": 1, "max": 2, "cpu": 0.5},
            "workers": {"min": 1, "max": 3, "cpu": 0.5},
            "checkpoint_every_steps": 25,
        }


@dataclass
class Fault:
    at: float
    kind: str
    target: str


@dataclass
class Ledger:
    """What the manager acknowledged, and what was done to it."""

    submitted: dict[str, int] = field(default_factory=dict)  # job -> program seed
    cancelled: set[str] = field(default_factory=set)
    faults: list[Fault] = field(default_factory=list)


def run(cfg: ChaosConfig, say: Callable[[str], None] = print) -> dict[str, Any]:
    """Start the cluster and the manager, inject ``cfg.faults`` faults, check the invariants."""
    unknown = set(cfg.kinds) - set(FAULTS)
    if unknown or not cfg.kinds:
        raise ValueError(f"fault kinds must be among {', '.join(FAULTS)}; got {sorted(unknown) or 'none'}")
    work = Path(tempfile.mkdtemp(prefix="elasticps-chaos-"))
    auth = _ray_auth(work)
    import ray
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        raise RuntimeError("the chaos benchmark starts its own Ray cluster; shut down the current one first")
    t0 = time.monotonic()
    signal.signal(signal.SIGTERM, _raise_interrupt)  # a stopped benchmark still takes its cluster down
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    server: _Server | None = None
    try:
        for _ in range(cfg.nodes):
            cluster.add_node(num_cpus=cfg.cpus_per_node)
        cluster.wait_for_nodes()
        server = _Server(work / "manager", cluster.address, cfg.interval_s)
        server.start()
        say(f"chaos: {cfg.nodes} Ray nodes (auth {auth}), manager pid {server.proc.pid}, workdir {work}")
        ledger = Ledger()
        rng = random.Random(cfg.seed)
        chaos = _Chaos(cfg, cluster, server, ledger, rng, say, t0)
        while len(ledger.faults) < cfg.faults:
            chaos.keep_jobs_running()
            chaos.settle()
            chaos.inject()
        say(f"chaos: {len(ledger.faults)} faults injected; waiting for every job to end")
        final = chaos.drain()
        reference = _reference_accuracy(cfg, set(ledger.submitted.values()), say)
        result = check(ledger, final, server.request("GET", "/events").json(), reference)
        result.update(
            workload=f"{PROGRAM} (MLP on digits, sync, {cfg.epochs} epochs, checkpoint every 25 steps)",
            config=asdict(cfg),
            ray_auth=auth,
            elapsed_s=round(time.monotonic() - t0, 1),
        )
        return result
    finally:
        if server is not None:
            server.stop()
        cluster.shutdown()


def _raise_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _ray_auth(work: Path) -> str:
    """Turn on Ray's token authentication for the cluster we start, if Ray has
    not been imported here yet (it reads the mode once, at import)."""
    if "ray" in sys.modules:
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
        return os.environ["RAY_AUTH_MODE"]
    ray_token_auth(work)
    return "token"


class _Server:
    """``elasticps server`` in a process of its own, joined to the cluster."""

    def __init__(self, workdir: Path, address: str, interval_s: float) -> None:
        self.workdir = workdir
        self.address = address
        self.interval_s = interval_s
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    def start(self, timeout_s: float = 180.0) -> None:
        self.starts += 1
        cmd = [sys.executable, "-m", "elasticps", "server", "--workdir", str(self.workdir), "--port", str(self.port)]
        cmd += ["--ray-address", self.address, "--interval-s", str(self.interval_s), "--rescale-cost-s", "1"]
        cmd += ["--shutdown-timeout-s", "10"]
        self.workdir.mkdir(parents=True, exist_ok=True)
        log = (self.workdir.parent / f"server-{self.starts}.log").open("w")
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the manager exited; see {log.name}")
            with contextlib.suppress(httpx.HTTPError, OSError):
                if self.request("GET", "/jobs", timeout=2).status_code == 200:
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
        r = self.request("GET", "/jobs")
        r.raise_for_status()
        return {j["name"]: j for j in r.json()}


class _Chaos:
    def __init__(
        self, cfg: ChaosConfig, cluster: Any, server: _Server, ledger: Ledger, rng: random.Random,
        say: Callable[[str], None], t0: float,
    ) -> None:  # fmt: skip
        self.cfg, self.cluster, self.server, self.ledger, self.rng, self.say, self.t0 = (
            cfg, cluster, server, ledger, rng, say, t0,
        )  # fmt: skip
        self.count = 0

    # -- jobs
    def submit(self, prefix: str) -> str | None:
        self.count += 1
        name, seed = f"{prefix}-{self.count}", self.count % 4
        r = self.server.request("POST", "/jobs", json=self.cfg.spec(name, seed))
        if r.status_code != 201:
            self.say(f"chaos: submit {name} refused: {r.status_code} {r.text}")
            return None
        self.ledger.submitted[name] = seed
        return name

    def keep_jobs_running(self) -> None:
        jobs = self.server.jobs()
        active = [n for n, j in jobs.items() if j["state"] not in ENDED and n not in self.ledger.cancelled]
        for _ in range(self.cfg.jobs_at_once - len(active)):
            self.submit("job")

    def drain(self) -> dict[str, dict[str, Any]]:
        deadline = time.monotonic() + self.cfg.drain_timeout_s
        while True:
            jobs = self.server.jobs()
            if all(j["state"] in ENDED for j in jobs.values()) or time.monotonic() > deadline:
                return jobs
            time.sleep(2.0)

    def settle(self) -> None:
        """Wait until every active job has trained ``settle_steps`` steps since the last fault
        (at most ``settle_timeout_s``): each fault then hits a job that recovered from the last."""

        def steps() -> dict[str, int]:
            return {
                n: (j.get("progress") or {}).get("step", -1) for n, j in self.server.jobs().items()
                if j["state"] not in ENDED and n not in self.ledger.cancelled
            }  # fmt: skip

        time.sleep(self.cfg.fault_every_s)
        before = steps()
        deadline = time.monotonic() + self.cfg.settle_timeout_s
        while time.monotonic() < deadline:
            now = steps()
            if all(now.get(n, 1 << 30) >= s + self.cfg.settle_steps for n, s in before.items()):
                return
            time.sleep(1.0)

    # -- faults
    def inject(self) -> None:
        kinds = list(self.cfg.kinds)
        self.rng.shuffle(kinds)
        for kind in kinds:  # the first kind that has a target now
            target = getattr(self, kind)()
            if target is not None:
                self.ledger.faults.append(Fault(round(time.monotonic() - self.t0, 1), kind, target))
                self.say(f"chaos: fault {len(self.ledger.faults)}/{self.cfg.faults} {kind} {target}")
                return

    def _task_pids(self, title: str) -> list[tuple[int, Any]]:
        nodes = [self.cluster.head_node, *self.cluster.worker_nodes]
        raylets = {_raylet_pid(n): n for n in nodes}
        return [(pid, raylets[ppid]) for pid, ppid, cmd in _processes() if ppid in raylets and cmd.startswith(title)]

    def kill_worker(self) -> str | None:
        return self._kill_task("ray::Worker")

    def kill_ps(self) -> str | None:
        return self._kill_task("ray::PSShard")

    def _kill_task(self, title: str) -> str | None:
        tasks = self._task_pids(title)
        if not tasks:
            return None
        pid, _ = self.rng.choice(tasks)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
            return f"pid {pid}"
        return None

    def kill_server(self) -> str | None:
        old = self.server.proc.pid if self.server.proc else None
        self.server.kill()
        time.sleep(self.rng.uniform(0.0, 3.0))
        self.server.start()
        return f"pid {old}, back as pid {self.server.proc.pid if self.server.proc else None}"

    def kill_node(self) -> str | None:
        drivers = {id(node) for _, node in self._task_pids("ray::JobDriver")}
        candidates = [n for n in self.cluster.worker_nodes if id(n) not in drivers]  # not the manager's own node
        if not candidates:
            return None
        node = self.rng.choice(candidates)
        self.cluster.remove_node(node, allow_graceful=False)
        self.cluster.add_node(num_cpus=self.cfg.cpus_per_node)
        return f"node {node.node_id[:12]} (replaced)"

    def corrupt_checkpoint(self) -> str | None:
        ckpts = sorted(self.server.workdir.glob("jobs.d/*/checkpoints/ckpt-*.npz"), key=lambda p: p.stat().st_mtime)
        if not ckpts:
            return None
        path = ckpts[-1]
        try:
            with open(path, "r+b") as f:
                f.seek(max(0, path.stat().st_size // 2 - 32))
                f.write(self.rng.randbytes(64))
                f.flush()
                os.fsync(f.fileno())
        except FileNotFoundError:  # pruned meanwhile
            return None
        return str(path.relative_to(self.server.workdir))

    def cancel_race(self) -> str | None:
        name = self.submit("race")
        if name is None:
            return None
        time.sleep(self.rng.uniform(0.0, 2.0))
        r = self.server.request("DELETE", f"/jobs/{name}")
        if r.status_code == 200 and r.json()["state"] == "cancelled":
            self.ledger.cancelled.add(name)
        return name


def _raylet_pid(node: Any) -> int:
    return node.all_processes["raylet"][0].process.pid


def _processes() -> list[tuple[int, int, str]]:
    """(pid, parent pid, command line) of every process (Linux /proc)."""
    out = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
            cmd = Path(entry.path, "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        out.append((int(entry.name), ppid, cmd))
    return out


_METRIC = re.compile(r"metric ([0-9.eE+-]+)")


def check(
    ledger: Ledger, final: dict[str, dict[str, Any]], events: list[dict[str, Any]], reference: dict[int, float]
) -> dict[str, Any]:
    """The invariants, from what the manager acknowledged (``ledger``), the jobs
    it lists at the end (``final``, by name), its events, and each program
    seed's fault-free accuracy (``reference``)."""
    violations: dict[str, list[str]] = {
        k: [] for k in ("acknowledged_submits", "cancels_final", "all_terminal", "none_failed", "accuracy")
    }
    for name in ledger.submitted:
        if name not in final:
            violations["acknowledged_submits"].append(f"{name} is missing")
    for name in ledger.cancelled:
        state = final.get(name, {}).get("state")
        if state != "cancelled":
            violations["cancels_final"].append(f"{name} was cancelled, ended {state}")
    finished_events = {e["job"]: e["message"] for e in events if e["kind"] == "finished"}
    diffs = []
    for name, job in final.items():
        if job["state"] not in ENDED:
            violations["all_terminal"].append(f"{name} is still {job['state']}")
        if job["state"] == "failed":
            violations["none_failed"].append(name)
        if job["state"] != "finished" or name not in ledger.submitted:
            continue
        found = _METRIC.search(finished_events.get(name, ""))
        if found is None:
            violations["accuracy"].append(f"{name}: no final accuracy stored")
            continue
        acc, ref = float(found.group(1)), reference[ledger.submitted[name]]
        diffs.append(abs(acc - ref))
        if diffs[-1] > ACCURACY_TOLERANCE:
            violations["accuracy"].append(f"{name}: {acc:.4f} vs {ref:.4f} fault-free")
    return {
        "faults_injected": len(ledger.faults),
        "faults_by_kind": dict(Counter(f.kind for f in ledger.faults)),
        "invariants_violated": sum(len(v) for v in violations.values()),
        "invariants": {k: {"violations": len(v), "examples": v[:5]} for k, v in violations.items()},
        "jobs": dict(Counter(j["state"] for j in final.values())),
        "cancels_acknowledged": len(ledger.cancelled),
        "accuracy": {
            "fault_free": {str(k): round(v, 4) for k, v in reference.items()},
            "finished_jobs_checked": len(diffs),
            "max_abs_diff": round(max(diffs, default=0.0), 6),
        },
        "recovery_events": {
            "checkpoints_set_aside": sum("set aside" in e["message"] for e in events),
            "restarted_from_checkpoint": sum("restarted from its latest checkpoint" in e["message"] for e in events),
            "task_or_node_losses": sum(e["kind"] == "loss" for e in events),
            "jobs_stopped_and_started_again": sum(e["message"].startswith("job stopped:") for e in events),
        },
        "faults": [asdict(f) for f in ledger.faults],
    }


def _reference_accuracy(cfg: ChaosConfig, seeds: set[int], say: Callable[[str], None]) -> dict[int, float]:
    """Each seed's program trained fault-free in one process (``sync`` is exact: the same result)."""
    from elasticps.examples import digits
    from elasticps.runtime.evaluate import evaluate
    from elasticps.runtime.reference import train_single_process

    out = {}
    for seed in sorted(seeds):
        program = digits.program(epochs=cfg.epochs, seed=seed)
        acc = evaluate(program, train_single_process(program).params)
        assert acc is not None
        out[seed] = acc
        say(f"chaos: fault-free accuracy, seed {seed}: {acc:.4f}")
    return out
