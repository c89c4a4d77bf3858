"""``bench runtime``'s push+pull rounds move what they say they move (real Ray actors, shared memory)."""

from __future__ import annotations

import numpy as np
import pytest
import ray

from elasticps.bench import pushpull_bench


def _arrays(actor, names: tuple[str, ...]) -> list:
    return ray.get(actor.__ray_call__.remote(lambda self: [np.copy(getattr(self, n)) for n in names]))


def _round_trip(read: str, compiled: bool) -> tuple[list, list]:
    """Two rounds of a worker's and a PS's end reading by ``read``: what each
    end sent (its own vector) and what it kept of what it got (``into``, ``seen``)."""
    worker, ps = pushpull_bench._WorkerSide.remote(True, read), pushpull_bench._PSSide.remote(True, read)
    try:
        sent = [*_arrays(worker, ("grad",)), *_arrays(ps, ("params",))]
        if compiled:
            step, teardown = pushpull_bench.compiled_round(worker, ps)
            try:
                step()
                step()
            finally:
                teardown()
        else:
            params = [ps.current.remote()]
            for _ in range(2):
                grad = worker.step.remote(params)
                params[0] = ps.take.remote([grad])
                ray.get([grad, params[0]])
        kept = [_arrays(end, ("into", "seen")) for end in (worker, ps)]
        assert all(t > 0 for t in ray.get([worker.read_ms.remote(), ps.read_ms.remote()]))
        return sent, kept
    finally:
        pushpull_bench._done(worker, ps)


@pytest.mark.parametrize("compiled", [False, True], ids=["two calls", "compiled graph"])
def test_a_copying_round_copies_every_byte_each_way(ray_local, compiled):
    (worker_grad, ps_params), [(worker_into, _), (ps_into, _)] = _round_trip("copy", compiled)
    assert not np.array_equal(worker_grad, ps_params)
    # the worker copied the PS's parameters into its own buffer, the PS the worker's gradient into its own
    assert np.array_equal(worker_into, ps_params) and np.array_equal(ps_into, worker_grad)


def test_an_in_place_round_reads_every_byte_each_way(ray_local):
    (worker_grad, ps_params), [(worker_into, worker_seen), (ps_into, ps_seen)] = _round_trip("in_place", False)
    # each end read the other's whole vector (its dot with itself), and copied nothing
    assert worker_seen == pytest.approx(float(np.dot(ps_params, ps_params)), rel=1e-4)
    assert ps_seen == pytest.approx(float(np.dot(worker_grad, worker_grad)), rel=1e-4)
    assert worker_seen != pytest.approx(ps_seen, rel=1e-4)
    assert not np.array_equal(worker_into, ps_params) and not np.array_equal(ps_into, worker_grad)


def test_an_unknown_way_of_reading_is_refused(ray_local):
    with pytest.raises(ray.exceptions.RayActorError, match="read must be one of"):
        ray.get(pushpull_bench._PSSide.remote(True, "mmap").current.remote(), timeout=60)
