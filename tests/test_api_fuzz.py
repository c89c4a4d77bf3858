"""Fuzzing the REST API: whatever a client sends, the answer is never a 5xx,
a refused request leaves no row behind, and an accepted job never breaks a
scheduling round or a listing (the in-memory runtime; the app in-process)."""

from __future__ import annotations

import json
import sqlite3
from urllib.parse import quote

import pytest
import yaml
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from elasticps.manager import Store
from elasticps.manager.api import create_app
from elasticps.manager.fake import FakeCapacity, FakeRuntime
from elasticps.manager.service import Manager

PROGRAM = "elasticps.examples.digits:program"

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12)
)
values = st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)  # fmt: skip
good_names = st.from_regex(r"[a-z][a-z0-9-]{0,30}", fullmatch=True)
names = good_names | st.sampled_from(["UPPER", "a\n", "", "-x", "x" * 70]) | st.text(max_size=10)
programs = st.sampled_from([PROGRAM, PROGRAM, "no.such:prog", "os:system", "elasticps.examples.digits:nothing", "bad"])
counts = st.integers(0, 10) | values
task = st.fixed_dictionaries(
    {}, optional={"min": counts, "max": counts, "cpu": st.floats(0.05, 8) | values, "cpu_limit": values}
)
# near-valid specs: each field plausible or anything at all
specs = st.fixed_dictionaries(
    {"name": names, "program": programs},
    optional={
        "ps": task | values,
        "workers": task | values,
        "args": st.dictionaries(st.sampled_from(["epochs", "seed", "lr", "x"]), values, max_size=3) | values,
        "checkpoint_every_steps": st.integers(1, 1000) | values,
        "memory_gb": values,
        "extra": values,
    },
)
encodings = st.sampled_from(["json", "yaml", "json", "yaml", "text/plain", "none"])


def _encode(body: object, how: str) -> tuple[bytes, dict[str, str]]:
    if how == "yaml":
        try:
            return yaml.safe_dump(body).encode(), {"Content-Type": "application/yaml"}
        except (yaml.YAMLError, ValueError):
            how = "json"
    text = json.dumps(body, allow_nan=True).encode()  # NaN and Infinity tokens included
    return text, (
        {"Content-Type": "application/json"} if how == "json" else {"Content-Type": how} if how != "none" else {}
    )


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    path = tmp_path_factory.mktemp("fuzz")
    manager = Manager(
        Store(path / "m.db"), path / "work", runtime=FakeRuntime(), capacity=FakeCapacity(),
        allow_programs=("elasticps.examples",),
    )  # fmt: skip
    app = create_app(manager, token="t", allowed_hosts=frozenset({"testserver"}))
    with TestClient(app, headers={"Authorization": "Bearer t"}, raise_server_exceptions=False) as client:
        yield client, manager, path / "m.db"
    manager.shutdown()


def _rows(db) -> int:
    with sqlite3.connect(db) as con:
        return con.execute("SELECT COUNT(*) FROM jobs").fetchone()[0]


def _check_consistent(client, manager, db) -> None:
    listed = client.get("/jobs")
    assert listed.status_code == 200
    assert len(listed.json()) == _rows(db)  # every stored row reads back
    manager.step()  # and a round over them works


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=specs | specs | values, how=encodings)
def test_submit_never_errs_and_leaves_no_half_written_row(api, body, how):
    client, manager, db = api
    before = _rows(db)
    content, headers = _encode(body, how)
    r = client.post("/jobs", content=content, headers=headers)
    event(f"status {r.status_code}")
    assert r.status_code < 500, (r.status_code, r.text, body)
    assert set(r.json()) >= ({"name", "state"} if r.status_code == 201 else {"detail"})
    assert _rows(db) == before + (1 if r.status_code == 201 else 0)
    if r.status_code == 201:
        assert client.get(f"/jobs/{r.json()['name']}").status_code == 200
    _check_consistent(client, manager, db)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(patch=st.fixed_dictionaries({}, optional={"ps": task, "workers": task}) | values,
       how=encodings, name=st.sampled_from(["fuzz-target", "fuzz-target", "nope"]) | names)  # fmt: skip
def test_patch_never_errs_and_changes_nothing_when_refused(api, patch, how, name):
    client, manager, db = api
    if "fuzz-target" not in {j.name for j in manager.store.list_jobs()}:
        spec = {"name": "fuzz-target", "program": PROGRAM, "workers": {"min": 1, "max": 4}}
        assert client.post("/jobs", json=spec).status_code == 201
    before = manager.store.get_job("fuzz-target").spec
    content, headers = _encode(patch, how)
    r = client.patch(f"/jobs/{quote(name, safe='')}", content=content, headers=headers)
    event(f"status {r.status_code}")
    assert r.status_code < 500, (r.status_code, r.text, patch)
    if r.status_code != 200 or name != "fuzz-target":
        assert manager.store.get_job("fuzz-target").spec == before
    else:
        after = manager.store.get_job("fuzz-target").spec
        assert 1 <= after.ps.min <= after.ps.max and 1 <= after.workers.min <= after.workers.max
    _check_consistent(client, manager, db)
