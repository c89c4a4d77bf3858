"""The invariants a chaos run must keep, checked from what the manager
acknowledged (the ledger), the jobs it lists at the end, its events, and each
program seed's fault-free accuracy."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import asdict
from typing import Any

from elasticps.bench.chaos.ledger import Ledger

ACCURACY_TOLERANCE = 0.005
ENDED = ("finished", "failed", "cancelled")
INVARIANTS = (
    "acknowledged_submits",  # every job whose submit was answered 201 is listed
    "cancels_final",  # every job whose cancel was acknowledged ends cancelled
    "all_terminal",  # every job ended within the drain timeout
    "normal_jobs_finished",  # no normal job failed: none starved or failed by another's bad figures
    "doomed_jobs_failed",  # every hostile or step-0 job failed, its event naming its cause
    "failures_name_cause",  # every failed job has a 'failed' event that says why
    "store_faults_answered",  # while the store could not write: 2xx or 503 with Retry-After, never 500
    "no_code_in_manager",  # no marker file written by a manager process (unpickled job output)
    "accuracy",  # each finished job's accuracy within 0.5 point of the program trained fault-free
)
_METRIC = re.compile(r"metric ([0-9.eE+-]+)")


def check(
    ledger: Ledger,
    final: dict[str, dict[str, Any]],
    events: list[dict[str, Any]],
    reference: dict[int, float],
    markers: tuple[str, ...] = (),
) -> dict[str, Any]:
    """``markers``: the marker files the hostile jobs left, named by the PID of the process that read them."""
    violations: dict[str, list[str]] = {k: [] for k in INVARIANTS}
    for name in [*ledger.submitted, *ledger.doomed]:
        if name not in final:
            violations["acknowledged_submits"].append(f"{name} is missing")
    for name in ledger.cancelled:
        state = final.get(name, {}).get("state")
        if state != "cancelled":
            violations["cancels_final"].append(f"{name} was cancelled, ended {state}")
    failed_events = {e["job"]: e for e in events if e["kind"] == "failed"}
    for name, job in final.items():
        if job["state"] not in ENDED:
            violations["all_terminal"].append(f"{name} is still {job['state']}")
        why = failed_events.get(name, {}).get("message", "")
        if job["state"] == "failed" and not why.removeprefix("job failed:").strip():
            violations["failures_name_cause"].append(f"{name} failed and no event says why")
        if name in ledger.doomed:
            if job["state"] != "failed" or ledger.doomed[name] not in why:
                violations["doomed_jobs_failed"].append(f"{name} ended {job['state']}: {why[:200]!r}")
        elif job["state"] == "failed":
            violations["normal_jobs_finished"].append(f"{name}: {why[:200]}")
    for p in ledger.probes:
        if not (200 <= p.status < 300 or (p.status == 503 and p.retry_after)):
            violations["store_faults_answered"].append(f"{p.fault}: {p.request} -> {p.status} {p.detail}")
    for pid in set(markers) & {str(p) for p in ledger.manager_pids}:
        violations["no_code_in_manager"].append(f"a job's object ran code in the manager (pid {pid})")
    diffs = _accuracy(ledger, final, events, reference, violations["accuracy"])
    by_time = {(e["job"], e["kind"]): e["at"] for e in events}
    fail_s: dict[str, float] = {}
    for name in ledger.doomed:
        first = min((e["at"] for e in events if e["job"] == name), default=None)
        if first is not None and (name, "failed") in by_time:
            kind = "step0_error" if name.startswith("step0") else "hostile_figures"
            fail_s[kind] = max(fail_s.get(kind, 0.0), by_time[(name, "failed")] - first)
    return {
        "faults_injected": len(ledger.faults),
        "faults_by_kind": dict(Counter(f.kind for f in ledger.faults)),
        "invariants_violated": sum(len(v) for v in violations.values()),
        "invariants": {k: {"violations": len(v), "examples": v[:5]} for k, v in violations.items()},
        "jobs": dict(Counter(j["state"] for j in final.values())),
        "doomed_jobs": len(ledger.doomed),
        "doomed_max_s_to_fail": {k: round(v, 1) for k, v in fail_s.items()},
        "cancels_acknowledged": len(ledger.cancelled),
        "submits_refused": ledger.refused,  # outside the probes; a refused doomed job is drawn again later
        "store_fault_probes": dict(Counter(f"{p.fault} {p.request} {p.status}" for p in ledger.probes)),
        "accuracy": {
            "fault_free": {str(k): round(v, 4) for k, v in reference.items()},
            "finished_jobs_checked": len(diffs),
            "max_abs_diff": round(max(diffs, default=0.0), 6),
        },
        "recovery_events": {
            "checkpoints_set_aside": sum("set aside" in e["message"] for e in events),
            "restarted_from_checkpoint": sum("restarted from its latest checkpoint" in e["message"] for e in events),
            "task_or_node_losses": sum(e["kind"] == "loss" for e in events),
            "jobs_stopped_and_started_again": sum(e["message"].startswith("job stopped:") for e in events),
        },
        "faults": [asdict(f) for f in ledger.faults],
    }


def _accuracy(
    ledger: Ledger, final: dict[str, dict[str, Any]], events: list[dict[str, Any]], reference: dict[int, float],
    violations: list[str],
) -> list[float]:  # fmt: skip
    """Each finished normal job's final accuracy against its seed's fault-free one (the differences)."""
    finished_events = {e["job"]: e["message"] for e in events if e["kind"] == "finished"}
    diffs = []
    for name, job in final.items():
        if job["state"] != "finished" or name not in ledger.submitted:
            continue
        found = _METRIC.search(finished_events.get(name, ""))
        if found is None:
            violations.append(f"{name}: no final accuracy stored")
            continue
        acc, ref = float(found.group(1)), reference[ledger.submitted[name]]
        diffs.append(abs(acc - ref))
        if diffs[-1] > ACCURACY_TOLERANCE:
            violations.append(f"{name}: {acc:.4f} vs {ref:.4f} fault-free")
    return diffs
