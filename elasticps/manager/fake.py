"""An in-memory :class:`JobRuntime` and :class:`CapacitySource` for tests.

Nothing runs: a :class:`FakeJob` advances a fixed number of steps each time
it is polled, at a speed given by a function of its shape, and rescales
apply at its next poll. Faults are injected explicitly (``fail_start``,
``fail_rescale``, ``crash``, ``lose_worker``, ``lose_driver``), so a test of
the manager's logic runs in milliseconds and says which fault it exercises.
The real engine is :mod:`elasticps.manager.ray_runtime`; the end-to-end tests
run that one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from elasticps.errors import JobFailedError, PlacementError, ProgramError
from elasticps.manager.runtime import JobStatus, Launch, ProgramInfo
from elasticps.manager.spec import JobSpec
from elasticps.placement import cross_share
from elasticps.runtime import JobReport, WindowReport
from elasticps.runtime.reports import RescaleRecord, StepTimes
from elasticps.sched import ClusterView, NodeView, Resources


def linear_speed(p: int, w: int) -> float:
    """Samples/s of a job whose workers scale perfectly while PS keep up."""
    return 100.0 * min(w, 2 * p)


@dataclass
class FakeJob:
    launch: Launch
    info: ProgramInfo
    speed: Callable[[int, int], float] = linear_speed
    steps_per_poll: int = 10
    max_windows: int = 2000  # the newest windows kept, as the real controller keeps its newest
    start_polls: int = 1  # polls spent starting (state "created") before the first step
    fail_rescale: str | None = None  # the next rescale raises PlacementError with this text
    state: str = "created"
    step: int = 0
    shape: tuple[int, int] = (0, 0)
    asked: tuple[int, int, dict] | None = None
    windows: list[WindowReport] = field(default_factory=list)
    events: list[str] = field(default_factory=list)
    error: str | None = None
    stopping: bool = False
    closed: bool = False
    lost: str | None = None
    polls: int = 0
    batch: int = 0  # the global batch (0: the program's)
    pause_s: float = 0.02  # what each rescale reports as the time training stood still
    launch_s: float = 0.0  # what each rescale that starts tasks reports as their start-up time
    rescales: list[RescaleRecord] = field(default_factory=list)
    noise_scale: float | None = None  # reported as measured
    speed_at: Callable[[int, int, int], float] | None = None  # samples/s at (p, w, batch), if the batch matters
    #: the speed is divided by 1 + cross_cost x the share of PS traffic that crosses nodes as placed
    cross_cost: float = 0.0
    placed: dict[str, str] = field(default_factory=dict)  # where the tasks run (the launch's, then each rescale's)

    # -- faults
    def crash(self, error: str = "RuntimeError: injected") -> None:
        self.state, self.error = "failed", error
        self.events.append(f"step {self.step}: failed: {error}")

    def lose_worker(self) -> None:
        self.events.append(f"step {self.step}: 1 worker(s) died; continuing with {self.shape[1] - 1}")

    def lose_driver(self, why: str = "the job's driver process is gone") -> None:
        self.lost = why

    # -- JobHandle
    def poll(self, after_step: int, after_event: int, after_rescale: int = 0) -> JobStatus:
        if self.lost:
            raise JobFailedError(self.lost)
        self.polls += 1
        if self.state == "created" and self.polls > self.start_polls:
            self.state, self.shape = "running", self.launch.shape
        if self.state == "running":
            self._advance()
        total = self.info.epochs * self.info.samples_per_epoch
        placement = self._placement()
        return JobStatus(
            state=self.state,
            ended=self.state in ("finished", "failed", "stopped"),
            step=self.step,
            epoch=self.step * self.info.batch_size // max(1, self.info.samples_per_epoch),
            num_ps=self.shape[0],
            num_workers=self.shape[1],
            placement=placement,
            held=placement if self.state != "created" else dict(self.launch.placement),
            windows=[w for w in self.windows if w.last_step > after_step],
            events=self.events[after_event:],
            events_total=len(self.events),
            remaining_samples=max(0, total - self.step * self.info.batch_size),
            samples_per_epoch=self.info.samples_per_epoch,
            error=self.error,
            batch_size=self.batch or self.info.batch_size,
            noise_scale=self.noise_scale,
            rescales=self.rescales[after_rescale:],
            rescales_total=len(self.rescales),
        )

    def _advance(self) -> None:
        if self.asked is not None:
            p, w, _ = self.asked
            self.events.append(f"step {self.step}: rescaled {self.shape[0]}x{self.shape[1]} -> {p}x{w}")
            new = max(0, p - self.shape[0]) + max(0, w - self.shape[1])
            self.rescales.append(
                RescaleRecord(
                    len(self.rescales) + 1, self.shape, (p, w), self.step, self.pause_s,
                    self.launch_s if new else 0.0, True, new_tasks=new,
                )
            )  # fmt: skip
            self.shape, self.placed, self.asked = (p, w), self.asked[2], None
        if self.stopping:
            self.state = "stopped"
            return
        total = self.info.epochs * self.info.samples_per_epoch
        steps = min(self.steps_per_poll, -(-(total - self.step * self.info.batch_size) // self.info.batch_size))
        if steps > 0:
            batch = self.batch or self.info.batch_size
            speed = self.speed_at(*self.shape, batch) if self.speed_at else self.speed(*self.shape)
            placement = self._placement()
            p, w = self.shape
            cross = cross_share(placement, 1.0, w) if p and w else None
            speed /= 1.0 + self.cross_cost * (cross or 0.0)
            samples = steps * self.info.batch_size  # progress counted at the program's batch
            elapsed = samples / speed
            window = WindowReport(
                self.step, self.step + steps - 1, steps, samples, elapsed, speed, 1.0, StepTimes(), *self.shape,
                batch_size=self.batch or self.info.batch_size, nodes=len(set(placement.values())), cross=cross,
            )  # fmt: skip
            self.windows.append(window)
            del self.windows[: -self.max_windows]
            self.step += steps
        if self.step * self.info.batch_size >= total:
            self.state = "finished"

    def _placement(self) -> dict[str, str]:
        placed = self.placed or self.launch.placement
        tasks = {f"ps-{i}" for i in range(self.shape[0])} | {f"worker-{i}" for i in range(self.shape[1])}
        if set(placed) == tasks:
            return dict(placed)
        node = next(iter(self.launch.placement.values()), "node-0")
        out = {f"ps-{i}": node for i in range(self.shape[0])}
        out.update({f"worker-{i}": node for i in range(self.shape[1])})
        return out

    def report(self) -> JobReport:
        return JobReport(
            name=self.launch.name, state=self.state, mode="sync", step=self.step, epoch=0, cursor=0,
            epochs=self.info.epochs, samples_seen=self.step * self.info.batch_size, num_ps=self.shape[0],
            num_workers=self.shape[1], target_shape=self.shape, placement=self._placement(),
            windows=list(self.windows), events=list(self.events), events_total=len(self.events), error=self.error,
        )  # fmt: skip

    def rescale(self, num_ps: int, num_workers: int, placement: dict[str, str]) -> None:
        if self.fail_rescale:
            why, self.fail_rescale = self.fail_rescale, None
            raise PlacementError(why)
        self.asked = (num_ps, num_workers, dict(placement))

    def set_batch_size(self, batch: int) -> None:
        self.batch = batch
        self.events.append(f"step {self.step}: global batch -> {batch}")

    def stop(self) -> None:
        self.stopping = True

    def close(self) -> None:
        self.closed = True


@dataclass
class FakeRuntime:
    """Programs by reference; any other reference fails to resolve, as an import would."""

    programs: dict[str, ProgramInfo] = field(
        default_factory=lambda: {"elasticps.examples.digits:program": ProgramInfo("digits", 64, 3, 1437)}
    )
    speed: Callable[[int, int], float] = linear_speed
    speed_at: Callable[[int, int, int], float] | None = None  # see FakeJob.speed_at
    cross_cost: float = 0.0  # see FakeJob.cross_cost
    noise_scale: float | None = None  # what every job reports as measured
    launch_s: float = 0.0  # see FakeJob.launch_s
    fail_start: str | None = None  # the next start raises JobFailedError with this text
    #: a job checkpoints every this many steps: a start after the first resumes from the last
    #: checkpoint the previous start reached, as the real runtime's restart does
    checkpoint_every: int = 1
    jobs: dict[str, list[FakeJob]] = field(default_factory=dict)  # every start of every job, in order

    def describe(self, spec: JobSpec, code_dir: str | None = None) -> ProgramInfo:
        try:
            return self.programs[spec.program]
        except KeyError:
            raise ProgramError(f"cannot import program {spec.program!r}") from None

    def start(self, launch: Launch) -> FakeJob:
        if self.fail_start:
            why, self.fail_start = self.fail_start, None
            raise JobFailedError(why)
        job = FakeJob(
            launch,
            self.programs[launch.program],
            self.speed,
            noise_scale=self.noise_scale,
            speed_at=self.speed_at,
            cross_cost=self.cross_cost,
            launch_s=self.launch_s,
        )
        starts = self.jobs.setdefault(launch.name, [])
        if starts:
            job.step = starts[-1].step // self.checkpoint_every * self.checkpoint_every
        starts.append(job)
        return job

    def latest(self, name: str) -> FakeJob:
        return self.jobs[name][-1]


@dataclass
class FakeCapacity:
    """Nodes as ``{name: (CPU capacity, CPU used by other tenants)}``."""

    nodes: dict[str, tuple[float, float]] = field(default_factory=lambda: {"node-0": (8.0, 0.0)})

    def view(self, ours: dict[str, Resources]) -> ClusterView:
        return ClusterView(
            tuple(NodeView(n, Resources(cpu=c), Resources(cpu=o)) for n, (c, o) in sorted(self.nodes.items()))
        )

    def hostnames(self) -> dict[str, str]:
        return {n: n for n in self.nodes}
