"""Job specs (validation names the bad field) and the SQLite store (survives SIGKILL)."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time

import pytest

from elasticps import ConfigError
from elasticps.manager import IllegalTransition, Store, parse_spec

GOOD = """
name: digits-1
program: elasticps.examples.digits:program
ps: {min: 1, max: 2, cpu: 0.5}
workers: {min: 1, max: 4, cpu: 1}
objective: efficiency
"""


def test_a_good_spec_parses_with_defaults():
    spec = parse_spec(GOOD)
    assert spec.name == "digits-1" and spec.mode == "sync" and spec.workers.max == 4
    assert spec.checkpoint_every_steps == 100 and spec.objective == "efficiency"
    assert parse_spec(spec.model_dump_json(), fmt="json") == spec
    with pytest.raises(ConfigError, match="not valid JSON: 'args' is given twice"):
        parse_spec('{"name": "j", "program": "m:p", "args": {}, "args": {"epochs": 2}}', fmt="json")


def test_a_ps_block_given_in_part_keeps_the_ps_defaults_for_the_rest():
    from elasticps.manager.spec import PS_DEFAULTS

    base = "name: j\nprogram: m:p\n"
    none = parse_spec(base).ps
    assert (none.min, none.max, none.cpu) == (PS_DEFAULTS["min"], PS_DEFAULTS["max"], PS_DEFAULTS["cpu"])
    part = parse_spec(base + "ps: {min: 1, max: 2}\n").ps
    assert (part.max, part.cpu) == (2, PS_DEFAULTS["cpu"])  # the PS's cpu, not a worker's 1.0
    assert parse_spec(base + "ps: {cpu: 2}\n").ps.max == PS_DEFAULTS["max"]
    assert parse_spec(base + "ps: {min: 6}\n").ps.max == 6  # a min above the default max raises it
    with pytest.raises(ConfigError, match=r"min \(3\) must be <= max \(2\)"):
        parse_spec(base + "ps: {min: 3, max: 2}\n")
    with pytest.raises(ConfigError, match="ps"):
        parse_spec(base + "ps: {mx: 2}\n")  # an unknown key is still refused


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (GOOD.replace("digits-1", "Digits_1"), "field 'name': must be 1-63 lowercase"),
        (GOOD.replace("digits-1", '"digits-1\\n"'), "field 'name': must be 1-63 lowercase"),
        (GOOD.replace("elasticps.examples.digits:program", "digits"), "field 'program': .*package.module:attr"),
        (GOOD.replace("max: 4", "max: 0"), r"field 'workers': min \(1\) must be <= max \(0\)"),
        (GOOD.replace("min: 1, max: 2, cpu: 0.5", "min: 0, max: 0, cpu: 0.5"), "field 'ps': min must be >= 1"),
        (GOOD.replace("min: 1, max: 4", "min: true, max: 4"), "field 'workers.min': Input should be a valid integer"),
        (GOOD.replace("max: 4", "max: '4'"), "field 'workers.max': Input should be a valid integer"),
        (GOOD + "args: {seed: .nan}\n", "field 'args.seed': must be a finite number"),
        (GOOD + f"args: {{epochs: {10**400}}}\n", r"argument 'epochs': integers must be at most 2\*\*53"),
        (GOOD + f"args: {{epochs: {-(2**53) - 1}}}\n", r"argument 'epochs': integers must be at most 2\*\*53"),
        (GOOD.replace("cpu: 1", "cpu: 1, memory_gb: .inf"), "field 'workers.memory_gb': Input should be a finite"),
        (GOOD + "args: {lr: &x 1, mom: *x}\n", "aliases are not allowed"),
        ("[" * 3000 + "]" * 3000, "nested too deeply"),
        ("x" * 70_000, "larger than"),
        (GOOD.replace("cpu: 0.5", "cpu: -1"), "field 'ps.cpu': Input should be greater than 0"),
        (GOOD + "step_timeout_s: 0\n", "field 'step_timeout_s': Input should be greater than 0"),
        (GOOD + "step_timeout_s: .inf\n", "field 'step_timeout_s': Input should be a finite"),
        (GOOD + "standby_workers: -1\n", "field 'standby_workers': Input should be greater than or equal to 0"),
        (
            GOOD.replace("cpu: 1", "cpu: 1, gpu: 1") + "standby_workers: 2\n",
            "field 'standby_workers': .*CPU workers only",
        ),
        (GOOD + "colour: red\n", r"field 'colour': unknown field \(fields: name, program, "),
        (GOOD.replace("objective: efficiency", "objective: fastest"), "field 'objective'"),
        ("name: [unclosed", "not valid YAML"),
        ("- a list", "must be a mapping"),
        (GOOD + "workers: {min: 1, max: 2}\n", r"not valid YAML \(line \d+, column 1\): 'workers' is given twice"),
        (GOOD + "args: {epochs: 1, epochs: 2}\n", "'epochs' is given twice"),
    ],
)
def test_bad_specs_name_the_field(text, message):
    with pytest.raises(ConfigError, match=message):
        parse_spec(text)


def test_store_round_trip_and_duplicate_names(tmp_path):
    store = Store(tmp_path / "m.db")
    spec = parse_spec(GOOD)
    rec = store.add_job(spec, now=10.0)
    assert rec.state == "pending" and rec.spec == spec
    with pytest.raises(ConfigError, match="already exists"):
        store.add_job(spec, now=11.0)
    store.transition("digits-1", "running", now=12.0)
    store.record_allocation("digits-1", 12.0, 1, 2, {"ps-0": "n1", "worker-0": "n1", "worker-1": "n2"})
    store.record_observation("digits-1", 20.0, 1, 2, 1234.5)
    store.record_observation("digits-1", 21.0, 1, 2, 1000.0, batch=64, nodes=2, cross=0.5)
    assert store.get_job("digits-1").state == "running"
    assert store.allocations("digits-1")[0][3]["worker-1"] == "n2"
    assert store.observations("digits-1") == [(1, 2, 1234.5, 0, 1, None), (1, 2, 1000.0, 64, 2, 0.5)]
    assert [e[3] for e in store.events("digits-1")] == ["submitted", "running"]
    assert [j.name for j in store.list_jobs(("running",))] == ["digits-1"]
    with pytest.raises(ValueError, match="'exploded' is not a valid JobState"):
        store.transition("digits-1", "exploded", now=13.0)
    store.transition("digits-1", "cancelled", now=14.0)
    with pytest.raises(IllegalTransition, match="is cancelled; it cannot become finished"):
        store.transition("digits-1", "finished", now=15.0)
    assert store.get_job("digits-1").state == "cancelled"  # the refused transition wrote nothing
    assert [e[3] for e in store.events("digits-1")][-1] == "cancelled"


def test_a_row_from_a_laxer_version_does_not_hide_the_others(tmp_path):
    store = Store(tmp_path / "m.db")
    store.add_job(parse_spec(GOOD), now=1.0)
    store._write(  # what an older version let in: an infinite number
        "INSERT INTO jobs(name, spec, state, submitted_at, updated_at) VALUES ('bad', ?, 'pending', 2, 2)",
        ('{"name": "bad", "program": "a.b:c", "workers": {"memory_gb": Infinity}}',),
    )
    assert [j.name for j in store.list_jobs()] == ["digits-1"]


def test_a_database_of_the_first_schema_gains_the_added_columns_and_keeps_its_rows(tmp_path):
    db = tmp_path / "old.db"
    first = sqlite3.connect(db)
    first.executescript(  # the first version's jobs and observations tables
        "CREATE TABLE jobs (name TEXT PRIMARY KEY, spec TEXT NOT NULL, state TEXT NOT NULL,"
        " submitted_at REAL NOT NULL, updated_at REAL NOT NULL);"
        "CREATE TABLE observations (id INTEGER PRIMARY KEY AUTOINCREMENT, job TEXT NOT NULL REFERENCES jobs(name),"
        " at REAL NOT NULL, num_ps INTEGER NOT NULL, num_workers INTEGER NOT NULL, samples_per_s REAL NOT NULL);"
    )
    first.execute("INSERT INTO jobs VALUES ('digits-1', ?, 'running', 1, 1)", (parse_spec(GOOD).model_dump_json(),))
    first.execute(
        "INSERT INTO observations(job, at, num_ps, num_workers, samples_per_s) VALUES ('digits-1', 2, 1, 3, 90)"
    )
    first.commit()
    first.close()
    store = Store(db)
    # read as the older version meant it: the program's batch, on one node, crossing not measured
    assert store.observations("digits-1") == [(1, 3, 90.0, 0, 1, None)]
    store.record_observation("digits-1", 3.0, 2, 4, 80.0, nodes=2, cross=0.25)
    assert store.observations("digits-1")[-1] == (2, 4, 80.0, 0, 2, 0.25)
    assert store.get_job("digits-1").desired is None


WRITER = """
import sys, time
from elasticps.manager import Store
store = Store(sys.argv[1])
i = 0
while True:
    store.add_event(float(i), None, "tick", str(i))
    print(i, flush=True)   # acknowledged: the write above has returned
    i += 1
"""


def test_acknowledged_writes_survive_sigkill(tmp_path):
    db = tmp_path / "m.db"
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(db)], stdout=subprocess.PIPE, text=True)
    acked = -1
    deadline = time.monotonic() + 30
    while acked < 200 and time.monotonic() < deadline:
        acked = int(proc.stdout.readline())
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    messages = [int(e[4]) for e in Store(db).events()]
    assert acked >= 200
    assert messages[: acked + 1] == list(range(acked + 1))  # every acknowledged write is there, in order
