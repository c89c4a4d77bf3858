"""The discrete-event simulation.

Ground truth, which the policy never sees: by default (``truth="optimus"``)
a job of kind k at shape (p, w) placed with cross-node fraction c of its PS
traffic runs at

    samples/s = M / (t0*M/w + t1 + t2*(w/p)*(c + (1 - c)*LOCAL) + t3*w + t4*p)

(the Optimus form, the PS-traffic term cheaper by ``local_traffic_factor`` for
same-node pairs); ``truth="grid"`` or ``"mixed"``: surfaces that are not the
form the model fits (:mod:`elasticps.sim.truth`). The ``oracle`` policy and
the lower bound use the same truth; the oracle decides with that function (tasks
assumed spread over as few nodes as hold them) instead of fitted models.
Each interval a running job reports that speed times
(1 + noise), and the policy's :class:`~elasticps.sched.SpeedModel` of the job is
refitted from those reports, as the live manager does. With ``fleet_prior``, a
job whose own model is not yet confident is judged by a model fitted on the
reports of every job of the same kind (the same model trained before), once
that pooled model is confident; the ground truth is never used. Events: arrivals,
completions, reports, scheduling ticks, other tenants' load changing. As in
the live manager (``Manager.run``), a full round decides at each tick and at
once when the tenants' load changes, a round that restarts the interval (the
next tick comes a whole interval after it; the reports keep their own
interval), and a round that only starts waiting jobs runs at once when a job
arrives or ends (:mod:`elasticps.sched.rounds`; ``event_rounds=False``: no such rounds).

Work counts in samples at the kind's batch M0. A job with an adaptive batch
trains at the batch the policy picks for its shape (:func:`batches_for`) and
progresses at samples/s x E(M), E from its noise scale, which grows as the job
progresses (:func:`~elasticps.sim.workload.noise_scale_at`); the policy sees
the noise scale of now (the runtime measures it every epoch).

Why one long module: :func:`simulate` is one event loop whose rounds, reports
and completions read and change the same jobs, clock and policy state, in an
order that is the model; what stands apart lives elsewhere (workloads, truths,
the bound, seeds, plots).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import random
import statistics
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from elasticps.errors import ConfigError
from elasticps.placement import (
    cross_node_bytes_per_step,
    cross_share,
    fewest_nodes,
    place,
    room_left,
    with_own_room,
)
from elasticps.sched import ClusterView, JobView, NodeView, Observation, PolicyState, Resources, SpeedModel
from elasticps.sched.fit import describe, fit_problem
from elasticps.sched.goodput import batch_candidates, statistical_efficiency
from elasticps.sched.objectives import DEFAULT_EFFICIENCY_THRESHOLD, batches_for
from elasticps.sched.policies import make_policy, options_for
from elasticps.sched.rounds import admission_only, state_after
from elasticps.sched.speed import PRIOR_PER_JOB, fleet_prior
from elasticps.sched.synthetic import ModelKind, kind_speed
from elasticps.sched.view import ShapeLimits, ViewPlan, plan_view
from elasticps.sim.bound import lower_bound
from elasticps.sim.truth import GRID_PATH, OPTIMUS, OPTIMUS_TRUTH, Truth, busiest_on_a_node, make_truth
from elasticps.sim.workload import KINDS, WorkloadJob, job_speed_factor, noise_scale_at

#: ``--policy oracle``: the elastic policy's decisions, admission and placement,
#: made knowing each job's true speed (a bound on what learning the speeds can give).
ORACLE = "oracle"


@dataclass(frozen=True)
class SimConfig:
    nodes: int = 64
    node_cpu: float = 32.0
    node_memory_gb: float = 256.0
    node_gpu: float = 0.0
    interval_s: float = 300.0
    rescale_pause_s: float = 30.0
    policy: str = "elastic"
    objective: str = "goodput"
    efficiency_threshold: float = DEFAULT_EFFICIENCY_THRESHOLD
    joint_trades: int = 0  # the elastic policy's joint search: trades a round may make (0: none)
    placement: str = "locality"
    noise: float = 0.05
    local_traffic_factor: float = 0.25
    tenant_change_s: float = 3600.0
    tenant_max_share: float = 0.5
    fleet_prior: bool = True
    job_speed_spread: float = 0.0  # jobs of one kind differ: each job's speed x lognormal(0, this)
    seed: int = 0
    truth: str = OPTIMUS  # elasticps.sim.truth.TRUTHS: the ground truth's speed surfaces
    truth_grid: str = ""  # a `bench shapes` JSON the grid surface follows ("": the project's own, GRID_PATH)
    # A round that starts waiting jobs when a job arrives or ends, as the live manager's (elasticps.sched.rounds);
    # False: rounds only every interval and when tenants change (how the simulator decided before).
    event_rounds: bool = True


@dataclass
class _Job:
    spec: WorkloadJob
    kind: ModelKind
    remaining: float
    model: SpeedModel
    observations: list[Observation] = field(default_factory=list)
    shape: tuple[int, int] | None = None
    placement: dict[str, str] = field(default_factory=dict)
    paused_until: float = 0.0
    started: float | None = None
    finished: float | None = None
    rescales: int = 0
    history: list[tuple[float, int, int]] = field(default_factory=list)
    batch: int = 0  # the global batch it trains at
    batch_changes: int = 0
    speed_factor: float = 1.0  # this job's speed against its kind's (SimConfig.job_speed_spread)
    surface: str = OPTIMUS  # the truth surface its speed follows

    @property
    def done_share(self) -> float:
        return 1.0 - self.remaining / self.spec.samples

    def efficiency(self) -> float:
        """E of its batch now, relative to the kind's batch."""
        if self.batch == self.kind.batch:
            return 1.0
        return statistical_efficiency(self.batch, noise_scale_at(self.spec, self.done_share), self.kind.batch)


