"""Push+pull: the data path of a sync step between a worker and a PS shard,
measured against memcpy (``bench runtime``'s and ``bench peers``' push+pull rows).

A round pulls 40 MB (PS -> worker) and pushes 40 MB (worker -> PS) with the two
Ray calls per step the controller makes, every byte read by the receiver:
through shared memory (the runtime's same-node path) or Ray's object store
(its path between nodes), driven call by call or through a Ray Compiled Graph
(channels Ray sets up once: what the round gives without Ray's per-call work;
not the runtime's path). Each round's time is split into the ends' reads and
the rest (Ray's calls and their waits).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import ray

from elasticps.runtime.shm import Attachments, OwnedVector, ShmRef

MB = 1e6
PAYLOAD_FLOATS = 10_000_000  # 40 MB


def _median_time(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def memcpy_mbps(repeats: int) -> float:
    src = np.random.default_rng(0).standard_normal(PAYLOAD_FLOATS).astype(np.float32)
    dst = np.empty_like(src)
    return src.nbytes / MB / _median_time(lambda: np.copyto(dst, src), repeats)


def _payload(kind: str, seed: int, shared: bool) -> tuple[np.ndarray, OwnedVector | None]:
    """40 MB of random float32, in a shared-memory vector if ``shared``."""
    data = np.random.default_rng(seed).standard_normal(PAYLOAD_FLOATS).astype(np.float32)
    if not shared:
        return data, None
    vec = OwnedVector(kind, PAYLOAD_FLOATS)
    vec.array[:] = data
    return vec.array, vec


READS = ("in_place", "copy")


class _Receiving:
    """How an end of a push+pull round reads what it receives, and how long that takes.

    ``in_place``: every byte read where it lies (a dot product of the vector with
    itself), as the runtime reads them: a worker's forward pass reads the shards'
    parameters through views bound to them (``FlatModel.bind``), a shard's update
    reads a lone worker's gradient where the worker wrote it (``PSShard._sum``).
    ``copy``: every byte copied into the end's own buffer ``into`` (a copy the
    runtime does not make, kept to compare with earlier figures)."""

    def _receiving(self, read: str) -> None:
        if read not in READS:
            raise ValueError(f"read must be one of {READS}, not {read!r}")
        self.read = read
        self.into = np.empty(PAYLOAD_FLOATS, dtype=np.float32)
        self.seen = float("nan")
        self.read_s: list[float] = []

    def _receive(self, data: np.ndarray) -> None:
        t0 = time.perf_counter()
        if self.read == "copy":
            np.copyto(self.into, data)
        else:
            self.seen = float(np.dot(data, data))
        self.read_s.append(time.perf_counter() - t0)

    def read_ms(self) -> float:
        """Median milliseconds of the reads so far, which are then forgotten."""
        times, self.read_s = self.read_s, []
        return 1e3 * statistics.median(times)


@ray.remote(num_cpus=0.5)
class _WorkerSide(_Receiving):
    """The worker's end of a step's exchange, as :class:`~elasticps.runtime.worker.Worker`'s
    ``step`` makes it: one call pulls the last parameters and pushes the gradient."""

    def __init__(self, shared: bool, read: str = "in_place") -> None:
        self._receiving(read)
        self.grad, self.shm = _payload("grad", 1, shared)
        self.attached = Attachments()

    def step(self, refs: list) -> np.ndarray | ShmRef:
        [part] = ray.get(refs)
        return self.step_value(part)

    def step_value(self, part: np.ndarray | ShmRef) -> np.ndarray | ShmRef:
        self._receive(self.attached.resolve(part))
        return self.grad if self.shm is None else self.shm.ref()

    def close(self) -> None:
        if self.shm is not None:
            self.shm.close()


@ray.remote(num_cpus=0.5)
class _PSSide(_Receiving):
    """A PS shard's end: its update call reads the gradient and returns the parameters."""

    def __init__(self, shared: bool, read: str = "in_place") -> None:
        self._receiving(read)
        self.params, self.shm = _payload("param", 2, shared)
        self.attached = Attachments()

    def current(self) -> np.ndarray | ShmRef:
        return self.params if self.shm is None else self.shm.ref()

    def take(self, refs: list) -> np.ndarray | ShmRef:
        [grad] = ray.get(refs)
        return self.take_value(grad)

    def take_value(self, grad: np.ndarray | ShmRef) -> np.ndarray | ShmRef:
        self._receive(self.attached.resolve(grad))
        return self.current()

    def close(self) -> None:
        if self.shm is not None:
            self.shm.close()


