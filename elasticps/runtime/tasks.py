"""Starting PS and worker actors where they are asked to run, and checking them."""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass
from typing import Any, Literal

import ray
from ray.util import remove_placement_group
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from elasticps import idle_start
from elasticps.errors import PlacementError
from elasticps.program import TrainingProgram
from elasticps.runtime import output
from elasticps.runtime.bounded_get import TakenForHung, hung_in
from elasticps.runtime.config import DEFAULT_STEP_TIMEOUT_S, TaskResources
from elasticps.runtime.output import FLUSH_WAIT_S, TaskOutput, flush_now
from elasticps.runtime.ps import PSShard
from elasticps.runtime.worker import Worker

Kind = Literal["ps", "worker"]

_ACTOR_CLASSES: dict[str, Any] = {}
_ACTOR_MODULES = {"ps": "elasticps.runtime.ps", "worker": "elasticps.runtime.worker"}  # what a task imports first


def _actor_key(kind: Kind, program: Any) -> str:
    return "loop" if kind == "worker" and not isinstance(program, TrainingProgram) else kind


def _actor_class(kind: Kind, program: Any) -> Any:
    """The PS shard, the worker, or (a user's own loop) the loop worker, a threaded actor."""
    key = _actor_key(kind, program)
    loop = key == "loop"
    if key not in _ACTOR_CLASSES:
        if loop:
            from elasticps.runtime.loop_worker import MAX_CONCURRENCY, LoopWorker

            _ACTOR_CLASSES[key] = ray.remote(max_concurrency=MAX_CONCURRENCY)(_with_output(LoopWorker))
        elif kind == "ps":  # a PS-held table's rows are read while the shard's update waits for gradients
            _ACTOR_CLASSES[key] = ray.remote(concurrency_groups={"rows": 1})(_with_output(PSShard))
        else:
            _ACTOR_CLASSES[key] = ray.remote(_with_output(Worker))
    return _ACTOR_CLASSES[key]


def quiet_unread_failures() -> None:
    """A job's processes pass results they never read themselves (a PS gets a
    worker's gradient by reference; the controller reads the first failure of a
    step, not the tasks that failed after it): when a task failed, Ray printed
    the failure again in each of them as an "Unhandled error" with its whole
    traceback, though the controller handles it (a failed step). Ray's switch
    for that, in this process only: for a job's own processes (its tasks, the
    manager's job driver, ``elasticps train``), not a user's driver script."""
    os.environ["RAY_IGNORE_UNHANDLED_ERRORS"] = "1"


def _with_output(cls: type) -> type:
    """``cls`` whose constructor first tees the process's output to its job's
    driver (``output``: see :mod:`elasticps.runtime.output`), so that what the
    program prints while it builds the model is kept too.

    Its process is quiet about failed results it never reads (:func:`quiet_unread_failures`).
    Its last lines reach the driver before it is stopped (:meth:`close`) and when
    asked (:meth:`flush_output`: the job is about to be reported ended)."""

    class Teed(cls):  # type: ignore[valid-type, misc]
        def __init__(self, *args: Any, output: TaskOutput | None = None, **kwargs: Any) -> None:
            quiet_unread_failures()
            if output is not None:
                output.install()
            super().__init__(*args, **kwargs)

        def close(self) -> None:
            super().close()
            flush_now()

        def flush_output(self) -> None:
            flush_now()

        def start_record(self) -> dict[str, Any] | None:
            """How its process imported its modules (:mod:`elasticps.idle_start`; None: as usual)."""
            return idle_start.record

    Teed.__name__ = Teed.__qualname__ = cls.__name__
    return Teed


@dataclass
class Task:
    """A running PS shard or worker. ``reservation``: the placement group that
    holds its resources when its actor holds none (a standby worker's, see
    :mod:`elasticps.runtime.standby`); released by :func:`stop` and
    :func:`retire_tasks`, whatever ends the task."""

    kind: Kind
    handle: Any
    node_id: str
    pid: int
    reservation: Any = None


@dataclass
class PendingTask:
    """A task starting: ``ready_ref`` resolves once it runs. A standby taken
    for a slot runs already: ``ready_ref`` is its reservation's, and ``info``
    what its ``ready()`` answered."""

    kind: Kind
    handle: Any
    ready_ref: Any
    wanted_node: str | None
    resources: TaskResources
    reservation: Any = None
    info: dict[str, Any] | None = None


def alive_nodes() -> dict[str, dict[str, float]]:
    """Total resources of every alive Ray node, by node id."""
    return {n["NodeID"]: dict(n.get("Resources", {})) for n in ray.nodes() if n.get("Alive")}


