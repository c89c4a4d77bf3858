import numpy as np

from elasticps.runtime.checkpoint import Checkpoint, CheckpointStore
from elasticps.runtime.data import DataPosition
from elasticps.runtime.shard_state import ShardState


def _ckpt(step):
    rng = np.random.default_rng(step)
    state = ShardState(
        rng.standard_normal(50).astype(np.float32), {"momentum_buffer": rng.standard_normal(50).astype(np.float32)}, {}
    )
    return Checkpoint(step, DataPosition(2, 64 * step), state, seed=5, optimizer="sgd", samples_seen=999 + step)


def test_round_trip_and_retention(tmp_path):
    store = CheckpointStore(tmp_path, keep=2)
    assert store.latest() is None
    for step in (1, 2, 3):
        store.save(_ckpt(step))
    latest = store.latest()
    want = _ckpt(3)
    assert latest.step == 3 and latest.position == DataPosition(2, 192) and latest.samples_seen == 1002
    assert np.array_equal(latest.state.params, want.state.params)
    assert np.array_equal(latest.state.vectors["momentum_buffer"], want.state.vectors["momentum_buffer"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt-0000000002.npz", "ckpt-0000000003.npz"]


def test_a_torn_temporary_file_is_never_read(tmp_path):
    store = CheckpointStore(tmp_path)
    store.save(_ckpt(4))
    (tmp_path / ".tmp-123-9.npz").write_bytes(b"half a checkpoint")  # a writer killed mid-write
    assert store.latest().step == 4


def test_a_damaged_newest_checkpoint_falls_back_to_the_older_one(tmp_path):
    store = CheckpointStore(tmp_path, keep=2)
    for step in (5, 6):
        store.save(_ckpt(step))
    newest = tmp_path / "ckpt-0000000006.npz"
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])  # torn by a disk fault
    latest = store.latest()
    assert latest.step == 5 and np.array_equal(latest.state.params, _ckpt(5).state.params)
    assert "ckpt-0000000006.npz is damaged" in store.skipped[0]
    # set aside, not pruned into the good one's place: the next two saves keep 5's successors
    store.save(_ckpt(7))
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "ckpt-0000000005.npz",
        "ckpt-0000000006.npz.corrupt",
        "ckpt-0000000007.npz",
    ]


def test_every_checkpoint_damaged_means_none(tmp_path):
    store = CheckpointStore(tmp_path)
    store.save(_ckpt(1))
    (tmp_path / "ckpt-0000000001.npz").write_bytes(b"garbage")
    assert store.latest() is None and len(store.skipped) == 1
