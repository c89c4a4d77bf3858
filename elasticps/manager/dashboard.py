"""The data the dashboard draws (``GET /api/overview``, ``/api/jobs/{name}``,
``/api/cluster``), read from the store and the manager's in-memory views.

Jobs' curves, shapes, rescales, events and latest progress come from the
store, so an ended job shows them after a manager restart as it did before.
What only the running manager knows (a running job's live status, the speed
model's estimate for its ETA, the cluster over time, the latest rounds' moves)
comes from the manager.
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Any

from elasticps.manager.live import STOPPED
from elasticps.manager.states import JobState
from elasticps.sched import ClusterView

if TYPE_CHECKING:
    from elasticps.manager.service import Manager
    from elasticps.manager.store import JobRecord, Rescale

log = logging.getLogger("elasticps.manager")

#: Event kinds whose newest message says why a job waits or ended as it did.
REASON_KINDS = ("unfit", "failed", "error", "cancelled")
#: Event kinds that end a run: after one, the job holds nothing until it is given a shape again
#: (and an error event that says the job stopped, to start again: elasticps.manager.live.STOPPED).
RUN_ENDS = ("cancelled", "failed", "finished", "pending")
#: Events a job's detail view lists (the newest ones).
MAX_EVENTS = 200


def overview(manager: Manager) -> dict[str, Any]:
    """The job table and each node's CPUs now: ``{"now", "nodes", "jobs"}``, running jobs first."""
    now = manager.clock()
    rows = _job_rows(manager, manager.store.list_jobs(), now)
    order = {JobState.RUNNING: 0, JobState.PENDING: 1}
    rows.sort(key=lambda r: (order.get(r["state"], 2), -r["submitted_at"] if r["ended"] else r["submitted_at"]))
    return {"now": now, "nodes": _nodes_now(manager, now), "jobs": rows}


def _shapes(store: Any, name: str, now: float | None, ended_at: float) -> list[list[float]]:
    """``[at, ps, workers]`` from each allocation on, with ``[at, 0, 0]`` where a
    run stopped (cancelled, failed, stopped to start again: it holds nothing
    until its next allocation), and the last shape held until ``now`` (None: the
    job has ended, at ``ended_at``)."""
    allocations = store.allocations(name)
    events = store.events(name)
    stops = sorted(at for _, at, _, k, m in events if k in RUN_ENDS or (k == "error" and m.startswith(STOPPED)))
    shapes: list[list[float]] = []
    for i, (at, p, w, _) in enumerate(allocations):
        shapes.append([at, p, w])
        until = allocations[i + 1][0] if i + 1 < len(allocations) else math.inf
        stop = next((t for t in stops if at < t < until), None)
        if stop is not None and (p or w):
            shapes.append([stop, 0, 0])
    if shapes and (shapes[-1][1] or shapes[-1][2]):
        shapes.append([now, shapes[-1][1], shapes[-1][2]] if now is not None else [ended_at, 0, 0])
    return shapes


def job_detail(manager: Manager, name: str) -> dict[str, Any]:
    """One job: its row, shapes over time, curves, rescales and events (KeyError if there is none)."""
    rec = manager.store.get_job(name)
    now = manager.clock()
    row = _job_rows(manager, [rec], now)[0]
    store = manager.store
    curves = store.curves(name)
    batches = {c.batch for c in curves if c.batch}
    info = rec.info
    adaptive = bool(info and info.max_batch_size and info.max_batch_size > info.batch_size) or len(batches) > 1
    shapes = _shapes(store, name, now if not row["ended"] else None, rec.updated_at)
    return {
        "job": row,
        "spec": rec.spec.model_dump(mode="json"),
        "shapes": shapes,
        "curves": {
            "at": [c.at for c in curves],
            "step": [c.step for c in curves],
            "samples_per_s": [c.samples_per_s for c in curves],
            "loss": [c.loss for c in curves],
            "metric": [c.metric for c in curves],
            "batch": [c.batch or (info.batch_size if info else None) for c in curves],
        },
        "adaptive_batch": adaptive,
        "rescales": [_rescale(r) for r in store.rescales(name)],
        "events": [{"id": i, "at": at, "kind": k, "message": m} for i, at, _, k, m in store.events(name)[-MAX_EVENTS:]],
    }


def _rescale(r: Rescale) -> dict[str, Any]:
    return {
        "at": r.at, "step": r.step, "from": list(r.from_shape), "to": list(r.to_shape), "pause_s": r.pause_s,
        "launch_s": r.launch_s, "ok": r.ok,
    }  # fmt: skip


