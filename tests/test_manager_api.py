"""The REST API over real HTTP on loopback (uvicorn), against a real store
and the in-memory runtime (programs are resolved by the runtime, so these
tests need no Ray; tests/test_manager_loop.py runs the real one).

These tests cover the API's contract: validation, status codes, the security
boundary (token, Host, Origin, body type and size), metrics.
"""

from __future__ import annotations

import json
import re
import sqlite3
import subprocess
import sys
import threading
import time

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from elasticps import ConfigError
from elasticps.manager import Store
from elasticps.manager.api import create_app
from elasticps.manager.fake import FakeCapacity, FakeRuntime
from elasticps.manager.service import Manager
from tests.helpers import serve_api, wait_for

SPEC = "name: {name}\nprogram: elasticps.examples.digits:program\nworkers: {{min: 1, max: 2}}\n"
YAML = {"Content-Type": "application/yaml"}


@pytest.fixture
def server(tmp_path):
    manager = Manager(Store(tmp_path / "m.db"), tmp_path / "work", runtime=FakeRuntime(), capacity=FakeCapacity())
    with serve_api(manager, "s3cret") as url:
        client = httpx.Client(base_url=url, headers={"Authorization": "Bearer s3cret"}, timeout=10)
        yield client, manager
        client.close()


def test_submit_list_get_cancel_events_metrics(server):
    client, _ = server
    r = client.post("/jobs", content=SPEC.format(name="job-1"), headers=YAML)
    assert r.status_code == 201 and r.json()["state"] == "pending"
    assert client.post("/jobs", content=SPEC.format(name="job-1"), headers=YAML).status_code == 409
    r = client.post("/jobs", json={"name": "job-2", "program": "elasticps.examples.digits:program"})
    assert r.status_code == 201
    assert [j["name"] for j in client.get("/jobs").json()] == ["job-1", "job-2"]
    assert client.get("/jobs/job-2").json()["spec"]["workers"]["max"] == 8
    assert client.get("/jobs/nope").status_code == 404
    assert client.delete("/jobs/job-1").json()["state"] == "cancelled"
    assert client.delete("/jobs/job-1").json()["state"] == "cancelled"  # idempotent
    assert client.post("/jobs/job-2/retry").status_code == 409  # pending: nothing to run again
    kinds = [(e["job"], e["kind"]) for e in client.get("/events").json()]
    assert kinds == [("job-1", "submitted"), ("job-2", "submitted"), ("job-1", "cancelled")]
    assert len(client.get("/events", params={"after": 2}).json()) == 1
    assert [e["kind"] for e in client.get("/events", params={"job": "job-1"}).json()] == ["submitted", "cancelled"]
    assert client.get("/events", params={"job": "no-such-job"}).status_code == 404
    # query figures beyond what the database holds are the client's error, not the server's
    for path, params in [
        ("/events", {"after": "99999999999999999999"}),
        ("/events", {"after": -1}),
        ("/jobs/job-2/logs", {"after_step": "99999999999999999999"}),
        ("/events", {"job": "x" * 64}),
    ]:
        assert client.get(path, params=params).status_code == 400, (path, params)
    metrics = client.get("/metrics").text
    families = {f.name: f for f in text_string_to_metric_families(metrics)}
    jobs = {s.labels["state"]: s.value for s in families["elasticps_jobs"].samples}
    assert jobs["pending"] == 1 and jobs["cancelled"] == 1 and jobs["running"] == 0
    assert families["elasticps_decision_seconds"].type == "histogram"
    assert "openapi" in client.get("/openapi.json").json()


