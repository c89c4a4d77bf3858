"""The manager's logic against the in-memory runtime (elasticps.manager.fake):
state ownership, commands, faults, events. Every test ends by checking the
manager's invariants; none starts Ray, so each runs in milliseconds."""

from __future__ import annotations

import dataclasses
import os
import re
import threading

import pytest

from elasticps.errors import ConfigError, ProgramError, UnschedulableError
from elasticps.manager import IllegalTransition, JobState, LimitsPatch, Manager, Retention, Store, parse_spec
from elasticps.manager.fake import FakeCapacity, FakeRuntime
from elasticps.manager.live import MAX_FAILURES, RESTART_BACKOFF_S
from elasticps.manager.runtime import ProgramInfo
from elasticps.manager.spec import Range
from elasticps.manager.states import TRANSITIONS, JobInUse
from elasticps.runtime import JobConfig

SPEC = """name: {name}
program: elasticps.examples.digits:program
ps: {{min: 1, max: 2, cpu: 0.5}}
workers: {{min: 1, max: 4, cpu: {cpu}}}
"""


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        self.t += 1.0
        return self.t


def check_invariants(manager: Manager) -> None:
    """What must hold after any sequence of commands and rounds."""
    jobs = {r.name: r for r in manager.store.list_jobs()}
    for name in manager.live:
        assert jobs[name].state == JobState.RUNNING, f"{name} has a handle but is {jobs[name].state}"
    runtime = manager.runtime
    for name, starts in getattr(runtime, "jobs", {}).items():
        if name not in jobs:  # deleted
            assert all(j.closed for j in starts), f"{name} was deleted but a start of it was not released"
        elif jobs[name].state in (JobState.CANCELLED, JobState.FINISHED):
            assert all(j.closed or j.stopping for j in starts), f"{name} ended but a start of it still runs"
        for older in starts[:-1]:
            assert older.closed, f"{name}: a replaced start was not released"


@pytest.fixture
def env(tmp_path):
    runtime, capacity = FakeRuntime(), FakeCapacity()
    manager = Manager(
        Store(tmp_path / "m.db"), tmp_path / "work", clock=Clock(), runtime=runtime, capacity=capacity,
        policy_options={"rescale_cost_s": 0.0},
    )  # fmt: skip
    yield manager, runtime, capacity
    manager.step()  # one more round: nothing may break the invariants
    check_invariants(manager)


def submit(manager: Manager, name: str, cpu: float = 1.0):
    return manager.submit(parse_spec(SPEC.format(name=name, cpu=cpu)))


def kinds(manager: Manager, name: str) -> list[str]:
    return [e[3] for e in manager.store.events(name)]


def test_terminal_states_are_terminal():
    for (a, b), cause in TRANSITIONS.items():
        assert not (a.ended and cause != "retry"), f"{a} -> {b} leaves a final state"
    from elasticps.manager.states import check_transition

    with pytest.raises(IllegalTransition, match="'j' is cancelled; it cannot become finished"):
        check_transition("j", "cancelled", "finished")
    with pytest.raises(IllegalTransition):
        check_transition("j", "finished", "running")


def test_a_job_is_started_polled_and_finished(env):
    manager, runtime, _ = env
    submit(manager, "a")
    assert manager.step() == {"a": (1, 1)}
    assert manager.store.get_job("a").state == "running"
    assert manager.store.allocations("a") == []  # asked for, not yet applied
    for _ in range(40):
        manager.step()
    assert manager.store.get_job("a").state == "finished"
    assert kinds(manager, "a")[:2] == ["submitted", "started"] and kinds(manager, "a")[-1] == "finished"
    assert manager.store.allocations("a")[0][1:3] == (1, 1)
    assert runtime.latest("a").closed and manager.ended["a"].state == "finished"


def test_cancel_during_start_up_is_final(env):
    """The bug: DELETE while the job was starting, a round restarted it, and it ended 'finished'."""
    manager, runtime, _ = env
    submit(manager, "c")
    manager.step()  # started; the fake is still starting (state "created")
    assert manager.cancel("c").state == "cancelled"
    assert manager.cancel("c").state == "cancelled"  # idempotent
    for _ in range(30):
        manager.step()
    assert manager.store.get_job("c").state == "cancelled"
    assert len(runtime.jobs["c"]) == 1 and runtime.latest("c").closed  # never started again
    assert kinds(manager, "c").count("cancelled") == 1


def test_an_ended_jobs_progress_is_shown_after_a_manager_restart(env, tmp_path):
    from elasticps.manager.job_replies import job_json

    manager, _, _ = env
    submit(manager, "a")
    for _ in range(40):
        manager.step()
    before = job_json(manager.store.get_job("a"), manager).progress
    assert before is not None and before.step > 0
    again = Manager(manager.store, tmp_path / "work", clock=Clock(), runtime=FakeRuntime(), capacity=FakeCapacity())
    after = job_json(again.store.get_job("a"), again).progress  # neither polled nor ended here
    assert after is not None and (after.step, after.epochs, after.loss) == (before.step, before.epochs, before.loss)
    again.shutdown()


def test_cancel_of_an_ended_job_is_refused_and_changes_nothing(env):
    manager, _runtime, _ = env
    submit(manager, "f")
    while manager.store.get_job("f").state != "finished":
        manager.step()
    with pytest.raises(IllegalTransition, match="is finished; it cannot become cancelled"):
        manager.cancel("f")
    assert manager.store.get_job("f").state == "finished"


def test_a_finish_reported_after_a_cancel_does_not_overwrite_it(env):
    manager, runtime, _ = env
    submit(manager, "r")
    manager.step()
    manager.step()
    job = runtime.latest("r")
    job.state = "finished"  # it finishes at the very moment the user cancels
    manager.cancel("r")
    manager.step()
    assert manager.store.get_job("r").state == "cancelled"