def cluster(manager: Manager) -> dict[str, Any]:
    """Each node's CPUs and GPUs (ours, other tenants', free) over time, and the latest rounds' moves."""
    return {"now": manager.clock(), "samples": manager.history.samples(), "rounds": manager.history.rounds()}


def _nodes_now(manager: Manager, now: float) -> list[dict]:
    ours = manager.held()
    try:
        view = manager.capacity.view(ours)
    except Exception as exc:  # no cluster to read (not connected yet, or gone)
        log.debug("no capacity to show: %s", exc)
        view = ClusterView(())
    nodes = manager.history.sample(now, view, ours, record=False)["nodes"]
    for n in nodes:  # the names the demo's timeline reads
        n["jobs_cpu"] = n["ours_cpu"]
    return nodes


def _job_rows(manager: Manager, records: list[JobRecord], now: float) -> list[dict]:
    statuses = manager.statuses()
    reasons = manager.store.last_events(REASON_KINDS)
    starts = manager.store.last_events(("started",))  # a run's start, as `events` and `describe` show it
    moves = manager.history.latest_moves()
    rows = []
    for rec in records:
        state = JobState(rec.state)
        allocs = manager.store.allocations(rec.name)
        # running: its shape; ended: the last it ran (as status shows it); waiting: none
        shape = (allocs[-1][1], allocs[-1][2]) if allocs and (state == JobState.RUNNING or state.ended) else (0, 0)
        epochs = rec.info.epochs if rec.info else 0
        total = epochs * rec.info.samples_per_epoch if rec.info else 0
        st = statuses.get(rec.name)
        kept = manager.store.progress(rec.name) or {}
        if st is not None:
            shape = (st.num_ps, st.num_workers) if st.num_ps or st.num_workers else shape
            step, epoch, remaining, metric = st.step, st.epoch, st.remaining_samples, st.metric
            if metric is None:
                metric = kept.get("metric")
        else:
            step, epoch, remaining, metric = (kept.get(k) for k in ("step", "epoch", "remaining_samples", "metric"))
        rate = kept.get("samples_per_s")
        if st is not None and st.windows:
            rate = st.windows[-1].samples_per_s
        done = None
        if state == JobState.FINISHED:
            done = 1.0
        elif total and remaining is not None:
            done = max(0.0, min(1.0, 1.0 - remaining / total))
        elif epochs and epoch is not None:
            done = min(1.0, epoch / epochs)
        started = starts[rec.name][0] if rec.name in starts else allocs[0][0] if allocs else None
        end = rec.updated_at if state.ended else now
        predicted = manager.predicted.get(rec.name) if state == JobState.RUNNING else None
        speed = predicted or (rate if state == JobState.RUNNING else None)
        eta = remaining / speed if speed and remaining is not None and state == JobState.RUNNING else None
        rows.append(
            {
                "name": rec.name,
                "state": rec.state,
                "ended": state.ended,
                "num_ps": shape[0],
                "num_workers": shape[1],
                "ps_range": [rec.spec.ps.min, rec.spec.ps.max],
                "workers_range": [rec.spec.workers.min, rec.spec.workers.max],
                "step": step,
                "epoch": epoch or 0,
                "epochs": epochs,
                "progress": done,
                "submitted_at": rec.submitted_at,
                "started_at": started,
                "updated_at": rec.updated_at,
                "elapsed_s": end - started if started is not None else None,
                "eta_s": eta,
                "eta_from": "speed model" if predicted else ("measured samples/s" if eta is not None else None),
                "samples_per_s": rate if rec.state == JobState.RUNNING or state.ended else None,
                "loss": kept.get("loss"),
                "metric": metric,
                "reason": _reason(manager, rec, state, reasons.get(rec.name), moves.get(rec.name), now),
                "move": moves.get(rec.name, {}).get("why") if state == JobState.RUNNING else None,
            }
        )
    return rows


def _reason(
    manager: Manager, rec: JobRecord, state: JobState, event: tuple | None, move: dict | None, now: float
) -> str | None:
    """Why a pending job waits, or why a job failed or was cancelled (None for the others)."""
    if state == JobState.PENDING:  # the manager's one account of why (elasticps.manager.waiting), as the API's
        waiting = manager.waiting.get(rec.name)
        if waiting is not None:
            return waiting.reason
        if move is not None and move["action"] in ("wait", "unfit"):
            return move["text"]
        return "waits for the next round"
    if state in (JobState.FAILED, JobState.CANCELLED) and event is not None:
        return event[2]
    failures = manager.failures_in_a_row(rec.name)
    if state == JobState.RUNNING and failures and event is not None and event[1] == "error":
        return f"started again after {failures} failure{'s' if failures > 1 else ''} with no progress: {event[2]}"
    return None