def free_now() -> dict[str, dict[str, float]]:
    """What every node has free now (Ray's view, by node id)."""
    from ray._private.state import available_resources_per_node  # no public per-node API without the dashboard

    return available_resources_per_node()


def check_fits(task: str, node_id: str, resources: TaskResources, nodes: dict[str, dict[str, float]]) -> None:
    """Raise at once if ``node_id`` is gone or could never hold the task."""
    if node_id not in nodes:
        raise PlacementError(f"cannot place {task}: node {node_id} is not an alive Ray node")
    total = nodes[node_id]
    for key, need in resources.as_ray_resources().items():
        if need > total.get(key, 0.0) + 1e-9:
            raise PlacementError(
                f"cannot place {task} on node {node_id}: it needs {key}={need:g}, "
                f"the node has {total.get(key, 0.0):g} in all"
            )


def launch(
    kind: Kind,
    program: Any,
    resources: TaskResources,
    threads: int,
    node_id: str | None,
    shared_memory: bool = False,
    dataset: Any = None,
    name: str | None = None,
    wait_s: float = DEFAULT_STEP_TIMEOUT_S,
    idle_import_s: float | None = None,
) -> PendingTask:
    """Start an actor (pinned to ``node_id`` with hard affinity if given); do not wait.
    ``dataset``: a worker's training set (an object ref, see :func:`share_dataset`;
    None: the worker builds it). ``name`` (``worker-1``) tags its output in its job's log.
    ``wait_s``: how long the task waits for another's part of a step (the job's ``step_timeout_s``).
    ``idle_import_s``: its process imports torch and the runtime at idle CPU
    priority for up to this long (:mod:`elasticps.idle_start`; a PS shard or a
    program's worker: a user's loop may start Ray tasks, which would inherit
    it); None: at normal priority."""
    options: dict[str, Any] = {"max_restarts": 0, **resources.ray_options()}
    key = _actor_key(kind, program)
    if idle_import_s is not None and key in _ACTOR_MODULES:
        job_env = dict(ray.get_runtime_context().runtime_env)
        env = idle_start.runtime_env(["torch", _ACTOR_MODULES[key]], job_env, int(resources.cpu), idle_import_s)
        if env is not None:
            options["runtime_env"] = env
    if node_id is not None:
        options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)
    args: tuple[Any, ...] = (program, threads, shared_memory, resources.cpu_limit)
    if kind == "worker" and dataset is not None:
        args += (dataset,)
    handle = _actor_class(kind, program).options(**options).remote(*args, output=output.for_task(name), wait_s=wait_s)
    return PendingTask(kind, handle, handle.ready.remote(), node_id, resources)


def share_dataset(dataset: Any) -> tuple[Any, str | None]:
    """``dataset`` in Ray's object store, for workers to take instead of
    building it: (the object ref, None), or (None, why) if it cannot be
    pickled (each worker then builds its own)."""
    try:
        return ray.put(dataset), None
    except Exception as exc:  # pickling fails in many ways: TypeError, PicklingError, AttributeError...
        return None, f"{type(exc).__name__}: {exc}"


def wait_ready(pending: list[PendingTask], timeout_s: float, names: list[str]) -> list[Task]:
    """Wait until every pending task runs; on timeout kill them all and raise."""
    refs = [p.ready_ref for p in pending]
    _, not_ready = ray.wait(refs, num_returns=len(refs), timeout=timeout_s) if refs else ([], [])
    if not_ready:
        raise give_up(pending, names, timeout_s)
    try:
        return [to_task(p) for p in pending]
    except ray.exceptions.RayError as exc:
        for p in pending:
            stop(p)
        raise PlacementError(f"a task died while starting: {exc}") from exc


def give_up(pending: list[PendingTask], names: list[str], waited_s: float) -> PlacementError:
    """Kill every pending task; the error names those that were not running yet."""
    refs = [p.ready_ref for p in pending]
    _, not_ready = ray.wait(refs, num_returns=len(refs), timeout=0) if refs else ([], [])
    late = set(not_ready)
    for p in pending:
        stop(p)
    details = ", ".join(
        f"{n} (needs {p.resources.as_ray_resources()}" + (f" on node {p.wanted_node})" if p.wanted_node else ")")
        for n, p in zip(names, pending, strict=True)
        if p.ready_ref in late
    )
    return PlacementError(f"not running within {waited_s:.0f} s (no room, or too slow to start): {details}")


STANDBY_ANSWER_S = 30.0  # a standby taken for a slot must still answer before it trains


