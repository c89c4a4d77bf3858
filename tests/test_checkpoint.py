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


def _mlp_program(hidden: int):
    from collections import OrderedDict

    import torch
    from torch import nn
    from torch.utils.data import TensorDataset

    from elasticps import TrainingProgram

    def model():
        return nn.Sequential(OrderedDict(fc1=nn.Linear(64, hidden), relu=nn.ReLU(), fc2=nn.Linear(hidden, 10)))

    data = TensorDataset(torch.zeros(32, 64), torch.zeros(32, dtype=torch.long))
    return TrainingProgram(name="mlp", model=model, dataset=data, loss=nn.functional.cross_entropy,
                           optimizer="sgd", lr=0.1, batch_size=16, epochs=1, seed=5)  # fmt: skip


def _saved_by(program, store: CheckpointStore, step: int, layout: bool = True) -> None:
    from elasticps.runtime.flat import flat_params, param_layout

    model = program.build_model()
    state = ShardState(flat_params(model), {}, {})
    store.save(Checkpoint(step, DataPosition(0, 0), state, seed=5, optimizer="sgd", samples_seen=16 * step,
                          layout=param_layout(model) if layout else None))  # fmt: skip


def test_a_checkpoint_keeps_each_parameters_name_and_shape(tmp_path):
    store = CheckpointStore(tmp_path)
    _saved_by(_mlp_program(128), store, 40)
    ckpt = store.latest()
    assert ckpt.file == "ckpt-0000000040.npz"
    assert ckpt.layout == [
        ("fc1.weight", [128, 64]), ("fc1.bias", [128]), ("fc2.weight", [10, 128]), ("fc2.bias", [10]),
    ]  # fmt: skip


def test_a_layout_mismatch_names_the_first_parameter_that_differs(tmp_path):
    from elasticps.runtime.checkpoint import layout_mismatch

    store = CheckpointStore(tmp_path)
    _saved_by(_mlp_program(128), store, 1)
    ckpt = store.latest()
    model = list(ckpt.layout)
    assert layout_mismatch(ckpt, model) is None
    assert layout_mismatch(ckpt, [model[1], model[0], *model[2:]]) == (
        "the model defines the same parameters in another order"
    )
    assert layout_mismatch(ckpt, [*model, ("fc3.weight", [2, 10])]) == (
        "fc3.weight [2, 10] is in the model, not in the checkpoint"
    )
    assert layout_mismatch(ckpt, model[:3]) == "fc2.bias [10] is in the checkpoint, not in the model"


def test_a_checkpoint_without_names_is_checked_by_its_size(tmp_path):
    """Checkpoints written before names were kept still resume a model of their size."""
    from elasticps.runtime.checkpoint import layout_mismatch
    from elasticps.runtime.flat import param_layout

    store = CheckpointStore(tmp_path)
    _saved_by(_mlp_program(128), store, 1, layout=False)
    ckpt = store.latest()
    assert ckpt.layout is None
    assert layout_mismatch(ckpt, param_layout(_mlp_program(128).build_model())) is None
    assert layout_mismatch(ckpt, param_layout(_mlp_program(256).build_model())) == (
        "it holds 9610 parameters, the model has 19210"
    )


def test_resuming_a_changed_model_fails_at_once_naming_both_shapes(tmp_path):
    """Through the controller: the check runs at start, before any task is launched
    (no Ray here), and the error is the program's own, so a manager fails the job
    at once instead of starting it again."""
    from elasticps.errors import UserCodeError
    from elasticps.manager.ray_runtime import failed_before_first_step
    from elasticps.runtime import JobConfig, JobController

    _saved_by(_mlp_program(128), CheckpointStore(tmp_path), 40)
    controller = JobController(_mlp_program(256), JobConfig(checkpoint_dir=str(tmp_path), share_dataset=False))
    with pytest.raises(UserCodeError) as err:
        controller.start()
    assert str(err.value) == (
        "checkpoint ckpt-0000000040.npz does not match the model: fc1.weight is [128, 64] in the checkpoint, "
        "[256, 64] in the model"
    )
    assert failed_before_first_step(err.value, controller.started_step, controller.step)
    assert controller.ps == [] and controller.workers == []  # nothing was started


def test_a_full_disk_before_the_first_step_is_worth_another_start_a_program_error_is_not():
    import errno

    from elasticps.errors import UserCodeError
    from elasticps.manager.ray_runtime import failed_before_first_step

    full = OSError(errno.ENOSPC, "No space left on device")
    try:
        try:
            raise full
        except OSError as exc:
            raise UserCodeError("step 0 failed in user code: OSError: no space") from exc
    except UserCodeError as wrapped:
        assert not failed_before_first_step(wrapped, started_step=0, step=0)  # the machine's, not the program's
    assert not failed_before_first_step(full, started_step=0, step=0)
    assert failed_before_first_step(FileNotFoundError(errno.ENOENT, "data.csv"), started_step=0, step=0)
    assert failed_before_first_step(ValueError("bad shape"), started_step=0, step=0)
    assert not failed_before_first_step(ValueError("bad shape"), started_step=0, step=3)  # after its first step


def test_a_rule_of_elasticps_torch_broken_after_the_first_step_fails_the_job_at_once():
    import pickle

    import ray

    from elasticps.errors import ProgramError, UserCodeError
    from elasticps.manager.ray_runtime import failed_before_first_step
    from elasticps.runtime.loop_worker import TrainingFunctionError

    def as_the_controller_sees(cause: BaseException) -> UserCodeError:
        """A loop worker's error, through Ray (pickled) and the controller's wrapping."""
        remote = ray.exceptions.RayTaskError("LoopWorker.step", "Traceback ...", pickle.loads(pickle.dumps(cause)))
        try:
            try:
                raise remote.as_instanceof_cause()
            except Exception as exc:
                raise UserCodeError("step 5 failed in user code: ...") from exc
        except UserCodeError as wrapped:
            return wrapped

    broken = TrainingFunctionError("ProgramError: the loop over the DataLoader ended before epoch 0 did", True)
    assert failed_before_first_step(as_the_controller_sees(broken), started_step=0, step=5)  # restarts break it again
    own = TrainingFunctionError("KeyError: 'x'")  # the loop's own error after progress: worth another start
    assert not failed_before_first_step(as_the_controller_sees(own), started_step=0, step=5)
    assert failed_before_first_step(ProgramError("a dataset sample must be (input, target)"), started_step=0, step=9)
