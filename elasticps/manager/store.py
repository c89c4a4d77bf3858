"""The manager's durable state in SQLite (WAL): specs, states, allocations,
observations, events, and the dashboard's cluster history. A write that
returned is on disk (``synchronous=FULL``): after a SIGKILL and restart,
nothing acknowledged is lost.

A job's row holds its spec, its state (changed only through the transition
table of :mod:`elasticps.manager.states`, compare-and-set, with its event in
the same transaction), what the scheduler wants of it (``desired``), and what
its program is (``info``, resolved once at submission). What the job actually
runs is recorded in ``allocations`` when the runtime reports it applied.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

from elasticps.errors import ConfigError
from elasticps.manager.runtime import ProgramInfo
from elasticps.manager.schema import connect
from elasticps.manager.spec import JobSpec
from elasticps.manager.states import JobState, check_transition

log = logging.getLogger("elasticps.manager")

STATES = tuple(s.value for s in JobState)


@dataclass(frozen=True)
class Retention:
    """How much history the store keeps (the oldest rows go first)."""

    events: int = 50_000
    observations_per_job: int = 2_000


@dataclass(frozen=True)
class JobRecord:
    name: str
    spec: JobSpec
    state: str
    submitted_at: float
    updated_at: float
    info: ProgramInfo | None = None
    desired: tuple[int, int] | None = None


@dataclass(frozen=True)
class Curve:
    """One stored progress window of a job: what the dashboard draws over time."""

    at: float
    step: int | None
    epoch: int | None
    num_ps: int
    num_workers: int
    samples_per_s: float
    batch: int  # 0: the program's
    loss: float | None
    metric: float | None


@dataclass(frozen=True)
class Rescale:
    """One applied (or failed) change of a job's shape, as the runtime measured it."""

    at: float
    step: int
    from_shape: tuple[int, int]
    to_shape: tuple[int, int]
    pause_s: float  # training stood still this long
    launch_s: float | None  # its new tasks took this long to start (None: it started none)
    ok: bool


