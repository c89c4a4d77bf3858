"""What the manager saw of the cluster lately, for the dashboard's cluster view:
each node's CPUs and GPUs held by our jobs, by other tenants and free, over
time, and the latest rounds' moves (:mod:`elasticps.manager.reasons`).

Bounded, held in memory for the page and written to the store as it grows,
so a restarted manager shows what the one before it saw. The store is
best effort here: a write that fails (a locked or full disk) is logged and
the entry kept in memory; the dashboard must never stop a round.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from collections import deque
from collections.abc import Mapping
from typing import TYPE_CHECKING

from elasticps.manager.reasons import Move
from elasticps.sched import ClusterView, Resources

if TYPE_CHECKING:
    from elasticps.manager.store import Store

log = logging.getLogger("elasticps.manager")

#: Samples kept (at one per MIN_GAP_S at most: an hour at 5 s).
MAX_SAMPLES = 720
#: Rounds whose moves are kept.
MAX_ROUNDS = 200
#: A sample this soon after the previous one is dropped unless the cluster changed.
MIN_GAP_S = 5.0
#: After a write the store refused, the history is kept in memory only this long.
RETRY_S = 30.0


def _node_sample(view_node, ours: Resources) -> dict:
    cap, others = view_node.capacity, view_node.used_by_others
    return {
        "id": view_node.name,
        "cpu": round(cap.cpu, 3),
        "gpu": round(cap.gpu, 3),
        "ours_cpu": round(ours.cpu, 3),
        "ours_gpu": round(ours.gpu, 3),
        "others_cpu": round(others.cpu, 3),
        "others_gpu": round(others.gpu, 3),
        "free_cpu": round(max(0.0, cap.cpu - ours.cpu - others.cpu), 3),
        "free_gpu": round(max(0.0, cap.gpu - ours.gpu - others.gpu), 3),
    }


class ClusterHistory:
    """``store``: where the history is kept across restarts (None: in memory only)."""

    def __init__(
        self, store: Store | None = None, max_samples: int = MAX_SAMPLES, max_rounds: int = MAX_ROUNDS
    ) -> None:
        self._store = store
        self._keep = {"sample": max_samples, "round": max_rounds}
        self._samples: deque[dict] = deque(self._load("sample"), maxlen=max_samples)
        self._rounds: deque[dict] = deque(self._load("round"), maxlen=max_rounds)
        self._lock = threading.Lock()
        self._retry_at = float("-inf")  # no write before then (the last one failed)

    def _load(self, kind: str) -> list[dict]:
        if self._store is None:
            return []
        try:
            return self._store.cluster_entries(kind, self._keep[kind])
        except sqlite3.Error as exc:
            log.warning("the cluster view's history could not be read; it starts empty: %s", exc)
            return []

    def _save(self, kind: str, entry: dict) -> None:
        """Write ``entry``; after a failed write, none for :data:`RETRY_S` (each would wait
        out the database's busy timeout inside a round)."""
        if self._store is None or entry["at"] < self._retry_at:
            return
        try:
            self._store.add_cluster_entry(kind, entry["at"], entry, self._keep[kind])
        except (sqlite3.Error, TypeError, ValueError) as exc:
            self._retry_at = entry["at"] + RETRY_S
            log.warning("the cluster view's history is not written for %.0f s (kept in memory): %s", RETRY_S, exc)

    def sample(self, now: float, view: ClusterView, ours: Mapping[str, Resources], record: bool = True) -> dict:
        """What each node holds now; recorded (unless the last sample is recent and the same) and
        written to the store. ``record=False``: returned only (a page's read: it must not wait on the
        database, nor make the next round's sample look like a repeat of one never written)."""
        nodes = [_node_sample(n, ours.get(n.name, Resources())) for n in view.nodes]
        sample = {"at": now, "nodes": nodes}
        if not record:
            return sample
        with self._lock:
            last = self._samples[-1] if self._samples else None
            new = last is None or now - last["at"] >= MIN_GAP_S or last["nodes"] != nodes
            if new:
                self._samples.append(sample)
        if new:
            self._save("sample", sample)
        return sample

    def round(self, now: float, moves: Mapping[str, Move]) -> None:
        entry = {"at": now, "moves": [m.as_dict() for m in moves.values()]}
        with self._lock:
            self._rounds.append(entry)
        self._save("round", entry)

    def samples(self) -> list[dict]:
        with self._lock:
            return list(self._samples)

    def rounds(self) -> list[dict]:
        with self._lock:
            return list(self._rounds)

    def latest_moves(self) -> dict[str, dict]:
        """Each job's move in the latest round that judged it."""
        with self._lock:
            latest: dict[str, dict] = {}
            for r in self._rounds:
                for m in r["moves"]:
                    latest[m["job"]] = {**m, "at": r["at"]}
            return latest
