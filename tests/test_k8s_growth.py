"""Kubernetes resource maths and the Ray cluster growth plan (pure code)."""

from __future__ import annotations

import dataclasses
from decimal import Decimal

import pytest

from elasticps.k8s import KubeCapacity, WorkerGroup, plan_replicas, pods_that_fit
from elasticps.k8s.resources import holds_resources, node_schedulable, parse_quantity, pod_request, to_resources
from elasticps.sched import PolicyState, Resources, make_policy
from tests.builders import make_cluster, make_job


@pytest.mark.parametrize(
    ("text", "value"),
    [("500m", "0.5"), ("2", "2"), ("1Gi", str(2**30)), ("1k", "1000"), ("1.5", "1.5"), ("100Mi", str(100 * 2**20)),
     ("1e3", "1000"), (3, "3"), ("250u", "0.00025")],
)  # fmt: skip
def test_quantities(text, value):
    assert parse_quantity(text) == Decimal(value)


def test_bad_quantity_is_named():
    with pytest.raises(ValueError, match="not a Kubernetes quantity: '12 cores'"):
        parse_quantity("12 cores")


def test_pod_request_sums_containers_takes_the_biggest_init_container_and_adds_overhead():
    spec = {
        "containers": [
            {"resources": {"requests": {"cpu": "500m", "memory": "1Gi"}}},
            {"resources": {"requests": {"cpu": "1", "nvidia.com/gpu": "1"}}},
            {"name": "no-requests"},
        ],
        "initContainers": [{"resources": {"requests": {"cpu": "2", "memory": "512Mi"}}}],
        "overhead": {"cpu": "100m"},
    }
    r = pod_request(spec)
    assert (r.cpu, r.gpu, r.memory_gb) == (pytest.approx(2.1), 1.0, pytest.approx(1.0))
    assert to_resources(None) == Resources()


def test_which_pods_hold_resources_and_which_nodes_take_pods():
    bound = {"spec": {"nodeName": "n1"}, "status": {"phase": "Running"}}
    assert holds_resources(bound)
    assert holds_resources({"spec": {"nodeName": "n1"}, "status": {"phase": "Pending"}})
    assert not holds_resources({"spec": {}, "status": {"phase": "Pending"}})  # not scheduled yet
    assert not holds_resources({"spec": {"nodeName": "n1"}, "status": {"phase": "Succeeded"}})
    assert not holds_resources({"spec": {"nodeName": "n1"}, "status": {"phase": "Failed"}})
    assert node_schedulable({"status": {}})
    assert not node_schedulable({"spec": {"unschedulable": True}})
    assert not node_schedulable({"status": {"conditions": [{"type": "Ready", "status": "False"}]}})
    assert node_schedulable({"status": {"conditions": [{"type": "Ready", "status": "True"}]}})


def test_pods_that_fit_counts_whole_pods_per_node_up_to_the_limit():
    pod = Resources(cpu=4, memory_gb=16)
    free = [Resources(cpu=9, memory_gb=64), Resources(cpu=16, memory_gb=20), Resources(cpu=3, memory_gb=64)]
    assert pods_that_fit(pod, free, 100) == 2 + 1 + 0
    assert pods_that_fit(pod, free, 2) == 2
    assert pods_that_fit(Resources(cpu=4, gpu=1), [Resources(cpu=64, gpu=2)], 10) == 2


GROUP = WorkerGroup("workers", replicas=2, min_replicas=1, max_replicas=6, pod=Resources(cpu=4))


def _plan(jobs, cluster, group=GROUP, pending=0, fit=10, idle=()):
    return plan_replicas(make_policy("greedy"), jobs, cluster, PolicyState(), group, pending, fit, list(idle))


def test_jobs_that_want_more_than_the_ray_cluster_has_ask_for_the_pods_they_would_use():
    # two 4-CPU Ray nodes; one job that can use 1 PS + 7 workers (8 CPUs more than there are)
    job = make_job("a", min_ps=1, max_ps=1, min_workers=1, max_workers=15, worker_resources=Resources(cpu=1))
    plan = _plan([job], make_cluster(n=2, cpu=4))
    assert plan.replicas == 2 + 2  # 16 tasks of 1 CPU: 8 on the two nodes there are, 8 on two new pods
    assert plan.workers_to_delete == ()
    # Kubernetes has room for one more pod only; the group's max caps it too
    assert _plan([job], make_cluster(n=2, cpu=4), fit=1).replicas == 3
    capped = dataclasses.replace(GROUP, max_replicas=2)
    assert _plan([job], make_cluster(n=2, cpu=4), group=capped).replicas == 2