class Store:
    """One SQLite database; safe to use from several threads of one process."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        os.close(os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600))  # the owner's alone (-wal and -shm follow it)
        self._db = connect(self.path)
        self._lock = threading.RLock()

    def close(self) -> None:
        self._db.close()

    def _write(self, sql: str, args: tuple) -> int:
        with self._lock:
            cur = self._db.execute(sql, args)
            return int(cur.lastrowid or 0)

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        """All of it or none of it, one writer at a time."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    # -- the cluster view's history (the dashboard's; elasticps.manager.history)
    def add_cluster_entry(self, kind: str, at: float, body: dict, keep: int) -> None:
        """Append one entry of ``kind`` (a node sample, a round's moves); keep the newest ``keep`` of that kind."""
        with self._transaction() as db:
            db.execute("INSERT INTO cluster_log(kind, at, body) VALUES (?, ?, ?)", (kind, at, json.dumps(body)))
            db.execute(
                "DELETE FROM cluster_log WHERE kind = ? AND id NOT IN "
                "(SELECT id FROM cluster_log WHERE kind = ? ORDER BY id DESC LIMIT ?)",
                (kind, kind, keep),
            )

    def cluster_entries(self, kind: str, limit: int) -> list[dict]:
        """The newest ``limit`` entries of ``kind``, oldest first."""
        sql = "SELECT body FROM cluster_log WHERE kind = ? ORDER BY id DESC LIMIT ?"
        return [json.loads(r[0]) for r in reversed(self._db.execute(sql, (kind, limit)).fetchall())]

    # -- jobs
    def add_job(self, spec: JobSpec, now: float, info: ProgramInfo | None = None) -> JobRecord:
        text = spec.model_dump_json()
        if JobSpec.model_validate_json(text) != spec:  # what is written must read back as it was
            raise ConfigError("job spec does not survive a round trip through JSON")
        try:
            with self._transaction() as db:
                db.execute(
                    "INSERT INTO jobs(name, spec, state, submitted_at, updated_at, info) "
                    "VALUES (?, ?, 'pending', ?, ?, ?)",
                    (spec.name, text, now, now, json.dumps(asdict(info)) if info else None),
                )
                db.execute(
                    "INSERT INTO events(at, job, kind, message) VALUES (?, ?, 'submitted', ?)",
                    (now, spec.name, f"job {spec.name} submitted"),
                )
        except sqlite3.IntegrityError as exc:
            raise ConfigError(f"a job named {spec.name!r} already exists") from exc
        return self.get_job(spec.name)

    def transition(
        self, name: str, wanted: str, now: float, message: str | None = None, kind: str | None = None
    ) -> JobRecord:
        """Move a job to ``wanted`` if the transition table allows it from its
        current state (else :class:`IllegalTransition`), with an event (of kind
        ``kind``, default the new state) in the same transaction."""
        with self._transaction() as db:
            row = db.execute("SELECT state FROM jobs WHERE name = ?", (name,)).fetchone()
            if row is None:
                raise KeyError(name)
            new = check_transition(name, row[0], wanted)
            db.execute(
                "UPDATE jobs SET state = ?, updated_at = ? WHERE name = ? AND state = ?", (new.value, now, name, row[0])
            )
            db.execute(
                "INSERT INTO events(at, job, kind, message) VALUES (?, ?, ?, ?)",
                (now, name, kind or new.value, message or f"job {name} {new.value}"),
            )
        return self.get_job(name)

    def update_spec(self, spec: JobSpec, now: float) -> None:
        self._write("UPDATE jobs SET spec = ?, updated_at = ? WHERE name = ?", (spec.model_dump_json(), now, spec.name))

    def set_info(self, name: str, info: ProgramInfo) -> None:
        self._write("UPDATE jobs SET info = ? WHERE name = ?", (json.dumps(asdict(info)), name))

    def set_desired(self, name: str, shape: tuple[int, int]) -> None:
        """What the scheduler last decided for the job (it may not be applied yet)."""
        self._write("UPDATE jobs SET desired = ? WHERE name = ?", (json.dumps(list(shape)), name))

    def set_progress(self, name: str, progress: dict) -> None:
        """The job's latest progress (step, epoch, epochs, samples/s, loss, metric), kept after it ends."""
        self._write("UPDATE jobs SET progress = ? WHERE name = ?", (json.dumps(progress), name))

    def progress(self, name: str) -> dict | None:
        row = self._db.execute("SELECT progress FROM jobs WHERE name = ?", (name,)).fetchone()
        return json.loads(row[0]) if row and row[0] else None

    def get_job(self, name: str) -> JobRecord:
        row = self._db.execute(f"SELECT {_COLUMNS} FROM jobs WHERE name = ?", (name,)).fetchone()
        if row is None:
            raise KeyError(name)
        return _job(row)

    def list_jobs(self, states: tuple[str, ...] | None = None) -> list[JobRecord]:
        if states is None:
            rows = self._db.execute(f"SELECT {_COLUMNS} FROM jobs ORDER BY submitted_at, name").fetchall()
        else:
            marks = ", ".join("?" * len(states))
            sql = f"SELECT {_COLUMNS} FROM jobs WHERE state IN ({marks}) ORDER BY submitted_at, name"
            rows = self._db.execute(sql, tuple(str(s) for s in states)).fetchall()
        jobs = []
        for r in rows:
            try:
                jobs.append(_job(r))
            except ValueError as exc:  # a row written by an older, laxer version: one bad row must not hide the rest
                log.error("job %r in the store cannot be read: %s", r[0], exc)
        return jobs

    # -- history
    def delete_job(self, name: str) -> JobRecord:
        """Remove a job and its history (allocations, observations, events); the name is free again."""
        rec = self.get_job(name)
        with self._transaction() as db:
            for table in ("allocations", "observations", "rescales", "events"):
                db.execute(f"DELETE FROM {table} WHERE job = ?", (name,))
            db.execute("DELETE FROM jobs WHERE name = ?", (name,))
        return rec

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

    def record_observation(
        self,
        name: str,
        now: float,
        num_ps: int,
        num_workers: int,
        samples_per_s: float,
        batch: int = 0,
        nodes: int = 1,
        cross: float | None = None,
        step: int | None = None,
        epoch: int | None = None,
        loss: float | None = None,
        metric: float | None = None,
    ) -> None:
        self._write(
            "INSERT INTO observations(job, at, num_ps, num_workers, samples_per_s, batch, nodes, cross,"
            " step, epoch, loss, metric) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (name, now, num_ps, num_workers, samples_per_s, batch, nodes, cross, step, epoch, loss, metric),
        )

    def curves(self, name: str) -> list[Curve]:
        """The job's stored progress windows, oldest first (those kept by :meth:`prune`)."""
        rows = self._db.execute(
            "SELECT at, step, epoch, num_ps, num_workers, samples_per_s, batch, loss, metric FROM observations"
            " WHERE job = ? ORDER BY id",
            (name,),
        )
        return [Curve(*r) for r in rows]

    def record_rescale(self, name: str, now: float, rescale: Rescale) -> None:
        self._write(
            "INSERT INTO rescales(job, at, step, from_ps, from_workers, to_ps, to_workers, pause_s, launch_s, ok)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (name, now, rescale.step, *rescale.from_shape, *rescale.to_shape, rescale.pause_s, rescale.launch_s,
             int(rescale.ok)),
        )  # fmt: skip

    def rescales(self, name: str) -> list[Rescale]:
        rows = self._db.execute(
            "SELECT at, step, from_ps, from_workers, to_ps, to_workers, pause_s, launch_s, ok FROM rescales"
            " WHERE job = ? ORDER BY id",
            (name,),
        )
        return [Rescale(at, step, (fp, fw), (tp, tw), pause, launch, bool(ok)) for at, step, fp, fw, tp, tw, pause,
                launch, ok in rows]  # fmt: skip

    def observations(self, name: str) -> list[tuple[int, int, float, int, int, float | None]]:
        """``(num_ps, num_workers, samples_per_s, batch, nodes, cross)``, oldest first
        (batch 0: the program's; cross None: not measured)."""
        rows = self._db.execute(
            "SELECT num_ps, num_workers, samples_per_s, batch, nodes, cross FROM observations"
            " WHERE job = ? ORDER BY id",
            (name,),
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

    def last_events(self, kinds: tuple[str, ...]) -> dict[str, tuple[float, str, str]]:
        """Per job, its newest event of one of ``kinds``: ``(at, kind, message)``."""
        marks = ", ".join("?" * len(kinds))
        rows = self._db.execute(
            f"SELECT job, at, kind, message FROM events WHERE id IN (SELECT MAX(id) FROM events"
            f" WHERE job IS NOT NULL AND kind IN ({marks}) GROUP BY job)",
            kinds,
        )
        return {job: (at, kind, msg) for job, at, kind, msg in rows}

    def last_event(self, job: str, kind: str) -> str | None:
        """The message of the job's latest event of this kind (None: there is none)."""
        row = self._db.execute(
            "SELECT message FROM events WHERE job = ? AND kind = ? ORDER BY id DESC LIMIT 1", (job, kind)
        ).fetchone()
        return row[0] if row else None

    def prune(self, keep: Retention) -> int:
        """Drop the oldest events and each job's oldest observations beyond ``keep``; rows deleted."""
        with self._transaction() as db:
            n = db.execute("DELETE FROM events WHERE id <= (SELECT MAX(id) FROM events) - ?", (keep.events,)).rowcount
            n += db.execute(
                "DELETE FROM observations WHERE id IN (SELECT id FROM (SELECT id, ROW_NUMBER() OVER "
                "(PARTITION BY job ORDER BY id DESC) AS k FROM observations) WHERE k > ?)",
                (keep.observations_per_job,),
            ).rowcount
        return n


_COLUMNS = "name, spec, state, submitted_at, updated_at, info, desired"


def _job(row: tuple) -> JobRecord:
    name, spec, state, submitted, updated, info, desired = row
    return JobRecord(
        name,
        JobSpec.model_validate_json(spec),
        state,
        submitted,
        updated,
        ProgramInfo(**json.loads(info)) if info else None,
        tuple(json.loads(desired)) if desired else None,  # type: ignore[arg-type]
    )
