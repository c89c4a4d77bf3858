"""``bench runtime``'s push+pull rounds move what they say they move (real Ray actors, shared memory)."""

from __future__ import annotations

import numpy as np
import ray

from elasticps.bench import runtime_bench


def _arrays(actor, names: tuple[str, ...]) -> list[np.ndarray]:
    return ray.get(actor.__ray_call__.remote(lambda self: [getattr(self, n).copy() for n in names]))


def test_a_compiled_round_reads_every_byte_each_way(ray_local):
    worker, ps = runtime_bench._WorkerSide.remote(True), runtime_bench._PSSide.remote(True)
    try:
        worker_grad, worker_params = _arrays(worker, ("grad", "params"))
        ps_params, ps_grad = _arrays(ps, ("params", "grad"))
        assert not np.array_equal(worker_params, ps_params) and not np.array_equal(ps_grad, worker_grad)
        step, teardown = runtime_bench.compiled_round(worker, ps)
        try:
            step()
            step()
        finally:
            teardown()
        # the worker read the PS's parameters into its own buffer, the PS the worker's gradient into its own
        [got_params] = _arrays(worker, ("params",))
        [got_grad] = _arrays(ps, ("grad",))
        assert np.array_equal(got_params, ps_params) and np.array_equal(got_grad, worker_grad)
    finally:
        ray.get([worker.close.remote(), ps.close.remote()])
        for a in (worker, ps):
            ray.kill(a)
