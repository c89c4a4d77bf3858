"""``elasticps bench batches``: epochs to a target at each fixed batch, single-process."""

from __future__ import annotations

import pytest

from elasticps.bench import batches_bench
from elasticps.examples import digits
from elasticps.runtime import train_single_process


def test_the_epoch_hook_sees_every_epoch_end_and_stops_training():
    program = digits.program(epochs=5, batch_size=64)
    seen: list[int] = []
    result = train_single_process(program, epoch_end=lambda epochs, model: seen.append(epochs) or epochs == 2)
    assert seen == [1, 2]
    steps_per_epoch = -(-len(digits.train_set()) // 64)
    assert result.steps == 2 * steps_per_epoch


def test_a_bigger_batch_needs_more_epochs_but_fewer_steps_to_the_target():
    out = batches_bench.run([128, 512], seeds=1, target=0.9, lr=0.05, max_epochs=30)
    small, big = out["batches"]["128"], out["batches"]["512"]
    assert small["reached"] == big["reached"] == 1
    assert big["median_epochs"] > small["median_epochs"]
    assert big["median_steps"] < small["median_steps"]
    unreachable = batches_bench.run([128], seeds=1, target=1.0, lr=0.05, max_epochs=1)
    assert unreachable["batches"]["128"] == {
        "runs": [{"seed": 0, "epochs": None, "steps": None}],
        "reached": 0,
        "median_epochs": None,
        "median_steps": None,
    }
    with pytest.raises(ValueError, match="0..1"):
        batches_bench.run([128], target=98)