@pytest.mark.parametrize(
    ("body", "detail"),
    [
        ("name: UPPER\nprogram: a.b:c\n", "field 'name'"),
        ("name: x\nprogram: a.b:c\nworkers: {min: 3, max: 1}\n", "field 'workers'"),
        ("name: x\nprogram: no.such.module:prog\n", "field 'program': cannot import program 'no.such.module:prog'"),
        ("name: x\nprogram: a.b:c\nargs: {seed: .nan}\n", "field 'args.seed': must be a finite number"),
        ("name: x\nprogram: a.b:c\nps: {min: 0, max: 0}\n", "field 'ps': min must be >= 1"),
        ("[" * 5000, "nested too deeply"),
        ("name: x\n", "field 'program': Field required"),
    ],
)
def test_bad_specs_get_a_4xx_naming_the_field(server, body, detail):
    client, manager = server
    r = client.post("/jobs", content=body, headers=YAML)
    # the document's own problems are a 422 listing each; a program that cannot be imported is a 400
    assert r.status_code == (400 if "cannot import" in detail else 422) and detail in r.json()["detail"], r.text
    assert manager.store.list_jobs() == []  # nothing half-written


def test_requests_without_the_token_are_refused(server):
    client, _ = server
    url = str(client.base_url).rstrip("/") + "/jobs"
    assert httpx.get(url).status_code == 401
    assert httpx.get(url, headers={"Authorization": "Bearer wrong"}).status_code == 401
    # the schema wants the token too, and no page that loads a CDN's script is served at all
    base = str(client.base_url).rstrip("/")
    assert httpx.get(base + "/openapi.json").status_code == 401
    for page in ("/docs", "/redoc", "/docs/oauth2-redirect"):
        assert client.get(page).status_code == 404, page
    assert "cdn" not in client.get("/").text.lower()


def test_the_boundary_refuses_cross_site_rebinding_and_oversized_requests(server):
    """What a web page (CSRF) or a DNS-rebinding attack could send, and a body
    too large to parse, are refused before anything runs."""
    client, manager = server
    spec = SPEC.format(name="csrf")
    # a page can POST text/plain cross-site without a preflight: not a type we accept
    assert client.post("/jobs", content=spec, headers={"Content-Type": "text/plain"}).status_code == 415
    assert client.post("/jobs", content=spec).status_code == 415  # no type at all
    r = client.post("/jobs", content=spec, headers={**YAML, "Origin": "http://evil.example"})
    assert r.status_code == 403 and "cross-origin" in r.json()["detail"]
    r = client.get("/jobs", headers={"Host": "evil.example"})
    assert r.status_code == 403 and "Host 'evil.example'" in r.json()["detail"]
    big = "name: big\nprogram: a.b:c\n#" + "x" * 100_000
    assert client.post("/jobs", content=big, headers=YAML).status_code == 413

    def chunks():  # no Content-Length: the limit holds while reading
        for _ in range(100):
            yield b"#" + b"x" * 1023 + b"\n"

    assert client.post("/jobs", content=chunks(), headers=YAML).status_code == 413
    assert manager.store.list_jobs() == []
    own = str(client.base_url).rstrip("/")
    assert client.post("/jobs", content=spec, headers={**YAML, "Origin": own}).status_code == 201
    assert client.get("/healthz", headers={"Authorization": ""}).status_code == 200
    # a kubelet's probe names the pod by its IP: /healthz answers any Host, nothing else does
    assert client.get("/healthz", headers={"Host": "10.1.2.3:8000"}).status_code == 200
    assert client.get("/", headers={"Host": "10.1.2.3:8000"}).status_code == 403


def test_a_token_is_always_required(tmp_path):
    manager = Manager(Store(tmp_path / "m.db"), tmp_path, runtime=FakeRuntime(), capacity=FakeCapacity())
    with pytest.raises(ConfigError, match="needs a token"):
        create_app(manager, token="")