def test_a_failed_rescale_is_an_event_and_the_round_goes_on(env):
    manager, runtime, capacity = env
    submit(manager, "x")
    submit(manager, "y")
    for _ in range(4):
        manager.step()
    asked_before = {n: live.asked for n, live in manager.live.items()}
    runtime.latest("x").fail_rescale = "pinned node is gone"
    capacity.nodes["node-1"] = (8.0, 0.0)  # room to grow: both jobs are asked for more
    for _ in range(3):
        manager.step()
    events = manager.store.events("x")
    assert any(k == "error" and "pinned node is gone" in m for _, _, _, k, m in events)
    assert manager.live["y"].asked != asked_before["y"]  # the other job was rescaled in the same round
    # what x runs is what its runtime reports, not what the failed request asked for
    last = manager.store.allocations("x")[-1]
    assert (last[1], last[2]) == (runtime.latest("x").shape[0], runtime.latest("x").shape[1])


def test_observations_follow_steps_not_list_positions(env):
    """The bug: seen_windows indexed a list the controller trims, so learning stopped after ~67 min."""
    manager, runtime, _ = env
    submit(manager, "long")
    manager.step()
    job = runtime.latest("long")
    job.max_windows, job.info = 3, job.info.__class__("digits", 64, 100, 1437)  # keeps 3 windows, as if trimmed
    for _ in range(25):
        manager.step()
    steps = {w.last_step for w in job.windows}
    assert len(manager.store.observations("long")) == job.polls - 1 >= 20 and len(steps) == 3


def test_start_failures_then_failed_then_retry(env):
    manager, runtime, _ = env
    submit(manager, "s")
    for _ in range(3):
        runtime.fail_start = "no room for the driver"
        manager.step()
    assert manager.store.get_job("s").state == "failed"
    assert kinds(manager, "s").count("error") == 3
    assert manager.retry("s").state == "pending"
    with pytest.raises(IllegalTransition):
        manager.retry("s")  # pending is not failed
    manager.step()
    assert manager.store.get_job("s").state == "running"


def test_a_lost_driver_restarts_the_job_and_three_failures_in_a_row_fail_it(env):
    manager, runtime, _ = env
    submit(manager, "l")
    manager.step()
    manager.step()
    runtime.latest("l").lose_worker()
    manager.step()
    assert any(k == "loss" and "worker(s) died" in m for _, _, _, k, m in manager.store.events("l"))
    runtime.latest("l").lose_driver("the job's driver process is gone: node died")
    manager.step()
    assert manager.store.get_job("l").state == "running"  # not lost: it starts again, after a pause
    assert "node died" in manager.store.events("l")[-1][4] and "starts again" in manager.store.events("l")[-1][4]
    manager.step()
    assert len(runtime.jobs["l"]) == 1  # not yet: a node that just died may still look alive
    for failures in (1, 2):
        manager.clock.t += RESTART_BACKOFF_S * failures
        manager.step()
        assert len(runtime.jobs["l"]) == failures + 1  # started again from its checkpoint
        runtime.latest("l").crash("PlacementError: cannot place ps-0: node n is not an alive Ray node")
        manager.step()
    rec = manager.store.get_job("l")
    assert rec.state == "failed" and "PlacementError" in manager.store.events("l")[-1][4]
    manager.retry("l")
    manager.step()
    assert manager.store.get_job("l").state == "running" and len(runtime.jobs["l"]) == 4


def test_progress_resets_the_failure_count_and_a_program_error_fails_at_once(env):
    manager, runtime, _ = env
    submit(manager, "p")
    for _ in range(2 * MAX_FAILURES):  # fails, restarts and makes progress each time: never failed
        manager.step()
        manager.step()
        manager.step()  # progress
        runtime.latest("p").crash("RayActorError: a worker died")
        manager.step()
        manager.clock.t += RESTART_BACKOFF_S
    assert manager.store.get_job("p").state == "running"
    manager.step()
    manager.step()
    runtime.latest("p").crash("ProgramError: the loss raised ValueError: bad shape")
    manager.step()
    assert manager.store.get_job("p").state == "failed"


def test_a_job_that_fails_at_the_same_step_after_each_restart_fails_for_good(env):
    manager, runtime, _ = env
    runtime.checkpoint_every = 1000  # every start resumes from step 0 and fails where the first did
    submit(manager, "f")
    reached = []
    for failures in range(1, MAX_FAILURES + 1):
        manager.step()  # started (again)
        manager.step()
        manager.step()  # steps beyond its checkpoint, but no further than the run before reached
        reached.append(runtime.latest("f").step)
        runtime.latest("f").crash(f"UserCodeError: step {reached[-1]}: ValueError: bad batch")
        manager.step()
        manager.clock.t += RESTART_BACKOFF_S * failures
    assert reached[0] > 0 and len(set(reached)) == 1
    assert manager.store.get_job("f").state == "failed", kinds(manager, "f")
    assert len(runtime.jobs["f"]) == MAX_FAILURES


def test_a_job_that_can_never_fit_is_refused_and_one_that_no_longer_fits_says_why_once(env):
    manager, _, capacity = env
    with pytest.raises(UnschedulableError, match="a worker needs 16 CPU, the largest node has 8 CPU"):
        submit(manager, "big", cpu=16)
    assert manager.store.list_jobs() == []
    submit(manager, "big", cpu=6)
    capacity.nodes = {"node-0": (4.0, 0.0)}  # the cluster shrank after the job was accepted
    for _ in range(3):
        manager.step()
    unfit = [m for _, _, _, k, m in manager.store.events("big") if k == "unfit"]
    assert unfit == ["cannot fit: a worker needs 6 CPU, the largest node has 4 CPU"]
    assert manager.store.get_job("big").state == "pending"
    assert manager.waiting["big"].never and manager.waiting["big"].reason == unfit[0]


