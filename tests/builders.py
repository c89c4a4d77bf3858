"""Builders for scheduler and placement tests: ``make_job(...)``, ``make_node(...)``."""

from __future__ import annotations

from elasticps.sched import ClusterView, JobView, NodeView, Resources


def optimus_speed(batch=256, t=(0.002, 0.01, 0.03, 0.001, 0.002)):
    """Ground truth in the Optimus sync form (samples/s)."""

    def speed(p: int, w: int) -> float:
        if w < 1 or p < 1:
            return 0.0
        return batch / (t[0] * batch / w + t[1] + t[2] * w / p + t[3] * w + t[4] * p)

    return speed


def make_job(job_id="j", speed=None, **kw) -> JobView:
    return JobView(id=job_id, speed=speed or optimus_speed(), **kw)


def make_node(name="n", cpu=8.0, gpu=0.0, mem=64.0, others_cpu=0.0) -> NodeView:
    return NodeView(name, Resources(cpu, gpu, mem), Resources(cpu=others_cpu))


def make_cluster(n=4, cpu=8.0, others_cpu=0.0) -> ClusterView:
    return ClusterView(tuple(make_node(f"n{i}", cpu=cpu, others_cpu=others_cpu) for i in range(n)))
