"""A user's own loop submitted to a real manager (REST API over HTTP, the Ray
runtime, a real local Ray cluster) through the Client: it runs, reports and
rescales as a TrainingProgram job does, its ``elasticps.torch.report``
values reach the epoch reports and the manager's metric, and what it prints
reaches the job's output tagged by worker."""

from __future__ import annotations

import threading
import time

import pytest

from elasticps.loop import api
from elasticps.loop.local import LocalSession
from elasticps.manager import Store
from elasticps.manager.api import create_app
from elasticps.manager.client import Client
from elasticps.manager.service import Manager
from tests.helpers import serve_app

TOKEN = "t" * 40
ARGS = {"epochs": 3, "batch_size": 16, "optimizer": "sgd", "lr": 0.05, "log_interval": 0}
SPEC = {
    "name": "loop",
    "program": "tests.loops:gated_digits",  # elasticps.examples.digits_loop:main, held until a rescale is done
    "ps": {"min": 1, "max": 1, "cpu": 0.5},
    "workers": {"min": 1, "max": 1, "cpu": 0.5},
}


@pytest.fixture(scope="module")
def served(ray_local, tmp_path_factory):
    """A manager on the module's Ray cluster, its control loop and its API served on loopback."""
    tmp = tmp_path_factory.mktemp("manager")
    manager = Manager(Store(tmp / "m.db"), tmp / "work", report_interval_s=0.5)
    stop = threading.Event()
    loop = threading.Thread(target=manager.run, args=(1.0, stop), daemon=True)
    loop.start()
    with serve_app(create_app(manager, TOKEN)) as url:
        yield Client(url, TOKEN, timeout_s=60), manager
    stop.set()
    manager.wake.set()
    loop.join(timeout=60)
    manager.shutdown()


def _reference() -> list[dict]:
    from elasticps.examples import digits_loop

    with api.active(LocalSession()) as session:
        digits_loop.main(**ARGS)
    return session.reports


def test_a_loop_submitted_to_the_manager_runs_rescales_and_reports_its_metric(served, tmp_path):
    client, manager = served
    gate = tmp_path / "rescaled"
    job = client.submit({**SPEC, "args": {**ARGS, "gate": str(gate)}})
    assert job.state == "pending"
    deadline = time.monotonic() + 240
    while (job := client.job("loop")).state == "pending" or job.progress is None or job.progress.step < 1:
        assert job.state in ("pending", "running") and time.monotonic() < deadline, job
        assert job.progress is None or job.progress.epoch == 0, "the job went past its first epoch unrescaled"
        time.sleep(0.2)
    client.scale("loop", workers=(2, 2))  # the manager must rescale the running loop to 1x2
    while not any(r.to_shape == (1, 2) for r in manager.report("loop").rescales):
        assert time.monotonic() < deadline, manager.report("loop").events
        time.sleep(0.2)
    gate.touch()
    done = client.wait("loop", timeout_s=240)
    assert done.state == "finished", [e.message for e in client.events("loop")][-5:]
    want = _reference()
    assert [r["epoch"] for r in want] == [0, 1, 2]
    # the metric is the first value of the loop's last report (accuracy here), as in one process
    assert done.progress.metric == want[-1]["metrics"]["accuracy"]
    assert done.progress.metrics["test_loss"] == pytest.approx(want[-1]["metrics"]["test_loss"], rel=1e-4)
    report = manager.report("loop")  # the final report, decoded from the job's plain data
    assert [(e.epoch, e.metric) for e in report.epoch_reports] == [
        (i, r["metrics"]["accuracy"]) for i, r in enumerate(want)
    ]
    for got, r in zip(report.epoch_reports, want, strict=True):
        assert got.metrics["test_loss"] == pytest.approx(r["metrics"]["test_loss"], rel=1e-4)
    assert [(m.step, m.epoch) for m in report.metrics] == [(85, 0), (170, 1), (255, 2)]
    assert any(r.ok and r.to_shape == (1, 2) for r in report.rescales)
    epochs = [line.text for line in client.logs("loop") if line.kind == "epoch"]
    assert len(epochs) == 3 and all(", metric " in text for text in epochs)
    # what the loop printed (its test pass, in every worker) is in the job's output, tagged by task
    printed = "".join(piece.text for piece in client.output("loop"))
    assert "[worker-0] Test set: Average loss" in printed
    assert "[worker-1] Test set: Average loss" in printed  # the worker that joined at 1x2
    messages = [e.message for e in client.events("loop")]
    assert any(m.startswith("job finished at step 255, metric ") for m in messages), messages