def test_every_job_that_is_not_running_says_why(env):
    manager, runtime, capacity = env
    submit(manager, "a", cpu=6)
    submit(manager, "b", cpu=4)
    assert manager.waiting["b"].reason == "submitted: waiting for the next scheduling round"
    manager.step()
    # a: 0.5 (PS) + 6 (worker) of node-0's 8 CPUs; b's worker needs 4
    assert "a" not in manager.waiting
    assert manager.waiting["b"].reason == "waiting for room: a worker needs 4 CPU, the largest free node has 1.5 CPU"
    assert not manager.waiting["b"].never
    capacity.nodes = {"node-0": (8.0, 0.0), "node-1": (4.0, 2.0)}  # another tenant holds 2 of node-1's 4
    manager.step()
    # b fits no node's free room (1.5 and 2 CPUs), though 3.5 CPUs are free in all
    assert manager.waiting["b"].reason == "waiting for room: a worker needs 4 CPU, the largest free node has 2 CPU"
    runtime.latest("a").crash("RayActorError: a worker died")
    manager.step()
    assert manager.waiting["a"].reason == f"starts again from its latest checkpoint in {RESTART_BACKOFF_S:.0f} s (1/3)"


def test_limits_go_through_validation(env):
    manager, _, _ = env
    submit(manager, "lim")
    rec = manager.set_limits("lim", LimitsPatch(workers=Range(max=2)))
    assert (rec.spec.workers.min, rec.spec.workers.max) == (1, 2)
    with pytest.raises(ValueError, match="min"):
        manager.set_limits("lim", LimitsPatch(workers=Range(min=3)))
    # limits this cluster can never hold are refused, as at submit (FakeCapacity: one node of 8 CPU)
    with pytest.raises(UnschedulableError, match="can never run on this cluster"):
        manager.set_limits("lim", LimitsPatch(ps=Range(min=20, max=20)))
    assert manager.store.get_job("lim").spec.ps.min == 1
    manager.cancel("lim")
    with pytest.raises(IllegalTransition, match="'lim' is cancelled: its limits no longer change"):
        manager.set_limits("lim", LimitsPatch(workers=Range(max=3)))


def test_allow_list_of_program_modules(tmp_path):
    manager = Manager(
        Store(tmp_path / "m.db"), tmp_path, runtime=FakeRuntime(), capacity=FakeCapacity(),
        allow_programs=("elasticps.examples",),
    )  # fmt: skip
    submit(manager, "ok")
    with pytest.raises(ProgramError, match="not allowed"):
        manager.submit(parse_spec("name: evil\nprogram: subprocess:getoutput\nargs: {cmd: id}\n"))
    with pytest.raises(ProgramError, match="not allowed"):
        manager.submit(parse_spec("name: evil\nprogram: elasticps.examplesx:program\n"))
    assert [r.name for r in manager.store.list_jobs()] == ["ok"]
    with pytest.raises(ProgramError, match="names a private part"):  # a helper of an allowed module
        manager.submit(parse_spec("name: evil\nprogram: elasticps.examples.digits:_split\n"))


def test_a_narrower_allow_list_after_a_restart_fails_stored_jobs_at_their_next_start(tmp_path):
    store = Store(tmp_path / "m.db")
    before = Manager(store, tmp_path / "work", runtime=FakeRuntime(), capacity=FakeCapacity())
    submit(before, "ran")
    before.step()
    submit(before, "waits")  # after the last round: never started
    assert before.store.get_job("ran").state == JobState.RUNNING
    before.shutdown()
    # the operator restarts the manager allowing another package only
    runtime = FakeRuntime()
    after = Manager(store, tmp_path / "work", runtime=runtime, capacity=FakeCapacity(), allow_programs=("team.jobs",))
    after.step()
    for name in ("ran", "waits"):
        assert after.store.get_job(name).state == JobState.FAILED
        why = after.store.events(name)[-1][4]
        assert "not started again" in why and "is not allowed" in why and "team.jobs" in why, why
    assert runtime.jobs == {}  # nothing of theirs started
    after.retry("ran")  # a retry is a start too
    after.step()
    assert after.store.get_job("ran").state == JobState.FAILED and runtime.jobs == {}


def test_commands_race_the_loop(env):
    """Submits and cancels from many threads while the loop runs: every
    acknowledged cancel stands, every acknowledged submit is stored."""
    manager, _runtime, _ = env
    stop = threading.Event()
    loop = threading.Thread(target=manager.run, args=(0.0, stop, 0.001, 0.0))
    loop.start()
    acked_cancel: list[str] = []
    errors: list[BaseException] = []

    def user(i: int) -> None:
        try:
            submit(manager, f"j{i}")
            if i % 2 == 0:
                manager.cancel(f"j{i}")
                acked_cancel.append(f"j{i}")
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=user, args=(i,)) for i in range(40)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for _ in range(200):
        if not manager.store.list_jobs(("pending", "running")):
            break
        threading.Event().wait(0.01)
    stop.set()
    loop.join()
    assert not errors
    states = {r.name: r.state for r in manager.store.list_jobs()}
    assert len(states) == 40
    assert all(states[n] == "cancelled" for n in acked_cancel)
    assert all(s == "finished" for n, s in states.items() if n not in acked_cancel)


def test_retention_keeps_the_newest(tmp_path):
    store = Store(tmp_path / "m.db")
    store.add_job(parse_spec(SPEC.format(name="a", cpu=1)), 0.0)
    for i in range(30):
        store.add_event(float(i), "a", "x", f"e{i}")
        store.record_observation("a", float(i), 1, 1, float(i))
    store.prune(Retention(events=10, observations_per_job=5))
    assert [e[4] for e in store.events()][-1] == "e29" and len(store.events()) == 10
    assert [o[2] for o in store.observations("a")] == [25.0, 26.0, 27.0, 28.0, 29.0]


