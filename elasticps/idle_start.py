"""A new task's heavy imports at idle CPU priority, so that the job it joins
keeps its speed while it starts.

A grow starts processes while the job trains (make before break), often on
the nodes its running tasks use (placement packs a job onto few nodes). Most
of a new process's start is importing torch and the runtime (~1.5 CPU-s): at
normal priority it takes those cycles from the job's running tasks, whose
synchronous steps wait on each other, so the whole job slows while it grows.

Ray runs a worker process's setup hook (``worker_process_setup_hook``) before
the process takes its actor; a task launched with :func:`runtime_env` runs
:func:`run` there, which imports its modules on a thread of its own under
``SCHED_IDLE``: that thread runs only when a core would otherwise be idle, and
any of the job's tasks that wakes takes the core back at once (a ``nice``
value does not do that: a nice-19 thread keeps its time slice, which delays
each wake-up of a step). The thread ends with the imports; the process's
other threads never change priority, so the task trains at normal priority.
Its actor then finds those modules imported.

The cost: where every core is busy, the start waits for idle time (Python's
own start and Ray's, before the hook, are at normal priority). After
``RAISE_AFTER_S`` the thread is put back at normal priority where the
process may do that (``CAP_SYS_NICE`` or an ``RLIMIT_NICE`` allowing it);
elsewhere the start waits on, at most the job's ``placement_timeout_s``, after
which the grow gives up as for a task that found no room.

This module is imported by every such process before anything else of the
project: it must stay light (no torch, no ``elasticps.runtime``).
"""

from __future__ import annotations

import importlib
import os
import threading
import time
from typing import Any

MODULES_ENV = "ELASTICPS_IDLE_IMPORTS"  # comma-separated modules the hook imports
HOOK = f"{__name__}.run"
RAISE_AFTER_S = 20.0

# What the hook did in this process (None: it did not run): read by the task's
# ``start_record`` for benchmarks and tests.
record: dict[str, Any] | None = None


def runtime_env(modules: list[str], job_env: dict[str, Any] | None) -> dict[str, Any] | None:
    """The ``runtime_env`` a task is launched with so that its process imports
    ``modules`` at idle priority; None where the job's own runtime env sets a
    setup hook already (a process runs one: the job's is kept)."""
    from ray._private.ray_constants import WORKER_PROCESS_SETUP_HOOK_ENV_VAR

    env_vars = (job_env or {}).get("env_vars") or {}
    if (job_env or {}).get("worker_process_setup_hook") or WORKER_PROCESS_SETUP_HOOK_ENV_VAR in env_vars:
        return None
    # Ray merges a task's env_vars into its job's and keeps the job's other fields
    return {"env_vars": {WORKER_PROCESS_SETUP_HOOK_ENV_VAR: HOOK, MODULES_ENV: ",".join(modules)}}


def run() -> None:
    """Ray's setup hook: import ``$ELASTICPS_IDLE_IMPORTS`` on an idle-priority thread."""
    global record
    modules = [m for m in os.environ.get(MODULES_ENV, "").split(",") if m]
    t0, cpu0 = time.monotonic(), time.process_time()
    outcome: dict[str, Any] = {"policy": "normal", "error": None}
    worker = threading.Thread(target=_import, args=(modules, outcome), name="elasticps-idle-import", daemon=True)
    worker.start()
    worker.join(RAISE_AFTER_S)
    if worker.is_alive():
        outcome["raised"] = _raise(worker.native_id)
        worker.join()
    record = {
        "modules": modules,
        "seconds": time.monotonic() - t0,
        "cpu_s": time.process_time() - cpu0,
        **outcome,
    }


def _import(modules: list[str], outcome: dict[str, Any]) -> None:
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))  # this thread only (Linux)
        outcome["policy"] = "idle" if os.sched_getscheduler(0) == os.SCHED_IDLE else "normal"
    except (AttributeError, OSError):  # no SCHED_IDLE here: import at normal priority
        pass
    try:
        for name in modules:
            importlib.import_module(name)
    except Exception as e:  # the actor's own import of it fails again, with its whole traceback
        outcome["error"] = f"{type(e).__name__}: {e}"


def _raise(native_id: int | None) -> bool:
    """Put the import thread back at normal priority; False where this process may not."""
    try:
        os.sched_setscheduler(native_id or 0, os.SCHED_OTHER, os.sched_param(0))
        return True
    except (AttributeError, OSError):
        return False
