"""``elasticps demo``: one digits job rescaled live, 1x1 -> 2x3 -> 1x2.

New tasks start in the background while the job trains (several seconds on a
small machine), so the schedule is in epochs trained at each shape after the
switch, and the job is stopped once the last shape has trained its epochs.
"""

from __future__ import annotations

import tempfile
import time

from elasticps.examples import digits
from elasticps.raycluster import ensure_ray
from elasticps.runtime import EpochReport, JobConfig, JobController, TaskResources, WindowReport
from elasticps.tables import shape_text

#: (num_ps, num_workers, epochs to train at that shape once switched)
FIRST_EPOCHS = 3
SCHEDULE = ((2, 3, 6), (1, 2, 6))


def _wait_epochs(job: JobController, epochs: int) -> None:
    until = job.report().epoch + epochs
    while job.report().epoch < until and job.state == "running":
        time.sleep(0.1)


def run(epochs: int = 30, num_cpus: int = 8) -> dict:
    """``epochs`` is a floor: the job trains at least that long, and longer when
    starting the new tasks takes a while."""
    ensure_ray(num_cpus=num_cpus)
    program = digits.program(epochs=10_000)
    print(f"job {program.name}: scikit-learn digits, global batch {program.batch_size}, sync mode")

    def on_window(w: WindowReport) -> None:
        t = w.mean_step_times
        print(
            f"  step {w.last_step:5d}  P={w.num_ps} W={w.num_workers}  {w.samples_per_s:7.0f} samples/s  "
            f"loss {w.loss:.4f}  step ms: compute {t.compute_s * 1e3:.1f} pull {t.pull_s * 1e3:.1f} "
            f"push {t.push_s * 1e3:.1f} update {t.update_s * 1e3:.1f} wait {t.wait_s * 1e3:.1f}"
        )

    def on_epoch(e: EpochReport) -> None:
        print(f"epoch {e.epoch:2d} done at step {e.step}: P={e.num_ps} W={e.num_workers}, test accuracy {e.metric:.4f}")

    with tempfile.TemporaryDirectory(prefix="elasticps-demo-") as ckpt:
        config = JobConfig(
            report_interval_s=2.0, checkpoint_dir=ckpt, ps_resources=TaskResources(cpu=0.5), checkpoint_every_steps=200
        )
        job = JobController(program, config, num_ps=1, num_workers=1, on_window=on_window, on_epoch=on_epoch)
        t0 = time.monotonic()
        job.start()
        print(f"started 1 PS x 1 worker in {time.monotonic() - t0:.1f} s: {job.placement()}")
        thread = job.run_in_thread()
        _wait_epochs(job, FIRST_EPOCHS)
        for num_ps, num_workers, train_epochs in SCHEDULE:
            request = job.rescale(num_ps, num_workers)
            print(f">> rescale to {shape_text(num_ps, num_workers)} requested at step {job.step}")
            rec = job.wait_rescale(request, timeout_s=300)
            print(
                f">> now {shape_text(*rec.to_shape)} from step {rec.at_step}: "
                f"paused {rec.pause_s * 1e3:.0f} ms (new tasks started in the background in {rec.launch_s:.1f} s)"
            )
            _wait_epochs(job, train_epochs)
        _wait_epochs(job, max(0, epochs - job.report().epoch))
        job.stop()
        thread.join()
        report = job.report()
        job.shutdown()
    if report.state != "stopped":
        raise SystemExit(f"demo job ended {report.state}: {report.error}")
    final = report.epoch_reports[-1]
    print(
        f"trained {report.step} steps in {time.monotonic() - t0:.1f} s; final test accuracy {final.metric:.4f}; "
        f"rescale pauses {[round(r.pause_s * 1e3) for r in report.rescales if r.ok]} ms"
    )
    return report.to_dict()
