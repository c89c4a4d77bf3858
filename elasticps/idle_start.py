"""A new task's heavy imports at idle CPU priority, so that the job it joins
keeps its speed while it starts.

A grow starts processes while the job trains (make before break), often on
the nodes its running tasks use (placement packs a job onto few nodes). Most
of a new process's start is importing torch and the runtime: at normal
priority it takes those cycles from the job's running tasks, whose
synchronous steps wait on each other, so the whole job slows while it grows.

Ray runs a worker process's setup hook (``worker_process_setup_hook``) before
the process takes its actor; a task launched with :func:`runtime_env` runs
:func:`run` there, which imports its modules on a thread of its own under
``SCHED_IDLE``: that thread runs only when a core would otherwise be idle, and
any of the job's tasks that wakes takes the core back at once (a ``nice``
value does not do that: a nice-19 thread keeps its time slice, which delays
each wake-up of a step). Threads are born with their creator's policy, so
numpy (whose BLAS starts its helper threads when it loads) is imported on the
main thread first, and any thread the imports leave at idle priority is put
back where the process may do that (``idle_threads_left`` counts the rest).
The task itself trains at normal priority and finds its modules imported.

The cost: where every core is busy, the start waits for idle time (Python's
own start and Ray's, before the hook, are at normal priority). After
``$ELASTICPS_IDLE_RAISE_AFTER_S`` the thread is put back at normal priority
where the process may (``CAP_SYS_NICE``, or an ``RLIMIT_NICE`` allowing it;
not in a default container); elsewhere the start waits on, at most the job's
``placement_timeout_s``, after which the change gives up as for a task that
found no room. Ray tasks that such a task starts inherit its runtime env,
and with it the hook: the runtime uses it for PS shards and a program's
workers (whose code is a model, a dataset and a loss), not for a user's own
loop, which may start Ray tasks of its own.

This module is imported by every such process before anything else of the
project: it must stay light (no torch, no ``elasticps.runtime``).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import threading
import time
from typing import Any

MODULES_ENV = "ELASTICPS_IDLE_IMPORTS"  # comma-separated modules the hook imports
RAISE_AFTER_ENV = "ELASTICPS_IDLE_RAISE_AFTER_S"  # when the import thread is put back at normal priority
HOOK = f"{__name__}.run"
DEFAULT_RAISE_AFTER_S = 20.0

# What the hook did in this process (None: it did not run): read by the task's
# ``start_record`` for benchmarks and tests.
record: dict[str, Any] | None = None


def runtime_env(
    modules: list[str], job_env: dict[str, Any] | None, threads: int, raise_after_s: float
) -> dict[str, Any] | None:
    """The ``runtime_env`` a task is launched with so that its process imports
    ``modules`` at idle priority; None where the job's own runtime env sets a
    setup hook already (a process runs one: the job's is kept). ``threads``:
    the task's ``OMP_NUM_THREADS`` unless the job sets one (Ray sets it from the
    task's CPUs only when the task runs, after numpy's BLAS has read it);
    ``raise_after_s``: how long the imports may run at idle priority."""
    from ray._private.ray_constants import WORKER_PROCESS_SETUP_HOOK_ENV_VAR

    job_env = job_env or {}
    job_vars = job_env.get("env_vars") or {}
    if job_env.get("worker_process_setup_hook") or WORKER_PROCESS_SETUP_HOOK_ENV_VAR in job_vars:
        return None
    env_vars = {
        WORKER_PROCESS_SETUP_HOOK_ENV_VAR: HOOK,
        MODULES_ENV: ",".join(modules),
        RAISE_AFTER_ENV: f"{raise_after_s:g}",
    }
    if "OMP_NUM_THREADS" not in job_vars:
        env_vars["OMP_NUM_THREADS"] = str(max(1, threads))
    # Ray merges a task's env_vars into its job's and keeps the job's other fields
    return {"env_vars": env_vars}


def run() -> None:
    """Ray's setup hook: import ``$ELASTICPS_IDLE_IMPORTS`` on an idle-priority thread."""
    global record
    modules = [m for m in os.environ.get(MODULES_ENV, "").split(",") if m]
    raise_after_s = float(os.environ.get(RAISE_AFTER_ENV, DEFAULT_RAISE_AFTER_S))
    t0, cpu0 = time.monotonic(), time.process_time()
    with contextlib.suppress(ImportError):  # torch imports without it
        importlib.import_module("numpy")  # its BLAS threads start here, at normal priority
    outcome: dict[str, Any] = {"policy": "normal", "error": None}
    worker = threading.Thread(target=_import, args=(modules, outcome), name="elasticps-idle-import", daemon=True)
    worker.start()
    worker.join(raise_after_s)
    if worker.is_alive() and worker.native_id is not None:
        outcome["raised"] = _raise(worker.native_id)
        worker.join()
    record = {
        "modules": modules,
        "seconds": time.monotonic() - t0,
        "cpu_s": time.process_time() - cpu0,
        "idle_threads_left": _raise_leftovers(),
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


def _raise(native_id: int) -> bool:
    """Put a thread back at normal priority; False where this process may not."""
    try:
        os.sched_setscheduler(native_id, os.SCHED_OTHER, os.sched_param(0))
        return True
    except (AttributeError, OSError):
        return False


def _raise_leftovers() -> int:
    """Threads the imports started (born at idle priority) put back where allowed; how many are left idle."""
    left = 0
    for tid in os.listdir("/proc/self/task") if os.path.isdir("/proc/self/task") else []:
        try:
            idle = os.sched_getscheduler(int(tid)) == os.SCHED_IDLE
        except (AttributeError, OSError):  # ended meanwhile, or no such policy here
            continue
        left += idle and not _raise(int(tid))
    return left
