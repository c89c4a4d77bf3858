"""The store's SQLite schema, and opening a database with it: the tables and
indexes, the columns added since the first schema (an older database gains
them on open), and the connection's settings (WAL, ``synchronous=FULL``,
foreign keys, how long a write waits for another process's lock).
:mod:`elasticps.manager.store` reads and writes through it."""

from __future__ import annotations

import sqlite3
from pathlib import Path

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
CREATE TABLE IF NOT EXISTS rescales (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    job TEXT NOT NULL REFERENCES jobs(name),
    at REAL NOT NULL,
    step INTEGER NOT NULL,
    from_ps INTEGER NOT NULL,
    from_workers INTEGER NOT NULL,
    to_ps INTEGER NOT NULL,
    to_workers INTEGER NOT NULL,
    pause_s REAL NOT NULL,
    launch_s REAL,
    ok INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS cluster_log (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    kind TEXT NOT NULL,
    at REAL NOT NULL,
    body TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS cluster_log_kind ON cluster_log(kind, id);
CREATE INDEX IF NOT EXISTS allocations_job ON allocations(job, id);
CREATE INDEX IF NOT EXISTS rescales_job ON rescales(job, id);
CREATE INDEX IF NOT EXISTS observations_job ON observations(job, id);
CREATE INDEX IF NOT EXISTS events_job ON events(job, id);
CREATE INDEX IF NOT EXISTS jobs_state ON jobs(state);
"""
#: Columns added since the first schema, per table (an older database gains them on open).
ADDED_COLUMNS = {
    "jobs": {"info": "TEXT", "desired": "TEXT", "progress": "TEXT"},  # progress: the latest Progress, as JSON
    "observations": {
        "batch": "INTEGER NOT NULL DEFAULT 0",  # the global batch (0: the program's)
        "nodes": "INTEGER NOT NULL DEFAULT 1",  # the nodes the job's tasks ran on
        "cross": "REAL",  # the share of PS traffic that crossed nodes (NULL: not measured)
        # what the dashboard's curves show (NULL in rows written before they were kept)
        "step": "INTEGER",  # the window's last step
        "epoch": "INTEGER",
        "loss": "REAL",  # the window's mean training loss
        "metric": "REAL",  # the latest evaluation metric when the window was read
    },
}

#: How long a write waits for another process's lock on the database before it
#: fails (the API then answers 503 with Retry-After, not a request hung for long).
BUSY_TIMEOUT_S = 2.0


def connect(path: Path) -> sqlite3.Connection:
    """A connection to the database at ``path`` (created if new), with the
    schema in place and every added column present; autocommit (the store
    opens its own transactions), usable from several threads under one lock."""
    db = sqlite3.connect(path, timeout=BUSY_TIMEOUT_S, check_same_thread=False, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    db.execute("PRAGMA foreign_keys=ON")
    db.executescript(SCHEMA)
    for table, columns in ADDED_COLUMNS.items():
        have = {row[1] for row in db.execute(f"PRAGMA table_info({table})")}
        for column, kind in columns.items():
            if column not in have:
                db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")
    return db
