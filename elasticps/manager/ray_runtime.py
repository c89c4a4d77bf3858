"""The manager's engine on Ray: each job's controller runs in a Ray actor of
its own, on the manager's node (its checkpoints go to the manager's workdir).

The job's program, a user's code, is imported and its factory called only in
that actor's process (and the describe task's), never in the manager: a
program that raises, hangs or misbehaves cannot take the API or the control
loop with it. What those processes answer is read as plain JSON bytes and
checked (:mod:`elasticps.manager.wire`); nothing of theirs is unpickled here.
The actors are owned by the manager's driver, so they end with it; a
restarted manager starts them again from their checkpoints.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import statistics
import sys
import threading
import time
import traceback
from typing import Any

import ray
from ray._private import ray_constants
from ray._private import state as ray_state
from ray.core.generated.common_pb2 import ErrorType
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from elasticps.errors import (
    ConfigError,
    ElasticPSError,
    JobFailedError,
    ProgramError,
    TrainingFunctionError,
    UserCodeError,
    broke_a_rule,
    error_chain,
    one_line,
)
from elasticps.manager.capacity import ray_cluster_view, ray_hostnames
from elasticps.manager.pinning import upload_pinned
from elasticps.manager.runtime import JobStatus, Launch, ProgramInfo
from elasticps.manager.spec import JobSpec
from elasticps.manager.wire import NotPlainData, answer, decode, error_record, parse, with_trace
from elasticps.runtime import JobController, JobReport
from elasticps.runtime.output import JobLog, capture, serve_tasks
from elasticps.runtime.standby import release_orphans
from elasticps.sched import ClusterView, Resources

log = logging.getLogger("elasticps.manager")

DESCRIBE_TIMEOUT_S = 180.0
CALL_TIMEOUT_S = 60.0


def shipped(runtime_env: dict[str, Any], pinned: str | None = None) -> dict[str, Any]:
    """``runtime_env`` with local ``working_dir`` and ``py_modules`` directories
    uploaded to the Ray cluster and replaced by their package URIs, and the
    job's packages pinned at submit (in the folder ``pinned``) uploaded where
    the cluster lacks them (:mod:`elasticps.manager.pinning`).

    Ray uploads local directories only for a whole Ray job (``ray.init``); an
    actor's ``runtime_env`` must name URIs. This does the upload ``ray.init``
    and Ray Jobs do, with the same (internal, Ray 2.x) functions; a package is
    stored once per content hash, so starting a job again uploads nothing new.
    """
    from ray._private.runtime_env.py_modules import upload_py_modules_if_needed
    from ray._private.runtime_env.working_dir import upload_working_dir_if_needed

    if pinned is not None:
        upload_pinned(runtime_env, pinned)
    scratch = ray._private.worker.global_worker.node.get_runtime_env_dir_path()
    env = upload_py_modules_if_needed(dict(runtime_env), include_gitignore=True, scratch_dir=scratch, logger=log)
    return upload_working_dir_if_needed(env, include_gitignore=True, scratch_dir=scratch, logger=log)


def _here() -> NodeAffinitySchedulingStrategy:
    return NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)


@ray.remote(num_cpus=0)  # in a process Ray reuses: describe_program imports the program's own modules afresh
def _describe(program: str, args: dict) -> bytes:
    from elasticps.manager.describe import describe_program

    return answer(lambda: describe_program(program, args), "the program's description")


@ray.remote(num_cpus=0, max_concurrency=8, max_restarts=0)
class JobDriver:
    """One job's controller, in a process of its own. Every method answers
    plain JSON bytes (:func:`elasticps.manager.wire.answer`), errors included;
    a controller that could not be made is a failed job, not a dead actor
    (whose creation error Ray would hand to the manager as a pickle)."""

    def __init__(self, launch: Launch) -> None:
        from elasticps.program import load_program
        from elasticps.runtime.tasks import quiet_unread_failures

        quiet_unread_failures()
        self.output = JobLog(launch.output_dir) if launch.output_dir else None
        if self.output is not None:  # what the program and its tasks print, kept in the job's folder
            capture("driver", self.output.write, every_s=None)
            serve_tasks(ray.get_runtime_context().current_actor)
        self.controller: JobController | None = None
        self.failure: dict[str, str] | None = None  # the error that ended the run (see error_record)
        self.fatal = False  # it is the program's own error before its first step: starting again fails again
        try:  # the program's factory and the controller's checks: the user's code, in this process
            self.controller = JobController(
                load_program(launch.program, launch.args), launch.config, *launch.shape, placement=launch.placement
            )
        except BaseException as exc:
            self._failed(exc, fatal=True)
            return
        self.thread = threading.Thread(target=self._run, name=f"elasticps-{launch.name}", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        c = self.controller
        assert c is not None
        try:
            c.run()
        except BaseException as exc:
            self._failed(exc, fatal=failed_before_first_step(exc, c.started_step, c.step))
        finally:  # the job is reported ended once this thread is: with every line its tasks printed
            if self.output is not None:
                c.flush_output()

    def _failed(self, exc: BaseException, fatal: bool) -> None:
        """Keep the error as plain text, and print it into the job's output: a user's
        loop's error as its worker said it (its own traceback, or the rule it broke
        and where), else the whole traceback."""
        self.failure, self.fatal = error_record(exc), fatal
        if any(isinstance(getattr(e, "cause", None), TrainingFunctionError) for e in error_chain(exc)):
            print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
        else:
            traceback.print_exception(exc, file=sys.stderr)
        sys.stderr.flush()

    def write_output(self, lines: list[str]) -> None:
        """Lines a task of the job printed (see :mod:`elasticps.runtime.output`)."""
        if self.output is not None:
            self.output.write([str(line) for line in lines[:10_000]])

    def poll(self, after_step: int, after_event: int, after_rescale: int = 0) -> bytes:
        return answer(lambda: self._poll(after_step, after_event, after_rescale), "the job's status")

    def _poll(self, after_step: int, after_event: int, after_rescale: int) -> JobStatus:
        if self.controller is None:
            assert self.failure is not None
            why = f"the job's driver could not start: {self.failure['type']}: {self.failure['message']}"
            return JobStatus(state="failed", ended=True, step=0, epoch=0, num_ps=0, num_workers=0, placement={},
                             held={}, error=why, fatal=True)  # fmt: skip
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
            metrics=dict(r.metrics[-1].values) if r.metrics else {},
            error=f"{self.failure['type']}: {self.failure['message']}" if self.failure else r.error,
            fatal=self.fatal,
            rescales=r.rescales[after_rescale:],
            rescales_total=len(r.rescales),
            batch_size=r.batch_size,
            noise_scale=statistics.median(noise[-3:]) if noise else None,  # one epoch's estimate is noisy
        )

    def _live(self) -> JobController:
        if self.controller is None:
            raise JobFailedError("the job's driver could not start")
        return self.controller

    def report(self) -> bytes:
        return answer(lambda: self._live().report(), "the job's report")

    def rescale(self, num_ps: int, num_workers: int, placement: dict[str, str]) -> bytes:
        return answer(lambda: _none(self._live().rescale(num_ps, num_workers, placement=placement)))

    def set_batch_size(self, batch: int) -> bytes:
        return answer(lambda: _none(self._live().set_batch_size(batch)))

    def stop(self) -> bytes:
        return answer(lambda: _none(self.controller is not None and self.controller.stop()))

    def shutdown(self) -> bytes:
        def close() -> None:
            if self.controller is not None:
                self.controller.stop()
                self.thread.join(timeout=CALL_TIMEOUT_S)
                self.controller.shutdown()

        return answer(close)


def _none(_result: object) -> None:
    """What a command answers: nothing (its effect shows in the next poll)."""
    return None


def failed_before_first_step(exc: BaseException, started_step: int | None, step: int) -> bool:
    """True if ``exc`` is the program's own deterministic error before this run's
    first step (starting again would fail the same way): it raised while the job
    started, or in a step with no task lost, or its checkpoint does not fit it.
    A lost task or node, or no room, is not: those are worth another start."""
    if broke_a_rule(exc):  # at any step: the same code breaks it again after a restart
        return True
    if started_step is not None and step > started_step:
        return False
    if _machine_trouble(exc):
        return False
    if isinstance(exc, (UserCodeError, ConfigError)):
        return True
    return not isinstance(exc, (ElasticPSError, ray.exceptions.RayError))


#: What the machine, not the program, ran out of: a full disk or quota, an I/O error,
#: memory, open files. Worth another start once it has passed.
_MACHINE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.ENOMEM, errno.EMFILE, errno.ENFILE})


def _machine_trouble(exc: BaseException) -> bool:
    """``exc``, or an error it was raised from, is an OSError of the machine's (``_MACHINE_ERRNOS``)."""
    return any(isinstance(e, OSError) and e.errno in _MACHINE_ERRNOS for e in error_chain(exc))


