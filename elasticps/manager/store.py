"""The manager's durable state in SQLite (WAL): specs, states, allocations,
observations, events. A write that returned is on disk (``synchronous=FULL``):
after a SIGKILL and restart, nothing acknowledged is lost.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from dataclasses import dataclass
from pathlib import Path

from elasticps.errors import ConfigError
from elasticps.manager.spec import JobSpec

SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    name TEXT PRIMARY KEY,
    spec TEXT NOT NULL,
    state TEXT NOT NULL,
    submitted_at REAL NOT NULL,
    updated_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS allocations (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    job TEXT NOT NULL REFERENCES jobs(name),
    at REAL NOT NULL,
    num_ps INTEGER NOT NULL,
    num_workers INTEGER NOT NULL,
    placement TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS observations (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    job TEXT NOT NULL REFERENCES jobs(name),
    at REAL NOT NULL,
    num_ps INTEGER NOT NULL,
    num_workers INTEGER NOT NULL,
    samples_per_s REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    at REAL NOT NULL,
    job TEXT,
    kind TEXT NOT NULL,
    message TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS allocations_job ON allocations(job, id);
CREATE INDEX IF NOT EXISTS observations_job ON observations(job, id);
CREATE INDEX IF NOT EXISTS events_job ON events(job, id);
"""

STATES = ("pending", "running", "finished", "failed", "cancelled")


@dataclass(frozen=True)
class JobRecord:
    name: str
    spec: JobSpec
    state: str
    submitted_at: float
    updated_at: float


class Store:
    """One SQLite database; safe to use from several threads of one process."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.execute("PRAGMA foreign_keys=ON")
        self._db.executescript(SCHEMA)
        self._lock = threading.Lock()

    def close(self) -> None:
        self._db.close()

    def _write(self, sql: str, args: tuple) -> int:
        with self._lock:
            cur = self._db.execute(sql, args)
            return int(cur.lastrowid or 0)

    # -- jobs
    def add_job(self, spec: JobSpec, now: float) -> JobRecord:
        try:
            self._write(
                "INSERT INTO jobs(name, spec, state, submitted_at, updated_at) VALUES (?, ?, 'pending', ?, ?)",
                (spec.name, spec.model_dump_json(), now, now),
            )
        except sqlite3.IntegrityError as exc:
            raise ConfigError(f"a job named {spec.name!r} already exists") from exc
        self.add_event(now, spec.name, "submitted", f"job {spec.name} submitted")
        return self.get_job(spec.name)

    def set_state(self, name: str, state: str, now: float) -> None:
        if state not in STATES:
            raise ValueError(f"state must be one of {STATES}")
        self._write("UPDATE jobs SET state = ?, updated_at = ? WHERE name = ?", (state, now, name))

    def update_spec(self, spec: JobSpec, now: float) -> None:
        self._write("UPDATE jobs SET spec = ?, updated_at = ? WHERE name = ?", (spec.model_dump_json(), now, spec.name))

    def get_job(self, name: str) -> JobRecord:
        row = self._db.execute(
            "SELECT name, spec, state, submitted_at, updated_at FROM jobs WHERE name = ?", (name,)
        ).fetchone()
        if row is None:
            raise KeyError(name)
        return _job(row)

    def list_jobs(self, states: tuple[str, ...] | None = None) -> list[JobRecord]:
        rows = self._db.execute("SELECT name, spec, state, submitted_at, updated_at FROM jobs ORDER BY submitted_at")
        jobs = [_job(r) for r in rows]
        return [j for j in jobs if states is None or j.state in states]

    # -- history
    def record_allocation(self, name: str, now: float, num_ps: int, num_workers: int, placement: dict) -> None:
        self._write(
            "INSERT INTO allocations(job, at, num_ps, num_workers, placement) VALUES (?, ?, ?, ?, ?)",
            (name, now, num_ps, num_workers, json.dumps(placement, sort_keys=True)),
        )

    def allocations(self, name: str) -> list[tuple[float, int, int, dict]]:
        rows = self._db.execute(
            "SELECT at, num_ps, num_workers, placement FROM allocations WHERE job = ? ORDER BY id", (name,)
        )
        return [(at, p, w, json.loads(pl)) for at, p, w, pl in rows]

    def record_observation(self, name: str, now: float, num_ps: int, num_workers: int, samples_per_s: float) -> None:
        self._write(
            "INSERT INTO observations(job, at, num_ps, num_workers, samples_per_s) VALUES (?, ?, ?, ?, ?)",
            (name, now, num_ps, num_workers, samples_per_s),
        )

    def observations(self, name: str) -> list[tuple[int, int, float]]:
        rows = self._db.execute(
            "SELECT num_ps, num_workers, samples_per_s FROM observations WHERE job = ? ORDER BY id", (name,)
        )
        return [tuple(r) for r in rows]  # type: ignore[misc]

    def add_event(self, now: float, job: str | None, kind: str, message: str) -> int:
        return self._write("INSERT INTO events(at, job, kind, message) VALUES (?, ?, ?, ?)", (now, job, kind, message))

    def events(self, job: str | None = None, after_id: int = 0) -> list[tuple[int, float, str | None, str, str]]:
        if job is None:
            rows = self._db.execute(
                "SELECT id, at, job, kind, message FROM events WHERE id > ? ORDER BY id", (after_id,)
            )
        else:
            rows = self._db.execute(
                "SELECT id, at, job, kind, message FROM events WHERE job = ? AND id > ? ORDER BY id", (job, after_id)
            )
        return [tuple(r) for r in rows]  # type: ignore[misc]


def _job(row: tuple) -> JobRecord:
    name, spec, state, submitted, updated = row
    return JobRecord(name, JobSpec.model_validate_json(spec), state, submitted, updated)
