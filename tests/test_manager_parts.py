"""The manager's parts one at a time, each against a real store and the
in-memory runtime (elasticps.manager.fake): the job table's failures and
backoff, a round's polls (observe), the views the policy reads (job_views),
the API's commands (commands) and a round's last step (apply).
No Ray, no Manager: each part is built from what it needs."""

from __future__ import annotations

import threading
from collections import OrderedDict

import pytest

from elasticps.errors import UnschedulableError
from elasticps.manager import Store, parse_spec
from elasticps.manager.admission import Admission
from elasticps.manager.apply import Applier
from elasticps.manager.commands import Commands
from elasticps.manager.fake import FakeCapacity, FakeJob, FakeRuntime
from elasticps.manager.job_views import RoundReads, ViewBuilder
from elasticps.manager.live import MAX_FAILURES, RESTART_BACKOFF_S, JobTable, LiveJob
from elasticps.manager.metrics import ManagerMetrics
from elasticps.manager.observe import Observer, event_kind, window_ends
from elasticps.manager.priors import FleetPriors
from elasticps.manager.rescale_costs import RescaleCosts
from elasticps.manager.runtime import Launch, ProgramInfo
from elasticps.manager.shipping import ShipPolicy
from elasticps.manager.spec import LimitsPatch
from elasticps.manager.states import JobInUse, JobState
from elasticps.placement import shared_spans
from elasticps.runtime import JobConfig
from elasticps.sched import Resources

SPEC = """name: {name}
program: elasticps.examples.digits:program
ps: {{min: 1, max: 2, cpu: 0.5}}
workers: {{min: 1, max: 4, cpu: 1}}
"""


class Parts:
    """A store, a fake runtime, and the parts of a manager around one job table."""

    def __init__(self, tmp_path, allow_programs: tuple[str, ...] | None = None) -> None:
        self.store = Store(tmp_path / "m.db")
        adaptive = ProgramInfo("digits", 64, 3, 1437, max_batch_size=256)  # the scheduler may pick its batch
        self.runtime = FakeRuntime(programs={"elasticps.examples.digits:program": adaptive})
        self.costs = RescaleCosts()
        self.priors = FleetPriors(self.store)
        self.jobs = JobTable(self.store, self.costs, self.priors)
        self.admission = Admission(allow_programs, ShipPolicy.of(None, tmp_path), self.jobs)
        self.views = ViewBuilder(self.store, self.runtime, tmp_path, self.jobs, self.admission, self.priors, self.costs)
        self.observer = Observer(self.store, self.jobs, ManagerMetrics(lambda: None), self.costs)  # type: ignore[arg-type, return-value]
        self.capacity = FakeCapacity()
        self.now = 100.0
        self.wake = threading.Event()
        self.commands = Commands(
            store=self.store, jobs=self.jobs, lock=threading.RLock(), wake=self.wake, clock=lambda: self.now,
            workdir=tmp_path, runtime=self.runtime, capacity=self.capacity, admission=self.admission,
        )  # fmt: skip
        self.applier = Applier(self.store, self.runtime, tmp_path, self.jobs, self.admission, report_interval_s=1.0)

    def add(self, name: str, now: float = 100.0):
        spec = parse_spec(SPEC.format(name=name))
        return self.store.add_job(spec, now, self.runtime.describe(spec))

    def run(self, name: str, shape: tuple[int, int], now: float = 101.0, **fake) -> FakeJob:
        """The job as the apply step leaves it: running in the store, its handle here."""
        rec = self.store.get_job(name)
        placement = {f"ps-{i}": "node-0" for i in range(shape[0])} | {f"worker-{i}": "node-0" for i in range(shape[1])}
        launch = Launch(name, rec.spec.program, {}, JobConfig(), shape, placement)
        handle = FakeJob(launch, rec.info, **fake)
        self.store.transition(name, JobState.RUNNING, now, "started", kind="started")
        self.jobs.started(name, LiveJob(handle, shape, dict(placement)))
        return handle

    def view(self, name: str, now: float = 200.0):
        return self.views.view(self.store.get_job(name), now, RoundReads(), shared_spans([Resources(cpu=8.0)]))

    def kinds(self, name: str) -> list[str]:
        return [e[3] for e in self.store.events(name)]


@pytest.fixture
def parts(tmp_path):
    return Parts(tmp_path)