def to_task(p: PendingTask) -> Task:
    """The running task of ``p`` (Ray's error if it died before it ran). A
    standby's ``ready_ref`` was its reservation's: it is asked again whether it
    runs, so that one that died while its reservation waited is not switched in."""
    info = ray.get(p.ready_ref)
    if p.info is not None:
        ray.get(p.handle.ping.remote(), timeout=STANDBY_ANSWER_S)
        info = p.info
    return Task(p.kind, p.handle, info["node_id"], info["pid"], p.reservation)


def all_ready(pending: list[PendingTask]) -> bool:
    refs = [p.ready_ref for p in pending]
    if not refs:
        return True
    _, not_ready = ray.wait(refs, num_returns=len(refs), timeout=0)
    return not not_ready


def answers(
    calls: list[tuple[str, Any, Any]], timeout_s: float, what: str
) -> tuple[list[Any], ray.exceptions.RayError | None]:
    """What each call (``(task name, its handle, the ref of a call to it)``)
    returned, waited for at most ``timeout_s`` in all: None where it failed or
    did not answer in time, and the first error. A task that did not answer in
    time is taken for hung and killed, so that the job's recovery finds it
    dead; the error is then a :class:`~elasticps.runtime.bounded_get.TakenForHung`
    that names those tasks: ``worker-1 did not {what}; taken for hung`` (its
    ``late`` also holds the tasks the others' own waits named, if any)."""
    refs = [ref for _, _, ref in calls]
    _, pending = ray.wait(refs, num_returns=len(refs), timeout=max(0.0, timeout_s)) if refs else ([], [])
    late = set(pending)
    for _, handle, ref in calls:
        if ref in late:
            kill(handle)
    values: list[Any] = []
    errors: list[ray.exceptions.RayError] = []
    for _, _, ref in calls:
        try:
            values.append(None if ref in late else ray.get(ref))
        except ray.exceptions.RayError as exc:
            values.append(None)
            errors.append(exc)
    if not late:
        return values, errors[0] if errors else None
    names = tuple(name for name, _, ref in calls if ref in late)
    named = tuple(dict.fromkeys((*names, *hung_in(*errors))))  # and what the others' own waits named
    return values, TakenForHung(f"{', '.join(names)} did not {what}; taken for hung", named)


def is_alive(handle: Any, timeout_s: float) -> bool:
    ref = handle.ping.remote()
    ready, _ = ray.wait([ref], timeout=timeout_s)
    if not ready:
        return False
    try:
        ray.get(ref)
    except ray.exceptions.RayError:
        return False
    return True


def flush_output(handles: list[Any], timeout_s: float = FLUSH_WAIT_S) -> None:
    """Wait (at most ``timeout_s``) until each task's output so far is written by
    its job's driver (see :mod:`elasticps.runtime.output`)."""
    _call_all(handles, "flush_output", timeout_s)


def retire(handles: list[Any], timeout_s: float = 5.0) -> None:
    """Let tasks release what they hold (shared memory), then kill them."""
    _call_all(handles, "close", timeout_s)
    for h in handles:
        kill(h)


def _call_all(handles: list[Any], method: str, timeout_s: float) -> None:
    """Call ``method`` of every task and wait for the answers, ``timeout_s`` at most in all."""
    refs = []
    for h in handles:
        with contextlib.suppress(Exception):
            refs.append(getattr(h, method).remote())
    if refs:
        ray.wait(refs, num_returns=len(refs), timeout=timeout_s)


@ray.remote(num_cpus=0)
def _sweep_node() -> int:
    from elasticps.runtime.shm import sweep

    return sweep()


def sweep_nodes(node_ids: set[str], timeout_s: float = 10.0) -> None:
    """Remove shared memory left by dead tasks on each of ``node_ids`` (best effort)."""
    alive = alive_nodes()
    refs = [
        _sweep_node.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=n, soft=False)).remote()
        for n in node_ids
        if n in alive
    ]
    if refs:
        ray.wait(refs, num_returns=len(refs), timeout=timeout_s)


def kill(handle: Any) -> None:
    with contextlib.suppress(Exception):
        ray.kill(handle, no_restart=True)


def stop(task: Task | PendingTask) -> None:
    """Kill ``task`` and release its reservation, if it has one."""
    kill(task.handle)
    release(getattr(task, "reservation", None))


def retire_tasks(items: list[Task]) -> None:
    """:func:`retire` ``items``, then release their reservations."""
    retire([t.handle for t in items])
    for t in items:
        release(getattr(t, "reservation", None))


def release(reservation: Any) -> None:
    """Remove a placement group (None, or one removed already: nothing)."""
    if reservation is not None:
        with contextlib.suppress(Exception):
            remove_placement_group(reservation)


def monotonic() -> float:
    return time.monotonic()
