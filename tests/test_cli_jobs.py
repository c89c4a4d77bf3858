"""The client commands as people read them: ``describe`` (a summary; ``-o json``
for machines), ``events`` (a time column, ``--tail``), ``status --active/--state``
(samples/s held between polls), ``logs --follow`` (ends with the final state; a
closed pipe ends quietly). One server with the in-memory runtime, rounds run by
the test."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from elasticps.cli.main import main
from elasticps.manager import Store, parse_spec
from elasticps.manager.api import create_app
from elasticps.manager.fake import FakeCapacity, FakeRuntime
from elasticps.manager.service import Manager
from tests.helpers import serve_app

SPEC = "name: {name}\nprogram: elasticps.examples.digits:program\nworkers: {{min: 1, max: 4}}\nps: {{max: 2}}\n"
TIME = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d"


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cli")
    manager = Manager(Store(tmp / "m.db"), tmp / "work", runtime=FakeRuntime(), capacity=FakeCapacity())
    for name in ("alpha", "beta", "gamma"):
        manager.submit(parse_spec(SPEC.format(name=name)))
    manager.cancel("gamma")
    for _ in range(4):
        manager.step()
    with serve_app(create_app(manager, token="s3cret" * 3)) as url:
        yield manager, url
    manager.shutdown()


@pytest.fixture
def cli(site, monkeypatch, capsys):
    _, url = site
    monkeypatch.setenv("ELASTICPS_TOKEN", "s3cret" * 3)

    def run(*argv: str) -> tuple[int, str]:
        code = main([*argv, "--url", url])
        return code, capsys.readouterr().out

    return run


def test_describe_is_a_summary_with_times_and_shape_history_and_json_for_machines(cli):
    code, out = cli("describe", "alpha")
    assert code == 0
    assert re.search(r"^state:\s+running$", out, re.M)
    assert re.search(rf"^submitted:\s+{TIME}$", out, re.M)  # a time, not a Unix float
    started = re.search(rf"^started:\s+({TIME})  \(elapsed \d+s\)$", out, re.M)
    _, events = cli("events", "alpha")
    assert started and f"{started.group(1)}  alpha        started" in events  # one start time, as events says
    assert re.search(r"^progress:\s+epoch \d+/\d+, step \d+, \d+ samples/s", out, re.M)
    assert re.search(rf"^shape history:\n  {TIME}  \d PS x \d workers?  for \d+s", out, re.M)
    code, out = cli("describe", "gamma")
    assert re.search(r"^reason:\s+job gamma cancelled$", out, re.M)
    code, out = cli("describe", "alpha", "-o", "json")
    assert code == 0 and json.loads(out)["name"] == "alpha" and json.loads(out)["state"] == "running"


def test_events_have_a_time_column_and_a_tail(cli, site):
    manager, _ = site
    code, out = cli("events")
    lines = out.strip().splitlines()
    assert code == 0 and len(lines) == len(manager.store.events())
    assert all(re.match(rf"{TIME}  \S+\s+\S+\s+", line) for line in lines)
    code, out = cli("events", "alpha", "--tail", "2")
    tail = out.strip().splitlines()
    assert len(tail) == 2 and tail[-1].endswith(manager.store.events("alpha")[-1][4])
    with pytest.raises(SystemExit):
        cli("events", "--tail", "-1")


def test_status_filters_and_keeps_samples_per_s_between_polls(cli, site):
    manager, _ = site
    code, out = cli("status", "--active")
    assert code == 0 and "alpha" in out and "beta" in out and "gamma" not in out
    code, out = cli("status", "--state", "cancelled")
    assert "gamma" in out and "alpha" not in out
    manager.live["alpha"].status = manager.live["alpha"].handle.poll(10**9, 10**9)  # a poll with no new window
    assert manager.live["alpha"].status.windows == []
    code, out = cli("status", "--active")
    (row,) = [line for line in out.splitlines() if line.startswith("alpha")]
    assert re.search(r"\s\d+\s+-\s*$", row), row  # samples/s is still shown (no metric yet)


def test_logs_follow_ends_with_the_final_state_and_a_closed_pipe_is_quiet(cli, site):
    manager, url = site
    manager.cancel("beta")
    manager.step()
    code, out = cli("logs", "beta", "--follow")
    assert code == 0 and out.rstrip().endswith("beta: cancelled")
    env = {"ELASTICPS_TOKEN": "s3cret" * 3, "PYTHONPATH": ":".join(sys.path)}
    many = subprocess.run(
        f"{sys.executable} -m elasticps events --url {url} | head -1", shell=True, capture_output=True, text=True,
        env=env, timeout=60,
    )  # fmt: skip
    assert re.match(TIME, many.stdout) and "Traceback" not in many.stderr and "BrokenPipe" not in many.stderr


def test_logs_of_a_job_that_printed_nothing_say_so(site, monkeypatch, capsys):
    _, url = site
    monkeypatch.setenv("ELASTICPS_TOKEN", "s3cret" * 3)
    assert main(["logs", "alpha", "--url", url]) == 0  # the in-memory runtime's jobs print nothing
    said = capsys.readouterr()
    assert said.out == "" and said.err == "alpha: running, printed nothing yet; --progress shows its progress log\n"
    assert main(["logs", "gamma", "--progress", "--url", url]) == 0  # cancelled before it ran: no progress either
    said = capsys.readouterr()
    assert said.out == "" and said.err == "gamma: cancelled, has no progress log\n"


def test_ctrl_c_while_following_stops_the_client_not_the_job_in_a_line(cli, site, monkeypatch, capsys):
    from elasticps.manager.client import Client

    def interrupted(*args, **kwargs):
        yield from ()
        raise KeyboardInterrupt  # where Ctrl-C lands: between two polls

    manager, url = site
    monkeypatch.setattr(Client, "output", interrupted)
    assert main(["logs", "alpha", "--follow", "--url", url]) == 130
    assert capsys.readouterr().err == "\nstopped watching alpha; it goes on (elasticps cancel alpha stops it)\n"
    assert manager.store.get_job("alpha").state == "running"
    monkeypatch.setattr(Client, "jobs", lambda self: (_ for _ in ()).throw(KeyboardInterrupt))
    assert main(["status", "--url", url]) == 130 and capsys.readouterr().err == "\ninterrupted\n"


def test_a_reason_with_a_traceback_is_one_line_of_the_status_table():
    from types import SimpleNamespace

    from elasticps.cli.jobs import REASON_WIDTH, _status_table

    reason = "job failed: UserCodeError: step 5 failed: Traceback (most recent call last):\n  File ...\nKeyError: 'x'"
    failed = SimpleNamespace(name="brk", state="failed", allocation=None, progress=None, reason=reason)
    ok = SimpleNamespace(name="ok", state="pending", allocation=None, progress=None, reason=None)
    lines = _status_table([failed, ok]).splitlines()
    assert len(lines) == 4 and lines[1].rstrip().endswith("job failed: UserCodeError: step 5 failed: ... KeyError: 'x'")
    assert lines[3] == "shortened here; whole: elasticps describe brk"  # the traceback's middle is left out
    failed.reason = "why " * 100
    row = _status_table([failed]).splitlines()[1].rstrip()
    cell = row[row.index("why") :]
    assert cell.endswith("...") and len(cell) == REASON_WIDTH
    assert _status_table([failed]).splitlines()[-1] == "shortened here; whole: elasticps describe brk"
    failed.reason = "waiting for room: a worker needs 4 CPU"  # whole in its cell: nothing to point at
    assert "shortened" not in _status_table([failed, ok])
