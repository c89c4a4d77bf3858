"""The policy's side of a simulation: what it is shown of each job (a plan
from the job's speed model, or from the truth for the oracle, and a view),
its rounds (a decision placed on the nodes and applied to the jobs, as the
live manager's: :mod:`elasticps.sched.rounds`), and the speed models
refitted from the running jobs' noisy reports, with the fleet prior of each
kind pooled from every job's reports. The ground truth reaches the policy
only as those reports (the oracle excepted)."""

from __future__ import annotations

import dataclasses
import functools
import random
import time

from elasticps.placement import cross_share, fewest_nodes, place, room_left, with_own_room
from elasticps.sched import ClusterView, JobView, NodeView, Observation, PolicyState, Resources, SpeedModel
from elasticps.sched.goodput import batch_candidates
from elasticps.sched.objectives import batches_for
from elasticps.sched.policies import make_policy, options_for
from elasticps.sched.pooling import PRIOR_PER_JOB
from elasticps.sched.rounds import admission_only, state_after
from elasticps.sched.speed import fleet_prior
from elasticps.sched.view import ShapeLimits, ViewPlan, plan_view
from elasticps.sim.config import KIND_ORACLE, ORACLES, SimConfig, worker_resources
from elasticps.sim.jobs import SimJob, oracle_speed, oracle_speed_at, span_of, true_speed
from elasticps.sim.truth import Truth
from elasticps.sim.workload import KINDS, noise_scale_at


def _remembered(plan: ViewPlan) -> ViewPlan:
    """``plan`` with each speed it works out kept: the rounds between two refits ask for the same shapes."""
    return dataclasses.replace(
        plan,
        speed=functools.cache(plan.speed),
        speed_at=None if plan.speed_at is None else functools.cache(plan.speed_at),
        sd=None if plan.sd is None else functools.cache(plan.sd),
    )


