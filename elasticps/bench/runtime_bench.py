"""``elasticps bench runtime``: the runtime's overheads, measured.

Workloads (a user's, not picked to flatter a ratio):
- throughput: the synthetic 10.0M-parameter MLP (40 MB of float32, ResNet-18
  sized), Adam, global batch 256, one torch thread per worker, against the same
  model, batch, data and thread count trained in one plain PyTorch process;
- push+pull (:mod:`elasticps.bench.pushpull_bench`): 40 MB each way through
  a step's data path on one node against one 40 MB ``memcpy``, every byte
  read by the receiver, through shared memory (read in place, as the runtime
  reads them, and copied) and through Ray's object store, driven by Ray calls
  and through a Ray Compiled Graph;
- rescale pauses: the same 10M model with Adam (parameters plus two moment
  vectors move when PS shards change);
- the user-loop path: the same model, data, batch and optimizer written as a
  user's own loop (``elasticps.torch``), at 1x1, and its add/remove-worker pauses;
- exactness: digits with Adam through the rescales 1x1 -> 2x3 -> 3x2 -> 1x2;
- task start: the demo's digits CNN, rescaled 1x1 -> 1x4 and back, the time
  its three new workers take to start (``RescaleRecord.launch_s``: the job
  trains on meanwhile), with the dataset shared from the controller and with
  each worker building its own (``JobConfig.share_dataset``).
"""

from __future__ import annotations

import contextlib
import functools
import statistics
import time
from collections.abc import Iterator
from typing import Any

from elasticps.bench.pushpull_bench import PAYLOAD_FLOATS, pushpull_rounds
from elasticps.examples import digits, synthetic
from elasticps.raycluster import ensure_ray
from elasticps.runtime import JobConfig, JobController, TaskResources, relative_error, train_single_process

MB = 1e6


def _bench_config(**kw: Any) -> JobConfig:
    return JobConfig(
        report_interval_s=3600.0,
        ps_resources=TaskResources(cpu=1.0),
        worker_resources=TaskResources(cpu=1.0),
        placement_timeout_s=300.0,
        **kw,
    )


def throughput(steps: int, batch: int) -> dict[str, float]:
    program = synthetic.program(batch_size=batch, epochs=100, num_samples=batch * (steps + 4))
    ref = train_single_process(program, max_steps=steps + 2, threads=1, skip_steps=2)
    job = JobController(program, _bench_config(), 1, 1)
    job.run(max_steps=2)  # warm-up
    t0 = time.perf_counter()
    job.run(max_steps=steps)
    elapsed = time.perf_counter() - t0
    job.shutdown()
    return {"single_process_samples_per_s": ref.samples_per_s, "ps_1x1_samples_per_s": steps * batch / elapsed}


def synthetic_loop(batch_size: int, num_samples: int) -> None:
    """The throughput workload written as a user's own loop: the same model,
    data, batch and (fused) Adam as the synthetic program."""
    import elasticps.torch as ept

    program = synthetic.program(batch_size=batch_size, epochs=100, num_samples=num_samples)
    model = program.build_model()
    opt = program.make_optimizer([p for p in model.parameters() if p.requires_grad])
    model, opt = ept.prepare(model, opt)
    loader = ept.DataLoader(program.build_dataset(), batch_size=batch_size, shuffle=True, seed=program.seed)
    for _ in ept.epochs(program.epochs):
        for x, y in loader:
            opt.zero_grad()
            program.loss(model(x), y).backward()
            opt.step()


def user_loop(steps: int, batch: int) -> dict[str, Any]:
    """The user-loop path at 1x1 (samples/s, as ``throughput``), and its pauses to add and remove a worker."""
    loop = functools.partial(synthetic_loop, batch, batch * (steps + 4))
    job = JobController(loop, _bench_config(), 1, 1)
    job.run(max_steps=2)  # warm-up
    t0 = time.perf_counter()
    job.run(max_steps=steps)
    elapsed = time.perf_counter() - t0
    job.shutdown()
    pauses = {}
    with _training(loop, _bench_config()) as job:
        for name, shape in (("add_worker", (1, 2)), ("remove_worker", (1, 1))):
            pauses[name] = job.wait_rescale(job.rescale(*shape), timeout_s=600).pause_s
    return {"user_loop_samples_per_s": steps * batch / elapsed, "user_loop_rescale_pause_s": pauses}


