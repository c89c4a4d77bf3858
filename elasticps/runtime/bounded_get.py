"""A task's own wait on another task's part of a step (a worker's pull of
the shards' parameters, a shard's of the workers' gradients), bounded: a task
that waits on a hung one gives up, and is free to answer the controller,
instead of hanging with it. Its error names the tasks it waited on in vain
(:class:`WaitRanOut`): the job's recovery takes those for hung, not the
task that gave up, nor the program's code."""

from __future__ import annotations

from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayTaskError


class WaitRanOut(GetTimeoutError):
    """A task's own wait ran out; ``late`` names the tasks (``ps-1``,
    ``worker-0``) whose part did not come. It reaches the controller as a
    :class:`RayTaskError` of the task that waited (whose ``cause`` it is)."""

    def __init__(self, message: str, late: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.late = tuple(late)

    def __reduce__(self) -> tuple[Any, ...]:  # it crosses processes with its names
        return (type(self), (str(self), self.late))


def get_within(
    refs: Any, timeout_s: float, what: str, names: list[str] | None = None, limit: str = "step_timeout_s"
) -> Any:
    """``ray.get(refs)``, waited for at most ``timeout_s`` (``limit`` says
    what sets it); after that a :class:`WaitRanOut` that says ``what`` did
    not come, and from which tasks (``names``: the task each of the list
    ``refs`` comes from). Another
    task's wait that ran out (its call failed with it) is passed on as it is:
    the task it names is the hung one, not the one waited on here."""
    try:
        return ray.get(refs, timeout=timeout_s)
    except GetTimeoutError as exc:
        if isinstance(exc, RayTaskError):
            raise
        late: tuple[str, ...] = ()
        if names is not None:
            _, pending = ray.wait(list(refs), num_returns=len(refs), timeout=0)
            late = tuple(n for n, ref in zip(names, refs, strict=True) if ref in pending)
            what += f" (of {', '.join(late)})"
        raise WaitRanOut(f"{what} did not come within {timeout_s:g} s ({limit})", late) from exc


class TakenForHung(GetTimeoutError):
    """The controller's own wait on a step's calls ran out (:func:`elasticps.runtime.tasks.answers`):
    the tasks ``late`` names were killed, taken for hung. Ray carries a kill out
    asynchronously, so a ping just after may still be answered: a recovery
    takes them for dead by this error, not by asking them."""

    def __init__(self, message: str, late: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.late = tuple(late)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.late))


def waited_on(exc: BaseException) -> tuple[str, ...] | None:
    """The tasks taken for hung by ``exc``: those a task's own wait ran out on
    (:func:`get_within`, raised in the task), or those the controller's own
    wait killed (:class:`TakenForHung`); None for any other error."""
    if isinstance(exc, TakenForHung):
        return exc.late
    cause = exc.cause if isinstance(exc, RayTaskError) else None
    return cause.late if isinstance(cause, WaitRanOut) else None


def hung_in(*errors: BaseException | None) -> tuple[str, ...]:
    """Every task that ``errors`` take for hung (:func:`waited_on`), each once, in order."""
    return tuple(dict.fromkeys(n for e in errors if e is not None for n in waited_on(e) or ()))