def test_a_new_job_of_a_known_kind_starts_at_the_fleet_priors_best(env):
    """The simulator's fleet prior, in the manager: jobs of the same program, batch, mode and
    task sizes pool their observations; a new one of that kind goes straight to the best shape."""
    manager, _, capacity = env
    capacity.nodes = {"node-0": (32.0, 0.0)}
    submit(manager, "first")
    manager.step()

    def speed(p: int, w: int) -> float:  # the PS bound: 2 PS x 4 workers is the best within the limits
        return 64 / (0.002 * 64 / w + 0.01 + 0.005 * w / p)

    for p in (1, 2):
        for w in (1, 2, 3, 4):
            manager.store.record_observation("first", manager.clock(), p, w, speed(p, w))
    submit(manager, "same-kind")
    submit(manager, "other-kind", cpu=2.0)  # other task sizes: another speed function, nothing known
    manager.step()
    assert manager.live["same-kind"].asked == (2, 4)
    assert manager.live["other-kind"].asked == (1, 1)


def test_the_fleet_prior_reads_an_ended_jobs_observations_once_and_forgets_it_when_deleted(env):
    """A round reads only the active jobs' observations, however many jobs ended before."""
    manager, _, capacity = env
    capacity.nodes = {"node-0": (32.0, 0.0)}
    submit(manager, "first")
    manager.step()

    def speed(p: int, w: int) -> float:  # as above: 2 PS x 4 workers is the best within the limits
        return 64 / (0.002 * 64 / w + 0.01 + 0.005 * w / p)

    for p in (1, 2):
        for w in (1, 2, 3, 4):
            manager.store.record_observation("first", manager.clock(), p, w, speed(p, w))
    manager.cancel("first")
    while manager.store.get_job("first").state != "cancelled" or manager.jobs.in_use("first"):
        manager.step()
    reads: list[str] = []
    observations = manager.store.observations
    manager.store.observations = lambda name: reads.append(name) or observations(name)  # type: ignore[method-assign]
    submit(manager, "same-kind")
    for _ in range(3):
        manager.step()
    assert manager.live["same-kind"].asked == (2, 4)  # the ended job's observations still count
    assert "first" not in reads and reads.count("same-kind") == 3  # ... read when it ended, not every round
    manager.delete("first")
    submit(manager, "after-delete")
    manager.step()
    assert manager.live["after-delete"].asked == (1, 1)  # deleted: nothing known of the kind any more


def test_delete_frees_the_name_of_an_ended_job_only(env):
    manager, runtime, _ = env
    submit(manager, "d")
    manager.step()
    with pytest.raises(JobInUse, match="cancel it before deleting it"):
        manager.delete("d")
    (manager.workdir / "jobs.d" / "d" / "checkpoints").mkdir(parents=True, exist_ok=True)
    manager.cancel("d")
    if manager.jobs.in_use("d"):  # still stopping: refused until the round has closed it
        with pytest.raises(JobInUse, match="still stopping"):
            manager.delete("d")
        manager.step()
    assert manager.delete("d").state == JobState.CANCELLED
    assert not (manager.workdir / "jobs.d" / "d").exists()  # a new job of that name must not resume the old checkpoints
    assert manager.store.events("d") == [] and manager.store.observations("d") == []
    assert any(k == "deleted" for _, _, _, k, _ in manager.store.events())
    submit(manager, "d")  # the name is free again
    manager.step()
    assert manager.store.get_job("d").state == JobState.RUNNING and len(runtime.jobs["d"]) == 2


def test_a_new_job_of_a_deleted_name_inherits_nothing_this_manager_held_of_the_old_one(env):
    """After a delete the name is free: the new job shows no final report of the old one,
    and says on its own why it can never fit (the old one's note does not stand for it)."""
    manager, _, capacity = env
    submit(manager, "d", cpu=6)
    manager.step()
    manager.step()  # it runs and trains
    capacity.nodes = {"node-0": (4.0, 0.0)}  # the cluster shrinks: the job, cancelled and queued again, never fits
    manager.cancel("d")
    manager.step()
    manager.retry("d")
    manager.step()
    assert [k for k in kinds(manager, "d") if k == "unfit"] == ["unfit"]
    assert manager.report("d") is not None  # the old run's final report
    manager.cancel("d")
    manager.delete("d")
    capacity.nodes = {"node-0": (8.0, 0.0)}
    submit(manager, "d", cpu=6)
    assert manager.report("d") is None  # nothing of the new job has run
    capacity.nodes = {"node-0": (4.0, 0.0)}
    manager.step()
    assert [m for _, _, _, k, m in manager.store.events("d") if k == "unfit"] == [
        "cannot fit: a worker needs 6 CPU, the largest node has 4 CPU"
    ]


def test_metrics_are_prometheus_families_that_follow_the_jobs(env):
    from prometheus_client.parser import text_string_to_metric_families

    manager, runtime, _ = env
    runtime.launch_s = 1.5  # what each rescale that starts tasks reports as their start-up
    submit(manager, "m")
    manager.step()
    runtime.latest("m").steps_per_poll = 1  # a long job: it runs through every scrape here
    for _ in range(7):
        manager.step()

    def scrape() -> dict[str, dict]:
        out: dict[str, dict] = {}
        for family in text_string_to_metric_families(manager.metrics.exposition().decode()):
            for s in family.samples:
                out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
        return out

    first = scrape()
    job = runtime.latest("m")
    assert first["elasticps_jobs"][(("state", "running"),)] == 1
    assert first["elasticps_job_tasks"][(("job", "m"), ("kind", "worker"))] == job.shape[1]
    samples = first["elasticps_job_samples_total"][(("job", "m"),)]
    assert samples == job.step * job.info.batch_size > 0
    assert first["elasticps_job_rescales_total"][(("job", "m"),)] == len(manager.store.allocations("m")) - 1
    assert first["elasticps_decision_seconds_count"][()] == 8
    applied = len(job.rescales)  # the runtime's records of applied rescales, each with its pause
    assert applied >= 1 and first["elasticps_rescale_pause_seconds_count"][()] == applied
    assert first["elasticps_rescale_pause_seconds_sum"][()] == pytest.approx(applied * job.pause_s)
    started = sum(1 for r in job.rescales if r.new_tasks)  # those that started tasks, each with its start-up
    assert started >= 1 and first["elasticps_rescale_launch_seconds_count"][()] == started
    assert first["elasticps_rescale_launch_seconds_sum"][()] == pytest.approx(started * 1.5)
    cpus = {k[0][1]: v for k, v in first["elasticps_cluster_cpus"].items()}
    assert cpus["capacity"] == 8.0 and cpus["ours"] + cpus["free"] + cpus["others"] == pytest.approx(8.0)
    manager.step()
    second = scrape()
    assert second["elasticps_job_samples_total"][(("job", "m"),)] > samples  # a counter: it only grows
    assert second["elasticps_decision_seconds_count"][()] == 9


