"""Failures a user can act on, against a real manager (REST API over HTTP, the
control loop, real Ray jobs): the program's own error before its first step
fails the job at once with that error; ``--wait`` / ``logs --follow`` print
each event once; a job the cluster can never hold is refused, a waiting one
says why; what the job's tasks print, and its traceback, is in ``logs``.

The programs are shipped in a working directory (runtime_env), as a user's
would be; each fails only in the job's own processes (not in the describe
task at submission), the way errors that depend on where code runs do.
"""

from __future__ import annotations

import json
import re
import textwrap
import threading
import time

import pytest

from elasticps.manager import Store
from elasticps.manager.client import Client
from elasticps.manager.observe import OWN_ERROR
from elasticps.manager.service import Manager
from tests.helpers import serve_api, wait_for

TOKEN = "t" * 32

PROGRAM = textwrap.dedent(
    """
    import ray
    import torch
    from torch import nn
    from torch.utils.data import TensorDataset

    from elasticps import TrainingProgram


    def in_job() -> bool:
        return ray.get_runtime_context().get_actor_id() is not None  # the job's driver or tasks, not describe


    def data():
        g = torch.Generator().manual_seed(0)
        x = torch.randn(64, 8, generator=g)
        return TensorDataset(x, (x[:, :2] * 2).argmax(1))


    def model(fail_step):
        print("building the model", flush=True)
        inputs = 9 if fail_step and in_job() else 8  # a shape mismatch at step 0, in the job only
        return nn.Sequential(nn.Linear(inputs, 16), nn.ReLU(), nn.Linear(16, 2))


    def program(fail_factory=False, fail_step=False, epochs=1):
        if fail_factory and in_job():
            raise ValueError("the factory cannot find its data")
        return TrainingProgram(
            name="user",
            model=lambda: model(fail_step),
            dataset=data,
            loss=nn.functional.cross_entropy,
            optimizer="sgd",
            lr=0.1,
            batch_size=32,
            epochs=epochs,
        )
    """
)


@pytest.fixture(scope="module")
def live(ray_local, tmp_path_factory):
    """A manager with the real runtime, its loop and its API; yields (client, manager, code dir)."""
    tmp = tmp_path_factory.mktemp("failures")
    code = tmp / "code"
    code.mkdir()
    (code / "userjob.py").write_text(PROGRAM)
    manager = Manager(Store(tmp / "m.db"), tmp / "work", report_interval_s=0.5, ship_roots=(code,))
    stop = threading.Event()
    loop = threading.Thread(target=manager.run, args=(0.5, stop), kwargs={"watch_s": 0.1}, daemon=True)
    loop.start()
    with serve_api(manager, TOKEN) as url:
        yield Client(url, TOKEN), manager, code
    stop.set()
    loop.join(timeout=30)
    manager.shutdown()


def _spec(name: str, code, **args) -> dict:
    return {
        "name": name,
        "program": "userjob:program",
        "args": args,
        "ps": {"min": 1, "max": 1, "cpu": 0.5},
        "workers": {"min": 1, "max": 1, "cpu": 0.5},
        "runtime_env": {"working_dir": str(code)},
    }


@pytest.mark.parametrize(
    ("args", "error"),
    [
        ({"fail_factory": True}, "ValueError: the factory cannot find its data"),
        ({"fail_step": True}, "step 0 failed in user code"),
    ],
    ids=["factory-raises-in-the-driver", "shape-mismatch-at-step-0"],
)
def test_the_programs_own_error_before_its_first_step_fails_the_job_at_once(live, args, error):
    client, _, code = live
    name = "fails-" + next(iter(args)).replace("_", "-")
    client.submit(_spec(name, code, **args))
    job = client.wait(name, timeout_s=120, poll_s=0.2)
    assert job.state == "failed"
    events = [(e.kind, e.message) for e in client.events(name)]
    failed = [m for k, m in events if k == "failed"]
    assert len(failed) == 1 and OWN_ERROR in failed[0] and error in failed[0], events
    assert not any("starts again" in m for _, m in events), events  # not retried
    assert "started" in [k for k, _ in events]
    # its own output: what each task printed, tagged by task, and the whole traceback
    output = "".join(piece.text for piece in client.output(name))
    assert "[driver] Traceback (most recent call last):" in output and error in output, output
    if "fail_step" in args:
        assert "[driver] building the model" in output and "[worker-0] building the model" in output, output
        assert "[driver] RuntimeError: mat1 and mat2 shapes cannot be multiplied" in output, output


