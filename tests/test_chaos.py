"""The chaos benchmark: its invariant checks catch each kind of violation, and a
short run on a real multi-node Ray cluster (faults that need no manager
restart, so it stays short) violates none."""

from __future__ import annotations

import pytest

from elasticps.bench import chaos_bench
from elasticps.bench.chaos.ledger import Probe
from elasticps.bench.chaos_bench import ChaosConfig, Fault, Ledger, check
from elasticps.errors import ConfigError


def _event(job: str, kind: str, message: str, at: float = 0.0) -> dict:
    return {"job": job, "kind": kind, "message": message, "at": at}


def test_the_checks_find_every_kind_of_violation():
    ledger = Ledger(submitted={"ok": 0, "lost": 0, "undone": 1, "bad": 1, "quiet": 0, "stuck": 0, "broke": 0})
    ledger.doomed = {"evil": "within 2**53", "mute": "one sample", "lucky": "one sample", "told": "one sample"}
    ledger.cancelled = {"undone"}
    ledger.faults = [Fault(1.0, "kill_worker", "pid 1"), Fault(2.0, "kill_server", "pid 2")]
    ledger.probes = [
        Probe("db_locked", "GET /jobs", 200, None),
        Probe("db_locked", "POST /jobs", 503, "5"),
        Probe("full_disk", "POST /jobs", 500, None, "Internal Server Error"),
        Probe("full_disk", "POST /jobs", 503, None),  # no Retry-After
    ]
    ledger.manager_pids = [41, 42]
    final = {
        "ok": {"state": "finished"},
        "undone": {"state": "finished"},  # acknowledged cancel, then finished
        "bad": {"state": "finished"},
        "quiet": {"state": "finished"},
        "stuck": {"state": "running"},
        "broke": {"state": "failed"},  # a normal job failed, and no event says why
        "evil": {"state": "failed"},
        "mute": {"state": "failed"},  # doomed, failed, but its event does not name the cause
        "lucky": {"state": "finished"},  # doomed, yet finished
        "told": {"state": "failed"},
    }  # "lost" is missing
    events = [
        _event("ok", "finished", "job finished at step 660, metric 0.98"),
        _event("undone", "finished", "job finished at step 660, metric 0.9756"),
        _event("bad", "finished", "job finished at step 660, metric 0.9"),
        _event("quiet", "finished", "job finished at step 660"),
        _event("ok", "loss", "step 3: 1 worker(s) died; continuing with 1"),
        _event("evil", "submitted", "job evil submitted", at=10.0),
        _event("evil", "failed", "job failed: remaining_samples must be an integer within 2**53", at=14.5),
        _event("mute", "failed", "job failed: "),
        _event("told", "submitted", "job told submitted", at=10.0),
        _event("told", "failed", "job failed: ValueError: takes one sample at a time", at=11.0),
    ]
    result = check(ledger, final, events, {0: 0.98, 1: 0.9756}, markers=("42", "77"))
    counts = {k: v["violations"] for k, v in result["invariants"].items()}
    assert counts == {
        "acknowledged_submits": 1,
        "cancels_final": 1,
        "all_terminal": 1,
        "normal_jobs_finished": 1,
        "doomed_jobs_failed": 2,
        "failures_name_cause": 2,
        "store_faults_answered": 2,
        "no_code_in_manager": 1,
        "accuracy": 2,
    }
    assert result["invariants_violated"] == 13
    assert result["invariants"]["accuracy"]["examples"] == [
        "bad: 0.9000 vs 0.9756 fault-free",
        "quiet: no final accuracy stored",
    ]
    assert result["invariants"]["no_code_in_manager"]["examples"] == ["a job's object ran code in the manager (pid 42)"]
    assert result["doomed_max_s_to_fail"] == {"hostile_figures": 4.5}  # "told" is no step0-named job
    assert result["faults_injected"] == 2 and result["faults_by_kind"] == {"kill_worker": 1, "kill_server": 1}
    assert result["recovery_events"]["task_or_node_losses"] == 1
    clean = check(Ledger(submitted={"ok": 0}), {"ok": {"state": "finished"}}, events[:1], {0: 0.98})
    assert clean["invariants_violated"] == 0 and clean["accuracy"]["finished_jobs_checked"] == 1


def test_unknown_fault_kinds_are_refused():
    with pytest.raises(ConfigError, match="fault kinds must be among"):
        chaos_bench.run(ChaosConfig(kinds=("kill_everything",)))


@pytest.mark.slow
def test_a_short_run_with_every_new_kind_of_fault_violates_nothing():
    """Each kind once (a deck holds each kind once): a worker killed, the
    workdir's disk full and the database locked (2 s each, and until the first
    probes are answered: the first submit and list meet the fault, which is what
    the probe checks need), a job with hostile figures and one whose model raises
    at step 0, among two normal jobs (short ones, and short waits between faults)."""
    import ray

    if ray.is_initialized():
        ray.shutdown()
    kinds = ("kill_worker", "full_disk", "db_locked", "hostile_figures", "step0_error")
    config = ChaosConfig(
        faults=len(kinds), nodes=2, jobs_at_once=2, epochs=8, fault_every_s=0.5, settle_steps=5,
        settle_timeout_s=20.0, hold_s=2.0, kinds=kinds,
    )  # fmt: skip
    result = chaos_bench.run(config, say=print)
    assert result["faults_by_kind"] == dict.fromkeys(kinds, 1), result["faults"]
    assert result["invariants_violated"] == 0, result["invariants"]
    assert result["jobs"]["failed"] == result["doomed_jobs"] == 2
    assert result["accuracy"]["finished_jobs_checked"] >= 2
    probes = result["store_fault_probes"]
    if result["workdir_on_tmpfs"]:
        assert probes.get("full_disk POST /jobs 503", 0) >= 1, probes
    assert probes.get("db_locked POST /jobs 503", 0) >= 1, probes