@pytest.mark.parametrize("objective", ["speed", "goodput"])
def test_the_objective_sets_an_adaptive_jobs_batch(tmp_path, objective):
    """A program with max_batch_size: the manager picks its global batch from the measured
    noise scale and the speed model (speed: the largest; goodput: where samples/s x E(M)
    peaks), asks the runtime for it, and records observations at the batch they ran at."""

    def speed_at(p: int, w: int, m: int) -> float:  # compute-heavy: big batches are barely faster per sample
        return m / (0.01 * m / w + 0.02 + 0.005 * w / p)

    info = ProgramInfo("adaptive", 64, 50, 100_000, max_batch_size=512)
    runtime = FakeRuntime(programs={"pkg:adaptive": info}, speed_at=speed_at, noise_scale=64.0)
    manager = Manager(
        Store(tmp_path / "m.db"), tmp_path / "work", objective=objective, clock=Clock(), runtime=runtime,
        capacity=FakeCapacity(), policy_options={"rescale_cost_s": 0.0},
    )  # fmt: skip
    manager.submit(
        parse_spec(SPEC.format(name="a", cpu=1.0).replace("elasticps.examples.digits:program", "pkg:adaptive"))
    )
    for _ in range(8):
        manager.step()
    job = runtime.latest("a")
    batches = {o[3] for o in manager.store.observations("a")}
    if objective == "speed":
        assert job.batch == 512 and 512 in batches
    else:  # E(512) = 128/576: goodput stays at the batch it has
        assert job.batch == 0 and batches == {64}
    assert ("batch" in kinds(manager, "a")) == (objective == "speed")
    if objective == "speed":  # the event says why: the objective's figure at the new batch against the old
        whys = [message for _, _, _, kind, message in manager.store.events(job="a") if kind == "batch"]
        assert whys[-1].startswith("batch 512: ")
        for why in whys:
            m = re.fullmatch(r"batch (\d+): speed (\d+) samples/s at (\d)x(\d), against (\d+) at batch (\d+)", why)
            assert m and int(m[1]) > int(m[6]) and int(m[2]) > int(m[5]), why
            # the speed model's estimate, fitted to the measured speeds: near the truth
            assert int(m[2]) == pytest.approx(speed_at(int(m[3]), int(m[4]), int(m[1])), rel=0.25), why
    check_invariants(manager)


def test_metrics_read_a_snapshot_and_import_nothing_of_the_manager():
    """manager/metrics.py and manager/service.py do not import each other both ways."""
    import ast
    import inspect

    import elasticps.manager.metrics as metrics

    tree = ast.parse(inspect.getsource(metrics))
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert "elasticps.manager.service" not in imported and "elasticps.manager" not in imported


def test_a_round_decides_before_releasing_an_ended_job_whose_tasks_still_count_as_ours(env):
    """Releasing an ended job's tasks takes seconds on Ray: the round that sees
    it end decides first (its room is handed out at once) and releases it
    after; meanwhile its tasks are ours, not another tenant's."""
    manager, runtime, capacity = env
    submit(manager, "a")
    submit(manager, "b")
    manager.step()
    manager.step()
    a = runtime.latest("a")
    a.step = a.info.epochs * a.info.samples_per_epoch // a.info.batch_size  # its last step is done
    seen = []
    view = capacity.view

    def recording(ours):
        seen.append((sum(r.cpu for r in ours.values()), a.closed))
        return view(ours)

    capacity.view = recording
    manager.observer.collect(manager.clock())  # as the loop does between rounds: "a" ended, queued for release
    assert manager.store.get_job("a").state == JobState.FINISHED and not a.closed
    manager.step()
    held_by_a = a.shape[0] * 0.5 + a.shape[1] * 1.0  # PS 0.5 CPU, workers 1 CPU each
    assert seen and seen[0][1] is False, "the round released the ended job before deciding"
    assert seen[0][0] >= held_by_a + 1.0, "the ended job's tasks were not counted as ours"
    assert a.closed