def test_cli_talks_to_the_server(server, tmp_path, monkeypatch, capsys):
    from elasticps.cli.main import main

    client, _ = server
    url = str(client.base_url).rstrip("/")
    monkeypatch.setenv("ELASTICPS_TOKEN", "s3cret")
    spec = tmp_path / "job.yaml"
    spec.write_text(SPEC.format(name="cli-job"))
    assert main(["submit", str(spec), "--url", url]) == 0
    assert main(["status", "--url", url]) == 0
    assert main(["cancel", "cli-job", "--url", url]) == 0
    assert main(["events", "cli-job", "--url", url]) == 0
    assert main(["submit", str(spec), "--url", url]) == 2  # duplicate: a clear error, non-zero exit
    out, err = capsys.readouterr()
    assert "submitted cli-job (pending)" in out
    assert "cli-job  pending" in out.replace("   ", "  ")
    assert "cli-job: cancelled" in out and "cancelled" in out
    assert "409: a job named 'cli-job' already exists" in err


def test_limits_can_be_changed_and_are_validated(server):
    client, _ = server
    assert client.post("/jobs", content=SPEC.format(name="lim"), headers=YAML).status_code == 201
    r = client.patch("/jobs/lim", json={"workers": {"max": 6}})
    assert r.status_code == 200 and r.json()["spec"]["workers"] == {**r.json()["spec"]["workers"], "min": 1, "max": 6}
    r = client.patch("/jobs/lim", json={"workers": {"min": 5, "max": 2}})
    assert r.status_code == 422 and "field 'workers'" in r.json()["detail"]
    r = client.patch("/jobs/lim", json={"gpus": 3})
    assert r.status_code == 422 and r.json()["problems"] == [
        "job limits field 'gpus': unknown field (fields: ps, workers)"
    ]
    r = client.patch("/jobs/lim", json={"workers": {"min": "abc"}})
    assert r.status_code == 422 and "field 'workers.min'" in r.json()["detail"]
    assert client.patch("/jobs/lim", json={"workers": {"min": True}}).status_code == 422
    assert client.patch("/jobs/lim", json=[1]).status_code == 422
    assert client.patch("/jobs/none", json={"ps": {"max": 2}}).status_code == 404
    assert [e["kind"] for e in client.get("/events", params={"job": "lim"}).json()] == ["submitted", "limits"]