def limits(view) -> tuple[int, int, int, int]:
    return view.min_ps, view.max_ps, view.min_workers, view.max_workers


def test_a_starting_job_is_held_at_the_shape_asked_until_a_poll_shows_it_applied(parts):
    parts.add("a")
    parts.run("a", (1, 2), start_polls=1)
    starting = parts.view("a")
    assert limits(starting) == (1, 1, 2, 2) and starting.current == (1, 2)
    assert starting.batch_sizes == ()  # no batch is chosen while it switches
    assert starting.remaining_samples == 3 * 1437  # epochs x samples per epoch: nothing reported yet
    parts.observer.collect(201.0)  # the start-up poll: "created", no shape applied yet
    assert limits(parts.view("a")) == (1, 1, 2, 2)
    parts.observer.collect(202.0)  # now it runs at 1x2 and has trained 10 steps
    running = parts.view("a")
    assert limits(running) == (1, 2, 1, 4)  # the spec's limits: the policy may move it again
    assert running.batch_sizes == (64, 128, 256) and running.waited_s == 0.0
    assert running.remaining_samples == 3 * 1437 - 10 * 64


def test_a_rescale_in_flight_holds_the_view_at_the_new_shape(parts):
    parts.add("a")
    handle = parts.run("a", (1, 2), start_polls=0)
    parts.observer.collect(201.0)
    live = parts.jobs.live["a"]
    live.asked = (2, 4)  # as the apply step leaves it after asking for a rescale
    assert limits(parts.view("a")) == (2, 2, 4, 4)
    handle.rescale(2, 4, {})
    parts.observer.collect(202.0)  # applied at the step boundary
    assert limits(parts.view("a")) == (1, 2, 1, 4)


def test_a_waiting_jobs_view_counts_its_wait_and_a_job_no_longer_allowed_has_none(tmp_path):
    parts = Parts(tmp_path, allow_programs=("elasticps.examples",))
    parts.add("ok", now=100.0)
    view = parts.view("ok", now=130.0)
    assert view.current is None and view.waited_s == 30.0
    parts.admission.allow_programs = ("elsewhere",)  # narrowed: checked again before each start, not each round
    assert parts.view("ok", now=131.0) is not None
    parts.add("later")
    assert parts.view("later") is None  # never checked here: checked now, refused
    rec = parts.store.get_job("later")
    assert rec.state == JobState.FAILED and "not started again" in parts.store.events("later")[-1][4]


def test_failures_in_a_row_back_off_longer_each_time_then_fail_the_job(parts):
    parts.add("f")
    now = 200.0
    handle = parts.run("f", (1, 1), now=now)
    for n in range(1, MAX_FAILURES):
        live = parts.jobs.live["f"]
        parts.jobs.stopped_by_failure("f", live, now, "JobFailedError: the node is gone")
        assert "f" not in parts.jobs.live and parts.jobs.in_use("f")  # queued to be stopped
        assert not parts.jobs.may_start("f", now + n * RESTART_BACKOFF_S - 1)
        assert parts.jobs.may_start("f", now + n * RESTART_BACKOFF_S)
        assert parts.jobs.backoff("f", now).reason.endswith(f"({n}/{MAX_FAILURES})")
        parts.jobs.started("f", LiveJob(handle, (1, 1), {}))  # started again
    parts.jobs.stopped_by_failure("f", parts.jobs.live["f"], now, "JobFailedError: again")
    assert parts.store.get_job("f").state == JobState.FAILED


def test_a_program_error_fails_at_once_and_progress_clears_the_count(parts):
    parts.add("p")
    parts.add("q")
    parts.run("p", (1, 1))
    handle = parts.run("q", (1, 1))
    assert parts.jobs.count_failure("p") == 1
    parts.jobs.progressed("p", 5)
    assert parts.jobs.count_failure("p") == 1  # counted from its last progress
    parts.jobs.progressed("p", 3)  # a step an earlier run reached: a run redoing it after a restart
    assert parts.jobs.count_failure("p") == 2
    parts.jobs.stopped_by_failure("q", parts.jobs.live["q"], 200.0, "ProgramError: bad answer")
    assert parts.store.get_job("q").state == JobState.FAILED
    assert parts.jobs.in_use("q") and not handle.closed  # released: the loop's drain closes it


