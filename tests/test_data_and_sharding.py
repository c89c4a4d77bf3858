import itertools

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from elasticps.runtime.data import DataPosition, GlobalBatches, split_evenly
from elasticps.runtime.flat import FlatModel, flat_params, shard_bounds
from elasticps.runtime.shard_state import ShardState, concat_shards, split_state


@given(st.integers(1, 10_000), st.integers(1, 64))
def test_shard_bounds_cover_contiguously_and_evenly(numel, shards):
    bounds = shard_bounds(numel, shards)
    assert bounds[0][0] == 0 and bounds[-1][1] == numel
    assert all(a[1] == b[0] for a, b in itertools.pairwise(bounds))
    sizes = [hi - lo for lo, hi in bounds]
    assert max(sizes) - min(sizes) <= 1


@given(st.integers(0, 300), st.integers(1, 17))
def test_split_evenly_keeps_order_and_balance(n, parts):
    items = np.arange(n)
    pieces = split_evenly(items, parts)
    assert len(pieces) == parts
    assert np.array_equal(np.concatenate(pieces), items)
    sizes = [len(p) for p in pieces]
    assert max(sizes) - min(sizes) <= 1


def test_global_batches_walk_every_sample_once_per_epoch():
    # 10 samples, batch 4: batches of 4, 4, 2, then epoch 1 starts at cursor 0.
    gb = GlobalBatches(seed=3, num_samples=10, batch_size=4)
    pos = DataPosition(0, 0)
    seen = []
    sizes = []
    while pos.epoch == 0:
        idx, pos = gb.take(pos, 4)
        seen.extend(idx.tolist())
        sizes.append(len(idx))
    assert sizes == [4, 4, 2]
    assert sorted(seen) == list(range(10))
    assert pos == DataPosition(1, 0)
    assert gb.steps_per_epoch() == 3
    # Epochs are shuffled differently, reproducibly.
    assert not np.array_equal(gb.order(0), gb.order(1))
    assert np.array_equal(GlobalBatches(3, 10, 4).order(1), gb.order(1))


def test_flat_model_params_and_grads_are_views():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    before = flat_params(model)
    flat = FlatModel(model)
    assert flat.numel == 3 * 4 + 4 + 4 * 2 + 2
    assert np.array_equal(flat.params_numpy(), before)
    flat.params_numpy()[:] = 0.5  # writing the flat vector changes the model
    assert all(torch.all(p == 0.5) for p in model.parameters())
    model(torch.ones(5, 3)).sum().backward()
    assert float(flat.grads.abs().sum()) > 0
    assert np.array_equal(flat.grads_numpy()[-2:], np.full(2, 5.0, dtype=np.float32))  # d(sum)/d(bias2) = batch


@given(st.integers(2, 200), st.integers(1, 8), st.integers(1, 8))
def test_reshard_round_trip_is_exact(numel, p_from, p_to):
    rng = np.random.default_rng(numel)
    state = ShardState(
        rng.standard_normal(numel).astype(np.float32),
        {"exp_avg": rng.standard_normal(numel).astype(np.float32)},
        {"step": 7.0},
    )
    shards = split_state(state, shard_bounds(numel, p_from))
    glued = concat_shards(shards)
    resharded = concat_shards(split_state(glued, shard_bounds(numel, p_to)))
    assert np.array_equal(resharded.params, state.params)
    assert np.array_equal(resharded.vectors["exp_avg"], state.vectors["exp_avg"])
    assert resharded.scalars == {"step": 7.0}


def test_concat_refuses_disagreeing_shards():
    a = ShardState(np.zeros(2, np.float32), {}, {"step": 1.0})
    b = ShardState(np.zeros(2, np.float32), {}, {"step": 2.0})
    with pytest.raises(ValueError, match="disagree on scalar"):
        concat_shards([a, b])


@given(st.integers(1, 6), st.integers(0, 2**16))
def test_bind_gives_the_model_exactly_the_pulled_parameters(num_shards, seed):
    torch.manual_seed(seed % 1000)
    model = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Linear(7, 3))
    flat = FlatModel(model)
    rng = np.random.default_rng(seed)
    full = rng.standard_normal(flat.numel).astype(np.float32)
    bounds = shard_bounds(flat.numel, num_shards)
    parts = [full[lo:hi].copy() for lo, hi in bounds]
    for part in parts:
        part.setflags(write=False)  # as the object store hands them out
    flat.bind(parts, bounds)
    assert np.array_equal(flat_params(model), full)
    x = torch.ones(2, 5)
    model(x).sum().backward()  # gradients still land in the flat buffer
    assert float(flat.grads.abs().sum()) > 0


def test_batches_of_dicts_tuples_and_batched_reads_are_collated_like_a_dataloader():
    from torch.utils.data import DataLoader

    from elasticps.errors import ProgramError
    from elasticps.runtime.data import fetch_batch, forward, rows

    class Reads:
        """A dataset read a batch at a time (``__getitems__``), counting its reads."""

        def __init__(self) -> None:
            self.calls = 0

        def __len__(self) -> int:
            return 10

        def __getitem__(self, i: int):
            raise AssertionError("read one at a time")

        def __getitems__(self, idx: list[int]):
            self.calls += 1
            return [({"a": torch.full((2,), float(i)), "b": (torch.tensor(i), torch.tensor(-i))}, i % 3) for i in idx]

    data = Reads()
    x, y = fetch_batch(data, np.array([4, 1, 7]))
    assert data.calls == 1
    ref_x, ref_y = next(iter(DataLoader(data, batch_size=3, sampler=[4, 1, 7])))  # what torch itself gives
    assert torch.equal(x["a"], ref_x["a"]) and torch.equal(x["b"][1], ref_x["b"][1]) and torch.equal(y, ref_y)
    part = rows(x, 1, 3)
    assert torch.equal(part["a"][:, 0], torch.tensor([1.0, 7.0])) and torch.equal(part["b"][0], torch.tensor([1, 7]))
    assert forward(lambda a, b: a.sum() + b[0].sum(), part).item() == 2 * (1 + 7) + 8  # a dict: keyword arguments
    with pytest.raises(ProgramError, match=r"must be \(input, target\)"):
        fetch_batch([torch.zeros(2)] * 3, np.array([0, 1]))
