"""The configuration manager's control loop (a Ray driver).

A job the store says is running but that has no controller here (the
manager was killed and restarted) is started again from its latest
checkpoint: its old tasks died with the old driver.

Every round (``step``): read the jobs' progress reports and record an
observation of each running job's speed at its shape; refit its speed model
from the stored observations; read the nodes' capacity and other tenants' use
from Ray; run the policy and placement (the same code as the simulator); start
admitted jobs, rescale running ones whose shape or placement changed, and mark
finished or failed ones. Everything it decides is written to the store first.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from elasticps.errors import ConfigError
from elasticps.manager.capacity import capacity_change, capacity_signature, ray_cluster_view, ray_hostnames
from elasticps.manager.spec import JobSpec, TaskSpec
from elasticps.manager.store import JobRecord, Store
from elasticps.placement import place
from elasticps.program import load_program
from elasticps.runtime import JobConfig, JobController, JobReport, TaskResources
from elasticps.sched import ClusterView, JobView, Observation, PolicyState, Resources, SpeedModel, make_policy
from elasticps.sched.policies.base import Policy
from elasticps.sched.types import total_of

log = logging.getLogger("elasticps.manager")


class ClusterGrowth(Protocol):
    """Grows or shrinks the Ray cluster itself (e.g. :class:`elasticps.k8s.KubeRayGrowth`)."""

    def reconcile(
        self,
        policy: Policy,
        jobs: list[JobView],
        ray_cluster: ClusterView,
        state: PolicyState,
        ours_by_node: dict[str, Resources],
        hostnames: dict[str, str],
        current: dict[str, dict[str, str]] | None = None,
        placement: str = "locality",
    ) -> Any: ...


@dataclass
class _Live:
    controller: JobController
    thread: threading.Thread
    shape: tuple[int, int]
    placement: dict[str, str] = field(default_factory=dict)
    seen_windows: int = 0


class Manager:
    def __init__(
        self,
        store: Store,
        workdir: str | Path,
        policy: str = "elastic",
        objective: str = "goodput",
        placement: str = "locality",
        clock: Callable[[], float] = time.time,
        report_interval_s: float = 2.0,
        growth: ClusterGrowth | None = None,
        policy_options: dict[str, Any] | None = None,
    ) -> None:
        self.store = store
        self.workdir = Path(workdir)
        # e.g. {"rescale_cost_s": 1.0}: what a rescale costs the elastic policy (see docs/scheduler.md)
        self.policy = make_policy(policy, objective=objective, **(policy_options or {}))
        self.placement_method = placement
        self.clock = clock
        self.report_interval_s = report_interval_s
        self.state = PolicyState()
        self.growth = growth
        self.live: dict[str, _Live] = {}
        self.wake = threading.Event()  # an event worth a round now (submission, finish, limits)
        self.ended: dict[str, JobReport] = {}  # last report of each job that ended while this manager ran
        self.samples_per_epoch: dict[str, int] = {}

    # -- API
    def submit(self, spec: JobSpec) -> JobRecord:
        load_program(spec.program, spec.args)  # fail now, with a clear error, if it cannot be imported
        rec = self.store.add_job(spec, self.clock())
        self.wake.set()
        return rec

    def set_limits(self, name: str, ps: tuple[int, int] | None, workers: tuple[int, int] | None) -> JobRecord:
        """Change a job's min/max PS and workers; the next round honours them."""
        rec = self.store.get_job(name)
        update: dict = {}
        if ps is not None:
            update["ps"] = rec.spec.ps.model_copy(update={"min": ps[0], "max": ps[1]})
        if workers is not None:
            update["workers"] = rec.spec.workers.model_copy(update={"min": workers[0], "max": workers[1]})
        spec = JobSpec.model_validate({**rec.spec.model_dump(), **{k: v.model_dump() for k, v in update.items()}})
        now = self.clock()
        self.store.update_spec(spec, now)
        self.store.add_event(
            now, name, "limits", f"PS {spec.ps.min}..{spec.ps.max}, workers {spec.workers.min}..{spec.workers.max}"
        )
        self.wake.set()
        return self.store.get_job(name)

    def cancel(self, name: str) -> None:
        now = self.clock()
        live = self.live.pop(name, None)
        if live is not None:
            live.controller.stop()
            live.thread.join(timeout=60)
            live.controller.shutdown()
        self.store.set_state(name, "cancelled", now)
        self.store.add_event(now, name, "cancelled", f"job {name} cancelled")

    def shutdown(self) -> None:
        for live in self.live.values():
            live.controller.stop()
        for live in self.live.values():
            live.thread.join(timeout=60)
            live.controller.shutdown()
        self.live.clear()

    # -- the loop
    def step(self) -> dict[str, tuple[int, int]]:
        now = self.clock()
        self._collect(now)
        records = self.store.list_jobs(("pending", "running"))
        views = [self._view(r) for r in records]
        cluster = ray_cluster_view(self._ours())
        decision, self.state = self.policy.decide(views, cluster, self.state)
        current = {n: live.placement for n, live in self.live.items()}
        placed = place(views, decision, cluster, current, self.placement_method)
        for rec in records:
            shape = decision.get(rec.name)
            placement = placed.placement.get(rec.name)
            if shape is None or placement is None:
                continue
            live = self.live.get(rec.name)
            if live is None:
                self._start(rec, shape, placement, now)
            elif shape != live.shape or placement != live.placement:
                try:
                    live.controller.rescale(*shape, placement=placement)
                except ConfigError:
                    if live.controller.state in ("finished", "failed"):
                        continue  # it ended since this round read its report; the next round retires it
                    raise
                live.shape, live.placement = shape, placement
                self.store.record_allocation(rec.name, now, *shape, placement)
                self.store.add_event(now, rec.name, "rescale", f"rescale to {shape[0]} PS x {shape[1]} workers")
        if self.growth is not None:
            self._grow(views, cluster, current, now)
        return decision

    def run(self, interval_s: float, stop: threading.Event, watch_s: float = 1.0, settle_s: float = 3.0) -> None:
        """Decide every ``interval_s``, and at once (within ``watch_s``) when a
        job is submitted or ends, limits change, a node joins or leaves, or
        another tenant takes or frees room.

        Ray accounts for tasks we start or stop a moment after we do (over a
        second when several start on a busy machine), so for ``settle_s`` after
        a round capacity is not compared; then it is compared with what it was
        before the round, and only others' changes remain.
        """
        last_round = float("-inf")
        settled_at = float("-inf")
        seen: dict[str, tuple[float, float]] | None = None
        while not stop.is_set():
            due = time.monotonic() - last_round >= interval_s
            woken = self.wake.is_set()
            self.wake.clear()
            try:
                woken = self._collect(self.clock()) or woken
                if not (due or woken) and time.monotonic() >= settled_at:
                    change = capacity_change(seen, now := capacity_signature(ray_cluster_view(self._ours())))
                    seen = now
                    if change:
                        self.store.add_event(self.clock(), None, "capacity", change)
                        woken = True
                if due or woken:
                    last_round = time.monotonic()
                    self.step()
                    settled_at = time.monotonic() + settle_s
            except Exception:
                log.exception("scheduling round failed")
            self.wake.wait(watch_s)

    def report(self, name: str) -> JobReport | None:
        """The job's report: live if it runs here, else its last one if it ended while this manager ran."""
        live = self.live.get(name)
        return live.controller.report() if live is not None else self.ended.get(name)

    def overview(self) -> dict:
        """What the dashboard shows: nodes (CPU used by jobs, by others, free) and
        jobs (tasks over time, throughput over time, loss by step)."""
        import ray

        nodes = []
        if ray.is_initialized():
            ours = self._ours()
            for n in ray_cluster_view(ours).nodes:
                jobs_cpu = ours.get(n.name, Resources()).cpu
                nodes.append(
                    {
                        "id": n.name,
                        "cpu": n.capacity.cpu,
                        "jobs_cpu": round(jobs_cpu, 2),
                        "others_cpu": round(n.used_by_others.cpu, 2),
                        "free_cpu": round(max(0.0, n.capacity.cpu - jobs_cpu - n.used_by_others.cpu), 2),
                    }
                )
        jobs = []
        for rec in self.store.list_jobs():
            allocs = self.store.allocations(rec.name)
            report = self.report(rec.name)
            last = allocs[-1] if allocs else (0, 0, 0, {})
            jobs.append(
                {
                    "name": rec.name,
                    "state": rec.state,
                    "num_ps": last[1],
                    "num_workers": last[2],
                    "tasks": [[at - rec.submitted_at, p + w] for at, p, w, _ in allocs],
                    "throughput": [[w.last_step, w.samples_per_s] for w in report.windows] if report else [],
                    "loss": [[w.last_step, w.loss] for w in report.windows] if report else [],
                    "metric": report.epoch_reports[-1].metric if report and report.epoch_reports else None,
                    "epoch": report.epoch if report else 0,
                    "samples_per_s": report.windows[-1].samples_per_s if report and report.windows else None,
                }
            )
        return {"nodes": nodes, "jobs": jobs}

    # -- helpers
    def _start(self, rec: JobRecord, shape: tuple[int, int], placement: dict[str, str], now: float) -> None:
        spec = rec.spec
        config = JobConfig(
            mode=spec.mode,
            checkpoint_dir=str(self.workdir / rec.name / "checkpoints"),
            checkpoint_every_steps=spec.checkpoint_every_steps,
            report_interval_s=self.report_interval_s,
            ps_resources=_task_resources(spec.ps),
            worker_resources=_task_resources(spec.workers),
        )
        controller = JobController(load_program(spec.program, spec.args), config, *shape, placement=placement)
        thread = controller.run_in_thread()
        self.live[rec.name] = _Live(controller, thread, shape, placement)
        restarted = rec.state == "running"  # running in the store, not here: the manager was restarted
        self.store.set_state(rec.name, "running", now)
        self.store.record_allocation(rec.name, now, *shape, placement)
        verb = "restarted from its latest checkpoint" if restarted else "started"
        self.store.add_event(now, rec.name, "started", f"{verb} with {shape[0]} PS x {shape[1]} workers")

    def _grow(self, views: list[JobView], cluster: ClusterView, current: dict, now: float) -> None:
        """Ask for more Ray nodes (or fewer) when the jobs could use them."""
        assert self.growth is not None
        try:
            plan = self.growth.reconcile(
                self.policy, views, cluster, self.state, self._ours(), ray_hostnames(), current, self.placement_method
            )
        except Exception as exc:  # the jobs keep running on the nodes there are
            log.warning("resizing the Ray cluster failed: %s", exc)
            self.store.add_event(now, None, "growth", f"could not resize the Ray cluster: {exc}")
            return
        if plan is not None:
            gone = f"; removing {', '.join(plan.workers_to_delete)}" if plan.workers_to_delete else ""
            self.store.add_event(now, None, "growth", f"Ray worker pods -> {plan.replicas} ({plan.reason}){gone}")

    def _collect(self, now: float) -> bool:
        """Record new speed observations; retire jobs that ended (True if one did).

        A job's first measurement at a new shape does not start a round: the
        job measured first would explore first and take the room that others,
        measured a moment later, would have shared (tried in the demo: their
        completion times got worse). Exploration moves at the interval."""
        news = False
        for name, live in list(self.live.items()):
            report = live.controller.report()
            for w in report.windows[live.seen_windows :]:
                self.store.record_observation(name, now, w.num_ps, w.num_workers, w.samples_per_s)
            live.seen_windows = len(report.windows)
            per_epoch = live.controller.samples_per_epoch()
            if per_epoch is not None:
                self.samples_per_epoch[name] = per_epoch
            if report.state in ("finished", "failed") and not live.thread.is_alive():
                self.ended[name] = report
                self.store.set_state(name, report.state, now)
                self.store.add_event(
                    now, name, report.state, f"job {report.state}" + (f": {report.error}" if report.error else "")
                )
                live.controller.shutdown()
                del self.live[name]
                news = True  # its room is free
        return news

    def _view(self, rec: JobRecord) -> JobView:
        spec = rec.spec
        program = load_program(spec.program, spec.args)
        live = self.live.get(rec.name)
        model = SpeedModel(program.batch_size, spec.mode).fit(
            [Observation(p, w, s) for p, w, s in self.store.observations(rec.name)]
        )
        current = None
        remaining = float(program.epochs * self.samples_per_epoch.get(rec.name, program.batch_size * 100))
        if live is not None:
            current = live.shape  # asked for; the controller switches at its next step boundary
            left = live.controller.remaining_samples()
            if left is not None:
                remaining = float(max(1, left))
        min_ps, min_w = spec.ps.min, spec.workers.min
        max_ps, max_w = spec.ps.max, spec.workers.max
        explore = None
        if not model.shapes:
            max_ps, max_w = min_ps, min_w
        elif not model.confident and current is not None:
            explore = model.explore(current, spec.ps.max, spec.workers.max)
            if explore is not None:
                max_ps, max_w = max(current[0], explore[0]), max(current[1], explore[1])
        return JobView(
            id=rec.name,
            speed=model.predict,
            min_ps=max(1, min_ps),
            max_ps=max(1, max_ps),
            min_workers=min_w,
            max_workers=max_w,
            ps_resources=Resources(cpu=spec.ps.cpu, gpu=spec.ps.gpu, memory_gb=spec.ps.memory_gb),
            worker_resources=Resources(cpu=spec.workers.cpu, gpu=spec.workers.gpu, memory_gb=spec.workers.memory_gb),
            remaining_samples=remaining,
            current=current,
            objective=spec.objective,
            arrival=rec.submitted_at,
            waited_s=self.clock() - rec.submitted_at if live is None else 0.0,
            explore=explore,
        )

    def _ours(self) -> dict[str, Resources]:
        per_node: dict[str, list[Resources]] = {}
        for name, live in self.live.items():
            spec = self.store.get_job(name).spec
            # What the manager asked for, and what the job still holds while it switches.
            held = live.controller.placement().items() | live.controller.starting().items()
            for task, node in held | live.placement.items():
                kind = spec.ps if task.startswith("ps-") else spec.workers
                per_node.setdefault(node, []).append(Resources(cpu=kind.cpu, gpu=kind.gpu, memory_gb=kind.memory_gb))
        return {n: total_of(rs) for n, rs in per_node.items()}


def _task_resources(task: TaskSpec) -> TaskResources:
    return TaskResources(
        cpu=task.cpu, gpu=task.gpu, memory_bytes=int(task.memory_gb * 1024**3), cpu_limit=task.cpu_limit
    )