def test_wait_and_follow_print_each_event_once_when_a_job_fails_before_step_1(live, capsys, monkeypatch):
    from elasticps.cli.main import main

    client, _, code = live
    url = str(client.http.base_url).rstrip("/")
    monkeypatch.setenv("ELASTICPS_TOKEN", TOKEN)
    spec = code.parent / "once.json"
    spec.write_text(json.dumps(_spec("once", code, fail_step=True)))
    assert main(["submit", str(spec), "--wait", "--url", url]) == 1
    out = capsys.readouterr().out
    lines = [ln for ln in out.splitlines() if ln.startswith("event")]
    assert lines and len(lines) == len(set(lines)), out  # each event once
    assert any("failed in user code" in ln for ln in lines), out
    assert any(ln.startswith("[worker-0] building the model") for ln in out.splitlines()), out  # its output too
    assert main(["logs", "once", "--url", url, "--follow", "--progress"]) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("event")]
    assert lines and len(lines) == len(set(lines))
    assert main(["logs", "once", "--url", url]) == 0
    out = capsys.readouterr().out
    assert "[worker-0] building the model" in out and "failed in user code" in out


def test_a_job_that_can_never_fit_is_refused_with_the_numbers_and_a_waiting_one_says_why(live, capsys, monkeypatch):
    from elasticps.cli.main import main
    from elasticps.manager.client import ManagerError

    client, _, code = live
    too_big = _spec("too-big", code)
    too_big["workers"]["cpu"] = 100
    with pytest.raises(ManagerError, match="a worker needs 100 CPU, the largest node has 8 CPU") as refused:
        client.submit(too_big)
    assert refused.value.status == 422
    holder, waiter = _spec("holder", code, epochs=100_000), _spec("waiter", code)
    holder["workers"]["cpu"], waiter["workers"]["cpu"] = 6, 4
    client.submit(holder)
    client.submit(waiter)
    # 8 CPUs - 0.5 - 6 held by the holder (less while earlier tests' tasks are still being released)
    shown = re.compile(r"waiting for room: a worker needs 4 CPU, the largest free node has (\S+) CPU$")
    wait_for(lambda: shown.match(client.job("waiter").reason or ""), 60, "the waiting job's reason")
    why = client.job("waiter").reason
    assert float(shown.match(why).group(1)) <= 1.5, why
    assert client.job("waiter").state == "pending" and not client.job("waiter").never_starts
    monkeypatch.setenv("ELASTICPS_TOKEN", TOKEN)
    url = str(client.http.base_url).rstrip("/")
    assert main(["status", "--url", url]) == 0
    out = capsys.readouterr().out
    assert re.search(shown.pattern.rstrip("$"), out), out
    assert main(["describe", "waiter", "--url", url, "-o", "json"]) == 0
    assert shown.match(json.loads(capsys.readouterr().out)["reason"])
    assert main(["describe", "waiter", "--url", url]) == 0
    out = capsys.readouterr().out
    assert re.search(r"reason:\s+" + shown.pattern.rstrip("$"), out), out
    for name in ("holder", "waiter"):
        client.cancel(name)


PINNED = textwrap.dedent(
    """
    import torch
    from torch import nn
    from torch.utils.data import TensorDataset

    from elasticps import TrainingProgram

    HIDDEN = 16


    def model():
        print(f"model hidden={HIDDEN}", flush=True)
        return nn.Sequential(nn.Linear(8, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, 2))


    def data():
        x = torch.randn(64, 8, generator=torch.Generator().manual_seed(0))
        return TensorDataset(x, (x[:, :2] * 2).argmax(1))


    def program():
        return TrainingProgram(name="pinned", model=model, dataset=data, loss=nn.functional.cross_entropy,
                               optimizer="sgd", lr=0.1, batch_size=32, epochs=100_000)
    """
)


