import numpy as np
import pytest

from elasticps.runtime.reports import GradientSample, noise_scale


def test_noise_scale_recovers_a_known_value():
    # Per-sample gradients g_i = G + noise with covariance sigma^2 I in d dims:
    # |G|^2 = d * 0.01, tr(Sigma) = d * sigma^2 = d, so B_noise = 100.
    rng = np.random.default_rng(0)
    d, big, small = 200, 256, 32
    true_g = np.full(d, 0.1)
    samples = []
    for _ in range(400):
        per_sample = true_g + rng.standard_normal((big, d))
        g_small = per_sample[:small].mean(axis=0)
        g_big = per_sample.mean(axis=0)
        samples.append(GradientSample(small, float(g_small @ g_small), big, float(g_big @ g_big)))
    assert noise_scale(samples) == pytest.approx(100.0, rel=0.15)


def test_noise_scale_is_none_when_it_cannot_tell():
    assert noise_scale([]) is None
    assert noise_scale([GradientSample(8, 1.0, 8, 1.0)]) is None  # equal batches
    assert noise_scale([GradientSample(4, float("nan"), 8, 1.0)]) is None