def _ends(shared: bool, read: str, nodes: tuple[str, str] | None) -> tuple[Any, Any]:
    """A worker's and a PS's end, on the Ray nodes ``nodes`` (default: wherever Ray puts them)."""
    if nodes is None:
        return _WorkerSide.remote(shared, read), _PSSide.remote(shared, read)
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    worker, ps = (
        side.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote(shared, read)
        for side, node in zip((_WorkerSide, _PSSide), nodes, strict=True)
    )
    return worker, ps


def _pushpull_figures(seconds: float, worker: Any, ps: Any) -> dict[str, Any]:
    """MB/s of a round that took ``seconds``, the round in ms, and the median
    read of each end (the rest of the round is Ray's calls and their waits)."""
    reads = dict(zip(("worker", "ps"), ray.get([worker.read_ms.remote(), ps.read_ms.remote()]), strict=True))
    return {"MBps": 2 * PAYLOAD_FLOATS * 4 / MB / seconds, "round_ms": 1e3 * seconds, "read_ms": reads}


def _done(worker: Any, ps: Any) -> None:
    ray.get([worker.close.remote(), ps.close.remote()])
    for a in (worker, ps):
        ray.kill(a)


def pushpull(
    repeats: int, shared: bool, nodes: tuple[str, str] | None = None, read: str = "in_place"
) -> dict[str, Any]:
    """One pull (PS -> worker) and one push (worker -> PS) of 40 MB each, driven
    as the controller drives a sync step: the worker's call reads the
    parameters of the last update and returns its gradient; the PS's call,
    submitted with it, reads that gradient and returns the new parameters; then
    both results are awaited. In place through shared memory (``shared``, the
    runtime's same-node path) or through Ray's object store (its cross-node
    path). ``nodes``: the Ray node ids of the worker's and the PS's end;
    ``read``: how each end reads (:class:`_Receiving`). Returns
    :func:`_pushpull_figures`, of the median round."""
    worker, ps = _ends(shared, read, nodes)
    params = [ps.current.remote()]

    def step() -> None:
        grad = worker.step.remote(params)
        params[0] = ps.take.remote([grad])
        ray.get([grad, params[0]])

    try:
        return _pushpull_figures(_median_time(step, repeats), worker, ps)
    finally:
        _done(worker, ps)


def pushpull_compiled(repeats: int) -> dict[str, Any]:
    """:func:`pushpull` through shared memory, read in place, the round driven
    through a Ray Compiled Graph: the worker's read feeds the PS's read on a
    channel Ray sets up once, the new parameters come back to the driver, which
    feeds them to the next round, as the controller's two calls would."""
    worker, ps = _WorkerSide.remote(True), _PSSide.remote(True)
    step, teardown = compiled_round(worker, ps)
    try:
        seconds = _median_time(step, repeats)
    finally:
        teardown()
    try:
        return _pushpull_figures(seconds, worker, ps)
    finally:
        _done(worker, ps)


def compiled_round(worker: Any, ps: Any) -> tuple[Callable[[], None], Callable[[], None]]:
    """A push+pull round of ``worker`` and ``ps`` (a :class:`_WorkerSide` and a
    :class:`_PSSide`) as a compiled graph: (run one round, tear the graph down)."""
    from ray.dag import InputNode

    params = [ray.get(ps.current.remote())]
    with InputNode() as given:
        graph = ps.take_value.bind(worker.step_value.bind(given)).experimental_compile()

    def step() -> None:
        params[0] = ray.get(graph.execute(params[0]))

    return step, graph.teardown


def pushpull_rounds(repeats: int) -> dict[str, Any]:
    """Every push+pull round of ``bench runtime``, a memcpy measured before each
    (this machine's memory speed moves within minutes): ``memcpy_MBps`` is their
    median, and each round's ratio is to it."""
    kinds: dict[str, Callable[[], dict[str, Any]]] = {
        "in_place": lambda: pushpull(repeats, shared=True),
        "copy": lambda: pushpull(repeats, shared=True, read="copy"),
        "compiled_in_place": lambda: pushpull_compiled(repeats),
        "object_store_in_place": lambda: pushpull(repeats, shared=False),
    }
    memcpy, rounds = [], {}
    for name, measure in kinds.items():
        memcpy.append(memcpy_mbps(repeats))
        rounds[name] = measure()
    base = statistics.median(memcpy)
    return {
        "memcpy_MBps": base,
        "memcpy_MBps_each": memcpy,
        "pushpull_rounds": rounds,
        "pushpull_MBps": rounds["in_place"]["MBps"],
        "pushpull_over_memcpy": rounds["in_place"]["MBps"] / base,
        "pushpull_copy_over_memcpy": rounds["copy"]["MBps"] / base,
        "pushpull_compiled_over_memcpy": rounds["compiled_in_place"]["MBps"] / base,
        "pushpull_object_store_MBps": rounds["object_store_in_place"]["MBps"],
    }
