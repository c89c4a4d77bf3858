"""The job's record (elasticps/runtime/recorder.py), fed the dicts workers and
shards return, without Ray: windows close at the report interval with the shape
they were measured at, PS traffic is counted per node pair and split into
same-node and cross-node, gradient samples give the epoch's noise scale, and
the event list keeps the newest."""

from __future__ import annotations

import threading
import types

import pytest

from elasticps.runtime import recorder
from elasticps.runtime.recorder import MAX_EVENTS, Shape, StepRecorder
from elasticps.runtime.reports import GradientSample, noise_scale


def _worker(samples: int, pulled: list[int], pushed: list[int], half: int = 0) -> dict:
    return {
        "samples": samples, "loss_sum": 2.0 * samples, "compute_s": 0.01, "pull_s": 0.002, "sent_at": 0.0,
        "batch_half": half, "sqnorm_half": 4.0, "sqnorm_local": 3.0, "prefetched": True,
        "pull_bytes": pulled, "push_bytes": pushed,
    }  # fmt: skip


def _shard(sqnorm: float | None = None) -> dict:
    info = {"received_at": 0.001, "update_s": 0.003}
    if sqnorm is not None:
        info["grad_sqnorm"] = sqnorm
    return info


def test_a_window_counts_traffic_per_node_pair_and_closes_at_the_shape_it_ran():
    seen = []
    rec = StepRecorder("job", report_interval_s=3600.0, lock=threading.RLock(), on_window=seen.append)
    for step in range(3):
        stats = [_worker(32, [100, 100], [10, 10]), _worker(32, [100, 100], [10, 10])]
        # shards on nodes a and b, workers on a and c
        rec.account(step, stats, [_shard(), _shard()], ["a", "b"], ["a", "c"], 0.05, 64, 0, Shape(2, 2, 64))
    assert rec.windows == []  # the interval has not passed
    rec.flush(Shape(2, 2, 64))
    (win,) = rec.windows
    assert seen == [win]
    assert (win.first_step, win.last_step, win.steps, win.samples) == (0, 2, 3, 192)
    assert (win.num_ps, win.num_workers, win.batch_size, win.nodes) == (2, 2, 64, 3)
    assert win.loss == pytest.approx(2.0)
    # per step: a<->a 110 same-node; a->c, b->a, b->c pulled 100 each and pushed 10 back
    assert rec.bytes["a->a"] == 3 * 110
    assert rec.bytes["b->c"] == 300 and rec.bytes["c->b"] == 30
    assert rec.cross_node_bytes() == 3 * 3 * 110
    assert win.cross == pytest.approx(3 / 4)
    assert rec.prefetched == 6
    rec.flush(Shape(2, 2, 64))  # nothing new: no empty window
    assert len(rec.windows) == 1


def test_a_window_closes_by_itself_once_the_interval_passed():
    rec = StepRecorder("job", report_interval_s=0.0, lock=threading.RLock())
    rec.account(7, [_worker(16, [8], [8])], [_shard()], ["a"], ["a"], 0.01, 16, 0, Shape(1, 1, 16))
    assert [(w.first_step, w.num_ps, w.num_workers, w.cross) for w in rec.windows] == [(7, 1, 1, 0.0)]


def test_a_window_ends_with_its_last_step_not_when_it_is_closed(monkeypatch):
    # closed 60 s after its step (a step that failed meanwhile, then the recovery): not counted
    clock = iter([100.0, 160.0])  # the recorder's clock only: the process's own time.monotonic stays
    monkeypatch.setattr(recorder, "time", types.SimpleNamespace(monotonic=lambda: next(clock)))
    rec = StepRecorder("job", report_interval_s=3600.0, lock=threading.RLock())
    rec.account(3, [_worker(64, [8], [8])], [_shard()], ["a"], ["a"], 0.5, 64, 0, Shape(1, 1, 64))
    rec.flush(Shape(1, 1, 64))
    (win,) = rec.windows
    assert (win.elapsed_s, win.samples_per_s) == (pytest.approx(0.5), pytest.approx(128.0))


def test_the_epochs_noise_scale_comes_from_its_own_gradient_samples():
    rec = StepRecorder("job", report_interval_s=3600.0, lock=threading.RLock())
    shape = Shape(1, 2, 64)
    for step in range(4):  # the shards measured the global batch's norm: that is the big batch
        stats = [_worker(32, [8], [8], half=16), _worker(32, [8], [8], half=16)]
        rec.account(step, stats, [_shard(sqnorm=2.5)], ["a"], ["a", "a"], 0.01, 64, 64, shape)
    expected = noise_scale([GradientSample(16, 4.0, 64, 2.5)] * 4)
    assert expected is not None
    rec.flush(shape)
    loss, scale = rec.end_epoch()
    assert loss == pytest.approx(2.0) and scale == pytest.approx(expected)
    assert rec.end_epoch()[1] is None  # the next epoch starts without samples
    assert len(rec.gradient_samples) == 4  # the job's own list keeps them


def test_uneven_small_batches_give_a_sample_of_the_workers_with_the_first_ones_size():
    rec = StepRecorder("job", report_interval_s=3600.0, lock=threading.RLock())
    # 64 samples over 3 workers: shares of 22, 21, 21; the two of 21 measured another small batch
    stats = [_worker(22, [8], [8], half=22), _worker(21, [8], [8], half=21), _worker(21, [8], [8], half=21)]
    stats[1]["sqnorm_half"] = stats[2]["sqnorm_half"] = 9.0
    rec.account(0, stats, [_shard(sqnorm=2.5)], ["a"], ["a"] * 3, 0.01, 64, 64, Shape(1, 3, 64))
    assert rec.gradient_samples == [GradientSample(22, 4.0, 64, 2.5)]


def test_events_keep_the_newest_and_count_them_all():
    rec = StepRecorder("job", report_interval_s=1.0, lock=threading.RLock())
    for i in range(MAX_EVENTS + 5):
        rec.event(i, f"event {i}")
    assert rec.events_total == MAX_EVENTS + 5
    assert len(rec.events) == MAX_EVENTS
    assert rec.events[-1] == f"step {MAX_EVENTS + 4}: event {MAX_EVENTS + 4}"
