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


def test_an_errors_text_in_one_line_for_tables_and_events():
    from elasticps.errors import error_text, one_line

    trace = (
        "UserCodeError: step 5 failed in user code: TrainingFunctionError: Traceback (most recent call last):\n"
        '  File "/home/me/proj/train.py", line 40, in main\n    for x, y in loader:\n'
        "elasticps.errors.ProgramError: the loop over the DataLoader ended before epoch 0 did\n"
    )
    assert one_line(trace) == (
        "UserCodeError: step 5 failed in user code: TrainingFunctionError: ... "
        "elasticps.errors.ProgramError: the loop over the DataLoader ended before epoch 0 did"
    )
    ray_text = "RayTaskError(TrainingFunctionError): \x1b[36mray::LoopWorker.snapshot()\x1b[39m (pid=7)"
    assert one_line(ray_text) == "RayTaskError(TrainingFunctionError): ray::LoopWorker.snapshot() (pid=7)"
    assert error_text(RuntimeError(ray_text)) == "RuntimeError: " + one_line(ray_text)
    assert one_line("x" * 500, 100) == "x" * 97 + "..." and one_line("one line") == "one line" and one_line("") == ""