@contextlib.contextmanager
def _training(program: Any, config: JobConfig) -> Iterator[JobController]:
    """A 1x1 job of ``program`` training in a thread while the block rescales it; stopped and shut down after."""
    job = JobController(program, config, 1, 1)
    job.start()
    thread = job.run_in_thread()
    try:
        yield job
    finally:
        job.stop()
        thread.join()
        job.shutdown()


def rescale_pauses(batch: int) -> dict[str, float]:
    program = synthetic.program(batch_size=batch, epochs=1000, num_samples=batch * 8)
    pauses = {}
    with _training(program, _bench_config()) as job:
        for name, shape in (
            ("add_worker", (1, 2)),
            ("remove_worker", (1, 1)),
            ("add_ps", (2, 1)),
            ("remove_ps", (1, 1)),
        ):
            rec = job.wait_rescale(job.rescale(*shape), timeout_s=600)
            pauses[name] = rec.pause_s
    return pauses


def task_starts(repeats: int) -> dict[str, float]:
    """Median seconds for three new workers of the demo's CNN to start, the
    dataset shared from the controller and built by each worker."""
    program = digits.program(epochs=1000, model="cnn", batch_size=128)
    out = {}
    for name, share in (("shared_dataset", True), ("own_dataset", False)):
        times = []
        with _training(program, _bench_config(share_dataset=share)) as job:
            for _ in range(repeats):
                times.append(job.wait_rescale(job.rescale(1, 4), timeout_s=600).launch_s)
                job.wait_rescale(job.rescale(1, 1), timeout_s=600)
        out[name] = statistics.median(times)
    return out


def sync_exactness(steps_per_shape: int) -> float:
    program = digits.program(epochs=1000, optimizer="adam")
    job = JobController(program, _bench_config(), 1, 1)
    job.run(max_steps=steps_per_shape)
    for shape in ((2, 3), (3, 2), (1, 2)):
        job.rescale(*shape)
        job.prepare()  # start the new tasks without training, so each shape runs a known number of steps
        job.run(max_steps=steps_per_shape)
    ref = train_single_process(program, max_steps=job.step)
    err = relative_error(job.parameters(), ref.params)
    job.shutdown()
    return err


def run(quick: bool = False) -> dict[str, Any]:
    ensure_ray(num_cpus=8)
    repeats = 5 if quick else 20
    batch = 256
    steps = 5 if quick else 20
    out: dict[str, Any] = {
        "workload": {
            "model": "synthetic MLP 512-2048-2048-2048-256, 10.0M float32 parameters (40 MB), Adam",
            "global_batch": batch,
            "threads_per_process": 1,
            "steps_timed": steps,
            "payload_MB": PAYLOAD_FLOATS * 4 / MB,
        }
    }
    out.update(throughput(steps, batch))
    out["ps_1x1_over_single_process"] = out["ps_1x1_samples_per_s"] / out["single_process_samples_per_s"]
    out.update(user_loop(steps, batch))
    out["user_loop_over_ps_1x1"] = out["user_loop_samples_per_s"] / out["ps_1x1_samples_per_s"]
    out.update(pushpull_rounds(repeats))
    out["rescale_pause_s"] = rescale_pauses(batch)
    out["three_workers_start_s"] = task_starts(2 if quick else 5)
    out["sync_exactness_max_rel_err"] = sync_exactness(3 if quick else 10)
    out["goals"] = {
        "ps_1x1_over_single_process>=0.85": out["ps_1x1_over_single_process"] >= 0.85,
        "pushpull_over_memcpy>=0.25": out["pushpull_over_memcpy"] >= 0.25,
        "pushpull_over_memcpy>=0.6": out["pushpull_over_memcpy"] >= 0.6,  # the runtime beside its peers' goal
        "user_loop_over_ps_1x1>=0.95": out["user_loop_over_ps_1x1"] >= 0.95,  # a user's own loop: within 5%
        "every_rescale_pause<1s": all(v < 1.0 for v in out["rescale_pause_s"].values()),
        "sync_exactness<=1e-5": out["sync_exactness_max_rel_err"] <= 1e-5,
    }
    return out
