"""Goodput: throughput times statistical efficiency (after Pollux).

With gradient noise scale B_noise (measured by the runtime, see
:mod:`elasticps.runtime.reports`), one step at batch M makes as much progress as

    E(M) = (B_noise + M0) / (B_noise + M)

steps at the reference batch M0, per sample. Goodput = samples/s x E(M).
"""

from __future__ import annotations

from collections.abc import Callable


def statistical_efficiency(batch: float, noise_scale: float | None, reference_batch: float) -> float:
    """E(M) relative to ``reference_batch`` (1.0 when the noise scale is unknown)."""
    if noise_scale is None or noise_scale <= 0:
        return 1.0
    return (noise_scale + reference_batch) / (noise_scale + batch)


def batch_candidates(base: int, top: int | None) -> tuple[int, ...]:
    """The global batches an adaptive job may train at: ``base`` doubled while at
    most ``top``, and ``top``; none when the batch is fixed (``top`` unset or
    not above ``base``): what :attr:`JobView.batch_sizes` takes."""
    if not top or top <= base:
        return ()
    out = [base]
    while out[-1] * 2 < top:
        out.append(out[-1] * 2)
    out.append(top)
    return tuple(out)


def best_batch(
    samples_per_s: Callable[[float], float],
    noise_scale: float | None,
    reference_batch: float,
    candidates: list[float],
) -> tuple[float, float]:
    """The batch size among ``candidates`` with the highest goodput, and that goodput
    (the adaptive batch size option; ``samples_per_s(M)`` at a fixed shape)."""
    best = max(candidates, key=lambda m: samples_per_s(m) * statistical_efficiency(m, noise_scale, reference_batch))
    return best, samples_per_s(best) * statistical_efficiency(best, noise_scale, reference_batch)