def test_a_released_jobs_tasks_count_as_held_until_drained(parts):
    parts.add("r")
    handle = parts.run("r", (1, 2))
    held = parts.jobs.held()
    assert held == {"node-0": Resources(cpu=0.5 + 2 * 1.0)}
    parts.jobs.release("r", parts.jobs.live["r"])
    assert parts.jobs.held() == held and parts.jobs.in_use("r")
    parts.jobs.drain(threading.RLock())
    assert parts.jobs.held() == {} and not parts.jobs.in_use("r")
    assert handle.stopping and handle.closed and parts.jobs.ended["r"].name == "r"


class CountingLock:
    """A stand-in for the manager's lock that says whether it is held now."""

    def __init__(self) -> None:
        self.depth = 0

    def __enter__(self) -> None:
        self.depth += 1

    def __exit__(self, *exc: object) -> None:
        self.depth -= 1


def test_final_reports_are_kept_and_trimmed_under_the_lock(parts):
    """drain stops tasks outside the manager's lock, but a delete (an API thread)
    forgets a name's final report under it: drain keeps and trims them under it too."""
    lock = CountingLock()
    held_when: list[tuple[str, int]] = []

    class Ended(OrderedDict):
        def __setitem__(self, key, value) -> None:
            held_when.append(("keep", lock.depth))
            super().__setitem__(key, value)

        def popitem(self, last: bool = True):
            held_when.append(("trim", lock.depth))
            return super().popitem(last)

    jobs = JobTable(parts.store, parts.costs, parts.priors, max_ended_reports=1)
    jobs.ended = Ended()
    for name in ("a", "b"):
        parts.add(name)
        parts.run(name, (1, 1))
        jobs.release(name, parts.jobs.live.pop(name))
    jobs.drain(lock)  # type: ignore[arg-type]
    assert list(jobs.ended) == ["b"]  # one report kept: the older one trimmed
    assert held_when == [("keep", 1), ("keep", 1), ("trim", 1)]


def test_an_allocation_is_recorded_when_a_poll_shows_it_applied_not_when_asked(parts):
    parts.add("a")
    handle = parts.run("a", (1, 2), start_polls=1)
    parts.observer.collect(201.0)  # starting
    assert parts.store.allocations("a") == []
    parts.observer.collect(202.0)
    assert [(p, w) for _, p, w, _ in parts.store.allocations("a")] == [(1, 2)]
    handle.rescale(2, 3, {})
    parts.observer.collect(203.0)
    parts.observer.collect(204.0)  # the same shape again: recorded once
    assert [(p, w) for _, p, w, _ in parts.store.allocations("a")] == [(1, 2), (2, 3)]
    assert [(p, w) for p, w, *_ in parts.store.observations("a")] == [(1, 2), (2, 3), (2, 3)]
    assert "runtime" in parts.kinds("a")  # the rescale's own event, stored


def test_a_job_that_ran_and_ended_between_two_polls_gets_its_shape_and_final_state(parts):
    parts.add("quick")
    handle = parts.run("quick", (1, 1), start_polls=0, steps_per_poll=10_000)
    assert parts.observer.collect(300.0)  # it ran all its steps and finished in one poll: news
    ((at, p, w, _),) = parts.store.allocations("quick")
    elapsed = handle.windows[0].elapsed_s
    assert (p, w) == (1, 1) and at == pytest.approx(300.0 - elapsed)  # when its first window began
    assert parts.store.get_job("quick").state == JobState.FINISHED and not parts.jobs.live


def test_a_window_with_figures_the_scheduler_cannot_use_fails_the_job(parts):
    parts.add("nan")
    handle = parts.run("nan", (1, 1), start_polls=0, speed=lambda p, w: float("nan"))
    assert parts.observer.collect(201.0)
    assert parts.store.get_job("nan").state == JobState.FAILED
    assert parts.jobs.in_use("nan") and not parts.jobs.live  # released: queued to be stopped
    assert handle.windows and parts.store.observations("nan") == []  # none of its figures reached the store


