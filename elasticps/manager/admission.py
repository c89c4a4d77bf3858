"""Whether this manager may run a job's code: at submit, and again before
every start (a restart, a retry), since the operator may have narrowed what
is allowed meanwhile (``--allow-programs``, the roots a runtime_env may ship
from). A stored job that is no longer allowed fails, saying why.
"""

from __future__ import annotations

from elasticps.errors import ConfigError, ProgramError
from elasticps.manager.live import JobTable
from elasticps.manager.shipping import ShipPolicy
from elasticps.manager.spec import JobSpec
from elasticps.manager.states import JobState
from elasticps.manager.store import JobRecord
from elasticps.program import check_program_ref


def check_allowed(program: str, allowed: tuple[str, ...] | None) -> None:
    """ProgramError unless ``program``'s module is one of ``allowed`` or inside one of them."""
    if allowed is None:
        return
    module = program.partition(":")[0]
    if not any(module == a or module.startswith(a + ".") for a in allowed):
        raise ProgramError(
            f"program {program!r} is not allowed: this manager runs programs from {', '.join(allowed)} only "
            "(--allow-programs)"
        )


class Admission:
    """Whether this manager may run a job's code: :meth:`check` at submit,
    :meth:`admitted_here` once per job when a round first sees it (e.g. after a
    restart of the manager), :meth:`still_admissible` before each start."""

    def __init__(self, allow_programs: tuple[str, ...] | None, shipping: ShipPolicy, jobs: JobTable) -> None:
        self.allow_programs = allow_programs
        self.shipping = shipping  # the local paths a runtime_env may ship
        self.jobs = jobs  # where a job no longer allowed is failed, and which jobs were checked here

    def check(self, spec: JobSpec) -> None:
        """A ProgramError or ConfigError unless this manager may run ``spec``'s code now."""
        check_program_ref(spec.program)
        check_allowed(spec.program, self.allow_programs)
        if spec.runtime_env is not None and self.allow_programs is not None:
            raise ProgramError(
                "runtime_env is refused: this manager runs installed programs only (--allow-programs), "
                "and shipped code could replace them"
            )
        self.shipping.check(spec.runtime_env)

    def still_admissible(self, rec: JobRecord, now: float) -> bool:
        """False (and the job failed, saying why) if this manager may no longer run the job's code."""
        try:
            self.check(rec.spec)
        except (ProgramError, ConfigError) as exc:
            self.jobs.finish(rec.name, JobState.FAILED, now, f"job failed: not started again: {exc}")
            return False
        return True

    def admitted_here(self, rec: JobRecord, now: float) -> bool:
        """:meth:`still_admissible`, checked once per job by this manager (a start checks again)."""
        if self.jobs.admitted(rec.name):
            return True
        if not self.still_admissible(rec, now):
            return False
        self.jobs.admit(rec.name)
        return True
