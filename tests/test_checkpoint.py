import errno

import numpy as np
import pytest

from elasticps.errors import ConfigError
from elasticps.runtime.checkpoint import Checkpoint, CheckpointStore
from elasticps.runtime.data import DataPosition
from elasticps.runtime.shard_state import ShardState
from tests.helpers import mount_tiny_tmpfs, unmount


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


def test_a_write_to_a_full_disk_leaves_no_temporary_file(tmp_path, monkeypatch):
    """A real full disk: a 64 KiB tmpfs, where this machine lets the test mount one;
    elsewhere ENOSPC is raised at the archive's write call (np.savez)."""
    disk = tmp_path / "disk"
    mounted = mount_tiny_tmpfs(disk)
    try:
        if not mounted:

            def full(*_a, **_k):
                raise OSError(errno.ENOSPC, "No space left on device")

            monkeypatch.setattr(np, "savez", full)
        store = CheckpointStore(disk)
        big = _ckpt(1)
        big = Checkpoint(1, big.position, ShardState(np.ones(100_000, np.float32), {}, {}), 5, "sgd", 1)
        with pytest.raises(OSError) as err:
            store.save(big)
        assert err.value.errno == errno.ENOSPC
        assert list(disk.iterdir()) == []  # no 0-byte .tmp-*.npz left behind
    finally:
        if mounted:
            unmount(disk)


def test_export_writes_nothing_and_falls_back_past_a_checkpoint_of_the_wrong_size(tmp_path):
    from elasticps.examples import digits
    from elasticps.runtime.export import export_checkpoint
    from elasticps.runtime.flat import flat_params

    program = digits.program(epochs=1)
    good = flat_params(program.build_model())
    store = CheckpointStore(tmp_path, keep=5)
    state = ShardState(good, {}, {})
    store.save(Checkpoint(3, DataPosition(0, 0), state, seed=5, optimizer="sgd", samples_seen=1))
    wrong = ShardState(np.zeros(good.size + 7, np.float32), {}, {})  # well-formed, of another model
    store.save(Checkpoint(4, DataPosition(0, 0), wrong, seed=5, optimizer="sgd", samples_seen=1))
    (tmp_path / "ckpt-0000000005.npz").write_bytes(b"garbage")  # damaged
    before = sorted((p.name, p.stat().st_mtime_ns) for p in tmp_path.iterdir())
    info = export_checkpoint(program, tmp_path, tmp_path.parent / "model.pt")
    assert info["step"] == 3
    assert sorted((p.name, p.stat().st_mtime_ns) for p in tmp_path.iterdir()) == before  # nothing renamed
    with pytest.raises(ConfigError, match="ckpt-0000000003.npz is not of digits-cnn's model"):
        export_checkpoint(digits.cnn_program(epochs=1), tmp_path, tmp_path.parent / "cnn.pt")
