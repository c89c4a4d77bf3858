"""The runtime on a real multi-raylet Ray cluster (head + 3 nodes on this machine)."""

from __future__ import annotations

import pytest

from elasticps.examples import digits
from elasticps.runtime import relative_error, train_single_process
from tests.helpers import make_job, run_until_applied

pytestmark = pytest.mark.slow
TOL = 1e-5


def test_exact_across_nodes_with_pins_and_measured_traffic(ray_cluster):
    _cluster, (n1, n2, n3) = ray_cluster
    a, b, c = n1.node_id, n2.node_id, n3.node_id
    program = digits.program(epochs=50)
    numel = sum(p.numel() for p in program.build_model().parameters())
    job = make_job(1, 1, program)
    job = type(job)(program, job.config, 1, 1, placement={"ps-0": a, "worker-0": b})
    job.run(max_steps=4)
    assert job.placement() == {"ps-0": a, "worker-0": b}
    report = job.report()
    # 4 steps x (numel float32) pulled a -> b and pushed b -> a; nothing else moved.
    assert report.bytes_between_nodes == {f"{a}->{b}": 4 * 4 * numel, f"{b}->{a}": 4 * 4 * numel}
    assert report.cross_node_bytes == 2 * 4 * 4 * numel
    assert (report.windows[-1].nodes, report.windows[-1].cross) == (2, 1.0)  # every byte crossed

    pins = {"ps-0": a, "ps-1": b, "worker-0": b, "worker-1": c, "worker-2": c}
    run_until_applied(job, job.rescale(2, 3, pins))
    assert job.placement() == pins
    before = dict(job.report().bytes_between_nodes)
    job.run(max_steps=3)
    report = job.report()
    moved = {k: v - before.get(k, 0) for k, v in report.bytes_between_nodes.items()}
    crossed = sum(v for k, v in moved.items() if k.split("->")[0] != k.split("->")[1]) / sum(moved.values())
    assert 0 < crossed < 1  # ps-1 and worker-0 share node b
    assert (report.windows[-1].nodes, report.windows[-1].cross) == (3, pytest.approx(crossed))
    run_until_applied(job, job.rescale(1, 2, {"ps-0": c, "worker-0": c, "worker-1": c}))
    assert set(job.placement().values()) == {c}
    job.run(max_steps=3)
    assert (job.report().windows[-1].nodes, job.report().windows[-1].cross) == (1, 0.0)

    ref = train_single_process(program, max_steps=job.step)
    assert relative_error(job.parameters(), ref.params) < TOL
    job.shutdown()


def test_losing_a_whole_node_recovers_and_stays_exact(ray_cluster, tmp_path):
    cluster, (_n1, n2, n3) = ray_cluster
    program = digits.program(epochs=2)
    job = make_job(1, 2, program, checkpoint_dir=str(tmp_path), checkpoint_every_steps=5, liveness_timeout_s=5.0)
    job = type(job)(
        program, job.config, 1, 2, placement={"ps-0": n3.node_id, "worker-0": n3.node_id, "worker-1": n2.node_id}
    )
    job.run(max_steps=8)
    cluster.remove_node(n3, allow_graceful=False)  # the raylet and every process on it die
    report = job.run()
    assert report.state == "finished"
    assert any("restored from checkpoint at step 5" in e for e in report.events), report.events
    assert any("worker(s) died" in e for e in report.events)
    assert n3.node_id not in job.placement().values()
    ref = train_single_process(program)
    assert relative_error(job.parameters(), ref.params) < TOL
    job.shutdown()


def test_on_a_full_cluster_a_rescale_releases_first_and_a_renaming_shrink_starts_nothing(ray_cluster):
    """Two tasks of 2 CPUs fill each 4-CPU node (the head has 1: none fits
    there): trading a worker for a PS can only happen if the worker goes
    first; a shrink whose pins rename the tasks keeps the running processes."""
    from elasticps.runtime import TaskResources

    _cluster, (n1, n2, _n3) = ray_cluster  # n3 may be gone (a test above removes it)
    a, b = n1.node_id, n2.node_id
    program = digits.program(epochs=50)
    two = TaskResources(cpu=2.0)
    job = make_job(1, 3, program, ps_resources=two, worker_resources=two, placement_timeout_s=30.0)
    job = type(job)(program, job.config, 1, 3, placement={"ps-0": a, "worker-0": a, "worker-1": b, "worker-2": b})
    job.run(max_steps=3)
    request = job.rescale(2, 2, {"ps-0": a, "worker-0": a, "ps-1": b, "worker-1": b})
    run_until_applied(job, request)
    report = job.report()
    assert [(r.reason, r.to_shape) for r in report.rescales if r.ok] == [("release", (1, 2)), ("request", (2, 2))]
    assert job.placement() == {"ps-0": a, "worker-0": a, "ps-1": b, "worker-1": b}
    job.run(max_steps=3)

    pids = {t.pid for t in job.ps + job.workers}
    request = job.rescale(1, 2, {"ps-0": b, "worker-0": b, "worker-1": a})
    run_until_applied(job, request)
    assert job.placement() == {"ps-0": b, "worker-0": b, "worker-1": a}
    assert {t.pid for t in job.ps + job.workers} < pids  # the same processes, one fewer
    assert job.report().rescales[-1].launch_s < 1.0
    job.run(max_steps=3)

    ref = train_single_process(program, max_steps=job.step)
    assert relative_error(job.parameters(), ref.params) < TOL
    job.shutdown()


def test_a_ps_held_table_across_nodes_stays_exact(ray_cluster):
    """Each worker beside one shard, reading rows from and pushing rows to the
    other across nodes (nodes 1 and 2: node 3 may be gone, a test above removes it)."""
    import functools

    from tests import loops
    from tests.test_user_loop_faults import reference

    _cluster, (n1, n2, _n3) = ray_cluster
    pins = {"ps-0": n1.node_id, "ps-1": n2.node_id, "worker-0": n2.node_id, "worker-1": n1.node_id}
    program = functools.partial(loops.tabled_bag, epochs=1)
    job = make_job(1, 1, program)
    job = type(job)(job.program, job.config, 2, 2, placement=pins)
    report = job.run()
    assert job.placement() == pins and report.state == "finished" and report.step == 12
    assert report.cross_node_bytes > 0
    params, _ = reference(loops.tabled_bag, epochs=1)
    assert relative_error(job.parameters(), params) < TOL
    job.shutdown()
