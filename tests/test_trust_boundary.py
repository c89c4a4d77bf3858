"""No code of a job runs in the manager: hostile programs against a real manager
on a real Ray cluster. Each hostile object runs a payload when it is unpickled,
writing a marker file named by the PID of the process that unpickled it; no
marker may name the manager's (this test's) process."""

from __future__ import annotations

import json
import os
import textwrap
import time

import pytest
import torch
from fastapi.testclient import TestClient

from elasticps.cli.main import main
from elasticps.examples import digits
from elasticps.manager import Store, parse_spec
from elasticps.manager.api import create_app
from elasticps.manager.service import Manager

pytestmark = pytest.mark.slow

HOSTILE = textwrap.dedent(
    """
    import dataclasses
    import os

    import ray
    from torch import nn

    from elasticps.examples import digits

    PAYLOAD = "import os; open(os.path.join({markers!r}, str(os.getpid())), 'w').close()"
    open(os.path.join({markers!r}, f"import-{{os.getpid()}}"), "w").close()  # who imports this module


    class EvilInt(int):
        def __reduce__(self):
            return (exec, (PAYLOAD,))


    class Boom(BaseException):  # escapes `except Exception`
        def __reduce__(self):
            return (exec, (PAYLOAD,))


    def base():
        return digits.program(epochs=1, batch_size=64)


    def evil_epochs():
        return dataclasses.replace(base(), epochs=EvilInt(2))


    def raises_boom():
        raise Boom("hostile")


    def patches_the_answers():
        if ray.get_runtime_context().get_actor_id() is not None:  # in the job's driver, not at submit
            from ray._private.serialization import SerializationContext

            own = SerializationContext.serialize  # the process is the program's: it can send Ray anything
            SerializationContext.serialize = lambda self, v: own(self, EvilInt(1) if isinstance(v, bytes) else v)
        return base()


    def wrong_shapes():
        return dataclasses.replace(base(), model=lambda: nn.Linear(3, 10))  # digits have 64 features
    """
)


@pytest.fixture(scope="module")
def manager(ray_local, tmp_path_factory):
    root = tmp_path_factory.mktemp("boundary")
    (root / "markers").mkdir()
    (root / "code").mkdir()
    (root / "code" / "hostile_job.py").write_text(HOSTILE.format(markers=str(root / "markers")))
    (root / "work").mkdir(mode=0o700)
    m = Manager(Store(root / "work" / "manager.db"), root / "work", report_interval_s=0.5, ship_roots=(root / "code",))
    m.root = root  # type: ignore[attr-defined]
    yield m
    m.shutdown()
    assert str(os.getpid()) not in os.listdir(root / "markers"), "a job's object ran code in the manager"


def spec(manager: Manager, name: str, factory: str) -> str:
    return json.dumps(
        {
            "name": name,
            "program": f"hostile_job:{factory}",
            "ps": {"min": 1, "max": 1, "cpu": 0.5},
            "workers": {"min": 1, "max": 1, "cpu": 0.5},
            "runtime_env": {"working_dir": str(manager.root / "code")},  # type: ignore[attr-defined]
        }
    )


def markers(manager: Manager) -> list[str]:
    return os.listdir(manager.root / "markers")  # type: ignore[attr-defined]


def test_hostile_answers_at_submit_are_refused_unread(manager):
    client = TestClient(create_app(manager, "t" * 32), base_url="http://127.0.0.1")
    headers = {"Authorization": "Bearer " + "t" * 32, "Content-Type": "application/json"}

    r = client.post("/jobs", content=spec(manager, "evil-epochs", "evil_epochs"), headers=headers)
    assert r.status_code == 400 and "program.epochs is a hostile_job.EvilInt, not plain data" in r.json()["detail"]

    r = client.post("/jobs", content=spec(manager, "boom", "raises_boom"), headers=headers)
    detail = r.json()["detail"]
    assert r.status_code == 400 and "Boom: hostile" in detail, detail
    assert 'hostile_job.py", line' in detail and 'raise Boom("hostile")' in detail  # where, in the user's code

    # a model that cannot take the data: refused at submit, with the user's error and where it was raised
    r = client.post("/jobs", content=spec(manager, "shapes", "wrong_shapes"), headers=headers)
    detail = r.json()["detail"]
    assert r.status_code == 400 and "training on one sample failed: RuntimeError" in detail, detail
    assert "mat1 and mat2 shapes cannot be multiplied" in detail and "in forward" in detail

    assert str(os.getpid()) not in markers(manager)
    assert client.get("/healthz").json() == {"ok": True}  # the manager serves on
    assert manager.store.list_jobs() == []


def test_a_driver_that_answers_with_pickles_fails_its_job_and_nothing_else(manager):
    manager.submit(parse_spec(spec(manager, "patched", "patches_the_answers"), "json"))
    manager.submit(parse_spec(spec(manager, "honest", "base"), "json"))
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and manager.store.get_job("patched").state in ("pending", "running"):
        manager.step()
        time.sleep(0.2)
    assert manager.store.get_job("patched").state == "failed"
    last = manager.store.events("patched")[-1][4]
    assert "came back as a Python object, which the manager does not read" in last, last
    assert str(os.getpid()) not in markers(manager)
    while time.monotonic() < deadline and manager.store.get_job("honest").state in ("pending", "running"):
        manager.step()
        time.sleep(0.2)
    assert manager.store.get_job("honest").state == "finished", manager.store.events("honest")

    # its model, exported by the operator's CLI, which must not import the job's code either
    out = manager.root / "model.pt"  # type: ignore[attr-defined]
    assert main(["export", "honest", "--workdir", str(manager.workdir), "--out", str(out)]) == 0
    exported = torch.load(out, weights_only=True)
    assert exported.keys() == digits.mlp().state_dict().keys() and exported["0.weight"].shape == (128, 64)
    imports = [m for m in markers(manager) if m.startswith("import-")]
    assert f"import-{os.getpid()}" not in imports and len(imports) >= 3  # describes, driver, export's child
