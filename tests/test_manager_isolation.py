"""One job's bad figures fail that job with an event; the round, and every other
job, go on (the in-memory runtime; no Ray)."""

from __future__ import annotations

import sqlite3
import threading
import time

import pytest

from elasticps.manager import Manager, Store
from elasticps.manager.fake import FakeCapacity, FakeRuntime
from elasticps.manager.isolation import decide_isolated
from elasticps.manager.runtime import ProgramInfo
from tests.builders import make_job
from tests.test_manager_logic import Clock, check_invariants, submit

HUGE = "elasticps.examples.huge:program"


@pytest.fixture
def env(tmp_path):
    runtime = FakeRuntime()
    # what a program's own description may say: more epochs than any float holds
    runtime.programs[HUGE] = ProgramInfo("huge", 64, 10**400, 1437)
    manager = Manager(
        Store(tmp_path / "m.db"), tmp_path / "work", clock=Clock(), runtime=runtime, capacity=FakeCapacity(),
        policy_options={"rescale_cost_s": 0.0},
    )  # fmt: skip
    yield manager, runtime
    manager.step()
    check_invariants(manager)


def _run(manager: Manager, rounds: int = 60) -> dict[str, str]:
    for _ in range(rounds):
        manager.step()  # never raises: the bad job is failed instead
    return {r.name: r.state for r in manager.store.list_jobs()}


def _last_event(manager: Manager, name: str) -> str:
    return manager.store.events(name)[-1][4]


def test_a_description_too_big_for_a_float_fails_its_job_and_the_other_finishes(env):
    manager, runtime = env
    rec = submit(manager, "huge")
    manager.store.update_spec(rec.spec.model_copy(update={"program": HUGE}), 1.0)
    manager.store.set_info("huge", runtime.programs[HUGE])
    submit(manager, "good")
    assert _run(manager) == {"huge": "failed", "good": "finished"}
    assert "figures broke the scheduler (OverflowError" in _last_event(manager, "huge")


@pytest.mark.parametrize(
    ("speed", "event"),
    [
        # finite, but its squares are not: the speed fit raises, in that job's view
        (1e300, "job failed: its figures broke the scheduler (ValueError: array must not contain infs or NaNs)"),
        # not a speed at all: refused before it is recorded
        (float("nan"), "job failed: it reported samples_per_s = nan, not a finite number >= 0"),
    ],
)
def test_a_running_job_reporting_speeds_the_scheduler_cannot_take_fails_alone(env, speed, event):
    manager, runtime = env
    submit(manager, "bad")
    submit(manager, "good")
    manager.step()
    runtime.latest("bad").speed = lambda p, w: speed
    assert _run(manager) == {"bad": "failed", "good": "finished"}
    assert _last_event(manager, "bad") == event
    assert all(0 <= s < float("inf") for _, _, s, *_ in manager.store.observations("bad"))  # no NaN recorded


def test_a_policy_that_raises_on_one_job_fails_that_job_and_decides_the_rest(env):
    manager, _ = env
    honest = manager.policy.decide

    def decide(views, cluster, state=None):
        if any(v.id == "evil" for v in views):
            raise OverflowError("int too large to convert to float")
        return honest(views, cluster, state)

    manager.policy.decide = decide  # type: ignore[method-assign]
    submit(manager, "evil")
    submit(manager, "good")
    assert _run(manager) == {"evil": "failed", "good": "finished"}
    assert "figures broke the scheduler (OverflowError: int too large" in _last_event(manager, "evil")


def test_decide_isolated_names_the_culprits_and_raises_what_no_one_job_causes():
    views = [make_job("a"), make_job("b"), make_job("c")]

    def one_bad(of):
        if any(v.id == "b" for v in of):
            raise ValueError("NaN in b")
        return sorted(v.id for v in of)

    assert decide_isolated(one_bad, views) == (["a", "c"], [views[0], views[2]], {"b": "ValueError: NaN in b"})

    def only_together(of):
        if len(of) == 3:
            raise OverflowError("the sum overflows")
        return len(of)

    with pytest.raises(OverflowError, match="the sum overflows"):
        decide_isolated(only_together, views)
    assert decide_isolated(len, views) == (3, views, {})  # nothing raised: decided once


def test_a_start_the_locked_database_cannot_record_is_released_and_tried_again(env, monkeypatch):
    manager, runtime = env
    submit(manager, "locked-out")
    real = manager.store.transition

    def locked(*args, **kwargs):
        raise sqlite3.OperationalError("database is locked")

    monkeypatch.setattr(manager.store, "transition", locked)
    with pytest.raises(sqlite3.OperationalError):
        manager.step()  # the round fails (the loop logs it and goes on) ...
    check_invariants(manager)  # ... with no job running that the store says is pending
    manager.drain()
    assert runtime.latest("locked-out").closed
    monkeypatch.setattr(manager.store, "transition", real)
    assert _run(manager) == {"locked-out": "finished"}
    assert len(runtime.jobs["locked-out"]) == 2


def test_the_loop_goes_on_past_a_locked_database_with_one_line_not_a_traceback(env, caplog, monkeypatch):
    manager, _ = env
    submit(manager, "later")
    real, calls = manager.step, []

    def step(full: bool = True):
        calls.append(1)
        if len(calls) == 1:
            raise sqlite3.OperationalError("database is locked")
        return real(full)

    monkeypatch.setattr(manager, "step", step)
    stop = threading.Event()
    loop = threading.Thread(target=manager.run, args=(0.0, stop, 0.01, 0.0))
    loop.start()
    deadline = time.monotonic() + 30
    while len(calls) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    stop.set()
    loop.join(timeout=30)
    skipped = [r for r in caplog.records if "database cannot be written now (database is locked)" in r.getMessage()]
    assert len(skipped) == 1 and skipped[0].exc_info is None
    assert manager.store.get_job("later").state == "running"  # the next round started it
