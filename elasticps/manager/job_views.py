"""What the policy reads of each job in a round: a :class:`JobView` built from
the store (spec, limits, observations), what the job's handle last said, the
fleet's priors and what rescales cost here.

A job's speed model is fitted to its stored observations and predicts for
the nodes each shape would span on the room the nodes have for our jobs; a
job that is starting, or whose rescale is in flight, is held at the shape
asked until the runtime reports it applied (or failed). The view's rule is
the simulator's (:func:`elasticps.sched.view.plan_view`). A job whose code
this manager may no longer run, or whose program cannot be described, fails
here and has no view. Called with the manager's lock held.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from elasticps.errors import ElasticPSError
from elasticps.manager.admission import Admission
from elasticps.manager.isolation import FIGURE_ERRORS
from elasticps.manager.live import JobTable
from elasticps.manager.pinning import CODE_DIR
from elasticps.manager.priors import FleetPriors, kind_of, read_observations
from elasticps.manager.rescale_costs import RescaleCosts
from elasticps.manager.runtime import JobRuntime, ProgramInfo
from elasticps.manager.spec import JobSpec
from elasticps.manager.states import JobState
from elasticps.manager.store import JobRecord, Store
from elasticps.manager.task_resources import policy_resources
from elasticps.manager.workdir import job_dir
from elasticps.placement import shared_spans
from elasticps.sched import ClusterView, JobView, Observation, Resources, SpeedModel
from elasticps.sched.goodput import batch_candidates
from elasticps.sched.view import ShapeLimits, ViewPlan, plan_view

log = logging.getLogger("elasticps.manager")

#: the nodes each shape of a job would span, by its PS's and workers' sizes (:func:`shared_spans`)
SpansOf = Callable[[Resources, Resources], Callable[[int, int], int]]


@dataclass
class RoundReads:
    """What a round reads of the store once: each job's observations, and the fleet's priors from them."""

    observed: dict[str, list[Observation]] = field(default_factory=dict)
    priors: dict[tuple, SpeedModel] = field(default_factory=dict)


@dataclass
class ViewBuilder:
    """Builds each job's :class:`JobView` for a round (see the module's docstring):
    :meth:`read` once per round, then :meth:`views` of the jobs that may run."""

    store: Store
    runtime: JobRuntime
    workdir: Path
    jobs: JobTable
    admission: Admission
    priors: FleetPriors
    rescale_costs: RescaleCosts

    def read(self, active: list[JobRecord]) -> RoundReads:
        """The round's reads of the active jobs' observations, and the fleet priors fitted to them."""
        reads = RoundReads()
        try:
            reads.priors = self.priors.models([(r, self.observations(r.name, reads)) for r in active])
        except FIGURE_ERRORS as exc:  # no fleet prior this round; each job's own view is judged below
            log.warning("fleet priors: %s", exc)
            reads.priors = {}
        return reads

    def views(self, records: list[JobRecord], reads: RoundReads, cluster: ClusterView, now: float) -> list[JobView]:
        """The views of ``records`` (those that have one); a job whose figures break its view fails, not the round."""
        spans = shared_spans([n.available for n in cluster.nodes])
        views = []
        for r in records:
            try:
                view = self.view(r, now, reads, spans)
            except FIGURE_ERRORS as exc:
                self.jobs.fail_on_figures(r.name, now, f"{type(exc).__name__}: {exc}")
                continue
            if view is not None:
                views.append(view)
        return views

    def observations(self, name: str, reads: RoundReads) -> list[Observation]:
        """A job's stored speed observations, read once per round."""
        if name not in reads.observed:
            reads.observed[name] = read_observations(self.store, name)
        return reads.observed[name]

    def view(self, rec: JobRecord, now: float, reads: RoundReads, spans: SpansOf) -> JobView | None:
        """What the policy knows of a job; its speeds are predicted for the
        nodes each shape would span on the room the nodes have for our jobs
        (``spans``: :func:`~elasticps.placement.shared_spans` of it)."""
        live = self.jobs.live.get(rec.name)
        if live is None and not self.admission.admitted_here(rec, now):  # once per job here; apply checks each start
            return None
        info = self._info(rec, now)
        if info is None:
            return None
        spec = rec.spec
        share = live.compute_share if live is not None else None
        ps_res, worker_res = policy_resources(spec.ps), policy_resources(spec.workers)
        span = spans(ps_res, worker_res)
        model = SpeedModel(info.batch_size, spec.mode, span=span, compute_share=share)
        model.fit(self.observations(rec.name, reads))
        current = None
        remaining = float(info.epochs * info.samples_per_epoch)
        if live is not None:
            current = live.asked  # asked for; the job switches at its next step boundary
            if live.status is not None and live.status.remaining_samples is not None:
                remaining = float(max(1, live.status.remaining_samples))
        limits = ShapeLimits(spec.ps.min, spec.ps.max, spec.workers.min, spec.workers.max)
        if live is not None and (live.status is None or (live.status.num_ps, live.status.num_workers) != live.asked):
            # starting, or a rescale in flight: judged again once the runtime reports it applied (or failed)
            (p, w) = live.asked
            plan = ViewPlan(model.predict, ShapeLimits(p, p, w, w))
        else:
            prior = reads.priors.get(kind_of(rec))
            prior = prior.with_span(span) if prior is not None else None
            plan = plan_view(model, limits, current, prior=prior, draw=rec.name)  # the simulator's rule too
        cost = self.rescale_costs.of(rec.name)
        return JobView(
            id=rec.name,
            **plan.fields(),
            ps_resources=ps_res,
            worker_resources=worker_res,
            remaining_samples=remaining,
            current=current,
            objective=spec.objective,
            arrival=rec.submitted_at,
            waited_s=now - rec.submitted_at if live is None else 0.0,
            batch_sizes=batch_sizes(spec, info) if plan.speed_at is not None else (),  # none while switching
            batch=live.batch_now if live is not None else None,
            noise_scale=live.status.noise_scale if live is not None and live.status is not None else None,
            rescale_pause_s=cost.pause_s if cost is not None else None,
            rescale_launch_s=cost.launch_s if cost is not None else 0.0,
        )

    def _info(self, rec: JobRecord, now: float) -> ProgramInfo | None:
        if rec.info is not None:
            return rec.info
        try:  # a job stored by an older version, before programs were described at submission
            info = self.runtime.describe(rec.spec, str(job_dir(self.workdir, rec.name) / CODE_DIR))
        except ElasticPSError as exc:
            self.jobs.finish(rec.name, JobState.FAILED, now, f"job failed: {exc}")
            return None
        self.store.set_info(rec.name, info)
        return info


def predicted(views: list[JobView]) -> dict[str, float]:
    """The speed model's samples/s for each running job at its shape (what its ETA is read from)."""
    out = {}
    for v in views:
        if v.current is not None:
            try:
                out[v.id] = float(v.speed(*v.current))
            except FIGURE_ERRORS:
                continue
    return out


def batch_sizes(spec: JobSpec, info: ProgramInfo) -> tuple[int, ...]:
    """The global batches the scheduler may choose for a job (none: it is fixed)."""
    return batch_candidates(info.batch_size, info.max_batch_size) if spec.mode == "sync" else ()
