"""``elasticps demo``: the published experiment, on a real multi-node Ray cluster.

A Ray cluster of ``nodes`` raylets runs on this machine
(``ray.cluster_utils.Cluster``). Another tenant (a separate Ray driver) holds
``tenant_per_node`` CPUs on every node. Three jobs (a CNN on scikit-learn's
digits, different lengths) are submitted to the configuration manager; the
tenant leaves ``tenant_s`` seconds after every job has reported its speed
(counted from then, not from submission, so that how long tasks take to start
on a busy machine does not change the scenario). With the ``elastic`` policy the manager
hands the freed CPUs to the jobs; with ``static`` each job keeps the shape it
started with. The same scenario runs under both, and the figures per job are
compared.

With ``objectives`` (``elasticps demo --objectives goodput,speed,efficiency``)
the jobs' global batch is adaptive (up to ``max_batch_size``) and the elastic
policy runs the scenario once under each objective; the table adds each job's
time to ``target_accuracy`` and the batches it trained at.

Every task is held to ``cores_per_cpu`` cores per CPU it asks for (see
:mod:`elasticps.runtime.cpu_limit`): the whole modelled cluster then fits in
the machine's physical cores, so a task's speed depends on what the manager
allocated rather than on what else happens to run.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from elasticps.demo.summary import epochs_to_target, time_to_target
from elasticps.errors import JobFailedError
from elasticps.manager.dashboard import overview
from elasticps.manager.service import Manager
from elasticps.manager.spec import JobSpec
from elasticps.manager.store import Store
from elasticps.sched.policies import options_for

T = TypeVar("T", bound=tuple)

PROGRAM = "elasticps.examples.digits:cnn_program"


@dataclass(frozen=True)
class Setup:
    nodes: int = 3
    cpus_per_node: int = 4
    cores_per_cpu: float = 0.0625  # 12 modelled CPUs in 0.75 of the 2 cores: room for Ray's own processes
    tenant_per_node: int = 2
    tenant_s: float = 15.0
    epochs: tuple[int, ...] = (30, 40, 50)
    interval_s: float = 10.0
    max_ps: int = 2
    max_workers: int = 4
    timeout_s: float = 600.0
    sample_s: float = 1.0
    policy_options: tuple[tuple[str, float], ...] = ()  # e.g. (("rescale_cost_s", 1.0),)
    max_batch_size: int | None = None  # the jobs' batch (128) may grow up to this
    target_accuracy: float = 0.98
    lr: float | None = None  # the jobs' learning rate at batch 128 (None: the program's 0.05)

    def job_specs(self) -> list[JobSpec]:
        task = {"cpu": 1.0, "cpu_limit": self.cores_per_cpu}
        extra: dict[str, Any] = {"max_batch_size": self.max_batch_size} if self.max_batch_size else {}
        if self.lr is not None:
            extra["lr"] = self.lr
        return [
            JobSpec.model_validate(
                {
                    "name": f"cnn-{i + 1}",
                    "program": PROGRAM,
                    "args": {"epochs": epochs, "seed": i, **extra},
                    "ps": {"min": 1, "max": self.max_ps, **task},
                    "workers": {"min": 1, "max": self.max_workers, **task},
                    "checkpoint_every_steps": 200,
                }
            )
            for i, epochs in enumerate(self.epochs)
        ]


@dataclass
class Sample:
    """The cluster and the jobs at one moment (``t``: seconds since submission)."""

    t: float
    tenant_cpu: float
    free_cpu: float
    jobs: dict[str, dict[str, Any]]


@dataclass
class ScenarioResult:
    policy: str
    jobs: dict[str, dict[str, Any]]
    timeline: list[Sample] = field(default_factory=list)
    events: list[tuple[float, str | None, str, str]] = field(default_factory=list)
    # every scheduling round: (t, {job: [ps, workers]}) as decided, before tasks start
    rounds: list[tuple[float, dict[str, list[int]]]] = field(default_factory=list)
    makespan_s: float = 0.0
    cluster_cpus: float = 0.0
    mean_job_cpu_share: float = 0.0
    objective: str = "goodput"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ScenarioResult:
        jobs = {n: {**j, "shapes": [tuple(x) for x in j["shapes"]]} for n, j in d["jobs"].items()}
        events = [tuple(e) for e in d["events"]]
        rounds = [tuple(r) for r in d.get("rounds", [])]
        timeline = [Sample(**s) for s in d["timeline"]]
        return cls(**{**d, "jobs": jobs, "events": events, "rounds": rounds, "timeline": timeline})


def run_scenario(
    policy: str, setup: Setup, workdir: Path, say: Callable[[str], None] = print, objective: str = "goodput"
) -> ScenarioResult:
    """Start a cluster and the tenant, run the three jobs under ``policy``, tear down."""
    import ray
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        raise RuntimeError("the demo starts its own Ray cluster; shut down the current one first")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    workdir.mkdir(parents=True, exist_ok=True)
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    tenant: subprocess.Popen | None = None
    manager: Manager | None = None
    try:
        for _ in range(setup.nodes):
            cluster.add_node(num_cpus=setup.cpus_per_node)
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, log_to_driver=False, logging_level="ERROR")
        tenant = _start_tenant(cluster.address, setup, workdir)
        say(f"[{policy}] other tenant holds {setup.tenant_per_node * setup.nodes} CPUs for {setup.tenant_s:.0f} s")
        manager = Manager(
            Store(workdir / "manager.db"),
            workdir,
            policy=policy,
            objective=objective,
            report_interval_s=2.0,
            policy_options=options_for(policy, dict(setup.policy_options)),
        )
        t0 = time.time()
        for spec in setup.job_specs():
            manager.submit(spec)
        stop = threading.Event()
        loop = threading.Thread(target=manager.run, args=(setup.interval_s, stop), daemon=True)
        loop.start()
        try:
            timeline = _watch(manager, t0, setup, policy, say, leave=workdir / "tenant.leave")
        finally:
            stop.set()
            loop.join(timeout=60)
        result = _result(policy, manager, t0, timeline, setup)
        result.objective = objective
        return result
    finally:
        if manager is not None:
            manager.shutdown()
        if tenant is not None:
            tenant.kill()
            tenant.wait(timeout=30)
        ray.shutdown()
        cluster.shutdown()


def _start_tenant(address: str, setup: Setup, workdir: Path) -> subprocess.Popen:
    ready = workdir / "tenant.ready"
    cmd = [sys.executable, "-m", "elasticps.demo.tenant", "--address", address]
    cmd += ["--per-node", str(setup.tenant_per_node), "--cpu-limit", str(setup.cores_per_cpu)]
    cmd += ["--seconds", str(setup.timeout_s), "--ready-file", str(ready)]
    cmd += ["--leave-file", str(workdir / "tenant.leave")]
    log = (workdir / "tenant.log").open("w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "RAY_AUTH_MODE": "disabled"})
    deadline = time.monotonic() + 180
    while not ready.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"the other tenant did not start; see {workdir / 'tenant.log'}")
        time.sleep(0.2)
    return proc


def _watch(
    manager: Manager, t0: float, setup: Setup, policy: str, say: Callable[[str], None], leave: Path
) -> list[Sample]:
    """Sample the cluster every ``sample_s`` and print events and progress until
    every job ended; tell the tenant to leave ``tenant_s`` after every job ran."""
    timeline: list[Sample] = []
    last_event, last_line = 0, 0.0
    all_running_at: float | None = None
    while True:
        now = time.time()
        ov = overview(manager)
        jobs = {
            j["name"]: {k: j[k] for k in ("state", "num_ps", "num_workers", "metric", "epoch", "samples_per_s")}
            for j in ov["jobs"]
        }
        timeline.append(
            Sample(
                round(now - t0, 2),
                round(sum(n["others_cpu"] for n in ov["nodes"]), 2),
                round(sum(n["free_cpu"] for n in ov["nodes"]), 2),
                jobs,
            )
        )
        for eid, at, job, _, message in manager.store.events(after_id=last_event):
            last_event = eid
            say(f"[{policy}] {at - t0:6.1f} s  {job or 'cluster'}: {message}")
        if all_running_at is None and jobs and all(j["samples_per_s"] for j in jobs.values()):
            all_running_at = now
            say(f"[{policy}] {now - t0:6.1f} s  every job runs; the other tenant leaves in {setup.tenant_s:g} s")
        if all_running_at is not None and now - all_running_at >= setup.tenant_s and not leave.exists():
            leave.touch()
        if now - last_line >= 10:
            last_line = now
            say(f"[{policy}] {now - t0:6.1f} s  " + _progress_line(jobs, timeline[-1]))
        if jobs and all(j["state"] in ("finished", "failed", "cancelled") for j in jobs.values()):
            failed = [n for n, j in jobs.items() if j["state"] != "finished"]
            if failed:
                raise JobFailedError(f"demo jobs did not finish: {failed}; see {manager.workdir}")
            return timeline
        if now - t0 > setup.timeout_s:
            raise TimeoutError(f"the {policy} scenario did not end within {setup.timeout_s:.0f} s")
        time.sleep(setup.sample_s)


def _progress_line(jobs: dict[str, dict[str, Any]], sample: Sample) -> str:
    parts = []
    for name, j in jobs.items():
        acc = f" acc {j['metric']:.3f}" if j["metric"] is not None else ""
        parts.append(f"{name} {j['state']} {j['num_ps']}x{j['num_workers']} ep {j['epoch']}{acc}")
    return " | ".join(parts) + f" | tenant {sample.tenant_cpu:g} CPU, free {sample.free_cpu:g}"


def _result(policy: str, manager: Manager, t0: float, timeline: list[Sample], setup: Setup) -> ScenarioResult:
    jobs: dict[str, dict[str, Any]] = {}
    end = t0
    for rec in manager.store.list_jobs():
        report = manager.ended[rec.name]
        epochs = report.epoch_reports
        busy = sum(w.mean_step_times.compute_s * w.steps for w in report.windows)
        wall = sum(w.elapsed_s for w in report.windows)
        allocations = manager.store.allocations(rec.name)
        cpu_s = _cpu_seconds(allocations, rec.updated_at)
        end = max(end, rec.updated_at)
        started = rec.updated_at - rec.submitted_at - sum(e.elapsed_s for e in epochs)  # waiting and start-up
        jobs[rec.name] = {
            "time_to_target_s": time_to_target(epochs, setup.target_accuracy, started),
            "trained_to_target_s": time_to_target(epochs, setup.target_accuracy, 0.0),
            "epochs_to_target": epochs_to_target(epochs, setup.target_accuracy),
            "batches": sorted({w.batch_size for w in report.windows if w.batch_size}),
            "epochs": len(epochs),
            "mean_epoch_s": round(sum(e.elapsed_s for e in epochs) / len(epochs), 3),
            "total_s": round(rec.updated_at - rec.submitted_at, 2),
            "final_accuracy": round(epochs[-1].metric, 4) if epochs[-1].metric is not None else None,
            "mean_utilization": round(busy / wall, 4) if wall else None,
            "mean_cpus": round(cpu_s / (rec.updated_at - rec.submitted_at), 3),
            "shapes": sorted({(p, w) for _, p, w, _ in allocations}),
            "rescales": sum(1 for r in report.rescales if r.ok),
        }
    cluster_cpus = float(setup.nodes * setup.cpus_per_node)
    job_cpu = [
        sum(j["num_ps"] + j["num_workers"] for j in s.jobs.values() if j["state"] == "running") for s in timeline
    ]
    return ScenarioResult(
        policy=policy,
        jobs=jobs,
        timeline=timeline,
        events=[(round(at - t0, 2), job, kind, msg) for _, at, job, kind, msg in manager.store.events()],
        rounds=[(round(at - t0, 2), {n: list(s) for n, s in d.items()}) for at, d in manager.decisions],
        makespan_s=round(end - t0, 2),
        cluster_cpus=cluster_cpus,
        mean_job_cpu_share=round(sum(job_cpu) / len(job_cpu) / cluster_cpus, 4) if job_cpu else 0.0,
    )


def _cpu_seconds(allocations: list[tuple[float, int, int, dict]], end: float) -> float:
    """CPU-seconds a job held (1 CPU per task) from its allocation history."""
    total = 0.0
    for (at, p, w, _), nxt in zip(allocations, [*allocations[1:], None], strict=True):
        total += (p + w) * ((nxt[0] if nxt else end) - at)
    return total


def run(
    setup: Setup | None = None,
    policies: tuple[str, ...] = ("static", "elastic"),
    workdir: Path | None = None,
    say: Callable[[str], None] = print,
    objectives: tuple[str, ...] = (),
    repeats: int = 1,
) -> dict[str, ScenarioResult]:
    """The scenario under each policy; or, with ``objectives``, under the elastic
    policy once per objective (results keyed by objective). With ``repeats`` > 1
    the whole list runs that many times, each time starting one further along it
    (whatever runs first on a cold machine starts slower), keyed ``name #k``."""
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    setup = setup or Setup()
    results: dict[str, ScenarioResult] = {}
    runs = [("elastic", o, o) for o in objectives] or [(p, "goodput", p) for p in policies]
    with tempfile.TemporaryDirectory(prefix="elasticps-demo-") as tmp:
        base = workdir or Path(tmp)
        for key, (policy, objective, _) in run_order(runs, repeats):
            results[key] = run_scenario(policy, setup, base / key.replace(" #", "-"), say, objective=objective)
    return results


def run_order(runs: list[T], repeats: int) -> list[tuple[str, T]]:
    """``runs`` (named by their last item) ``repeats`` times, the k-th time
    starting k places along, each keyed by its name (``name #k`` when repeated)."""
    out = []
    for k in range(repeats):
        shift = k % len(runs)
        for run in runs[shift:] + runs[:shift]:
            out.append((run[-1] if repeats == 1 else f"{run[-1]} #{k + 1}", run))
    return out
