"""Progress reports: what a running job tells the configuration manager.

Everything here is plain data (dataclasses of numbers and strings), so the
manager, the CLI and the tests read it without touching Ray.

Gradient noise scale (McCandlish et al., 2018). For mean gradients over
batches of size B_s < B_b with squared norms S_s and S_b:

    |G|^2  ~= (B_b * S_b - B_s * S_s) / (B_b - B_s)
    tr(S)  ~= (S_s - S_b) / (1 / B_s - 1 / B_b)
    B_noise = tr(S) / |G|^2          (ratio of the averages over many steps)
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class GradientSample:
    """Squared norms of the mean gradient at a small and a big batch size."""

    batch_small: int
    sqnorm_small: float
    batch_big: int
    sqnorm_big: float

    def estimates(self) -> tuple[float, float] | None:
        """(|G|^2, tr(Sigma)) from this sample, or None if it cannot tell."""
        bs, bb = self.batch_small, self.batch_big
        if not (0 < bs < bb) or not (math.isfinite(self.sqnorm_small) and math.isfinite(self.sqnorm_big)):
            return None
        g2 = (bb * self.sqnorm_big - bs * self.sqnorm_small) / (bb - bs)
        trace = (self.sqnorm_small - self.sqnorm_big) / (1.0 / bs - 1.0 / bb)
        return g2, trace


def noise_scale(samples: list[GradientSample]) -> float | None:
    """B_noise from the averages of the per-step estimates; None if undefined."""
    pairs = [e for e in (s.estimates() for s in samples) if e is not None]
    if not pairs:
        return None
    g2 = sum(p[0] for p in pairs) / len(pairs)
    trace = sum(p[1] for p in pairs) / len(pairs)
    if g2 <= 0:
        return None
    return trace / g2


@dataclass
class StepTimes:
    """Seconds spent in each phase of a step (means over workers for worker phases)."""

    compute_s: float = 0.0
    pull_s: float = 0.0
    push_s: float = 0.0
    update_s: float = 0.0
    wait_s: float = 0.0

    def add(self, other: StepTimes) -> None:
        for k in asdict(self):
            setattr(self, k, getattr(self, k) + getattr(other, k))

    def scaled(self, factor: float) -> StepTimes:
        return StepTimes(**{k: v * factor for k, v in asdict(self).items()})


@dataclass
class WindowReport:
    """Steps aggregated over one reporting interval."""

    first_step: int
    last_step: int
    steps: int
    samples: int
    elapsed_s: float
    samples_per_s: float
    loss: float
    mean_step_times: StepTimes
    num_ps: int
    num_workers: int
    batch_size: int = 0  # the global batch of these steps (0: not recorded)
    nodes: int = 1  # the nodes the window's tasks ran on
    cross: float | None = None  # the share of its PS traffic (bytes) that crossed nodes; None: none moved


@dataclass(frozen=True)
class MetricReport:
    """``elasticps.torch.report(**values)`` of a user's loop: at ``step`` (steps
    done), in ``epoch`` (None: outside the epochs). A value that is not a finite
    number crosses to the manager as None."""

    step: int
    epoch: int | None
    values: dict[str, float | None]


@dataclass
class EpochReport:
    epoch: int
    step: int
    samples_per_s: float
    elapsed_s: float
    loss: float
    metric: float | None
    noise_scale: float | None
    num_ps: int
    num_workers: int
    batch_size: int = 0  # the global batch at the epoch's end
    metrics: dict[str, float | None] = field(default_factory=dict)  # a user loop's last report of the epoch


@dataclass
class RescaleRecord:
    """One completed (or failed) change of the job's shape."""

    request_id: int
    from_shape: tuple[int, int]
    to_shape: tuple[int, int]
    at_step: int
    pause_s: float
    launch_s: float
    ok: bool
    error: str | None = None
    reason: str = "request"
    new_tasks: int = 0  # tasks it started (``launch_s`` is their start-up time if any)

    @property
    def tasks_start_s(self) -> float | None:
        """How long its new tasks took to start while the job trained on (None: it started none)."""
        return self.launch_s if self.new_tasks > 0 else None


@dataclass
class JobReport:
    """A snapshot of a job, as the manager reads it."""

    name: str
    state: str
    mode: str
    step: int
    epoch: int
    cursor: int
    epochs: int
    samples_seen: int
    num_ps: int
    num_workers: int
    target_shape: tuple[int, int]
    placement: dict[str, str]
    windows: list[WindowReport] = field(default_factory=list)
    epoch_reports: list[EpochReport] = field(default_factory=list)
    rescales: list[RescaleRecord] = field(default_factory=list)
    events: list[str] = field(default_factory=list)
    events_total: int = 0  # events ever recorded; ``events`` holds the newest of them
    gradient_samples: list[GradientSample] = field(default_factory=list)
    bytes_between_nodes: dict[str, int] = field(default_factory=dict)
    cross_node_bytes: int = 0
    error: str | None = None
    batch_size: int = 0  # the global batch now
    prefetched_batches: int = 0  # worker batches that had been read in the background before their step
    metrics: list[MetricReport] = field(default_factory=list)  # a user loop's reports

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def pair_key(src: str, dst: str) -> str:
    """A JSON-friendly key for the directed node pair ``src -> dst``."""
    return f"{src}->{dst}"
