"""``elasticps``: the runtime's sync PS, timed as a user runs it (default config).

Throughput: a P x W job on one node (or pinned over several nodes), the
steps after a warm-up timed by the driver; ``ps_table``: the workload's loop
whose embedding table the PS holds (a user's loop with
``elasticps.torch.Embedding``) in place of its TrainingProgram, where every
worker pulls and pushes the whole table. Resize: a 1 x 2 job training in a
thread, rescaled live to 1 x 4 and back (new workers start in the background;
the switch happens at a step boundary), every step's time and samples kept,
and the CPU time the new workers used until the switch.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

from elasticps.bench.peak_rss import peak_mib
from elasticps.bench.peers.common import RunResult, comm_share, most
from elasticps.bench.peers.resize import Timeline
from elasticps.bench.peers.workloads import Workload
from elasticps.bench.proc_stat import cpu_seconds
from elasticps.runtime import JobConfig, JobController, TaskResources
from elasticps.runtime.reports import WindowReport


def _config(threads: int, standby: int = 0, import_at_idle: bool = True) -> JobConfig:
    return JobConfig(
        standby_workers=standby,
        import_at_idle=import_at_idle,
        report_interval_s=1e-6,  # a window per step: every step's loss and times
        ps_resources=TaskResources(cpu=1.0),
        worker_resources=TaskResources(cpu=1.0),
        ps_threads=threads,
        worker_threads=threads,
        placement_timeout_s=300.0,
    )


def run(
    workload: Workload,
    workers: int,
    steps: int,
    warmup: int = 2,
    threads: int = 1,
    num_ps: int = 1,
    placement: dict[str, str] | None = None,
    ps_table: bool = False,
) -> RunResult:
    loop = workload.ps_table_loop() if ps_table else None
    if ps_table and loop is None:
        raise ValueError(f"workload {workload.name!r} has no table for the PS to hold")
    job = JobController(loop or workload.program(), _config(threads), num_ps, workers, placement=placement)
    program = job.program
    try:
        job.run(max_steps=warmup)
        t0 = time.perf_counter()
        job.run(max_steps=steps)
        elapsed = time.perf_counter() - t0
        windows = job.report().windows
        # the tasks run on this machine (one node, or the nodes of a ray.cluster_utils.Cluster)
        worker_peak = most([peak_mib(t.pid) for t in job.workers])
        ps_peak = most([peak_mib(t.pid) for t in job.ps])
    finally:
        job.shutdown()
    timed = [w for w in windows if w.first_step >= warmup]
    compute = statistics.median(w.mean_step_times.compute_s + w.mean_step_times.update_s for w in timed)
    step_s = elapsed / steps
    parts = {
        k: statistics.median(getattr(w.mean_step_times, k) for w in timed)
        for k in ("compute_s", "pull_s", "push_s", "update_s", "wait_s")
    }
    return RunResult(
        "elasticps",
        steps * program.batch_size / elapsed,
        comm_share(step_s, compute),
        [w.loss for w in windows],
        {"num_ps": num_ps, "ps_table": ps_table, "step_s": step_s, **parts},
        worker_peak_mib=worker_peak,
        ps_peak_mib=ps_peak,
    )


def resize(
    workload: Workload,
    sizes: tuple[int, ...],
    hold_s: float,
    threads: int = 1,
    say: Callable[[str], None] = lambda _: None,
    standby: int = 0,
    import_at_idle: bool = True,
) -> Timeline:
    """Train 1 x ``sizes[0]`` for ``hold_s``; then rescale live to each later size
    in turn, training ``hold_s`` after each switch. ``standby``: the job's
    standby workers (``elasticps_standby``), started and waited for before
    the first timed step; their start is kept in ``before_window``.
    ``import_at_idle`` off (``elasticps_import_now``): new workers import at
    normal priority (``JobConfig.import_at_idle``), the control for that rule."""
    if standby and not import_at_idle:
        raise ValueError("standby and import_at_idle=False: one control at a time")
    name = "elasticps_standby" if standby else "elasticps" if import_at_idle else "elasticps_import_now"
    how = "live rescale (JobController.rescale): new workers start while it trains"
    if standby:
        how = f"live rescale taking {standby} standby workers started before the timed window"
    elif not import_at_idle:
        how += ", importing at normal priority (import_at_idle off)"
    timeline = Timeline(name, how=how)

    def on_window(w: WindowReport) -> None:
        timeline.add(time.monotonic(), w.samples, w.num_workers, w.loss)

    program = workload.program()
    job = JobController(program, _config(threads, standby, import_at_idle), 1, sizes[0], on_window=on_window)
    job.start()
    if standby:
        timeline.before_window = _standbys_started(job, standby)
    thread = job.run_in_thread()
    try:
        for workers in sizes[1:]:
            _sleep_training(job, hold_s)
            timeline.mark(time.monotonic(), workers)
            say(f"{name}: rescale to 1 x {workers}")
            running = {t.pid for t in job.ps + job.workers}
            parked = {t.pid: cpu_seconds(t.pid) or 0.0 for t in job.standbys()}  # their start was paid before
            job.wait_rescale(job.rescale(1, workers), timeout_s=600)
            started = [t.pid for t in job.ps + job.workers if t.pid not in running]
            if (
                started
            ):  # processes of this machine (the run's one node): from their start (or the request) to the switch
                timeline.started(sum((cpu_seconds(pid) or 0.0) - parked.get(pid, 0.0) for pid in started))
        _sleep_training(job, hold_s)
    finally:
        job.stop()
        thread.join()
        job.shutdown()
    if job.error:
        raise RuntimeError(f"elasticps resize run failed: {job.error}")
    return timeline


def _standbys_started(job: JobController, n: int, timeout_s: float = 600.0) -> dict[str, float]:
    """Wait until the job's ``n`` standby workers run (no step runs meanwhile); what their start cost."""
    t0 = time.monotonic()
    while len(job.standbys()) < n:
        if time.monotonic() - t0 > timeout_s:
            raise RuntimeError(f"{n} standby workers did not start within {timeout_s:.0f} s")
        time.sleep(0.05)
    cpu = [cpu_seconds(t.pid) for t in job.standbys()]
    return {
        "standby_workers": n,
        "standby_start_s": time.monotonic() - t0,  # wall time from the job's start until they all ran
        "standby_start_cpu_s": sum(c for c in cpu if c is not None),  # their processes' CPU, all together
    }


def _sleep_training(job: JobController, seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if job.error:
            raise RuntimeError(f"elasticps job failed: {job.error}")
        time.sleep(0.05)
