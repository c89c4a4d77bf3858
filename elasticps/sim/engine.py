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

This module is the event loop: the order of the events each moment, which is
the model. The settings are in :mod:`elasticps.sim.config`, a job and its true
speed in :mod:`elasticps.sim.jobs`, the rounds and the reports the policy
learns from in :mod:`elasticps.sim.scheduling`, the result in
:mod:`elasticps.sim.results` (and workloads, truths, the bound, seeds and
plots in theirs).
"""

from __future__ import annotations

import math
import random
import statistics
from typing import Any

from elasticps.errors import ConfigError
from elasticps.placement import cross_node_bytes_per_step
from elasticps.sched import Resources, SpeedModel
from elasticps.sim.bound import lower_bound
from elasticps.sim.config import SimConfig, check_fits
from elasticps.sim.jobs import SimJob, span_of
from elasticps.sim.results import SimResult, percentile
from elasticps.sim.scheduling import Scheduler
from elasticps.sim.truth import GRID_PATH, OPTIMUS, make_truth
from elasticps.sim.workload import KINDS, WorkloadJob, job_speed_factor


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
    capacity = Resources(cpu=config.node_cpu, gpu=config.node_gpu, memory_gb=config.node_memory_gb)
    sched = Scheduler(config, truth, capacity)
    tenant = {f"n{i:04d}": 0.0 for i in range(config.nodes)}
    arrivals = sorted(workload, key=lambda j: (j.arrival_s, j.id))
    jobs: dict[str, SimJob] = {}
    active: dict[str, SimJob] = {}
    t = 0.0
    next_tick = 0.0  # the next full round: every interval, restarted by a round on the tenants' change
    next_report = 0.0  # the running jobs' next speed reports: every interval, whatever the rounds
    next_tenant = config.tenant_change_s if config.tenant_max_share > 0 else math.inf
    ai = 0
    util_series: list[tuple[float, float]] = []
    busy_cpu_s = avail_cpu_s = 0.0
    cross_bytes = 0.0
    done = 0

    while done < len(arrivals):
        # the next event
        t_next = min(next_tick, next_report, next_tenant, arrivals[ai].arrival_s if ai < len(arrivals) else math.inf)
        for job in active.values():
            r = sched.rates.get(job.spec.id, 0.0)
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
            r = sched.rates.get(s.id, 0.0)
            job.remaining -= r * run
            steps_per_s = sched.speeds.get(s.id, 0.0) / job.batch
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
            sched.forget(jid)
            done += 1
            events = True
        while ai < len(arrivals) and arrivals[ai].arrival_s <= t:
            spec = arrivals[ai]
            kind = KINDS[spec.kind]
            job = SimJob(spec, kind, spec.samples, SpeedModel(kind.batch, span=span_of(spec, config)), batch=kind.batch)
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
            sched.schedule(active, tenant, t, full=False)
        if t >= next_report:
            next_report = t + config.interval_s
            sched.report(t, active, jobs, rng, noise)
        if t >= next_tick:
            sched.schedule(active, tenant, t)
            util_series.append((t, used / avail if avail > 0 else 0.0))
            next_tick = t + config.interval_s
            if progress is not None:
                progress(t, done, len(arrivals))

    jct = [j.finished - j.spec.arrival_s for j in jobs.values() if j.finished is not None]
    metrics = {
        "jobs": len(jct),
        "avg_jct_s": statistics.fmean(jct) if jct else math.nan,
        "p50_jct_s": percentile(jct, 0.5),
        "p99_jct_s": percentile(jct, 0.99),
        "makespan_s": t,
        "mean_utilization": busy_cpu_s / avail_cpu_s if avail_cpu_s > 0 else 0.0,
        "cross_node_bytes": cross_bytes,
        "rescales": sum(j.rescales for j in jobs.values()),
        "batch_changes": sum(j.batch_changes for j in jobs.values()),
        "cpu_hours": busy_cpu_s / 3600.0,
        "decisions": len(sched.decision_times),
        "decision_median_ms": statistics.median(sched.decision_times) * 1e3 if sched.decision_times else 0.0,
        "decision_p99_ms": percentile(sched.decision_times, 0.99) * 1e3,
    }
    bound = lower_bound(
        workload, config.nodes, capacity, config.local_traffic_factor,
        lambda spec: job_speed_factor(spec, config.seed, config.job_speed_spread), truth,
    )  # fmt: skip
    metrics["lower_bound_s"] = bound.avg_jct_s
    metrics["gap_to_bound"] = metrics["avg_jct_s"] / bound.avg_jct_s - 1.0
    metrics["lower_bound"] = bound.to_dict()
    gpu_placements = sched.gpu_placements
    if gpu_placements[0]:
        metrics["gpu_jobs_over_spread"] = gpu_placements[1] / gpu_placements[0]
        metrics["gpu_jobs_avoidably_spread"] = gpu_placements[2] / gpu_placements[0]
    cfg = {k: getattr(config, k) for k in config.__dataclass_fields__}
    return SimResult(cfg, metrics, jct, util_series, {j: jobs[j].history for j in jobs})