@dataclass
class SimResult:
    config: dict[str, Any]
    metrics: dict[str, Any]
    jct_s: list[float]
    utilization: list[tuple[float, float]]
    allocations: dict[str, list[tuple[float, int, int]]]

    def to_dict(self, with_series: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {"config": self.config, **self.metrics}
        if with_series:
            out.update(jct_s=self.jct_s, utilization=self.utilization, allocations=self.allocations)
        return out


def true_speed(
    job: _Job, p: int, w: int, placement: dict[str, str], local_factor: float, truth: Truth = OPTIMUS_TRUTH
) -> float:
    """Raw samples/s at the job's batch, as placed."""
    if job.kind.allreduce:
        nodes = len(set(placement.values())) if placement else w
        return job.speed_factor * kind_speed(job.kind, p, w, 1.0 - 1.0 / max(1, nodes), local_factor)
    if w < 1 or p < 1:
        return 0.0
    cross = cross_share(placement, job.kind.param_bytes, w)
    ps_nodes = Counter(n for task, n in placement.items() if task.startswith("ps-"))
    busiest = max(ps_nodes.values()) if ps_nodes else p
    return job.speed_factor * truth.speed(job.surface, job.kind, p, w, cross, local_factor, job.batch, busiest)


def spanned_speed(
    kind: ModelKind,
    p: int,
    w: int,
    nodes: int,
    local_factor: float,
    batch: int | None = None,
    truth: Truth = OPTIMUS_TRUTH,
    surface: str = OPTIMUS,
) -> float:
    """Ground-truth samples/s of a shape whose tasks are spread evenly over
    ``nodes`` nodes: a worker's PS traffic crosses nodes for the 1 - 1/nodes of
    PS shards that are elsewhere."""
    cross = 1.0 - 1.0 / max(1, nodes)
    return truth.speed(surface, kind, p, w, cross, local_factor, batch, busiest_on_a_node(p, nodes))


def _remembered(plan: ViewPlan) -> ViewPlan:
    """``plan`` with each speed it works out kept: the rounds between two refits ask for the same shapes."""
    return dataclasses.replace(
        plan,
        speed=functools.cache(plan.speed),
        speed_at=None if plan.speed_at is None else functools.cache(plan.speed_at),
        sd=None if plan.sd is None else functools.cache(plan.sd),
    )


def _worker_resources(spec: WorkloadJob) -> Resources:
    return Resources(cpu=spec.worker_cpu, gpu=spec.worker_gpu, memory_gb=spec.worker_memory_gb)


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    s = sorted(values)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


def check_fits(workload: list[WorkloadJob], config: SimConfig) -> None:
    """Raise :class:`ConfigError` naming the first job that could never run on
    the empty modelled cluster (it would wait for ever)."""
    capacity = Resources(cpu=config.node_cpu, gpu=config.node_gpu, memory_gb=config.node_memory_gb)
    cluster = ClusterView(tuple(NodeView(f"n{i:04d}", capacity) for i in range(config.nodes)))
    for spec in workload:
        view = JobView(
            id=spec.id,
            speed=lambda p, w: 0.0,
            min_ps=spec.min_ps,
            max_ps=spec.max_ps,
            min_workers=spec.min_workers,
            max_workers=spec.max_workers,
            ps_resources=Resources(cpu=spec.ps_cpu, memory_gb=spec.ps_memory_gb),
            worker_resources=_worker_resources(spec),
        )
        problem = fit_problem(view, cluster)
        static = view.resources(spec.static_ps, spec.static_workers)
        if problem is None and config.policy == "static" and not static.fits_in(cluster.capacity):
            problem = (
                f"cannot fit: its static shape needs {describe(static)}, the cluster has {describe(cluster.capacity)}"
            )
        if problem is not None:
            raise ConfigError(
                f"job {spec.id} {problem} ({config.nodes} nodes x {config.node_cpu:g} CPU, "
                f"{config.node_memory_gb:g} GB memory)"
            )


def simulate(workload: list[WorkloadJob], config: SimConfig, progress: Any = None) -> SimResult:
    """Run ``workload`` under ``config``; :class:`ConfigError` at once if a job
    could never fit."""
    if not config.job_speed_spread >= 0:
        raise ConfigError(f"job speed spread is a lognormal sigma, at least 0, got {config.job_speed_spread:g}")
    check_fits(workload, config)
    if config.truth_grid and config.truth == OPTIMUS:
        raise ConfigError("a truth grid is read only by the grid and mixed truths, not by optimus")
    truth = make_truth(config.truth, config.seed, config.truth_grid or GRID_PATH)
    noise = truth.noise(config.noise)
    rng = random.Random(config.seed)
    oracle = config.policy == ORACLE
    # the oracle decides with the elastic policy's code; only what it knows differs
    name = "elastic" if oracle else config.policy
    settings = {
        "rescale_cost_s": config.rescale_pause_s,
        "efficiency_threshold": config.efficiency_threshold,
        "joint_trades": config.joint_trades,
    }
    policy = make_policy(name, objective=config.objective, **options_for(name, settings))
    state = PolicyState()
    capacity = Resources(cpu=config.node_cpu, gpu=config.node_gpu, memory_gb=config.node_memory_gb)
    tenant = {f"n{i:04d}": 0.0 for i in range(config.nodes)}
    arrivals = sorted(workload, key=lambda j: (j.arrival_s, j.id))
    jobs: dict[str, _Job] = {}
    active: dict[str, _Job] = {}
    t = 0.0
    next_tick = 0.0  # the next full round: every interval, restarted by a round on the tenants' change
    next_report = 0.0  # the running jobs' next speed reports: every interval, whatever the rounds
    next_tenant = config.tenant_change_s if config.tenant_max_share > 0 else math.inf
    ai = 0
    decision_times: list[float] = []
    util_series: list[tuple[float, float]] = []
    busy_cpu_s = avail_cpu_s = 0.0
    cross_bytes = 0.0
    done = 0
    speeds: dict[str, float] = {}  # raw samples/s at the job's batch, set when it is scheduled
    rates: dict[str, float] = {}  # progress: those samples/s x E(M) at that moment, in samples at the kind's batch
    # all-reduce jobs placed; of them, spread over more nodes than their shape needs;
    # and of those, spread while the room left (with their own) held them on fewer
    gpu_placements = [0, 0, 0]

    def cluster_view() -> ClusterView:
        return ClusterView(tuple(NodeView(n, capacity, Resources(cpu=used)) for n, used in tenant.items()))

    def speed_of(job: _Job) -> float:
        """Raw samples/s at the job's batch, as placed."""
        if job.shape is None:
            return 0.0
        return true_speed(job, *job.shape, job.placement, config.local_traffic_factor, truth)

    kind_models: dict[str, SpeedModel] = {}  # the fleet prior: one model per kind, from every job's reports

    def span_of(spec: WorkloadJob):
        """How many nodes a shape's tasks need at least: what placement aims for."""

        def span(p: int, w: int) -> int:
            need = [(spec.ps_cpu * p + spec.worker_cpu * w) / config.node_cpu]
            if spec.worker_gpu > 0:
                need.append(spec.worker_gpu * w / config.node_gpu if config.node_gpu > 0 else math.inf)
            return max(1, math.ceil(max(need) - 1e-9))

        return span

    def oracle_speed(job: _Job):
        """The job's true speed, with its tasks over as few nodes as they fit in."""
        span = span_of(job.spec)

        def speed(p: int, w: int) -> float:
            return job.speed_factor * spanned_speed(
                job.kind, p, w, span(p, w), config.local_traffic_factor, None, truth, job.surface
            )

        return speed

    def oracle_speed_at(job: _Job):
        span = span_of(job.spec)

        def speed_at(p: int, w: int, batch: int) -> float:
            return job.speed_factor * spanned_speed(
                job.kind, p, w, span(p, w), config.local_traffic_factor, batch, truth, job.surface
            )

        return speed_at

    priors: dict[tuple[str, float, float], SpeedModel] = {}  # a kind's model, for jobs of one task size

    # A job's plan changes only when its model or its shape does: models are refitted at the reports (``fits``
    # counts them), so the rounds between two reports reuse each job's plan and the speeds it worked out.
    plans: dict[str, tuple[tuple[int, tuple[int, int] | None], ViewPlan]] = {}
    fits = 0

    def plan_of(job: _Job) -> ViewPlan:
        key = (fits, job.shape)
        cached = plans.get(job.spec.id)
        if cached is None or cached[0] != key:
            cached = plans[job.spec.id] = (key, _remembered(new_plan(job)))
        return cached[1]

    def new_plan(job: _Job) -> ViewPlan:
        s = job.spec
        limits = ShapeLimits(s.min_ps, s.max_ps, s.min_workers, s.max_workers)
        if oracle:  # it knows every shape's speed: nothing to explore
            plan = ViewPlan(oracle_speed(job), limits, speed_at=oracle_speed_at(job))
        else:
            prior = None
            if config.fleet_prior and job.kind.name in kind_models:
                key = (job.kind.name, s.ps_cpu, s.worker_cpu)
                if key not in priors:
                    priors[key] = kind_models[job.kind.name].with_span(span_of(s))
                prior = priors[key]
            static = (s.static_ps, s.static_workers)
            start = static if span_of(s)(*static) <= config.nodes else None  # asked more than there is: the minimum
            plan = plan_view(job.model, limits, job.shape, start, prior)
        return plan

    def view(job: _Job) -> JobView:
        s = job.spec
        plan = plan_of(job)
        return JobView(
            id=s.id,
            **plan.fields(),
            ps_resources=Resources(cpu=s.ps_cpu, memory_gb=s.ps_memory_gb),
            worker_resources=_worker_resources(s),
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

    def schedule(full: bool = True) -> None:
        """A round (elasticps.sched.rounds): a full one, or one that only starts waiting jobs."""
        nonlocal state
        views = [view(j) for j in active.values()]
        cluster = cluster_view()
        t0 = time.perf_counter()
        decision, new_state = policy.decide(views if full else admission_only(views), cluster, state)
        state = state_after(state, new_state, full)
        current = {j: active[j].placement for j in active if active[j].shape}
        placed = place(views, decision, cluster, current, config.placement)
        decision = placed.shapes  # a running job whose new shape did not fit on the nodes kept its old one
        batches = batches_for(views, decision, config.objective)
        decision_times.append(time.perf_counter() - t0)
        left: dict[str, Resources] | None = None  # the room left once placed: worked out if a GPU job is spread
        by_id = {v.id: v for v in views}
        for job in active.values():
            jid = job.spec.id
            where = placed.placement.get(jid)
            if not (job.kind.allreduce and where and jid in decision):
                continue
            spans = len(set(where.values()))
            gpu_placements[0] += 1
            if spans > span_of(job.spec)(*decision[jid]):
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
            speeds[jid] = speed_of(job)
            rates[jid] = speeds[jid] * job.efficiency()

    while done < len(arrivals):
        # the next event
        t_next = min(next_tick, next_report, next_tenant, arrivals[ai].arrival_s if ai < len(arrivals) else math.inf)
        for job in active.values():
            r = rates.get(job.spec.id, 0.0)
            if r > 0:
                t_next = min(t_next, max(t, job.paused_until) + job.remaining / r)
        # progress to it
        dt = t_next - t
        used = 0.0
        for job in active.values():
            if job.shape is None:
                continue
            s = job.spec
            used += s.ps_cpu * job.shape[0] + s.worker_cpu * job.shape[1]
            run = max(0.0, t_next - max(t, job.paused_until))
            r = rates.get(s.id, 0.0)
            job.remaining -= r * run
            steps_per_s = speeds.get(s.id, 0.0) / job.batch
            cross_bytes += steps_per_s * run * cross_node_bytes_per_step(job.placement, job.kind.param_bytes)
        avail = sum(config.node_cpu - u for u in tenant.values())
        busy_cpu_s += used * dt
        avail_cpu_s += avail * dt
        t = t_next
        events = False  # an arrival or a completion: the live manager decides at once
        # completions
        for jid in [
            j for j, job in active.items() if job.shape is not None and job.remaining <= 1e-6 * job.spec.samples
        ]:
            job = active.pop(jid)
            job.finished, job.shape, job.placement = t, None, {}
            job.history.append((t, 0, 0))
            rates.pop(jid, None)
            speeds.pop(jid, None)
            plans.pop(jid, None)
            done += 1
            events = True
        while ai < len(arrivals) and arrivals[ai].arrival_s <= t:
            spec = arrivals[ai]
            kind = KINDS[spec.kind]
            job = _Job(spec, kind, spec.samples, SpeedModel(kind.batch, span=span_of(spec)), batch=kind.batch)
            job.speed_factor = job_speed_factor(spec, config.seed, config.job_speed_spread)
            job.surface = truth.surface(spec.id, kind)
            jobs[spec.id] = active[spec.id] = job
            ai += 1
            events = True
        if t >= next_tenant:
            for n in tenant:
                share = rng.uniform(0, config.tenant_max_share) if rng.random() < 0.5 else 0.0
                tenant[n] = math.floor(share * config.node_cpu / 4) * 4
            next_tenant = t + rng.expovariate(1.0 / config.tenant_change_s)
            next_tick = t  # room changed: a full round now, and the interval runs from it (Manager.run)
        if events and config.event_rounds and t < next_tick and done < len(arrivals):
            schedule(full=False)
        if t >= next_report:
            next_report = t + config.interval_s
            fits += 1
            for job in active.values():
                speed = speeds.get(job.spec.id, 0.0)
                if job.shape is not None and speed > 0 and t >= job.paused_until:
                    # what the runtime reports: samples/s at its batch
                    observed = speed * max(0.05, 1.0 + rng.gauss(0.0, noise))
                    nodes = len(set(job.placement.values())) or 1
                    p, w = job.shape
                    cross = None if job.kind.allreduce else cross_share(job.placement, job.kind.param_bytes, w)
                    job.observations.append(Observation(p, w, observed, nodes, job.batch, cross))
                    job.model.fit(job.observations[-50:])
            if config.fleet_prior:
                by_kind: dict[str, list[Observation]] = {}
                for j in jobs.values():
                    by_kind.setdefault(j.kind.name, []).extend(j.observations[-PRIOR_PER_JOB:])
                for name, obs in by_kind.items():
                    kind_models[name] = fleet_prior(KINDS[name].batch, obs)
                priors.clear()
        if t >= next_tick:
            schedule()
            util_series.append((t, used / avail if avail > 0 else 0.0))
            next_tick = t + config.interval_s
            if progress is not None:
                progress(t, done, len(arrivals))

    jct = [j.finished - j.spec.arrival_s for j in jobs.values() if j.finished is not None]
    metrics = {
        "jobs": len(jct),
        "avg_jct_s": statistics.fmean(jct) if jct else math.nan,
        "p50_jct_s": _percentile(jct, 0.5),
        "p99_jct_s": _percentile(jct, 0.99),
        "makespan_s": t,
        "mean_utilization": busy_cpu_s / avail_cpu_s if avail_cpu_s > 0 else 0.0,
        "cross_node_bytes": cross_bytes,
        "rescales": sum(j.rescales for j in jobs.values()),
        "batch_changes": sum(j.batch_changes for j in jobs.values()),
        "cpu_hours": busy_cpu_s / 3600.0,
        "decisions": len(decision_times),
        "decision_median_ms": statistics.median(decision_times) * 1e3 if decision_times else 0.0,
        "decision_p99_ms": _percentile(decision_times, 0.99) * 1e3,
    }
    bound = lower_bound(
        workload, config.nodes, capacity, config.local_traffic_factor,
        lambda spec: job_speed_factor(spec, config.seed, config.job_speed_spread), truth,
    )  # fmt: skip
    metrics["lower_bound_s"] = bound.avg_jct_s
    metrics["gap_to_bound"] = metrics["avg_jct_s"] / bound.avg_jct_s - 1.0
    metrics["lower_bound"] = bound.to_dict()
    if gpu_placements[0]:
        metrics["gpu_jobs_over_spread"] = gpu_placements[1] / gpu_placements[0]
        metrics["gpu_jobs_avoidably_spread"] = gpu_placements[2] / gpu_placements[0]
    cfg = {k: getattr(config, k) for k in config.__dataclass_fields__}
    return SimResult(cfg, metrics, jct, util_series, {j: jobs[j].history for j in jobs})


def gain_captured(results: dict[str, SimResult]) -> dict[str, float]:
    """Per policy, (static - policy) / (static - oracle) of the average JCT: the
    share of the gain over static that knowing every speed gives, captured
    (needs ``static`` and ``oracle`` among the results)."""
    if "static" not in results or ORACLE not in results:
        return {}
    static, best = results["static"].metrics["avg_jct_s"], results[ORACLE].metrics["avg_jct_s"]
    if static - best <= 0:
        return {}
    return {name: (static - r.metrics["avg_jct_s"]) / (static - best) for name, r in results.items()}
