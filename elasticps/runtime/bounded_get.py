"""A task's own wait on another task's part of a step (a worker's pull of
the shards' parameters, a shard's of the workers' gradients), bounded: a task
that waits on a hung one gives up, and is free to answer the controller,
instead of hanging with it."""

from __future__ import annotations

from typing import Any

import ray
from ray.exceptions import GetTimeoutError


def get_within(refs: Any, timeout_s: float, what: str, names: list[str] | None = None) -> Any:
    """``ray.get(refs)``, waited for at most ``timeout_s``; after that a
    :class:`GetTimeoutError` that says ``what`` did not come, and from which
    tasks (``names``: the task each of the list ``refs`` comes from)."""
    try:
        return ray.get(refs, timeout=timeout_s)
    except GetTimeoutError as exc:
        if names is not None:
            _, late = ray.wait(list(refs), num_returns=len(refs), timeout=0)
            what += f" (of {', '.join(n for n, ref in zip(names, refs, strict=True) if ref in late)})"
        raise GetTimeoutError(f"{what} did not come within {timeout_s:g} s (step_timeout_s)") from exc
