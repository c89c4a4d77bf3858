"""Placement: table-driven cases with their arithmetic, and properties."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from elasticps import ConfigError
from elasticps.placement import PLACERS, cross_node_bytes_per_step, fewest_nodes, place, room_left, with_own_room
from elasticps.sched import ClusterView, NodeView, Resources
from tests.builders import make_job, make_node

S = 100.0  # parameter bytes


@pytest.mark.parametrize(
    ("placement", "expected"),
    [
        # 1 PS + 2 workers on one node: nothing crosses
        ({"ps-0": "a", "worker-0": "a", "worker-1": "a"}, 0.0),
        # PS on a, workers on b: 2 pairs x 2 x 100 / 1 = 400
        ({"ps-0": "a", "worker-0": "b", "worker-1": "b"}, 400.0),
        # 2 PS (a, b), workers on a and b: pairs (wa, pb) and (wb, pa) cross: 2 x 2 x 100 / 2 = 200
        ({"ps-0": "a", "ps-1": "b", "worker-0": "a", "worker-1": "b"}, 200.0),
        # no PS: no PS traffic
        ({"worker-0": "a", "worker-1": "b"}, 0.0),
    ],
)
def test_traffic_model(placement, expected):
    assert cross_node_bytes_per_step(placement, S) == expected


def _cluster(*cpus):
    return ClusterView(tuple(make_node(f"n{i}", cpu=c) for i, c in enumerate(cpus)))


def test_locality_puts_a_job_that_fits_on_one_node_there_best_fit():
    # nodes with 8, 4 and 16 CPUs; the job needs 1 + 2 = 3 CPUs: best fit is n1 (4 - 3 = 1 left over)
    job = make_job("j")
    result = place([job], {"j": (1, 2)}, _cluster(8, 4, 16))
    assert set(result.placement["j"].values()) == {"n1"}


def test_locality_ranks_nodes_by_gpus_for_a_gpu_job():
    # a 4-GPU all-reduce job (no PS). n0: 4 GPUs free, 30 CPUs; n1: 8 GPUs free, 10 CPUs.
    # By CPUs left over n1 would be the best fit and leave 4 GPUs stranded; by GPUs n0 fits exactly.
    gpu_worker = Resources(cpu=2.0, gpu=1.0)
    job = make_job("g", min_ps=0, max_ps=0, worker_resources=gpu_worker)
    nodes = ClusterView((make_node("n0", cpu=32, gpu=4), make_node("n1", cpu=12, gpu=8)))
    assert set(place([job], {"g": (0, 4)}, nodes).placement["g"].values()) == {"n0"}
    # 10 GPUs over nodes of 8, 4 and 4: the roomiest in GPUs first, so 2 nodes, not 3
    nodes = ClusterView((make_node("a", cpu=64, gpu=4), make_node("b", cpu=16, gpu=8), make_node("c", cpu=64, gpu=4)))
    placed = place([job], {"g": (0, 10)}, nodes).placement["g"]
    assert len(set(placed.values())) == 2 and sum(n == "b" for n in placed.values()) == 8


def test_locality_splits_ps_in_proportion_to_workers():
    # two 6-CPU nodes; 2 PS + 8 workers = 10 CPUs. A worker and its share of PS = 1 + 2/8 = 1.25 CPUs:
    # 4 fit per node (5 CPUs). Workers 4 + 4, shards 2 x 4/8 = 1 per node.
    # Cross pairs: each worker talks to the shard on the other node: 8 x 2 x 100 / 2 = 800 bytes/step.
    job = make_job("j", max_workers=16)
    result = place([job], {"j": (2, 8)}, _cluster(6, 6))
    placed = result.placement["j"]
    assert sorted(placed[f"ps-{i}"] for i in range(2)) == ["n0", "n1"]
    assert cross_node_bytes_per_step(placed, S) == 800.0
    spread = place([job], {"j": (2, 8)}, _cluster(6, 6), method="spread").placement["j"]
    assert cross_node_bytes_per_step(spread, S) >= 800.0


def test_spread_scatters_and_pack_fills_in_order():
    # 3 nodes of 4 CPUs; 1 PS + 2 workers. spread: each task on the roomiest node -> n0, n1, n2.
    # pack: all three fit on n0.
    job = make_job("j")
    spread = place([job], {"j": (1, 2)}, _cluster(4, 4, 4), method="spread").placement["j"]
    pack = place([job], {"j": (1, 2)}, _cluster(4, 4, 4), method="pack").placement["j"]
    assert sorted(spread.values()) == ["n0", "n1", "n2"]
    assert set(pack.values()) == {"n0"}


def test_optimus_uses_the_fewest_nodes_with_equal_shares():
    # nodes of 4 CPUs; 2 PS + 4 workers = 6 CPUs: 1 node is too small; 2 nodes take 1 PS + 2 workers each
    job = make_job("j")
    placed = place([job], {"j": (2, 4)}, _cluster(4, 4, 4), method="optimus").placement["j"]
    per_node = {}
    for task, node in placed.items():
        per_node.setdefault(node, []).append(task.split("-")[0])
    assert sorted(sorted(v) for v in per_node.values()) == [["ps", "worker", "worker"]] * 2


def test_a_job_that_does_not_fit_is_reported_not_half_placed():
    # 2 nodes x 4 CPUs = 8; 'big' needs 2 + 8 = 10 CPUs; 'small' 1 + 1 = 2 still gets placed
    big, small = make_job("big", max_workers=16), make_job("small")
    for method in PLACERS:
        result = place([big, small], {"big": (2, 8), "small": (1, 1)}, _cluster(4, 4), method=method)
        assert result.unplaceable == ["big"], method
        assert "big" not in result.placement and len(result.placement["small"]) == 2


def test_a_running_job_with_the_same_shape_stays_put():
    job = make_job("j")
    current = {"j": {"ps-0": "n2", "worker-0": "n2", "worker-1": "n2"}}
    result = place([job], {"j": (1, 2)}, _cluster(8, 4, 8), current)  # n1 would be the best fit for a new job
    assert result.placement["j"] == current["j"] and result.moves == 0


def _two_cpu_workers(job_id: str):
    """A job of 2-CPU workers and no PS: a node of 3 CPUs holds one worker, and 1 CPU nobody can use."""
    return make_job(job_id, min_ps=0, max_ps=0, max_workers=8, worker_resources=Resources(cpu=2.0))


def test_a_running_job_whose_new_shape_does_not_fit_on_the_nodes_keeps_its_old_one():
    # the policy sees 4 free CPUs, room for 2 workers; per node there is room for 1. Stopping
    # the job would cost a restart and a wait: it keeps its worker on n0.
    job = _two_cpu_workers("r")
    current = {"r": {"worker-0": "n0"}}
    for method in PLACERS:
        result = place([job], {"r": (0, 2)}, _cluster(3, 1), current, method=method)
        assert result.kept == ["r"] and result.unplaceable == [], method
        assert result.placement["r"] == current["r"] and result.shapes == {"r": (0, 1)}
    # a job that is not running yet has no shape to keep: it waits
    assert place([job], {"r": (0, 2)}, _cluster(3, 1)).unplaceable == ["r"]
    # nor is a shape kept that its limits no longer allow (narrowed to exactly 2 workers)
    narrowed = make_job("r", min_ps=0, max_ps=0, min_workers=2, max_workers=2, worker_resources=Resources(cpu=2.0))
    assert place([narrowed], {"r": (0, 2)}, _cluster(3, 1), current).unplaceable == ["r"]


def test_resized_running_jobs_keep_their_tasks_so_their_new_tasks_fit_in_the_free_room():
    # The live demo's round: three jobs at 1x1 on three 4-CPU nodes (2 CPUs each), 6 CPUs free;
    # asked for 1x2, 2x4 and 2x1: 12 CPUs in all. The runtime starts new tasks before it stops
    # old ones, so the new tasks must fit in the 6 free CPUs: 1 + 4 + 1 = 6, if no task moves.
    jobs = [make_job(j, max_ps=2, max_workers=4) for j in ("a", "b", "c")]
    current = {j: {"ps-0": n, "worker-0": n} for j, n in (("a", "n0"), ("b", "n1"), ("c", "n2"))}
    decision = {"a": (1, 2), "b": (2, 4), "c": (2, 1)}
    result = place(jobs, decision, _cluster(4, 4, 4), current)
    assert result.shapes == decision and result.moves == 0
    new_tasks = {n: 0 for n in ("n0", "n1", "n2")}
    for j, placed in result.placement.items():
        for kind in ("ps-", "worker-"):
            old = [n for t, n in current[j].items() if t.startswith(kind)]
            now = [n for t, n in placed.items() if t.startswith(kind)]
            assert all(now.count(n) >= 1 for n in old), f"{j}'s {kind} task left its node"
            for n in set(now):
                new_tasks[n] += now.count(n) - old.count(n)
    assert all(k <= 2 for k in new_tasks.values()), new_tasks  # each node had 2 CPUs free
    # shrinking back, no task moves either: it leaves the node holding the fewest of the job's tasks
    big = {"ps-0": "n0", "ps-1": "n1", "worker-0": "n0", "worker-1": "n0", "worker-2": "n1"}
    result = place([jobs[0]], {"a": (1, 2)}, _cluster(4, 4, 4), {"a": big})
    assert result.placement["a"] == {"ps-0": "n0", "worker-0": "n0", "worker-1": "n0"}


def test_running_jobs_are_placed_before_jobs_that_start():
    # nodes of 3 CPUs each hold one 2-CPU worker. 'r' runs 2 workers and is to shrink to 1;
    # 'new' (bigger) asks for 2. Placed biggest first, 'new' would take both nodes and 'r'
    # would stop; running first, 'r' keeps a node and 'new' waits.
    running, new = _two_cpu_workers("r"), _two_cpu_workers("new")
    current = {"r": {"worker-0": "n0", "worker-1": "n1"}}
    result = place([running, new], {"r": (0, 1), "new": (0, 2)}, _cluster(3, 3), current)
    assert result.shapes == {"r": (0, 1)} and result.unplaceable == ["new"]


def test_a_kept_job_spread_wider_than_the_room_needs_is_compacted():
    # kept with the same shape over n0 and n2, while n1 alone holds all 3 CPUs: moved there
    job = make_job("j")
    current = {"j": {"ps-0": "n2", "worker-0": "n2", "worker-1": "n0"}}
    result = place([job], {"j": (1, 2)}, _cluster(8, 4, 8), current)
    assert len(set(result.placement["j"].values())) == 1 and result.moves >= 1
    # when no node holds it whole (2 CPUs free on each), it stays where it is
    result = place([job], {"j": (1, 2)}, _cluster(2, 2, 2), current)
    assert result.placement["j"] == current["j"] and result.moves == 0


def test_a_gpu_job_placed_before_room_freed_moves_onto_one_node():
    # g1 (4 GPUs) runs spread 2 + 2 over a and b because c was full; c's job has finished,
    # so c (4 GPUs) takes g1 whole. fewest_nodes says the same from the room left.
    gpu_worker = Resources(cpu=2.0, gpu=1.0)
    g1 = make_job("g1", min_ps=0, max_ps=0, worker_resources=gpu_worker)
    nodes = ClusterView(tuple(make_node(n, cpu=32, gpu=4) for n in "abc"))
    current = {"g1": {"worker-0": "a", "worker-1": "a", "worker-2": "b", "worker-3": "b"}}
    assert fewest_nodes(g1, 0, 4, room_left([g1], nodes, {})) == 1
    placed = place([g1], {"g1": (0, 4)}, nodes, current).placement["g1"]
    assert len(set(placed.values())) == 1


@st.composite
def gpu_scenarios(draw):
    nodes = tuple(
        NodeView(
            f"n{i}", Resources(cpu=32.0, gpu=4.0, memory_gb=64.0), Resources(cpu=draw(st.sampled_from([0, 8, 24])))
        )
        for i in range(draw(st.integers(2, 6)))
    )
    gpu_worker = Resources(cpu=4.0, gpu=1.0, memory_gb=8.0)
    jobs = [make_job(f"g{i}", min_ps=0, max_ps=0, worker_resources=gpu_worker) for i in range(draw(st.integers(1, 6)))]
    decision = {j.id: (0, draw(st.integers(1, 8))) for j in jobs}
    current = {}
    for j in jobs:  # some run already, anywhere (possibly spread)
        if draw(st.booleans()):
            current[j.id] = {f"worker-{k}": draw(st.sampled_from(nodes)).name for k in range(decision[j.id][1])}
    return jobs, decision, ClusterView(nodes), current


@settings(deadline=None)
@given(scenario=gpu_scenarios())
def test_no_gpu_job_spans_more_nodes_than_the_room_left_needs(scenario):
    jobs, decision, cluster, current = scenario
    result = place(jobs, decision, cluster, current)
    left = room_left(jobs, cluster, result.placement)
    by_id = {j.id: j for j in jobs}
    for job_id, placed in result.placement.items():
        free = with_own_room(by_id[job_id], placed, left)
        assert len(set(placed.values())) <= fewest_nodes(by_id[job_id], *decision[job_id], free)


def test_other_tenants_room_is_respected():
    # n0 has 8 CPUs but another tenant uses 7: the 3-CPU job goes to n1
    cluster = ClusterView((make_node("n0", cpu=8, others_cpu=7), make_node("n1", cpu=4)))
    placed = place([make_job("j")], {"j": (1, 2)}, cluster).placement["j"]
    assert set(placed.values()) == {"n1"}


def test_unknown_method_is_refused():
    with pytest.raises(ConfigError, match="placement must be one of"):
        place([], {}, _cluster(4), method="random")


@st.composite
def scenarios(draw):
    nodes = tuple(
        NodeView(
            f"n{i}",
            Resources(cpu=draw(st.sampled_from([2.0, 4.0, 8.0, 16.0])), memory_gb=32.0),
            Resources(cpu=draw(st.sampled_from([0.0, 1.0]))),
        )
        for i in range(draw(st.integers(1, 6)))
    )
    jobs, decision = [], {}
    for i in range(draw(st.integers(1, 6))):
        job = make_job(
            f"j{i}",
            max_ps=8,
            max_workers=16,
            ps_resources=Resources(cpu=draw(st.sampled_from([0.5, 1.0, 2.0])), memory_gb=1.0),
            worker_resources=Resources(cpu=draw(st.sampled_from([1.0, 2.0, 3.0])), memory_gb=2.0),
        )
        jobs.append(job)
        decision[job.id] = (draw(st.integers(1, 4)), draw(st.integers(1, 8)))
    return jobs, decision, ClusterView(nodes)


@pytest.mark.parametrize("method", sorted(PLACERS))
@settings(deadline=None)
@given(scenario=scenarios())
def test_placement_properties(method, scenario):
    jobs, decision, cluster = scenario
    result = place(jobs, decision, cluster, method=method)
    by_id = {j.id: j for j in jobs}
    used = {n.name: Resources() for n in cluster.nodes}
    for job_id, placed in result.placement.items():
        p, w = decision[job_id]
        assert set(placed) == {f"ps-{i}" for i in range(p)} | {f"worker-{i}" for i in range(w)}  # every task
        for task, node in placed.items():
            job = by_id[job_id]
            used[node] = used[node] + (job.ps_resources if task.startswith("ps-") else job.worker_resources)
    for n in cluster.nodes:
        assert used[n.name].fits_in(n.available)  # never over capacity
    assert set(result.placement) | set(result.unplaceable) == set(decision)  # placed whole or reported
    assert not set(result.placement) & set(result.unplaceable)
    assert place(jobs, decision, cluster, method=method).placement == result.placement  # deterministic