def test_window_ends_space_a_polls_windows_by_what_they_lasted():
    class W:
        def __init__(self, elapsed_s: float) -> None:
            self.elapsed_s = elapsed_s

    # three windows of 2, 3 and 5 s, polled at t=100: the last ends now, the one before 5 s earlier, ...
    assert window_ends([W(2.0), W(3.0), W(5.0)], 100.0) == [92.0, 95.0, 100.0]
    assert window_ends([], 100.0) == []


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        ("step 3: 1 worker(s) died; continuing with 2", "loss"),
        ("step 3: node n1 is gone", "loss"),
        ("step 3: checkpoint 40 is damaged; resuming from 20", "checkpoint"),
        ("step 3: rescaled 1x1 -> 1x2", "runtime"),
    ],
)
def test_runtime_events_are_stored_by_kind(text, kind):
    assert event_kind(text) == kind


def test_forgetting_a_deleted_job_drops_all_that_was_held_of_it(parts):
    from elasticps.runtime.reports import RescaleRecord

    parts.costs.observe("x", RescaleRecord(1, (1, 1), (1, 2), 10, 5.0, 2.0, True, new_tasks=1))
    parts.costs.observe("y", RescaleRecord(1, (1, 1), (1, 2), 10, 0.1, 2.0, True, new_tasks=1))
    assert parts.costs.of("x").pause_s == 5.0  # its own records first
    parts.add("x")
    parts.run("x", (1, 1))
    parts.jobs.stopped_by_failure("x", parts.jobs.live["x"], 200.0, "JobFailedError: the node is gone")
    parts.jobs.drain(threading.RLock())
    parts.jobs.note_unfit("x", "cannot fit: ...")
    parts.jobs.admit("x")
    assert not parts.jobs.may_start("x", 200.0) and "x" in parts.jobs.ended
    parts.jobs.forget("x")
    assert parts.costs.of("x").pause_s == pytest.approx((5.0 + 0.1) / 2)  # every job's: the median of two
    assert parts.jobs.may_start("x", 200.0) and parts.jobs.failures_of("x") == 0 and "x" not in parts.jobs.unfit
    assert not parts.jobs.admitted("x") and "x" not in parts.jobs.ended


def test_a_cancel_forgets_the_jobs_own_rescale_costs_as_any_end_does(parts):
    from elasticps.runtime.reports import RescaleRecord

    parts.costs.observe("c", RescaleRecord(1, (1, 1), (1, 2), 10, 5.0, 2.0, True, new_tasks=1))
    parts.costs.observe("y", RescaleRecord(1, (1, 1), (1, 2), 10, 0.1, 2.0, True, new_tasks=1))
    parts.add("c")
    parts.run("c", (1, 1))
    assert parts.costs.of("c").pause_s == 5.0  # its own records first
    parts.commands.cancel("c")
    assert parts.costs.of("c").pause_s == pytest.approx((5.0 + 0.1) / 2)  # every job's: the median of two
    assert parts.jobs.in_use("c") and "c" not in parts.jobs.live and parts.wake.is_set()


def test_a_cancel_ends_the_run_here_and_a_retry_starts_clean_unfit_event_again(parts):
    parts.capacity.nodes = {"node-0": (0.75, 0.0)}  # a worker needs 1 CPU: the job can never fit
    cluster = parts.capacity.view({})
    parts.add("big")

    def note_unfit(now: float) -> None:
        views = parts.views.views([parts.store.get_job("big")], RoundReads(), cluster, now)
        parts.applier.note_unfit(views, cluster, now)

    note_unfit(200.0)
    note_unfit(201.0)  # the same reason: stored once
    assert parts.kinds("big").count("unfit") == 1 and "big" in parts.jobs.unfit
    parts.jobs.count_failure("big")  # e.g. a start that failed earlier
    parts.commands.cancel("big")
    assert "big" not in parts.jobs.unfit and parts.jobs.failures_of("big") == 0 and "big" not in parts.jobs.waiting
    parts.commands.retry("big")
    assert parts.jobs.waiting["big"].reason.startswith("submitted")
    note_unfit(300.0)  # the retried run cannot fit either: it says so, as its first run did
    assert parts.kinds("big").count("unfit") == 2


PLACED = {"ps-0": "node-0", "worker-0": "node-0"}