class Scheduler:
    """The policy, its state and what it has learned, for one simulation."""

    def __init__(self, config: SimConfig, truth: Truth, capacity: Resources) -> None:
        self.config, self.truth, self.capacity = config, truth, capacity
        self.oracle = config.policy in ORACLES
        # the oracle decides with the elastic policy's code; only what it knows differs
        name = "elastic" if self.oracle else config.policy
        settings = {
            "rescale_cost_s": config.rescale_pause_s,
            "efficiency_threshold": config.efficiency_threshold,
            "joint_trades": config.joint_trades,
        }
        self.policy = make_policy(name, objective=config.objective, **options_for(name, settings))
        self.state = PolicyState()
        self.decision_times: list[float] = []
        self.speeds: dict[str, float] = {}  # raw samples/s at the job's batch, set when it is scheduled
        # progress: those samples/s x E(M) at that moment, in samples at the kind's batch
        self.rates: dict[str, float] = {}
        # all-reduce jobs placed; of them, spread over more nodes than their shape needs;
        # and of those, spread while the room left (with their own) held them on fewer
        self.gpu_placements = [0, 0, 0]
        self.kind_models: dict[str, SpeedModel] = {}  # the fleet prior: one model per kind, from every job's reports
        self.priors: dict[tuple[str, float, float], SpeedModel] = {}  # a kind's model, for jobs of one task size
        # A job's plan changes only when its model or its shape does: models are refitted at the reports (``fits``
        # counts them), so the rounds between two reports reuse each job's plan and the speeds it worked out.
        self.plans: dict[str, tuple[tuple[int, tuple[int, int] | None], ViewPlan]] = {}
        self.fits = 0

    def cluster_view(self, tenant: dict[str, float]) -> ClusterView:
        return ClusterView(tuple(NodeView(n, self.capacity, Resources(cpu=used)) for n, used in tenant.items()))

    def speed_of(self, job: SimJob) -> float:
        """Raw samples/s at the job's batch, as placed."""
        if job.shape is None:
            return 0.0
        return true_speed(job, *job.shape, job.placement, self.config.local_traffic_factor, self.truth)

    def plan_of(self, job: SimJob) -> ViewPlan:
        key = (self.fits, job.shape)
        cached = self.plans.get(job.spec.id)
        if cached is None or cached[0] != key:
            cached = self.plans[job.spec.id] = (key, _remembered(self.new_plan(job)))
        return cached[1]

    def new_plan(self, job: SimJob) -> ViewPlan:
        config = self.config
        s = job.spec
        limits = ShapeLimits(s.min_ps, s.max_ps, s.min_workers, s.max_workers)
        if self.oracle:  # it knows every shape's speed (the kind oracle: its kind's): nothing to explore
            among = self.truth.surfaces_of(job.kind) if config.policy == KIND_ORACLE else None
            plan = ViewPlan(
                oracle_speed(job, config, self.truth, among),
                limits,
                speed_at=oracle_speed_at(job, config, self.truth, among),
            )
        else:
            prior = None
            if config.fleet_prior and job.kind.name in self.kind_models:
                key = (job.kind.name, s.ps_cpu, s.worker_cpu)
                if key not in self.priors:
                    self.priors[key] = self.kind_models[job.kind.name].with_span(span_of(s, config))
                prior = self.priors[key]
            static = (s.static_ps, s.static_workers)
            # asked more than there is: the minimum
            start = static if span_of(s, config)(*static) <= config.nodes else None
            plan = plan_view(job.model, limits, job.shape, start, prior, draw=f"{config.seed}:{s.id}")
        return plan

    def view(self, job: SimJob, t: float) -> JobView:
        s = job.spec
        plan = self.plan_of(job)
        return JobView(
            id=s.id,
            **plan.fields(),
            ps_resources=Resources(cpu=s.ps_cpu, memory_gb=s.ps_memory_gb),
            worker_resources=worker_resources(s),
            remaining_samples=job.remaining,
            current=job.shape,
            static_shape=(s.static_ps, s.static_workers),
            arrival=s.arrival_s,
            waited_s=t - s.arrival_s if job.started is None else 0.0,
            batch_sizes=batch_candidates(job.kind.batch, s.max_batch),
            batch=job.batch,
            noise_scale=noise_scale_at(s, job.done_share) if s.noise_scale > 0 else None,
            age_s=t - s.arrival_s,
        )

    def schedule(self, active: dict[str, SimJob], tenant: dict[str, float], t: float, full: bool = True) -> None:
        """A round (elasticps.sched.rounds): a full one, or one that only starts waiting jobs."""
        config = self.config
        views = [self.view(j, t) for j in active.values()]
        cluster = self.cluster_view(tenant)
        t0 = time.perf_counter()
        decision, new_state = self.policy.decide(views if full else admission_only(views), cluster, self.state)
        self.state = state_after(self.state, new_state, full)
        current = {j: active[j].placement for j in active if active[j].shape}
        placed = place(views, decision, cluster, current, config.placement)
        decision = placed.shapes  # a running job whose new shape did not fit on the nodes kept its old one
        batches = batches_for(views, decision, config.objective)
        self.decision_times.append(time.perf_counter() - t0)
        left: dict[str, Resources] | None = None  # the room left once placed: worked out if a GPU job is spread
        by_id = {v.id: v for v in views}
        gpu_placements = self.gpu_placements
        for job in active.values():
            jid = job.spec.id
            where = placed.placement.get(jid)
            if not (job.kind.allreduce and where and jid in decision):
                continue
            spans = len(set(where.values()))
            gpu_placements[0] += 1
            if spans > span_of(job.spec, config)(*decision[jid]):
                gpu_placements[1] += 1
                left = left if left is not None else room_left(views, cluster, placed.placement)
                free = with_own_room(by_id[jid], where, left)
                gpu_placements[2] += (fewest_nodes(by_id[jid], *decision[jid], free) or spans) < spans
        for job in active.values():
            jid = job.spec.id
            new_shape = decision.get(jid)
            new_place = placed.placement.get(jid, {})
            if new_shape != job.shape or (new_shape and new_place != job.placement):
                if new_shape is not None:
                    if job.shape is not None:
                        job.rescales += 1
                    job.paused_until = t + config.rescale_pause_s
                    if job.started is None:
                        job.started = t
                job.shape, job.placement = new_shape, new_place
                job.history.append((t, *(new_shape or (0, 0))))
            batch = batches.get(jid, job.batch) if job.shape is not None else job.batch
            if batch != job.batch:  # at a step boundary: no new tasks, no pause
                job.batch, job.batch_changes = batch, job.batch_changes + 1
            self.speeds[jid] = self.speed_of(job)
            self.rates[jid] = self.speeds[jid] * job.efficiency()

    def forget(self, jid: str) -> None:
        """A job that completed: nothing of it is kept for the rounds."""
        self.rates.pop(jid, None)
        self.speeds.pop(jid, None)
        self.plans.pop(jid, None)

    def report(
        self, t: float, active: dict[str, SimJob], jobs: dict[str, SimJob], rng: random.Random, noise: float
    ) -> None:
        """Every running job reports its speed (times 1 + noise); its model, and each kind's fleet prior, are
        refitted."""
        self.fits += 1
        for job in active.values():
            speed = self.speeds.get(job.spec.id, 0.0)
            if job.shape is not None and speed > 0 and t >= job.paused_until:
                # what the runtime reports: samples/s at its batch
                observed = speed * max(0.05, 1.0 + rng.gauss(0.0, noise))
                nodes = len(set(job.placement.values())) or 1
                p, w = job.shape
                cross = None if job.kind.allreduce else cross_share(job.placement, job.kind.param_bytes, w)
                job.observations.append(Observation(p, w, observed, nodes, job.batch, cross))
                job.model.fit(job.observations[-50:])
        if self.config.fleet_prior:
            by_kind: dict[str, list[Observation]] = {}
            for j in jobs.values():
                by_kind.setdefault(j.kind.name, []).extend(j.observations[-PRIOR_PER_JOB:])
            for name, obs in by_kind.items():
                self.kind_models[name] = fleet_prior(KINDS[name].batch, obs)
            self.priors.clear()