def test_pods_already_asked_for_are_not_asked_for_twice():
    job = make_job("a", min_ps=1, max_ps=1, min_workers=1, max_workers=15, worker_resources=Resources(cpu=1))
    # replicas=4, but only 2 pods are in Ray yet: the 2 pending ones already cover the need
    group = WorkerGroup("workers", replicas=4, min_replicas=1, max_replicas=6, pod=Resources(cpu=4))
    assert _plan([job], make_cluster(n=2, cpu=4), group=group, pending=2).replicas == 4


def test_idle_pods_are_given_back_down_to_min_replicas_when_nothing_needs_them():
    small = make_job("a", min_ps=1, max_ps=1, min_workers=1, max_workers=1, worker_resources=Resources(cpu=1))
    group = WorkerGroup("workers", replicas=3, min_replicas=1, max_replicas=6, pod=Resources(cpu=4))
    plan = _plan([small], make_cluster(n=3, cpu=4), group=group, idle=["pod-c", "pod-b"])
    assert (plan.replicas, plan.workers_to_delete) == (1, ("pod-b", "pod-c"))
    group_min3 = WorkerGroup("workers", replicas=3, min_replicas=3, max_replicas=6, pod=Resources(cpu=4))
    assert _plan([small], make_cluster(n=3, cpu=4), group=group_min3, idle=["pod-b"]).workers_to_delete == ()
    # an unneeded pending pod goes first, before an idle one
    plan = _plan([small], make_cluster(n=2, cpu=4), group=group, pending=1, idle=["pod-b"])
    assert (plan.replicas, plan.workers_to_delete) == (1, ("pod-b",))


def test_a_watch_that_fails_is_said_once_and_listed_again_ever_less_often(caplog):
    """An API server that refuses every connection (nothing listens): one
    warning per watch, then its later failures at debug level, the pauses
    between lists doubling (1, 2, 4 s ...), not a warning a second."""
    import logging
    import time

    from kubernetes import client

    config = client.Configuration()
    config.host = "http://127.0.0.1:9"  # the discard port: nothing listens there
    cap = KubeCapacity(client.ApiClient(config))
    with caplog.at_level(logging.DEBUG, logger="elasticps.k8s"):
        cap.start()
        time.sleep(6.5)  # failures at about 0, 1 and 3 s, the next at 7 (every second: 7 of them)
        cap.stop()
    for kind in ("nodes", "pods"):
        said = [r for r in caplog.records if r.getMessage().startswith(f"watching {kind} failed")]
        assert [r.levelno for r in said][:1] == [logging.WARNING] and len(said) >= 2, [r.getMessage() for r in said]
        assert all(r.levelno == logging.DEBUG for r in said[1:])
        assert 2 <= sum(e.startswith(f"{kind}: ") for e in cap.errors) <= 4, cap.errors


def test_a_watch_refused_after_every_good_list_still_backs_off(caplog):
    """``list`` allowed and ``watch`` refused (an RBAC role that grants only
    ``list``): each list works, each watch fails at once. A good list alone is
    no recovery: one warning, and pauses that double, not two lines a second."""
    import logging
    import threading
    import time
    from types import SimpleNamespace

    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    calls = []

    def lister(**kw):
        calls.append(time.monotonic())
        if kw.get("watch"):
            raise ApiException(status=403, reason="Forbidden")
        return SimpleNamespace(data=b'{"items": [], "metadata": {"resourceVersion": "1"}}')

    cap = KubeCapacity(client.ApiClient(client.Configuration()))
    with caplog.at_level(logging.DEBUG, logger="elasticps.k8s"):
        thread = threading.Thread(target=cap._run, args=("pods", lister), daemon=True)
        thread.start()
        time.sleep(4.5)  # watches refused at about 0, 1 and 3 s (every second: 5 of them)
        cap._stop.set()
        thread.join(5)
    said = [(r.levelno, r.getMessage()) for r in caplog.records if r.getMessage().startswith("watching pods")]
    assert [level for level, _ in said].count(logging.WARNING) == 1, said
    assert said[0][1].startswith("watching pods failed (403 Forbidden)"), said
    assert 2 <= len(calls) // 2 <= 3, len(calls)  # a list and a watch each time