def _retried(client, name: str) -> None:
    from elasticps.manager.client import ManagerError

    def retry() -> bool:
        try:
            client.retry(name)
        except ManagerError as exc:  # its last run is still stopping
            assert "still stopping" in str(exc), exc
            return False
        return True

    wait_for(retry, 60, f"{name} retried")


def _step(client, name: str) -> int:
    job = client.job(name)
    return job.progress.step if job.progress else -1


@pytest.mark.slow
def test_a_jobs_code_is_pinned_at_submit_and_a_retry_runs_it_after_the_directory_changed(live):
    """Submit ships a working dir; the model file then changes on disk (a wider
    layer). The cancelled job's retry resumes its checkpoint with the code as
    submitted (with the new code it would fail: the checkpoint does not fit);
    a new submit takes the new code."""
    client, manager, code = live
    src = code / "pinsrc"
    src.mkdir()
    (src / "pinjob.py").write_text(PINNED)
    spec = {**_spec("pinned", src), "program": "pinjob:program", "args": {}}
    job = client.submit(spec)
    uri = job.spec.runtime_env.working_dir
    assert re.fullmatch(r"gcs://_ray_pkg_[0-9a-f]{40}\.zip", uri), uri
    stored = manager.workdir / "jobs.d" / "pinned" / "code" / uri.removeprefix("gcs://")
    assert stored.is_file() and stored.stat().st_mode & 0o777 == 0o600
    pinned_event = [e.message for e in client.events("pinned") if e.kind == "pinned"]
    assert pinned_event == [f"code pinned: working_dir {src} as {uri}"]
    wait_for(lambda: _step(client, "pinned") >= 4, 120, "pinned's first steps")
    client.cancel("pinned")
    (src / "pinjob.py").write_text(PINNED.replace("HIDDEN = 16", "HIDDEN = 32"))

    _retried(client, "pinned")
    wait_for(lambda: any("resumed from checkpoint" in e.message for e in client.events("pinned")), 120, "resumed")
    resumed_at = _step(client, "pinned")
    wait_for(lambda: _step(client, "pinned") > resumed_at + 2, 120, "steps after the retry")
    assert client.job("pinned").state == "running"
    output = "".join(piece.text for piece in client.output("pinned"))
    assert "model hidden=16" in output and "hidden=32" not in output, output
    client.cancel("pinned")

    client.submit({**spec, "name": "repinned"})  # a new submit: the code as it is now
    wait_for(lambda: _step(client, "repinned") >= 1, 120, "repinned's first step")
    assert client.job("repinned").spec.runtime_env.working_dir != uri
    assert "model hidden=32" in "".join(piece.text for piece in client.output("repinned"))
    client.cancel("repinned")


def test_a_pinned_package_is_uploaded_to_a_cluster_that_lacks_it(live, tmp_path):
    """What a restarted manager meets: a fresh cluster without the job's package."""
    from ray._private.runtime_env.packaging import package_exists

    from elasticps.manager.pinning import pin, upload_pinned
    from elasticps.manager.spec import RuntimeEnvSpec

    src = tmp_path / "src"
    src.mkdir()
    (src / f"mod_{time.time_ns()}.py").write_text("X = 1\n")  # a package no cluster has seen
    env, pinned = pin(RuntimeEnvSpec(working_dir=str(src)), tmp_path / "code")
    assert len(pinned) == 1 and not package_exists(env.working_dir)
    upload_pinned(env.to_ray(), tmp_path / "code")
    assert package_exists(env.working_dir)


def test_a_runtime_env_that_cannot_be_set_up_is_refused_in_one_line(live):
    """Ray's own text of a runtime_env it could not set up runs on with the
    setup's traceback; the submit's refusal is one line, its reason (what was
    raised) included."""
    from elasticps.manager.client import ManagerError

    client, _, code = live
    spec = _spec("no-such-pip", code)
    spec["runtime_env"]["pip"] = ["elasticps-no-such-package==0.0.1"]
    with pytest.raises(ManagerError) as refused:
        client.submit(spec)
    text = str(refused.value)
    assert refused.value.status == 400 and "the job's runtime_env could not be set up: " in text, text
    assert "\n" not in text and "Traceback" not in text and len(text) < 800, text
    assert text.endswith("to enable pip runtime env.") or "elasticps-no-such-package" in text, text  # Ray's reason
