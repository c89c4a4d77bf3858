"""A job whose whole driver process is killed restarts from its checkpoint, exactly."""

from __future__ import annotations

import os
import signal
import time

import pytest

from elasticps.examples import digits
from elasticps.runtime import CheckpointStore, relative_error, train_single_process
from tests.helpers import spawn_elasticps

pytestmark = pytest.mark.slow


def _train(ckpt_dir, log_path):
    args = [
        "train",
        "elasticps.examples.digits:program",
        "--ps",
        "2",
        "--workers",
        "2",
        "--checkpoint-dir",
        str(ckpt_dir),
        "--report-interval-s",
        "0.5",
        "--num-cpus",
        "8",
    ]
    return spawn_elasticps(args, log_path)


def test_sigkilled_job_resumes_from_checkpoint(tmp_path):
    ckpt = tmp_path / "ckpt"
    first = _train(ckpt, tmp_path / "first.log")
    store = CheckpointStore(ckpt)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        latest = store.latest()
        if latest is not None and latest.step >= 100:
            break
        assert first.poll() is None, (tmp_path / "first.log").read_text()
        time.sleep(0.2)
    else:
        pytest.fail("no checkpoint past step 100 within 180 s")
    os.killpg(first.pid, signal.SIGKILL)  # the driver and everything in its session
    first.wait()
    killed_at = store.latest().step

    second = _train(ckpt, tmp_path / "second.log")
    assert second.wait(timeout=300) == 0, (tmp_path / "second.log").read_text()
    log = (tmp_path / "second.log").read_text()
    assert f"step {killed_at}" in log and "finished at step 440" in log

    final = store.latest()
    ref = train_single_process(digits.program())
    assert final.step == ref.steps == 440
    assert relative_error(final.state.params, ref.params) < 1e-5
