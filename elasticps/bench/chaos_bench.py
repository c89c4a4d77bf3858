"""``elasticps bench chaos``: faults against a live manager on a real multi-node Ray cluster.

A Ray cluster of ``nodes`` raylets runs on this machine (``ray.cluster_utils.Cluster``,
with Ray's token authentication on when this process has not imported Ray yet),
the manager runs as its own process (``elasticps server --ray-address``) with
its workdir on a tmpfs of its own (where this machine lets us mount one), and
jobs (the digits MLP, ``sync`` mode, checkpoints every 25 steps) are submitted
through the REST API so that ``jobs_at_once`` of them are active. Every
fault, once every active job has trained ``settle_steps`` steps since the last
one (so that each fault hits a job that recovered), one fault is drawn from a
shuffled deck of the kinds (each kind once per deck; a kind with no target at
that moment waits for the next draw):

- ``kill_worker`` / ``kill_ps`` / ``kill_server`` / ``kill_node``: SIGKILL a
  job's worker or PS, the manager (started again on the same workdir), or a
  whole Ray node (replaced) (:mod:`elasticps.bench.chaos.kills`);
- ``corrupt_checkpoint`` (64 bytes of a job's newest checkpoint overwritten),
  ``cancel_race`` (a submit cancelled 0-2 s later), ``hostile_figures`` (a job
  whose processes report figures that overflow, or answer with pickles that run
  code) and ``step0_error`` (a job whose model raises on its first batch)
  (:mod:`elasticps.bench.chaos.jobs`; the doomed programs in
  :mod:`elasticps.bench.chaos.programs`);
- ``full_disk`` (the workdir's tmpfs filled to the last byte for ``hold_s``)
  and ``db_locked`` (an exclusive transaction on the manager's database held by
  another process for ``hold_s``), with the API probed meanwhile
  (:mod:`elasticps.bench.chaos.store`).

When the faults are done no more jobs are submitted; every job is waited for,
and the invariants of :mod:`elasticps.bench.chaos.invariants` are checked.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from elasticps.bench.chaos import jobs, kills, store
from elasticps.bench.chaos.invariants import ENDED, check
from elasticps.bench.chaos.ledger import Fault, Ledger
from elasticps.bench.chaos.server import ManagerProcess, ray_auth
from elasticps.errors import ConfigError

__all__ = ["FAULTS", "Chaos", "ChaosConfig", "Fault", "Ledger", "check", "run"]

INJECT: dict[str, Callable[[Chaos], str | None]] = {
    "kill_worker": kills.kill_worker,
    "kill_ps": kills.kill_ps,
    "kill_server": kills.kill_server,
    "kill_node": kills.kill_node,
    "corrupt_checkpoint": jobs.corrupt_checkpoint,
    "cancel_race": jobs.cancel_race,
    "full_disk": store.full_disk,
    "db_locked": store.db_locked,
    "hostile_figures": jobs.hostile_figures,
    "step0_error": jobs.step0_error,
}
FAULTS = tuple(INJECT)
PROGRAM = "elasticps.examples.digits:program"


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
    hold_s: float = 20.0  # how long the disk stays full, the database locked
    disk_size: str = "256m"  # the workdir's tmpfs
    kinds: tuple[str, ...] = FAULTS

    def spec(self, name: str, seed: int, program: str = PROGRAM, **args: Any) -> dict[str, Any]:
        return {
            "name": name,
            "program": program,
            "args": {"epochs": self.epochs, "seed": seed, **args},
            "ps": {"min": 1, "max": 2, "cpu": 0.5},
            "workers": {"min": 1, "max": 3, "cpu": 0.5},
            "checkpoint_every_steps": 25,
        }


def run(cfg: ChaosConfig, say: Callable[[str], None] = print) -> dict[str, Any]:
    """Start the cluster and the manager, inject ``cfg.faults`` faults, check the invariants."""
    unknown = set(cfg.kinds) - set(FAULTS)
    if unknown or not cfg.kinds:
        raise ConfigError(f"fault kinds must be among {', '.join(FAULTS)}; got {sorted(unknown) or 'none'}")
    work = Path(tempfile.mkdtemp(prefix="elasticps-chaos-"))
    auth = ray_auth(work)
    import ray
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        raise RuntimeError("the chaos benchmark starts its own Ray cluster; shut down the current one first")
    t0 = time.monotonic()
    signal.signal(signal.SIGTERM, _raise_interrupt)  # a stopped benchmark still takes its cluster down
    mounted = "full_disk" in cfg.kinds and store.mount_disk(work / "manager", cfg.disk_size)
    if "full_disk" in cfg.kinds and not mounted:
        say("chaos: cannot mount a tmpfs here (root needed): no full_disk faults")
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    server: ManagerProcess | None = None
    clean = False  # a run that ended with every invariant held leaves nothing behind; another keeps its folder
    try:
        for _ in range(cfg.nodes):
            cluster.add_node(num_cpus=cfg.cpus_per_node)
        cluster.wait_for_nodes()
        server = ManagerProcess(work / "manager", cluster.address, cfg.interval_s)
        server.start()
        disk = f", workdir on a {cfg.disk_size} tmpfs" if mounted else ""
        say(f"chaos: {cfg.nodes} Ray nodes (auth {auth}), manager pid {server.proc.pid}, work {work}{disk}")
        chaos = Chaos(cfg, cluster, server, random.Random(cfg.seed), say, t0, work / "markers", mounted)
        while len(chaos.ledger.faults) < cfg.faults:
            chaos.keep_jobs_running()
            chaos.settle()
            chaos.inject()
        say(f"chaos: {len(chaos.ledger.faults)} faults injected; waiting for every job to end")
        final = chaos.drain()
        reference = _reference_accuracy(cfg, set(chaos.ledger.submitted.values()), say)
        chaos.ledger.manager_pids = server.pids
        markers = tuple(os.listdir(chaos.markers)) if chaos.markers.is_dir() else ()
        result = check(chaos.ledger, final, server.request("GET", "/events").json(), reference, markers)
        result.update(
            workload=f"{PROGRAM} (MLP on digits, sync, {cfg.epochs} epochs, checkpoint every 25 steps)",
            config=asdict(cfg),
            ray_auth=auth,
            workdir_on_tmpfs=mounted,
            job_list_reads_over_30s=server.slow_reads,
            elapsed_s=round(time.monotonic() - t0, 1),
        )
        clean = result["invariants_violated"] == 0
        return result
    finally:
        if server is not None:
            server.stop()
        cluster.shutdown()
        if mounted:
            store.unmount_disk(work / "manager")
        if clean:
            shutil.rmtree(work, ignore_errors=True)
        else:
            say(f"chaos: its manager's workdir and logs are kept in {work}")


def _raise_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


class Chaos:
    """The run in progress: what the faults act on, and what the manager acknowledged."""

    def __init__(
        self, cfg: ChaosConfig, cluster: Any, server: ManagerProcess, rng: random.Random,
        say: Callable[[str], None], t0: float, markers: Path, disk_mounted: bool,
    ) -> None:  # fmt: skip
        self.cfg, self.cluster, self.server, self.rng, self.say, self.t0 = cfg, cluster, server, rng, say, t0
        self.markers, self.disk_mounted = markers, disk_mounted
        self.ledger = Ledger()
        self.count = 0
        self.deck: list[str] = []

    # -- jobs
    def next_name(self, prefix: str) -> str:
        self.count += 1
        return f"{prefix}-{self.count}"

    def submit(self, prefix: str) -> str | None:
        name = self.next_name(prefix)
        seed = self.count % 4
        if self._post(self.cfg.spec(name, seed)):
            self.ledger.submitted[name] = seed
            return name
        return None

    def submit_doomed(self, prefix: str, program: str, args: dict[str, Any], cause: str) -> str | None:
        """A job meant to fail; its failure's event must contain ``cause``."""
        name = self.next_name(prefix)
        if self._post(self.cfg.spec(name, 0, program, **args)):
            self.ledger.doomed[name] = cause
            return name
        return None

    def _post(self, spec: dict[str, Any]) -> bool:
        r = self.server.request("POST", "/jobs", json=spec, timeout=180)
        if r.status_code != 201:
            self.ledger.refused.append(f"{spec['name']}: {r.status_code} {r.text[:300]}")
            self.say(f"chaos: submit {spec['name']} refused: {r.status_code} {r.text[:500]}")
        return r.status_code == 201

    def _active(self, jobs: dict[str, dict[str, Any]]) -> list[str]:
        """The normal jobs still to end (doomed and cancelled ones aside)."""
        skip = self.ledger.cancelled | self.ledger.doomed.keys()
        return [n for n, j in jobs.items() if j["state"] not in ENDED and n not in skip]

    def keep_jobs_running(self) -> None:
        for _ in range(self.cfg.jobs_at_once - len(self._active(self.server.jobs()))):
            self.submit("job")

    def drain(self) -> dict[str, dict[str, Any]]:
        deadline = time.monotonic() + self.cfg.drain_timeout_s
        while True:
            jobs = self.server.jobs()
            if all(j["state"] in ENDED for j in jobs.values()) or time.monotonic() > deadline:
                return jobs
            time.sleep(0.5)

    def settle(self) -> None:
        """Wait until every active job has trained ``settle_steps`` steps since the last fault
        (at most ``settle_timeout_s``): each fault then hits a job that recovered from the last."""

        def steps() -> dict[str, int]:
            jobs = self.server.jobs()
            return {n: (jobs[n].get("progress") or {}).get("step", -1) for n in self._active(jobs)}

        time.sleep(self.cfg.fault_every_s)
        before = steps()
        deadline = time.monotonic() + self.cfg.settle_timeout_s
        while time.monotonic() < deadline:
            now = steps()
            if all(now.get(n, 1 << 30) >= s + self.cfg.settle_steps for n, s in before.items()):
                return
            time.sleep(0.25)  # a job trains several steps a second: a coarser poll only delays the next fault

    # -- faults
    def inject(self) -> None:
        """The next kind of the deck that has a target now (a new shuffled deck when it runs out)."""
        if not self.deck:
            self.deck = list(self.cfg.kinds)
            self.rng.shuffle(self.deck)
        for kind in list(self.deck):
            target = INJECT[kind](self)
            if target is not None:
                self.deck.remove(kind)
                self.ledger.faults.append(Fault(round(time.monotonic() - self.t0, 1), kind, target))
                self.say(f"chaos: fault {len(self.ledger.faults)}/{self.cfg.faults} {kind} {target}")
                return


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