def test_cli_scale_changes_the_limits_and_reads_print_json_or_yaml(server, monkeypatch, capsys):
    from elasticps.cli.main import main

    client, manager = server
    url = str(client.base_url).rstrip("/")
    monkeypatch.setenv("ELASTICPS_TOKEN", "s3cret")
    assert client.post("/jobs", content=SPEC.format(name="sc"), headers=YAML).status_code == 201
    assert main(["scale", "sc", "--workers", "2..8", "--ps", "3", "--url", url]) == 0
    assert "sc: ps 3..3, workers 2..8" in capsys.readouterr().out
    spec = manager.store.get_job("sc").spec
    assert (spec.ps.min, spec.ps.max, spec.workers.min, spec.workers.max) == (3, 3, 2, 8)
    with pytest.raises(SystemExit):
        main(["scale", "sc", "--workers", "8..2", "--url", url])  # refused by the parser
    assert "expected 1 <= MIN <= MAX, got '8..2'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["scale", "sc", "--ps", "0..2", "--url", url])  # a job needs a PS: refused before a request
    assert "expected 1 <= MIN <= MAX, got '0..2'" in capsys.readouterr().err
    assert main(["scale", "sc", "--url", url]) == 2
    assert "error: scale: give --ps and/or --workers" in capsys.readouterr().err
    capsys.readouterr()
    assert main(["status", "-o", "json", "--url", url]) == 0
    assert [j["name"] for j in json.loads(capsys.readouterr().out)] == ["sc"]
    assert main(["describe", "sc", "-o", "yaml", "--url", url]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["spec"]["workers"]["max"] == 8
    assert main(["events", "sc", "-o", "json", "--url", url]) == 0
    assert [e["kind"] for e in json.loads(capsys.readouterr().out)] == ["submitted", "limits"]
    assert main(["delete", "sc", "--url", url, "--yes"]) == 2  # not ended
    assert "409: job 'sc' is pending; cancel it before deleting it" in capsys.readouterr().err
    # without --yes, a job that cannot be deleted is refused before the question is asked
    monkeypatch.setattr("sys.stdin.isatty", lambda: True)
    monkeypatch.setattr("builtins.input", lambda question: pytest.fail(f"asked {question!r}"))
    assert main(["delete", "sc", "--url", url]) == 2
    assert "job 'sc' is pending; cancel it before deleting it" in capsys.readouterr().err
    assert main(["delete", "no-such-job", "--url", url]) == 2
    assert "404" in capsys.readouterr().err
    assert main(["retry", "sc", "--url", url]) == 2  # pending: nothing to retry, whatever stops or not
    assert "job 'sc' is pending: only failed or cancelled jobs are retried" in capsys.readouterr().err
    assert main(["cancel", "sc", "--url", url]) == 0
    # a cancelled job runs again from its latest checkpoint on a retry
    assert main(["retry", "sc", "--url", url]) == 0 and "sc: pending" in capsys.readouterr().out
    assert [e["kind"] for e in client.get("/events", params={"job": "sc"}).json()][-2:] == ["cancelled", "retry"]
    assert main(["cancel", "sc", "--url", url]) == 0
    # delete asks first: no terminal, no --yes: nothing is deleted
    monkeypatch.setattr("sys.stdin.isatty", lambda: False)
    assert main(["delete", "sc", "--url", url]) == 1 and "pass --yes" in capsys.readouterr().err
    monkeypatch.setattr("sys.stdin.isatty", lambda: True)
    monkeypatch.setattr("builtins.input", lambda question: "n")
    assert main(["delete", "sc", "--url", url]) == 1 and client.get("/jobs/sc").status_code == 200
    monkeypatch.setattr("builtins.input", lambda question: "y" if "checkpoints" in question else "n")
    assert main(["delete", "sc", "--url", url]) == 0
    assert "sc: deleted" in capsys.readouterr().out
    assert client.get("/jobs/sc").status_code == 404
    assert client.post("/jobs", content=SPEC.format(name="sc"), headers=YAML).status_code == 201  # the name is free


def test_submit_wait_streams_the_log_and_exits_with_the_jobs_result(server, tmp_path, monkeypatch, capsys):
    from elasticps.cli.main import main

    client, manager = server
    url = str(client.base_url).rstrip("/")
    monkeypatch.setenv("ELASTICPS_TOKEN", "s3cret")
    done = threading.Event()

    def loop() -> None:  # the manager's rounds, quickly
        while not done.is_set():
            manager.step()
            time.sleep(0.02)

    rounds = threading.Thread(target=loop, daemon=True)
    rounds.start()
    try:
        spec = tmp_path / "w.yaml"
        spec.write_text(SPEC.format(name="w"))
        assert main(["submit", str(spec), "--wait", "--url", url]) == 0
        out = capsys.readouterr().out
        assert "submitted w (pending)" in out and "samples/s" in out and out.rstrip().endswith("w: finished")
        done.set()  # no more rounds: the next job stays pending until cancelled
        rounds.join(timeout=10)
        spec.write_text(SPEC.format(name="w2"))
        threading.Timer(0.5, lambda: manager.cancel("w2")).start()
        assert main(["submit", str(spec), "--wait", "--url", url]) == 1
        assert capsys.readouterr().out.rstrip().endswith("w2: cancelled")
    finally:
        done.set()
        rounds.join(timeout=10)


def test_submit_wait_says_why_a_job_waits_and_exits_1_when_it_can_never_start(server, tmp_path, monkeypatch, capsys):
    from elasticps.cli.main import main

    client, manager = server
    monkeypatch.setenv("ELASTICPS_TOKEN", "s3cret")
    spec = tmp_path / "big.yaml"
    spec.write_text(SPEC.format(name="big").replace("max: 2}", "max: 2, cpu: 6}"))

    def shrink() -> None:  # once it is accepted, the cluster loses its large node
        wait_for(lambda: "big" in manager.waiting, 20, "the job to be accepted")
        manager.capacity.nodes = {"node-0": (4.0, 0.0)}
        manager.step()

    threading.Thread(target=shrink, daemon=True).start()
    assert main(["submit", str(spec), "--wait", "--url", str(client.base_url).rstrip("/")]) == 1
    err = capsys.readouterr().err
    assert "big can never start on this cluster: cannot fit: a worker needs 6 CPU, the largest node has 4 CPU" in err
    job = client.get("/jobs/big").json()
    assert job["state"] == "pending" and job["never_starts"] and job["reason"].startswith("cannot fit")
    r = client.post("/jobs", content=SPEC.format(name="bigger").replace("max: 2}", "max: 2, cpu: 6}"), headers=YAML)
    assert r.status_code == 422 and "a worker needs 6 CPU, the largest node has 4 CPU" in r.json()["detail"]


def test_logs_and_the_live_status_view(server, monkeypatch, capsys):
    from elasticps.cli.main import main
    from elasticps.runtime import EpochReport, JobReport, WindowReport
    from elasticps.runtime.reports import StepTimes

    client, manager = server
    client.post("/jobs", content=SPEC.format(name="done"), headers=YAML)
    times = StepTimes(compute_s=0.004, pull_s=0.001, push_s=0.001, update_s=0.0005, wait_s=0.0)
    windows = [
        WindowReport(0, 9, 10, 640, 1.0, 640.0, 1.5, times, 1, 1),
        WindowReport(10, 19, 10, 640, 0.5, 1280.0, 0.9, times, 1, 2),
    ]
    epoch = EpochReport(1, 21, 900.0, 1.6, 1.1, 0.93, None, 1, 2)
    # the last report of a job that ended while this manager ran (what the control loop keeps)
    manager.ended["done"] = JobReport(
        name="done", state="finished", mode="sync", step=21, epoch=1, cursor=0, epochs=2, samples_seen=1344,
        num_ps=1, num_workers=2, target_shape=(1, 2), placement={}, windows=windows, epoch_reports=[epoch],
        events=["resumed at step 0"],
    )  # fmt: skip
    manager.store.record_allocation("done", time.time(), 1, 2, {})
    manager.store.transition("done", "running", time.time())
    manager.store.transition("done", "finished", time.time())
    lines = client.get("/jobs/done/logs").json()
    assert [(line["step"], line["kind"]) for line in lines] == [
        (9, "window"),
        (19, "window"),
        (21, "epoch"),
        (None, "event"),
    ]
    assert "P=1 W=2 1280 samples/s loss 0.9000" in lines[1]["text"]
    assert [line["step"] for line in client.get("/jobs/done/logs", params={"after_step": 9}).json()] == [19, 21]
    assert client.get("/jobs/nope/logs").status_code == 404

    url = str(client.base_url).rstrip("/")
    monkeypatch.setenv("ELASTICPS_TOKEN", "s3cret")
    assert main(["logs", "done", "--url", url, "--follow", "--progress"]) == 0  # ends: the job has finished
    assert main(["status", "--url", url, "--watch", "0.1"]) == 0  # ends: every job has ended
    out, _ = capsys.readouterr()
    assert "step     21  epoch 1 done in 1.6 s, metric 0.9300" in out
    assert re.search(r"done\s+finished\s+1x2\s+\[#{10}\.{10}\] 1/2\s+1280\s+0\.9300", out), out


def test_the_cli_finds_the_token_in_the_workdir_then_env_then_flag(server, tmp_path, monkeypatch, capsys):
    from elasticps.cli.main import main
    from elasticps.manager.workdir import api_token

    client, _ = server
    url = str(client.base_url).rstrip("/")
    monkeypatch.delenv("ELASTICPS_TOKEN", raising=False)
    state = tmp_path / "state"
    made = api_token(state)  # what a server makes at first start: 64 hex digits, 0600
    assert len(made) == 64 and (state / "token").stat().st_mode & 0o777 == 0o600
    (state / "token").write_text("s3cret\n")  # this test server's token
    assert main(["status", "--url", url, "--workdir", str(state)]) == 0
    assert main(["status", "--url", url, "--workdir", str(tmp_path / "none")]) == 2  # no token: 401
    assert main(["status", "--url", url, "--workdir", str(tmp_path / "none"), "--token", "s3cret"]) == 0
    monkeypatch.setenv("ELASTICPS_TOKEN", "wrong")
    assert main(["status", "--url", url, "--workdir", str(state)]) == 2  # the environment wins over the file
    monkeypatch.delenv("ELASTICPS_TOKEN")
    (state / "token").chmod(0o644)
    assert main(["status", "--url", url, "--workdir", str(state)]) == 2
    err = capsys.readouterr().err
    assert "401" in err and "readable by other users; run: chmod 600" in err


def test_the_python_client_is_typed_and_waits_follows_and_reads_metrics(server, tmp_path):
    from elasticps.manager.client import Client, ManagerError
    from elasticps.manager.models import JobOut, LogLine
    from elasticps.manager.spec import parse_spec

    http, manager = server
    client = Client(str(http.base_url).rstrip("/"), token="s3cret")
    done = threading.Event()

    def loop() -> None:
        while not done.is_set():
            manager.step()
            time.sleep(0.02)

    path = tmp_path / "a.yaml"
    path.write_text(SPEC.format(name="from-file"))
    job = client.submit(path)  # a file
    assert isinstance(job, JobOut) and job.name == "from-file" and job.state == "pending"
    assert client.submit(parse_spec(SPEC.format(name="from-spec"))).spec.workers.max == 2  # a JobSpec
    assert client.submit({"name": "from-dict", "program": "elasticps.examples.digits:program"}).name == "from-dict"
    with pytest.raises(ManagerError, match="409") as err:
        client.submit(path)
    assert err.value.status == 409
    with pytest.raises(TimeoutError, match="still pending"):
        client.wait("from-file", timeout_s=0.3, poll_s=0.1)  # no rounds yet
    assert client.scale("from-spec", workers=(1, 1)).spec.workers.max == 1
    rounds = threading.Thread(target=loop, daemon=True)
    rounds.start()
    try:
        lines = list(client.logs("from-file", follow=True, poll_s=0.1))  # returns once the job has ended
        assert lines and all(isinstance(x, LogLine) for x in lines) and any(x.kind == "window" for x in lines)
        steps = [x.step for x in lines if x.step is not None]
        assert len(steps) == len(set(zip(steps, [x.kind for x in lines if x.step is not None], strict=True)))
        assert client.wait("from-file", timeout_s=30).state == "finished"
    finally:
        done.set()
        rounds.join(timeout=10)
    families = {f.name for f in text_string_to_metric_families(client.metrics())}
    assert "elasticps_jobs" in families and "elasticps_decision_seconds" in families
    assert next(e.kind for e in client.events("from-file")) == "submitted"


def test_the_openapi_schema_types_every_request_and_answer_a_client_needs(server):
    """What a client generator needs: every job operation has a typed success answer
    and typed errors, bodies have schemas, and every $ref resolves."""
    http, _ = server
    schema = http.get("/openapi.json").json()
    components = schema["components"]["schemas"]
    refs: list[str] = []

    def collect(node) -> None:
        if isinstance(node, dict):
            if "$ref" in node:
                refs.append(node["$ref"])
            for value in node.values():
                collect(value)
        elif isinstance(node, list):
            for value in node:
                collect(value)

    collect(schema["paths"])
    assert refs and all(r.startswith("#/components/schemas/") and r.rsplit("/", 1)[1] in components for r in refs)
    for path, ops in schema["paths"].items():
        if not (path.startswith("/jobs") or path == "/events"):
            continue
        for method, op in ops.items():
            ok = next(code for code in op["responses"] if code.startswith("2"))
            answer = op["responses"][ok]["content"]["application/json"]["schema"]
            assert "$ref" in answer or "$ref" in answer.get("items", {}), (method, path)
            assert op["responses"]["404"]["content"]["application/json"]["schema"]["$ref"].endswith("/ErrorOut")
            if method in ("post", "patch") and path in ("/jobs", "/jobs/{name}"):
                body = op["requestBody"]["content"]
                assert set(body) == {"application/json", "application/yaml"}, (method, path)
    job_spec = components["JobSpec"]
    assert {"name", "program", "ps", "workers", "runtime_env"} <= set(job_spec["properties"])
    assert set(job_spec["required"]) == {"name", "program"}


LOCKER = """
import sqlite3, sys
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute("BEGIN EXCLUSIVE")
print("locked", flush=True)
sys.stdin.readline()  # held until the test says so
db.execute("COMMIT")
"""


def test_a_database_locked_by_another_process_is_a_quick_503_with_retry_after(server):
    client, manager = server
    locker = subprocess.Popen(
        [sys.executable, "-c", LOCKER, str(manager.store.path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert locker.stdout.readline().strip() == "locked"
        started = time.monotonic()
        r = client.post("/jobs", content=SPEC.format(name="while-locked"), headers=YAML)
        waited_s = time.monotonic() - started
        assert r.status_code == 503 and "database" in r.json()["detail"] and r.headers["Retry-After"] == "5", r.text
        assert waited_s < 8, waited_s  # the store's busy timeout (2 s), not a hung request
        assert client.get("/jobs").status_code == 200  # readers go on (WAL)
    finally:
        locker.communicate("go\n", timeout=10)
    assert client.post("/jobs", content=SPEC.format(name="while-locked"), headers=YAML).status_code == 201


def test_a_full_disk_is_a_503_with_retry_after(server, monkeypatch):
    """Simulated: SQLite's own error for a full disk, raised at the store's write
    (tests/test_server_hardening.py fills a real tmpfs under a real server)."""
    client, manager = server

    def full(*_args, **_kwargs):
        raise sqlite3.OperationalError("database or disk is full")

    monkeypatch.setattr(manager.store, "add_job", full)
    r = client.post("/jobs", content=SPEC.format(name="no-room"), headers=YAML)
    assert r.status_code == 503 and "full" in r.json()["detail"] and r.headers["Retry-After"] == "5", r.text


def test_reads_answer_while_a_round_holds_the_managers_lock(server):
    """A round that is starting jobs (Ray calls: seconds) holds the manager's lock;
    listing and reading jobs must not wait for it."""
    client, manager = server
    assert client.post("/jobs", content=SPEC.format(name="job-1"), headers=YAML).status_code == 201
    taken, release = threading.Event(), threading.Event()

    def a_long_round() -> None:
        with manager._lock:
            taken.set()
            release.wait(60)

    holder = threading.Thread(target=a_long_round)
    holder.start()
    try:
        assert taken.wait(10)
        assert [j["name"] for j in client.get("/jobs", timeout=5).json()] == ["job-1"]
        assert client.get("/jobs/job-1", timeout=5).json()["state"] == "pending"
    finally:
        release.set()
        holder.join()


def test_a_name_no_job_can_have_never_reaches_the_server(server):
    """A name is a path segment: 'done/delete?' would be the delete endpoint of job 'done'."""
    from elasticps.manager.client import Client, ManagerError

    http, _ = server
    client = Client(str(http.base_url).rstrip("/"), token="s3cret")
    client.submit({"name": "done", "program": "elasticps.examples.digits:program"})
    client.cancel("done")
    for call in (client.retry, client.delete, client.job, client.detail, client.cancel, client.events):
        for bad in ("done/delete?", "", "..", "Done", "done/logs"):
            with pytest.raises(ManagerError, match=f"no job can be named {re.escape(repr(bad))}"):
                call(bad)
    assert client.job("done").state == "cancelled"
    assert [e.kind for e in client.events("done")][-1] == "cancelled"
