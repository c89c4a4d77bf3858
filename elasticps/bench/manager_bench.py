"""``elasticps bench manager``: how long one round of the live manager takes
with many ended jobs in its store.

A round reads the store, builds every active job's view (its speed model and
the fleet priors), decides, places and applies. The jobs run on the manager's
in-memory runtime (:mod:`elasticps.manager.fake`), so what is timed is the
manager's own work, not Ray's. Ended jobs come in three kinds (task sizes),
each with ``observations`` speed observations over a 2 x 4 grid of shapes.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from elasticps.manager.fake import FakeCapacity, FakeRuntime
from elasticps.manager.runtime import ProgramInfo
from elasticps.manager.service import Manager
from elasticps.manager.spec import JobSpec
from elasticps.manager.store import Store

PROGRAM = "elasticps.examples.digits:program"


def _spec(name: str, kind: int) -> JobSpec:
    return JobSpec.model_validate(
        {
            "name": name,
            "program": PROGRAM,
            "ps": {"min": 1, "max": 2, "cpu": 0.5},
            "workers": {"min": 1, "max": 4, "cpu": 1.0 + kind},
        }
    )


def run(ended: int = 2000, active: int = 20, rounds: int = 11, observations: int = 30) -> dict[str, Any]:
    info = ProgramInfo("digits", 64, 3, 1437)
    with tempfile.TemporaryDirectory(prefix="elasticps-bench-manager-") as tmp:
        store = Store(Path(tmp) / "manager.db")
        for i in range(ended):
            name = f"ended-{i}"
            store.add_job(_spec(name, i % 3), float(i), info)
            store.transition(name, "running", float(i))
            for k in range(observations):
                p, w = 1 + k % 2, 1 + (k // 2) % 4
                store.record_observation(name, float(i), p, w, 100.0 * min(w, 2 * p) * (1 + 0.01 * (k % 5)))
            store.transition(name, "finished", float(i) + 1.0)
        capacity = FakeCapacity(nodes={f"node-{i}": (32.0, 0.0) for i in range(max(1, active // 4))})
        clock = iter(float(ended + 10 + k) for k in range(10**9))
        manager = Manager(
            store, Path(tmp) / "work", clock=lambda: next(clock), runtime=FakeRuntime(), capacity=capacity
        )
        for i in range(active):
            manager.submit(_spec(f"active-{i}", i % 3))
        manager.step()  # the first round also reads every ended job once
        times = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            manager.step()
            times.append(time.perf_counter() - t0)
        manager.shutdown()
        store.close()
    return {
        "ended_jobs": ended,
        "active_jobs": active,
        "observations_per_ended_job": observations,
        "rounds": rounds,
        "median_round_ms": round(statistics.median(times) * 1e3, 2),
        "max_round_ms": round(max(times) * 1e3, 2),
    }
