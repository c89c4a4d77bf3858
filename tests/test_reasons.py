"""Why each job got what a round gave it (elasticps.manager.reasons), and the
store's record of curves, rescales and progress that the dashboard draws after
a restart."""

from __future__ import annotations

from elasticps.manager import Store, parse_spec
from elasticps.manager.reasons import explain
from elasticps.manager.store import Rescale
from elasticps.sched import Resources
from tests.builders import make_cluster, make_job

ONE = Resources(cpu=1.0)


def test_each_move_is_named_with_its_cause():
    cluster = make_cluster(n=1, cpu=8.0)  # 8 CPUs, every task takes 1
    jobs = [
        make_job("grower", current=(1, 1), ps_resources=ONE, worker_resources=ONE),
        make_job("giver", current=(2, 4), ps_resources=ONE, worker_resources=ONE),
        make_job("prober", current=(1, 1), probes=((1, 2),), ps_resources=ONE, worker_resources=ONE),
        make_job("new", ps_resources=ONE, worker_resources=ONE),
        make_job("waiter", min_workers=2, ps_resources=ONE, worker_resources=ONE),
        make_job("never", ps_resources=ONE, worker_resources=Resources(cpu=64)),
    ]
    given = {"grower": (1, 2), "giver": (1, 1), "prober": (1, 2), "new": (1, 1)}
    moves = explain(jobs, given, given, {"never": "cannot fit: a worker needs 64 CPU"}, cluster)
    assert {j: m.action for j, m in moves.items()} == {
        "grower": "grow", "giver": "shrink", "prober": "probe", "new": "admit", "waiter": "wait", "never": "unfit",
    }  # fmt: skip
    assert moves["giver"].why == "shrink for jobs grower, new, prober"  # the jobs that gained room this round
    assert moves["grower"].text == "grow 1 PS x 1 worker -> 1 PS x 2 workers"
    # 8 CPUs less what the round gave: grower 3 + giver 2 + prober 3 + new 2 = 10 > 8, so nothing is left
    assert moves["waiter"].text.endswith("needs 3 CPU; 0 CPU, 64 GB memory left after this round's shapes")
    assert moves["never"].text == "cannot fit: a worker needs 64 CPU" and moves["never"].shape is None


def test_a_shape_the_users_new_limits_leave_out_is_moved_for_them_not_as_a_probe():
    cluster = make_cluster(n=1, cpu=8.0)
    jobs = [
        make_job("cut", current=(1, 3), max_workers=2, probes=((1, 2),)),  # `scale cut --workers 1..2` at 1x3
        make_job("raised", current=(1, 1), min_workers=2),  # `scale raised --workers 2..8` at 1x1
    ]
    moves = explain(jobs, {"cut": (1, 2), "raised": (1, 2)}, {"cut": (1, 2), "raised": (1, 2)}, {}, cluster)
    assert (moves["cut"].action, moves["cut"].why) == ("shrink", "new limits")
    assert moves["cut"].text == (
        "new limits 1 PS x 3 workers -> 1 PS x 2 workers: 1 PS x 3 workers is outside PS 1..8, workers 1..2"
    )
    assert (moves["raised"].action, moves["raised"].why) == ("grow", "new limits")


def test_a_kept_shape_and_one_placement_could_not_fit():
    cluster = make_cluster(n=2, cpu=4.0)
    jobs = [make_job("a", current=(1, 2)), make_job("b", current=(1, 1))]
    moves = explain(jobs, {"a": (1, 2), "b": (2, 4)}, {"a": (1, 2), "b": (1, 1)}, {}, cluster)
    assert moves["a"].action == "keep" and moves["a"].shape == (1, 2)
    assert moves["b"].action == "unplaced" and "2 PS x 4 workers did not fit" in moves["b"].text


def test_curves_rescales_and_progress_are_stored(tmp_path):
    store = Store(tmp_path / "m.db")
    store.add_job(parse_spec("name: a\nprogram: elasticps.examples.digits:program\n"), now=1.0)
    store.record_observation("a", 2.0, 1, 2, 500.0, batch=64, step=10, epoch=0, loss=2.1, metric=None)
    store.record_observation("a", 3.0, 1, 2, 520.0, step=20, epoch=1, loss=1.5, metric=0.7)
    store.record_rescale("a", 3.5, Rescale(3.5, 21, (1, 2), (2, 4), 0.04, 4.2, True))
    store.set_progress("a", {"step": 20, "metric": 0.7})
    store.close()
    again = Store(tmp_path / "m.db")  # what a restarted manager reads
    curves = again.curves("a")
    assert [(c.at, c.step, c.loss, c.metric, c.batch) for c in curves] == [
        (2.0, 10, 2.1, None, 64), (3.0, 20, 1.5, 0.7, 0),
    ]  # fmt: skip
    assert again.rescales("a") == [Rescale(3.5, 21, (1, 2), (2, 4), 0.04, 4.2, True)]
    assert again.progress("a") == {"step": 20, "metric": 0.7}
    assert again.observations("a")[0] == (1, 2, 500.0, 64, 1, None)  # what the speed model reads is unchanged
    again.add_event(4.0, "a", "unfit", "cannot fit: x")
    again.add_event(5.0, "a", "error", "boom")
    again.add_event(6.0, "a", "runtime", "ignored")
    assert again.last_events(("unfit", "error")) == {"a": (5.0, "error", "boom")}