#: Ray's own failures (a process or node gone), told apart from everything else.
_GONE = frozenset({"ACTOR_DIED", "WORKER_DIED", "NODE_DIED", "OWNER_DIED", "LOCAL_RAYLET_DIED", "OBJECT_LOST"})


def _fetch(ref: Any, what: str, timeout_s: float = CALL_TIMEOUT_S) -> Any:
    """The answer of a job-side call, read as raw bytes: Ray's ``get`` would
    unpickle whatever the job's process stored, and a pickle runs code.

    A JSON answer (raw bytes) is parsed by :func:`elasticps.manager.wire.parse`.
    Ray's own errors (a process gone, a runtime_env that failed) are protobuf
    records, read for their message; anything else (a pickled value or
    exception) is refused unread. Raises GetTimeoutError after ``timeout_s``."""
    worker = ray._private.worker.global_worker
    worker.check_connected()
    ((data, metadata, *_),) = worker.core_worker.get_objects([ref], int(timeout_s * 1000))
    kind = (metadata or b"").split(b",")
    if kind[0] == ray_constants.OBJECT_METADATA_TYPE_RAW:
        return parse(data.to_pybytes() if data is not None else b"", what)
    if not kind[0].isdigit():
        raise NotPlainData(f"{what} came back as a Python object, which the manager does not read")
    name = ErrorType.Name(int(kind[0])) if int(kind[0]) in ErrorType.values() else kind[0].decode()
    if name == "TASK_EXECUTION_EXCEPTION":  # a pickled exception: something got past answer()
        raise NotPlainData(f"{what} came back as a Python exception, which the manager does not read (see Ray's logs)")
    text = _ray_error_text(worker, data, kind)
    if name in _GONE:
        raise JobFailedError(f"the job's driver process is gone ({name}{': ' + text if text else ''})")
    if name == "RUNTIME_ENV_SETUP_FAILED":
        raise ProgramError(f"the job's runtime_env could not be set up: {text}")
    raise JobFailedError(f"{what}: Ray error {name}{': ' + text if text else ''}")