def test_a_start_that_fails_counts_says_why_the_job_waits_and_fails_the_job_at_the_limit(parts):
    parts.add("s")
    cluster = parts.capacity.view({})
    for n in range(1, MAX_FAILURES + 1):
        parts.applier.new_round()
        parts.runtime.fail_start = f"no room on node-0 ({n})"
        parts.applier.apply(parts.store.get_job("s"), (1, 1), PLACED, 200.0 + n, cluster)
        assert parts.jobs.failures_of("s") == (n if n < MAX_FAILURES else 0)  # at the limit the run is over
        assert parts.store.events("s")[-1 if n < MAX_FAILURES else -2][4] == f"could not start: no room on node-0 ({n})"
        if n < MAX_FAILURES:
            parts.applier.note_waiting([parts.store.get_job("s")], [], cluster, {}, 200.0 + n)
            assert parts.jobs.waiting["s"].reason == f"could not start: no room on node-0 ({n})"
    rec = parts.store.get_job("s")
    assert rec.state == JobState.FAILED and "s" not in parts.jobs.live and "s" not in parts.runtime.jobs
    assert parts.store.events("s")[-1][4] == f"job failed: {MAX_FAILURES} starts failed: no room on node-0 (3)"


def test_a_start_records_the_job_running_and_a_new_round_forgets_last_rounds_failed_start(parts):
    parts.add("s")
    cluster = parts.capacity.view({})
    parts.runtime.fail_start = "no room"
    parts.applier.apply(parts.store.get_job("s"), (1, 1), PLACED, 200.0, cluster)
    parts.applier.new_round()  # the failed start was last round's: this round's reason is the view's
    view = parts.view("s", now=201.0)
    parts.applier.note_waiting([parts.store.get_job("s")], [view], cluster, {}, 201.0)
    assert parts.jobs.waiting["s"].reason.startswith("queued behind 0 job(s)")
    parts.applier.apply(parts.store.get_job("s"), (1, 1), PLACED, 202.0, cluster)
    rec = parts.store.get_job("s")
    assert rec.state == JobState.RUNNING and rec.desired == (1, 1)
    assert parts.jobs.live["s"].asked == (1, 1) and "s" not in parts.jobs.waiting
    assert parts.store.events("s")[-1][4] == "started with 1 PS x 1 worker"
    parts.applier.note_waiting([rec], [view], cluster, {}, 203.0)  # a job running here gets no reason to wait
    assert "s" not in parts.jobs.waiting


def test_a_job_backing_off_after_a_failure_waits_for_that_not_for_room(parts):
    parts.add("b")
    parts.run("b", (1, 1))
    parts.jobs.stopped_by_failure("b", parts.jobs.live["b"], 200.0, "JobFailedError: the node is gone")
    cluster = parts.capacity.view({})
    parts.applier.note_waiting([parts.store.get_job("b")], [], cluster, {}, 205.0)
    assert parts.jobs.waiting["b"].reason == f"starts again from its latest checkpoint in 10 s (1/{MAX_FAILURES})"


def test_submit_waits_for_a_round_and_a_job_that_can_never_fit_is_refused_with_no_folder(parts, tmp_path):
    rec = parts.commands.submit(parse_spec(SPEC.format(name="ok")))
    assert rec.state == JobState.PENDING and parts.wake.is_set()
    assert parts.jobs.waiting["ok"].reason == "submitted: waiting for the next scheduling round"
    parts.capacity.nodes = {"node-0": (0.75, 0.0)}
    with pytest.raises(UnschedulableError, match="can never run on this cluster"):
        parts.commands.submit(parse_spec(SPEC.format(name="big")))
    assert "big" not in parts.jobs.waiting and not (tmp_path / "jobs.d" / "big").exists()
    with pytest.raises(KeyError):
        parts.store.get_job("big")


def test_new_limits_ask_for_a_full_round_and_retry_and_delete_wait_for_a_stopping_run(parts):
    parts.commands.submit(parse_spec(SPEC.format(name="j")))
    parts.commands.set_limits("j", LimitsPatch.model_validate({"workers": {"max": 2}}))
    assert parts.commands.reshape.is_set() and parts.store.get_job("j").spec.workers.max == 2
    parts.run("j", (1, 1))
    with pytest.raises(JobInUse, match="cancel it before deleting it"):
        parts.commands.delete("j")
    parts.commands.cancel("j")
    with pytest.raises(JobInUse, match="still stopping"):
        parts.commands.retry("j")
    with pytest.raises(JobInUse, match="still stopping"):
        parts.commands.delete("j")
    parts.jobs.drain(threading.RLock())
    assert parts.commands.delete("j").state == JobState.CANCELLED
    assert "j" not in parts.jobs.ended  # forgotten with the job
    with pytest.raises(KeyError):
        parts.store.get_job("j")
