"""The manager's engine on Ray: each job's controller runs in a Ray actor of
its own, on the manager's node (its checkpoints go to the manager's workdir).

The job's program, a user's code, is imported and its factory called only in
that actor's process (and the describe task's), never in the manager: a
program that raises, hangs or misbehaves cannot take the API or the control
loop with it. The actors are owned by the manager's driver, so they end with
it; a restarted manager starts them again from their checkpoints.
"""

from __future__ import annotations

import contextlib
import logging
import statistics
from pathlib import Path
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from elasticps.errors import ConfigError, ElasticPSError, JobFailedError, ProgramError
from elasticps.manager.capacity import ray_cluster_view, ray_hostnames
from elasticps.manager.runtime import JobStatus, Launch, ProgramInfo
from elasticps.manager.spec import JobSpec
from elasticps.runtime import JobController, JobReport
from elasticps.sched import ClusterView, Resources

log = logging.getLogger("elasticps.manager")

DESCRIBE_TIMEOUT_S = 180.0
CALL_TIMEOUT_S = 60.0


def shipped(runtime_env: dict[str, Any]) -> dict[str, Any]:
    """``runtime_env`` with local ``working_dir`` and ``py_modules`` directories
    uploaded to the Ray cluster and replaced by their package URIs.

    Ray uploads local directories only for a whole Ray job (``ray.init``); an
    actor's ``runtime_env`` must name URIs. This does the upload ``ray.init``
    and Ray Jobs do, with the same (internal, Ray 2.x) functions; a package is
    stored once per content hash, so starting a job again uploads nothing new.
    """
    from ray._private.runtime_env.py_modules import upload_py_modules_if_needed
    from ray._private.runtime_env.working_dir import upload_working_dir_if_needed

    for key in ("working_dir", "py_modules"):
        for path in [runtime_env.get(key)] if key == "working_dir" else runtime_env.get(key, []):
            if path and "://" not in path and not Path(path).exists():
                raise ProgramError(f"runtime_env {key} {path!r} does not exist on the manager's machine")
    scratch = ray._private.worker.global_worker.node.get_runtime_env_dir_path()
    env = upload_py_modules_if_needed(dict(runtime_env), include_gitignore=True, scratch_dir=scratch, logger=log)
    return upload_working_dir_if_needed(env, include_gitignore=True, scratch_dir=scratch, logger=log)


def _here() -> NodeAffinitySchedulingStrategy:
    return NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)


@ray.remote(num_cpus=0)
def _describe(program: str, args: dict) -> ProgramInfo:
    from elasticps.program import load_program

    p = load_program(program, args)
    return ProgramInfo(p.name, p.batch_size, p.epochs, len(p.build_dataset()), p.max_batch_size)


@ray.remote(num_cpus=0, max_concurrency=8, max_restarts=0)
class JobDriver:
    """One job's controller, in a process of its own."""

    def __init__(self, launch: Launch) -> None:
        from elasticps.program import load_program

        self.controller = JobController(
            load_program(launch.program, launch.args), launch.config, *launch.shape, placement=launch.placement
        )
        self.thread = self.controller.run_in_thread()

    def poll(self, after_step: int, after_event: int, after_rescale: int = 0) -> JobStatus:
        c = self.controller
        r = c.report()
        new_events = r.events_total - after_event
        last_epoch = r.epoch_reports[-1] if r.epoch_reports else None
        noise = [e.noise_scale for e in r.epoch_reports if e.noise_scale is not None]
        return JobStatus(
            state=r.state,
            ended=r.state in ("finished", "failed", "stopped") and not self.thread.is_alive(),
            step=r.step,
            epoch=r.epoch,
            num_ps=r.num_ps,
            num_workers=r.num_workers,
            placement=r.placement,
            held={**r.placement, **c.starting()},
            windows=[w for w in r.windows if w.last_step > after_step],
            events=r.events[-new_events:] if new_events > 0 else [],
            events_total=r.events_total,
            remaining_samples=c.remaining_samples(),
            samples_per_epoch=c.samples_per_epoch(),
            metric=c.final_metric if c.final_metric is not None else last_epoch.metric if last_epoch else None,
            error=r.error,
            rescales=r.rescales[after_rescale:],
            rescales_total=len(r.rescales),
            batch_size=r.batch_size,
            noise_scale=statistics.median(noise[-3:]) if noise else None,  # one epoch's estimate is noisy
        )

    def report(self) -> JobReport:
        return self.controller.report()

    def rescale(self, num_ps: int, num_workers: int, placement: dict[str, str]) -> None:
        self.controller.rescale(num_ps, num_workers, placement=placement)

    def set_batch_size(self, batch: int) -> None:
        self.controller.set_batch_size(batch)

    def stop(self) -> None:
        self.controller.stop()

    def shutdown(self) -> None:
        self.controller.stop()
        self.thread.join(timeout=CALL_TIMEOUT_S)
        self.controller.shutdown()