def test_a_speed_measured_with_tasks_spread_over_nodes_is_not_taken_for_one_nodes(env):
    """The simulator's placement-aware speed, in the manager: reports carry the nodes
    they ran on and the share of PS traffic that crossed them, and each shape is
    judged for the nodes it would span on the room there is now."""
    manager, runtime, capacity = env
    local = {1: 100.0, 2: 190.0, 3: 270.0, 4: 340.0, 5: 400.0}  # samples/s with all of a shape on one node
    runtime.speed = lambda p, w: local[w]
    runtime.cross_cost = 1.5  # PS traffic across nodes slows a step down
    runtime.programs = {"elasticps.examples.digits:program": ProgramInfo("digits", 64, 100, 1437)}  # long
    capacity.nodes = {"a": (4.0, 1.0), "b": (4.0, 1.0)}  # another tenant: 1 PS + 3 workers fit on no one node
    manager.submit(parse_spec(SPEC.format(name="spread", cpu=1.0).replace("max: 4", "max: 5")))
    manager.set_limits("spread", LimitsPatch(ps=Range(min=1, max=1), workers=Range(min=3, max=3)))
    for _ in range(4):
        manager.step()
    placement = manager.store.allocations("spread")[-1][3]
    crossed = sum(n != placement["ps-0"] for t, n in placement.items() if t.startswith("worker-")) / 3
    *_, nodes, cross = manager.store.observations("spread")[-1]
    assert (nodes, cross) == (2, pytest.approx(crossed)) and 0 < crossed < 1
    for w in (1, 2):  # measured earlier, on one node
        manager.store.record_observation("spread", manager.clock(), 1, w, local[w])
    capacity.nodes = {"a": (4.0, 0.0), "b": (4.0, 0.0)}  # the tenant left
    manager.set_limits("spread", LimitsPatch(workers=Range(min=1, max=3)))
    # 1 x 3 ran slower than 1 x 2 (270 / (1 + 1.5 x crossed) < 190) because of the spread; on one
    # node (4 CPU now hold 1 PS + 3 workers) it is the fastest shape, so the job keeps it (a shrink
    # would come after the policy's shrink_rounds rounds of wishing it)
    assert manager.store.observations("spread")[-3][2] < local[2]
    for _ in range(3):
        manager.step()
        assert manager.live["spread"].asked == (1, 3)
    assert manager.store.observations("spread")[-1][2:] == (local[3], 64, 1, 0.0)  # moved onto one node
    # more workers would span both nodes: what crossing costs was measured, so 1 x 4 and 1 x 5 are
    # judged as spread (slower than 1 x 3 on one node) and the job stays
    manager.set_limits("spread", LimitsPatch(workers=Range(min=1, max=5)))
    for _ in range(3):
        manager.step()
        assert manager.live["spread"].asked == (1, 3)


def test_the_policy_weighs_a_move_by_what_rescales_measured_here_cost(tmp_path):
    """Until a rescale that started tasks is measured, a job's view has no
    figures (the policy uses its own); then its own, and for a job never
    rescaled, every job's."""
    runtime, capacity = FakeRuntime(launch_s=3.0), FakeCapacity()
    runtime.programs = {"elasticps.examples.digits:program": ProgramInfo("digits", 64, 100, 1437)}
    manager = Manager(Store(tmp_path / "m.db"), tmp_path / "work", clock=Clock(), runtime=runtime, capacity=capacity)
    seen: list[dict[str, tuple]] = []
    decide = manager.policy.decide

    def spy(views, *args):
        seen.append({v.id: (v.rescale_pause_s, v.rescale_launch_s) for v in views})
        return decide(views, *args)

    manager.policy.decide = spy
    submit(manager, "a")
    for _ in range(8):
        manager.step()
        if runtime.latest("a").rescales:
            break
    grown = runtime.latest("a").rescales
    assert grown and grown[0].new_tasks > 0, "the job was never rescaled"
    # nothing measured while it ran its first shape; the round that read the record decides with it
    assert len(seen) > 1 and all(s["a"] == (None, 0.0) for s in seen[:-1])
    assert seen[-1]["a"] == (pytest.approx(0.02), pytest.approx(3.0))
    asked = [e[4] for e in manager.store.events("a") if e[3] == "rescale"]
    assert asked and asked[0].endswith("(the round saw 8 of 8 CPUs free for our jobs)")  # what it was decided on
    submit(manager, "b")
    manager.step()
    assert seen[-1]["b"] == seen[-1]["a"]  # never rescaled: what every job's rescales cost
    check_invariants(manager)


def test_rescale_costs_are_the_medians_of_applied_moves_own_first():
    from elasticps.manager.rescale_costs import RescaleCost, RescaleCosts
    from elasticps.runtime.reports import RescaleRecord

    def rec(pause: float, launch: float, new: int, ok: bool = True, reason: str = "request") -> RescaleRecord:
        return RescaleRecord(1, (1, 1), (1, 1 + new), 5, pause, launch, ok, reason=reason, new_tasks=new)

    costs = RescaleCosts(recent=3)
    costs.observe("a", rec(0.1, 0.0, 0))  # a shrink: a pause, no launch
    assert costs.of("a") is None  # no start-up of new tasks measured yet
    costs.observe("a", rec(0.3, 5.0, 2))
    costs.observe("a", rec(9.0, 9.0, 1, ok=False))  # failed: no move
    costs.observe("a", rec(9.0, 0.0, 0, reason="release"))  # tasks released, not a move the policy made
    assert costs.of("a") == RescaleCost(pytest.approx(0.2), 5.0)
    for launch in (1.0, 2.0, 3.0, 4.0):  # only the newest 3 count
        costs.observe("a", rec(0.2, launch, 1))
    assert costs.of("a") == RescaleCost(0.2, 3.0)
    assert costs.of("b") == RescaleCost(0.2, 3.0)  # never rescaled: every job's (launches 5, 1, 2, 3, 4)
    costs.observe("b", rec(1.0, 10.0, 1))
    assert costs.of("b") == RescaleCost(1.0, 10.0)
    costs.forget("b")
    assert costs.of("b") == RescaleCost(0.2, 3.5)  # every job's again: launches 1, 2, 3, 4, 5 and 10


