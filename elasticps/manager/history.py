"""What the manager saw of the cluster lately, for the dashboard's cluster view:
each node's CPUs and GPUs held by our jobs, by other tenants and free, over
time, and the latest rounds' moves (:mod:`elasticps.manager.reasons`).

Kept in memory, bounded: a restarted manager starts a new history (jobs'
own curves are in the store and survive it).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Mapping

from elasticps.manager.reasons import Move
from elasticps.sched import ClusterView, Resources

#: Samples kept (at one per MIN_GAP_S at most: an hour at 5 s).
MAX_SAMPLES = 720
#: Rounds whose moves are kept.
MAX_ROUNDS = 200
#: A sample this soon after the previous one is dropped unless the cluster changed.
MIN_GAP_S = 5.0


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
    def __init__(self, max_samples: int = MAX_SAMPLES, max_rounds: int = MAX_ROUNDS) -> None:
        self._samples: deque[dict] = deque(maxlen=max_samples)
        self._rounds: deque[dict] = deque(maxlen=max_rounds)
        self._lock = threading.Lock()

    def sample(self, now: float, view: ClusterView, ours: Mapping[str, Resources]) -> dict:
        """Record what each node holds now (unless the last sample is recent and the same); the sample."""
        nodes = [_node_sample(n, ours.get(n.name, Resources())) for n in view.nodes]
        sample = {"at": now, "nodes": nodes}
        with self._lock:
            last = self._samples[-1] if self._samples else None
            if last is None or now - last["at"] >= MIN_GAP_S or last["nodes"] != nodes:
                self._samples.append(sample)
        return sample

    def round(self, now: float, moves: Mapping[str, Move]) -> None:
        with self._lock:
            self._rounds.append({"at": now, "moves": [m.as_dict() for m in moves.values()]})

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