def _cause(exc: BaseException) -> BaseException:
    """The user-facing error inside a Ray error (an elasticps error raised remotely, if any)."""
    cause = getattr(exc, "cause", None)
    return cause if isinstance(cause, BaseException) else exc


def _call(ref: Any, timeout_s: float = CALL_TIMEOUT_S) -> Any:
    try:
        return ray.get(ref, timeout=timeout_s)
    except ray.exceptions.RayTaskError as exc:
        cause = _cause(exc)
        if isinstance(cause, ElasticPSError):
            raise cause from None
        raise JobFailedError(f"{type(cause).__name__}: {cause}") from exc
    except ray.exceptions.RayActorError as exc:
        raise JobFailedError(f"the job's driver process is gone: {_first_line(exc)}") from exc


def _first_line(exc: BaseException) -> str:
    """The innermost error line of a Ray error's message (its traceback is in the logs)."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    errors = [ln for ln in lines if "Error:" in ln and not ln.startswith("File ")]
    return (errors[-1] if errors else lines[0] if lines else type(exc).__name__)[:500]


class RayJobHandle:
    def __init__(self, actor: Any) -> None:
        self.actor = actor
        self._closed = False

    def poll(self, after_step: int, after_event: int, after_rescale: int = 0) -> JobStatus:
        return _call(self.actor.poll.remote(after_step, after_event, after_rescale))

    def report(self) -> JobReport:
        return _call(self.actor.report.remote())

    def rescale(self, num_ps: int, num_workers: int, placement: dict[str, str]) -> None:
        _call(self.actor.rescale.remote(num_ps, num_workers, placement))

    def set_batch_size(self, batch: int) -> None:
        _call(self.actor.set_batch_size.remote(batch))

    def stop(self) -> None:
        with contextlib.suppress(ElasticPSError, ray.exceptions.GetTimeoutError):
            _call(self.actor.stop.remote(), timeout_s=10)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            _call(self.actor.shutdown.remote(), timeout_s=2 * CALL_TIMEOUT_S)
        except (ElasticPSError, ray.exceptions.GetTimeoutError) as exc:
            log.warning("closing a job's driver: %s", exc)
        ray.kill(self.actor, no_restart=True)


class RayJobRuntime:
    """Jobs as Ray actors on the manager's node; programs resolved in Ray processes."""

    def describe(self, spec: JobSpec) -> ProgramInfo:
        env = {"runtime_env": shipped(spec.runtime_env.to_ray())} if spec.runtime_env else {}
        ref = _describe.options(scheduling_strategy=_here(), **env).remote(spec.program, dict(spec.args))
        try:
            return _call(ref, timeout_s=DESCRIBE_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError:
            ray.cancel(ref, force=True)
            raise ProgramError(f"resolving {spec.program!r} took longer than {DESCRIBE_TIMEOUT_S:g} s") from None
        except (JobFailedError, ConfigError) as exc:
            raise ProgramError(str(exc)) from exc

    def start(self, launch: Launch) -> RayJobHandle:
        # the job's PS and workers, started by the driver, inherit its runtime_env
        env = {"runtime_env": shipped(launch.runtime_env)} if launch.runtime_env else {}
        actor = JobDriver.options(name=None, scheduling_strategy=_here(), **env).remote(launch)
        return RayJobHandle(actor)


class RayCapacity:
    def view(self, ours: dict[str, Resources]) -> ClusterView:
        return ray_cluster_view(ours)

    def hostnames(self) -> dict[str, str]:
        return ray_hostnames()
