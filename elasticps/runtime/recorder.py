"""What a job records as it trains, for its reports: windows of steps (speed,
loss, where a step's time went, PS traffic on a node and between nodes),
the gradient samples the noise scale is estimated from, bytes between each
pair of nodes, and its events. The controller feeds it each step's statistics
(the workers' and the shards' dicts) and reads it back into a
:class:`~elasticps.runtime.reports.JobReport`; it holds no task and calls no Ray.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from elasticps.runtime.reports import GradientSample, StepTimes, WindowReport, noise_scale, pair_key

log = logging.getLogger("elasticps.runtime")

MAX_WINDOWS = 2000
MAX_EVENTS = 500
MAX_GRADIENT_SAMPLES = 1000


@dataclass
class _Window:
    start: float
    first_step: int
    end: float = 0.0  # when its last step ended
    steps: int = 0
    samples: int = 0
    loss_sum: float = 0.0
    times: StepTimes = field(default_factory=StepTimes)
    nodes: set[str] = field(default_factory=set)  # where the window's tasks ran
    local_bytes: int = 0  # PS traffic between tasks on one node
    cross_bytes: int = 0  # PS traffic between nodes


@dataclass(frozen=True)
class Shape:
    """The job's shape and batch when a window closes (what its figures were measured at)."""

    num_ps: int
    num_workers: int
    batch_size: int


class StepRecorder:
    """One job's record. ``lock``: the controller's, so that a report reads the
    record and the controller's own state as of one moment."""

    def __init__(
        self,
        name: str,
        report_interval_s: float,
        lock: threading.RLock,
        on_window: Callable[[WindowReport], None] | None = None,
    ) -> None:
        self.name = name
        self.report_interval_s = report_interval_s
        self._lock = lock
        self._on_window = on_window
        self._window: _Window | None = None
        self.windows: list[WindowReport] = []
        self.events: list[str] = []
        self.events_total = 0  # events ever recorded (the list keeps the newest MAX_EVENTS)
        self.gradient_samples: list[GradientSample] = []
        self._epoch_samples: list[GradientSample] = []
        self.bytes: dict[str, int] = {}
        self.prefetched = 0

    def account(
        self,
        step: int,
        stats: list[dict[str, Any]],
        infos: list[dict[str, float]],
        ps_nodes: list[str],
        worker_nodes: list[str],
        wall_s: float,
        samples: int,
        big_batch: int,
        shape: Shape,
    ) -> None:
        """One step (sync) or one worker's gradient (async): ``stats`` the workers'
        dicts, ``infos`` the shards' answers; ``big_batch`` the global batch whose
        gradient norm the shards measured (0: none); ``shape`` the job's now. A
        window that has lasted the report interval closes."""
        n = len(stats)
        last_sent = max(s["sent_at"] for s in stats)
        times = StepTimes(
            compute_s=sum(s["compute_s"] for s in stats) / n,
            pull_s=sum(s["pull_s"] for s in stats) / n,
            push_s=max(0.0, max(i["received_at"] for i in infos) - last_sent),
            update_s=max(i["update_s"] for i in infos),
        )
        busy = max(s["compute_s"] + s["pull_s"] for s in stats) + times.push_s + times.update_s
        times.wait_s = max(0.0, wall_s - busy)
        loss = sum(s["loss_sum"] for s in stats)
        with self._lock:
            self.prefetched += sum(1 for s in stats if s.get("prefetched"))
            now = time.monotonic()
            if self._window is None:
                self._window = _Window(start=now - wall_s, first_step=step)
            win = self._window
            win.nodes.update((*ps_nodes, *worker_nodes))
            for s, worker in zip(stats, worker_nodes, strict=True):
                for ps, pulled, pushed in zip(ps_nodes, s["pull_bytes"], s["push_bytes"], strict=True):
                    down, up = pair_key(ps, worker), pair_key(worker, ps)
                    self.bytes[down] = self.bytes.get(down, 0) + pulled
                    self.bytes[up] = self.bytes.get(up, 0) + pushed
                    if ps == worker:
                        win.local_bytes += pulled + pushed
                    else:
                        win.cross_bytes += pulled + pushed
            # the workers whose small batch is the first's (shares may differ by a sample): an even average
            halves = [s for s in stats if s["batch_half"] > 0]
            halves = [s for s in halves if s["batch_half"] == halves[0]["batch_half"]]
            if halves and (not big_batch or all("grad_sqnorm" in i for i in infos)):
                sample = GradientSample(
                    batch_small=halves[0]["batch_half"],
                    sqnorm_small=sum(s["sqnorm_half"] for s in halves) / len(halves),
                    batch_big=big_batch or stats[0]["samples"],
                    sqnorm_big=sum(i["grad_sqnorm"] for i in infos) if big_batch else stats[0]["sqnorm_local"],
                )
                self.gradient_samples.append(sample)
                self._epoch_samples.append(sample)
                del self.gradient_samples[:-MAX_GRADIENT_SAMPLES]
            win.end = now
            win.steps += 1
            win.samples += samples
            win.loss_sum += loss
            win.times.add(times)
            if now - win.start >= self.report_interval_s:
                self.flush(shape)

    def flush(self, shape: Shape) -> None:
        """Close the open window (if it has steps) as measured at ``shape``; it
        ends with its last step (what came after, a failed step, is not in it)."""
        with self._lock:
            win = self._window
            if win is None or win.steps == 0:
                return
            elapsed = max(1e-9, win.end - win.start)
            report = WindowReport(
                first_step=win.first_step,
                last_step=win.first_step + win.steps - 1,
                steps=win.steps,
                samples=win.samples,
                elapsed_s=elapsed,
                samples_per_s=win.samples / elapsed,
                loss=win.loss_sum / max(1, win.samples),
                mean_step_times=win.times.scaled(1.0 / win.steps),
                num_ps=shape.num_ps,
                num_workers=shape.num_workers,
                batch_size=shape.batch_size,
                nodes=max(1, len(win.nodes)),
                cross=win.cross_bytes / moved if (moved := win.local_bytes + win.cross_bytes) else None,
            )
            self.windows.append(report)
            del self.windows[:-MAX_WINDOWS]
            self._window = None
        log.info(
            "%s step %d: %.0f samples/s, loss %.4f, P=%d W=%d",
            self.name,
            report.last_step,
            report.samples_per_s,
            report.loss,
            report.num_ps,
            report.num_workers,
        )
        if self._on_window:
            self._on_window(report)

    def end_epoch(self) -> tuple[float, float | None]:
        """The loss of the epoch's last window and the epoch's noise scale; the
        next epoch's gradient samples start afresh."""
        with self._lock:
            trained = [w for w in self.windows if w.samples]
            loss = trained[-1].loss if trained else float("nan")
            scale = noise_scale(self._epoch_samples)
            self._epoch_samples = []
        return loss, scale

    def event(self, step: int, text: str) -> None:
        line = f"step {step}: {text}"
        log.info("%s %s", self.name, line)
        with self._lock:
            self.events.append(line)
            self.events_total += 1
            del self.events[:-MAX_EVENTS]

    def cross_node_bytes(self) -> int:
        return sum(v for k, v in self.bytes.items() if _crosses(k))


def _crosses(key: str) -> bool:
    src, _, dst = key.partition("->")
    return src != dst
