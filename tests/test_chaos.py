"""The chaos benchmark: its invariant checks catch each kind of violation, and a
short run on a real multi-node Ray cluster (faults that need no manager
restart, so it stays short) violates none."""

from __future__ import annotations

import pytest

from elasticps.bench import chaos_bench
from elasticps.bench.chaos_bench import ChaosConfig, Fault, Ledger, check


def _event(job: str, kind: str, message: str) -> dict:
    return {"job": job, "kind": kind, "message": message}


def test_the_checks_find_every_kind_of_violation():
    ledger = Ledger(submitted={"ok": 0, "lost": 0, "undone": 1, "bad": 1, "quiet": 0, "stuck": 0, "broke": 0})
    ledger.cancelled = {"undone"}
    ledger.faults = [Fault(1.0, "kill_worker", "pid 1"), Fault(2.0, "kill_server", "pid 2")]
    final = {
        "ok": {"state": "finished"},
        "undone": {"state": "finished"},  # acknowledged cancel, then finished
        "bad": {"state": "finished"},
        "quiet": {"state": "finished"},
        "stuck": {"state": "running"},
        "broke": {"state": "failed"},
    }  # "lost" is missing
    events = [
        _event("ok", "finished", "job finished at step 660, metric 0.98"),
        _event("undone", "finished", "job finished at step 660, metric 0.9756"),
        _event("bad", "finished", "job finished at step 660, metric 0.9"),
        _event("quiet", "finished", "job finished at step 660"),
        _event("ok", "loss", "step 3: 1 worker(s) died; continuing with 1"),
    ]
    result = check(ledger, final, events, {0: 0.98, 1: 0.9756})
    counts = {k: v["violations"] for k, v in result["invariants"].items()}
    assert counts == {"acknowledged_submits": 1, "cancels_final": 1, "all_terminal": 1, "none_failed": 1, "accuracy": 2}
    assert result["invariants_violated"] == 6
    assert result["invariants"]["accuracy"]["examples"] == [
        "bad: 0.9000 vs 0.9756 fault-free",
        "quiet: no final accuracy stored",
    ]
    assert result["faults_injected"] == 2 and result["faults_by_kind"] == {"kill_worker": 1, "kill_server": 1}
    assert result["recovery_events"]["task_or_node_losses"] == 1
    clean = check(Ledger(submitted={"ok": 0}), {"ok": {"state": "finished"}}, events[:1], {0: 0.98})
    assert clean["invariants_violated"] == 0 and clean["accuracy"]["finished_jobs_checked"] == 1


def test_unknown_fault_kinds_are_refused():
    with pytest.raises(ValueError, match="fault kinds must be among"):
        chaos_bench.run(ChaosConfig(kinds=("kill_everything",)))


@pytest.mark.slow
def test_a_short_run_on_a_real_cluster_violates_nothing():
    import ray

    if ray.is_initialized():
        ray.shutdown()
    config = ChaosConfig(
        faults=3, nodes=2, jobs_at_once=2, epochs=12, settle_steps=10, kinds=("kill_worker", "kill_ps", "cancel_race")
    )
    result = chaos_bench.run(config, say=print)
    assert result["faults_injected"] == 3
    assert result["invariants_violated"] == 0, result["invariants"]
    assert result["accuracy"]["finished_jobs_checked"] >= 2