def _ray_error_text(worker: Any, data: Any, kind: list[bytes]) -> str:
    """The message of one of Ray's error records (msgpack around protobuf; no pickle in it)."""
    if not data:
        return ""
    try:
        info = worker.get_serialization_context()._deserialize_error_info(data, kind)
    except Exception:
        return ""
    text = info.error_message
    if info.HasField("runtime_env_setup_failed_error"):
        text = info.runtime_env_setup_failed_error.error_message or text
    return one_line(text, 500)  # its first line, and what was raised where it carries a traceback


class RayJobHandle:
    def __init__(self, actor: Any) -> None:
        self.actor = actor
        self._closed = False

    def poll(self, after_step: int, after_event: int, after_rescale: int = 0) -> JobStatus:
        data = _fetch(self.actor.poll.remote(after_step, after_event, after_rescale), "the job's status")
        return decode(JobStatus, data, "status")

    def report(self) -> JobReport:
        return decode(JobReport, _fetch(self.actor.report.remote(), "the job's report"), "report")

    def rescale(self, num_ps: int, num_workers: int, placement: dict[str, str]) -> None:
        _fetch(self.actor.rescale.remote(num_ps, num_workers, placement), "a rescale")

    def set_batch_size(self, batch: int) -> None:
        _fetch(self.actor.set_batch_size.remote(batch), "a batch change")

    def stop(self) -> None:
        with contextlib.suppress(ElasticPSError, ray.exceptions.GetTimeoutError):
            _fetch(self.actor.stop.remote(), "a stop", timeout_s=10)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            _fetch(self.actor.shutdown.remote(), "a shutdown", timeout_s=2 * CALL_TIMEOUT_S)
        except (ElasticPSError, ray.exceptions.GetTimeoutError) as exc:
            log.warning("closing a job's driver: %s", exc)
        ray.kill(self.actor, no_restart=True)
        # its standbys' reservations belong to our Ray job, not to it: they outlive it unless removed here
        actor_id = self.actor._actor_id.hex()
        _wait_dead(actor_id, CALL_TIMEOUT_S)
        n = release_orphans(actor_id)
        if n:
            log.warning("a job's driver left %d standby reservation(s): released", n)


def _wait_dead(actor_id: str, timeout_s: float) -> None:
    """Until Ray knows the actor ``actor_id`` is dead (a kill is carried out
    asynchronously: until then, it may still make a reservation), or ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        info = ray_state.actors(actor_id)
        if not info or info.get("State") == "DEAD":
            return
        time.sleep(0.05)


class RayJobRuntime:
    """Jobs as Ray actors on the manager's node; programs resolved in Ray processes."""

    def describe(self, spec: JobSpec, code_dir: str | None = None) -> ProgramInfo:
        env = {"runtime_env": shipped(spec.runtime_env.to_ray(), code_dir)} if spec.runtime_env else {}
        ref = _describe.options(scheduling_strategy=_here(), **env).remote(spec.program, dict(spec.args))
        try:
            data = _fetch(ref, "the program's description", DESCRIBE_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError:
            ray.cancel(ref, force=True)
            raise ProgramError(f"resolving {spec.program!r} took longer than {DESCRIBE_TIMEOUT_S:g} s") from None
        except ElasticPSError as exc:  # the user's own error type, or the task's process lost
            text = with_trace(exc)
            if "cannot import module" in text and not (spec.runtime_env and spec.runtime_env.working_dir):
                text += (
                    " (the job's processes import what is installed where they run, and what the job ships: "
                    "code of your own goes with the job, `elasticps submit --working-dir DIR` or "
                    "runtime_env.working_dir)"
                )
            raise ProgramError(text) from None
        return decode(ProgramInfo, data, "the program's description")

    def start(self, launch: Launch) -> RayJobHandle:
        # the job's PS and workers, started by the driver, inherit its runtime_env
        env = {"runtime_env": shipped(launch.runtime_env, launch.code_dir)} if launch.runtime_env else {}
        actor = JobDriver.options(name=None, scheduling_strategy=_here(), **env).remote(launch)
        return RayJobHandle(actor)


class RayCapacity:
    def view(self, ours: dict[str, Resources]) -> ClusterView:
        return ray_cluster_view(ours)

    def hostnames(self) -> dict[str, str]:
        return ray_hostnames()