def test_jobs_named_like_the_workdirs_secrets_keep_their_files_apart(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    (work / "token").write_text("api-secret\n")
    (work / "ray-token").write_text("ray-secret\n")
    runtime = FakeRuntime()
    manager = Manager(Store(tmp_path / "m.db"), work, clock=Clock(), runtime=runtime, capacity=FakeCapacity())
    for name in ("token", "ray-token"):
        submit(manager, name, cpu=0.5)
    manager.step()
    for name in ("token", "ray-token"):
        assert runtime.latest(name).launch.config.checkpoint_dir == str(work / "jobs.d" / name / "checkpoints")
    for name in ("token", "ray-token"):
        manager.cancel(name)
    manager.step()
    for name in ("token", "ray-token"):
        manager.delete(name)
    assert (work / "token").read_text() == "api-secret\n" and (work / "ray-token").read_text() == "ray-secret\n"
    check_invariants(manager)


def test_a_specs_step_timeout_and_standbys_reach_its_runtime_and_none_keeps_the_runtimes_default(env):
    manager, runtime, _ = env
    manager.submit(parse_spec(SPEC.format(name="slow", cpu=1) + "step_timeout_s: 1800\nstandby_workers: 2\n"))
    submit(manager, "usual")
    manager.step()
    assert runtime.latest("slow").launch.config.step_timeout_s == 1800.0
    assert runtime.latest("slow").launch.config.standby_workers == 2
    assert runtime.latest("usual").launch.config.step_timeout_s == JobConfig().step_timeout_s
    assert runtime.latest("usual").launch.config.standby_workers == 0


def test_a_workdir_of_the_older_layout_has_its_job_folders_moved(tmp_path):
    work = tmp_path / "work"
    store = Store(tmp_path / "m.db")
    for name in ("old-a", "old-b"):
        store.add_job(parse_spec(SPEC.format(name=name, cpu=1)), 1.0)
    (work / "old-a" / "checkpoints").mkdir(parents=True)
    (work / "old-a" / "checkpoints" / "ckpt-0000000005.npz").write_bytes(b"x")
    (work / "stranger").mkdir()  # not a job's: left alone
    Manager(store, work, clock=Clock(), runtime=FakeRuntime(), capacity=FakeCapacity())
    assert (work / "jobs.d" / "old-a" / "checkpoints" / "ckpt-0000000005.npz").read_bytes() == b"x"
    assert not (work / "old-a").exists() and (work / "stranger").is_dir() and not (work / "jobs.d" / "old-b").exists()
    # both layouts at once: which holds the checkpoints is not guessed
    (work / "old-a").mkdir()
    with pytest.raises(ConfigError, match="both"):
        Manager(store, work, clock=Clock(), runtime=FakeRuntime(), capacity=FakeCapacity())


def test_a_policy_option_no_policy_takes_is_an_error_that_lists_the_valid_ones(tmp_path):
    with pytest.raises(ConfigError, match=r"no option 'rescale_cost'.*rescale_cost_s"):
        Manager(Store(tmp_path / "m.db"), tmp_path, runtime=FakeRuntime(), capacity=FakeCapacity(),
                policy_options={"rescale_cost": 1.0})  # fmt: skip
    with pytest.raises(ConfigError, match=r"policy 'static' has no option 'spare_z' \(its options: none\)"):
        Manager(Store(tmp_path / "m.db"), tmp_path, policy="static", runtime=FakeRuntime(), capacity=FakeCapacity(),
                policy_options={"spare_z": 1.0})  # fmt: skip


def test_a_round_on_an_arrival_or_an_end_only_starts_waiting_jobs(env):
    """elasticps.sched.rounds: full rounds (the interval, limits, capacity) move running jobs; a round on
    a submit or a job's end holds them at their shapes and starts what waits in the free room."""
    manager, _, _ = env
    submit(manager, "a")
    assert manager.step() == {"a": (1, 1)}
    for _ in range(4):  # a has room to grow into (8 CPUs), but these rounds hold it
        assert manager.step(full=False) == {"a": (1, 1)}
    submit(manager, "b")
    assert manager.step(full=False) == {"a": (1, 1), "b": (1, 1)}  # b starts in the free room at once
    moved = [manager.step() for _ in range(4)]
    assert any(d["a"] != (1, 1) for d in moved), moved  # a full round moves it (the policy explores it)


def test_the_loop_runs_a_full_round_on_new_limits_and_an_admission_round_on_a_submit(env):
    manager, _, _ = env
    calls = []
    manager.step = lambda full=True: calls.append(full) or {}
    stop = threading.Event()
    loop = threading.Thread(target=manager.run, args=(3600.0, stop), kwargs={"watch_s": 0.05})
    loop.start()
    try:
        _wait_for(lambda: calls == [True])  # the first round is due
        submit(manager, "a")
        _wait_for(lambda: calls == [True, False])
        manager.set_limits("a", LimitsPatch(workers=Range(max=2)))
        _wait_for(lambda: calls == [True, False, True])
    finally:
        stop.set()
        manager.wake.set()
        loop.join(10)
    assert not loop.is_alive()
    del manager.step  # the fixture's last round is a real one


def test_a_full_round_for_new_limits_that_fails_is_run_again(env):
    manager, _, _ = env
    submit(manager, "a")
    calls = []

    def step(full=True):
        calls.append(full)
        if len(calls) == 2:
            raise RuntimeError("this round fails")
        return {}

    manager.step = step
    stop = threading.Event()
    loop = threading.Thread(target=manager.run, args=(3600.0, stop), kwargs={"watch_s": 0.05})
    loop.start()
    try:
        _wait_for(lambda: calls == [True])
        manager.set_limits("a", LimitsPatch(workers=Range(max=2)))
        _wait_for(lambda: len(calls) >= 3)  # the full round failed; the next pass runs it again, full
        assert calls[:3] == [True, True, True]
    finally:
        stop.set()
        manager.wake.set()
        loop.join(10)
    assert not loop.is_alive()
    del manager.step


def _wait_for(condition, timeout_s: float = 10.0) -> None:
    import time

    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_a_relative_workdir_reaches_the_job_as_absolute_paths(tmp_path, monkeypatch):
    # a shipped job's tasks run in Ray's copy of its working_dir: a relative checkpoint or output
    # folder would land there, not in the manager's workdir
    monkeypatch.chdir(tmp_path)
    runtime = FakeRuntime()
    manager = Manager(Store(tmp_path / "m.db"), "state", clock=Clock(), runtime=runtime, capacity=FakeCapacity())
    submit(manager, "a")
    manager.step()
    launch = runtime.latest("a").launch
    paths = [launch.config.checkpoint_dir, launch.output_dir, launch.code_dir]
    assert all(os.path.isabs(p) and p.startswith(str(tmp_path / "state")) for p in paths), paths
    manager.shutdown()


def test_what_a_users_own_loop_cannot_do_is_refused_at_submit(env):
    from elasticps.manager.describe import describe_program

    manager, runtime, _ = env
    info = describe_program("elasticps.examples.digits_loop:main", {"epochs": 1})
    assert info["own_loop"] is True and describe_program("elasticps.examples.digits:program", {})["own_loop"] is False
    runtime.programs["mine.loop:main"] = ProgramInfo("my-loop", 64, 2, 1000, own_loop=True)
    base = "name: {name}\nprogram: mine.loop:main\n"
    with pytest.raises(ConfigError, match="mode: async: mine.loop:main is a user's own loop, .* sync mode only"):
        manager.submit(parse_spec(base.format(name="a") + "mode: async\n"))
    with pytest.raises(ConfigError, match="standby_workers: mine.loop:main is a user's own loop"):
        manager.submit(parse_spec(base.format(name="s") + "standby_workers: 1\n"))
    assert manager.store.list_jobs() == []  # neither stored
    assert manager.submit(parse_spec(base.format(name="ok"))).state == "pending"


def test_a_jobs_shape_history_stops_while_it_is_cancelled_and_goes_on_at_its_retry(env):
    from elasticps.cli.readable import describe_text
    from elasticps.manager.dashboard import job_detail

    manager, _, _ = env
    submit(manager, "h")
    for _ in range(3):
        manager.step()
    (first,) = manager.store.allocations("h")
    manager.cancel("h")
    cancelled_at = manager.store.events("h")[-1][1]
    for _ in range(3):
        manager.step()  # the job sits cancelled a while (its tasks stopped) before its retry
    manager.retry("h")
    for _ in range(3):
        manager.step()
    again = manager.store.allocations("h")[-1]
    shapes = job_detail(manager, "h")["shapes"]
    shape = [again[1], again[2]]  # the retried run's own shape
    assert shapes[:3] == [[first[0], 1, 1], [cancelled_at, 0, 0], [again[0], *shape]], shapes
    assert again[0] > cancelled_at + 3 and len(shapes) == 4 and shapes[3][1:] == shape  # held until now
    detail = job_detail(manager, "h")
    held = [ln for ln in describe_text(detail, detail["spec"]).splitlines() if " for " in ln]
    assert len(held) == 2 and held[0].endswith(f"1 PS x 1 worker  for {int(cancelled_at - first[0])}s"), held


def test_a_rescale_asked_of_a_job_whose_driver_is_then_lost_is_said_dropped(env):
    manager, runtime, _ = env
    submit(manager, "d")
    asked: list[str] = []
    for _ in range(12):
        manager.step()
        asked = [m for *_, k, m in manager.store.events("d") if k == "rescale"]
        if asked:
            break
    assert asked, "the job was never asked to rescale"
    shape = asked[-1].removeprefix("rescale to ").partition(":")[0]  # "rescale to 2 PS x 3 workers: why ..."
    runtime.latest("d").lose_driver("the job's driver process is gone: node died")
    manager.step()
    lines = [m for *_, k, m in manager.store.events("d")]
    dropped = f"the rescale to {shape} was dropped: the job's driver is gone"
    assert dropped in lines and lines.index(dropped) < next(i for i, m in enumerate(lines) if "node died" in m)


def test_the_progress_kept_of_a_cancelled_job_is_where_it_stopped_not_its_last_poll(env):
    manager, runtime, _ = env
    submit(manager, "c")
    for _ in range(3):
        manager.step()
    polled = manager.store.progress("c")["step"]
    job = runtime.latest("c")
    job.step += 7  # steps trained after the last poll, before the cancel stops it
    job.windows.append(dataclasses.replace(job.windows[-1], samples_per_s=12345.0))
    manager.cancel("c")
    manager.step()  # the round drains the cancelled job: stopped, its final report read
    kept = manager.store.progress("c")
    assert kept["step"] == polled + 7 == job.step and kept["epoch"] == job.report().epoch
    assert kept["samples_per_s"] == 12345.0  # as describe and the API show it, from the final report


def test_the_api_counts_a_run_from_its_start_event_as_describe_and_events_do(env):
    from elasticps.manager.dashboard import overview

    manager, _, _ = env
    submit(manager, "s")
    for _ in range(6):
        manager.step()
    started = next(at for _, at, _, kind, _ in manager.store.events("s") if kind == "started")
    first_allocation = manager.store.allocations("s")[0][0]
    assert first_allocation > started
    view = overview(manager)
    [row] = [r for r in view["jobs"] if r["name"] == "s"]
    assert row["started_at"] == started and row["elapsed_s"] == pytest.approx(view["now"] - started)


def test_an_ended_job_shows_the_shape_it_last_ran_in_the_api_as_in_status(env):
    from elasticps.manager.dashboard import overview

    manager, runtime, _ = env
    submit(manager, "e")
    for _ in range(3):
        manager.step()
    ran = runtime.latest("e").shape
    manager.cancel("e")
    manager.step()
    [row] = [r for r in overview(manager)["jobs"] if r["name"] == "e"]
    assert row["ended"] and (row["num_ps"], row["num_workers"]) == ran == manager.store.allocations("e")[-1][1:3]
    submit(manager, "w")  # submitted, not started yet: no shape
    [row] = [r for r in overview(manager)["jobs"] if r["name"] == "w"]
    assert (row["num_ps"], row["num_workers"]) == (0, 0)
