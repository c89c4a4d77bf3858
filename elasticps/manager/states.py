"""A job's life in the manager: states and the only transitions allowed.

```
pending --start--> running --finish--> finished
   |                  |----fail-----> failed --retry--> pending
   |                  '----cancel---> cancelled --retry--> pending
   |----cancel------> cancelled
   '----fail--------> failed         (it could not be started)
```

``finished`` is final. ``failed`` and ``cancelled`` are final for the control
loop; only an explicit retry (a user's command) leaves them: the job runs again
from its latest checkpoint. Every change of a
job's state goes through :func:`check_transition`, so an illegal change (a
round restarting a cancelled job, a late "finished" overwriting a cancel)
raises instead of being written.
"""

from __future__ import annotations

from enum import StrEnum

from elasticps.errors import ElasticPSError


class JobState(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    FINISHED = "finished"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def ended(self) -> bool:
        return self in ENDED


ENDED = frozenset({JobState.FINISHED, JobState.FAILED, JobState.CANCELLED})
ACTIVE = (JobState.PENDING, JobState.RUNNING)

#: (from, to) -> the cause that may make it.
TRANSITIONS: dict[tuple[JobState, JobState], str] = {
    (JobState.PENDING, JobState.RUNNING): "start",
    (JobState.PENDING, JobState.CANCELLED): "cancel",
    (JobState.PENDING, JobState.FAILED): "fail",
    (JobState.RUNNING, JobState.FINISHED): "finish",
    (JobState.RUNNING, JobState.FAILED): "fail",
    (JobState.RUNNING, JobState.CANCELLED): "cancel",
    (JobState.FAILED, JobState.PENDING): "retry",
    (JobState.CANCELLED, JobState.PENDING): "retry",  # a new run from its latest checkpoint, asked by the user
}


class IllegalTransition(ElasticPSError):
    """A change of state that the table does not allow."""

    def __init__(self, job: str, current: JobState, wanted: JobState, message: str | None = None) -> None:
        self.job, self.current, self.wanted = job, current, wanted
        super().__init__(message or f"job {job!r} is {current}; it cannot become {wanted}")


class JobInUse(ElasticPSError):
    """A job that has not ended (or is still stopping) cannot be deleted."""


def check_transition(job: str, current: str, wanted: str) -> JobState:
    """The wanted state, if ``current -> wanted`` is allowed; else :class:`IllegalTransition`."""
    cur, new = JobState(current), JobState(wanted)
    if (cur, new) not in TRANSITIONS:
        raise IllegalTransition(job, cur, new)
    return new
