"""``GET /metrics``: the manager in Prometheus's exposition format, written by
``prometheus_client``.

Per scrape, from a :class:`MetricsSnapshot` of the manager's state (the manager
hands a function that reads one; nothing here knows the manager): jobs by state, each running job's tasks,
samples trained (a counter: steps x global batch) and applied rescales (a
counter, from the store's allocation history), and the cluster's CPUs
(capacity, held by other tenants, held by our jobs, free). Kept by the
manager as it runs: a histogram of the time each round takes to decide and
place, and of the pause each applied rescale cost its job (as the runtime
measured it). Each manager has its own registry, so several can live in one
process.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from elasticps.manager.runtime import JobStatus
from elasticps.manager.states import JobState
from elasticps.manager.store import JobRecord
from elasticps.sched import ClusterView, Resources

#: What ``GET /metrics`` answers with.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
DECISION_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
PAUSE_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
LAUNCH_BUCKETS = (0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0)


@dataclass(frozen=True)
class MetricsSnapshot:
    """The manager's state as one scrape reports it."""

    records: list[JobRecord]
    statuses: dict[str, JobStatus]  # the last poll of each running job
    rescales: dict[str, int]  # rescales applied to each running job
    held: dict[str, Resources]  # what our jobs hold per node
    cluster: ClusterView | None  # None: no cluster to read now


class ManagerMetrics:
    """A manager's registry: its decision-time histogram and a collector of its state."""

    def __init__(self, snapshot: Callable[[], MetricsSnapshot]) -> None:
        self.registry = CollectorRegistry()
        self.decision_seconds = Histogram(
            "elasticps_decision_seconds",
            "Time one round takes to run the policy and placement.",
            buckets=DECISION_BUCKETS,
            registry=self.registry,
        )
        self.rescale_pause_seconds = Histogram(
            "elasticps_rescale_pause_seconds",
            "Time training stood still for one applied rescale (the runtime's RescaleRecord.pause_s).",
            buckets=PAUSE_BUCKETS,
            registry=self.registry,
        )
        self.rescale_launch_seconds = Histogram(
            "elasticps_rescale_launch_seconds",
            "Time the new tasks of one applied rescale took to start while the job trained on "
            "(the runtime's RescaleRecord.launch_s, of rescales that started tasks).",
            buckets=LAUNCH_BUCKETS,
            registry=self.registry,
        )
        self.registry.register(_StateCollector(snapshot))

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class _StateCollector(Collector):
    def __init__(self, snapshot: Callable[[], MetricsSnapshot]) -> None:
        self.snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        snap = self.snapshot()
        jobs = GaugeMetricFamily("elasticps_jobs", "Jobs by state.", labels=["state"])
        counts: dict[str, int] = {}
        for rec in snap.records:
            counts[rec.state] = counts.get(rec.state, 0) + 1
        for state in JobState:
            jobs.add_metric([state.value], counts.get(state.value, 0))
        yield jobs

        batch = {rec.name: rec.info.batch_size for rec in snap.records if rec.info is not None}
        tasks = GaugeMetricFamily("elasticps_job_tasks", "Tasks of a running job.", labels=["job", "kind"])
        samples = CounterMetricFamily(
            "elasticps_job_samples", "Samples trained by a running job (steps x global batch).", labels=["job"]
        )
        rescales = CounterMetricFamily("elasticps_job_rescales", "Rescales applied to a job.", labels=["job"])
        for name, st in sorted(snap.statuses.items()):
            tasks.add_metric([name, "ps"], st.num_ps)
            tasks.add_metric([name, "worker"], st.num_workers)
            samples.add_metric([name], st.step * batch.get(name, 0))
            rescales.add_metric([name], snap.rescales.get(name, 0))
        yield tasks
        yield samples
        yield rescales

        view = snap.cluster
        if view is None:
            return
        cpus = GaugeMetricFamily("elasticps_cluster_cpus", "The cluster's CPUs.", labels=["kind"])
        held = sum(r.cpu for r in snap.held.values())  # the view counts only other tenants as used
        cpus.add_metric(["capacity"], view.capacity.cpu)
        cpus.add_metric(["others"], sum(n.used_by_others.cpu for n in view.nodes))
        cpus.add_metric(["ours"], held)
        cpus.add_metric(["free"], max(0.0, view.available.cpu - held))
        yield cpus
