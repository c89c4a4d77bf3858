"""What the manager's REST API answers, as pydantic models: the OpenAPI schema's
response types, and what :class:`elasticps.manager.client.Client` returns."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from elasticps.manager.spec import JobSpec

#: A job in one of these states has ended; its state does not change any more.
ENDED = ("finished", "failed", "cancelled")


class Allocation(BaseModel):
    at: float
    num_ps: int
    num_workers: int
    placement: dict[str, str]


class Progress(BaseModel):
    step: int
    epoch: int
    epochs: int
    samples_per_s: float | None = None
    loss: float | None = None
    metric: float | None = None
    metrics: dict[str, float | None] = {}  # a user loop's latest elasticps.torch.report(...)


class JobOut(BaseModel):
    name: str
    state: Literal["pending", "running", "finished", "failed", "cancelled"]
    submitted_at: float
    updated_at: float
    spec: JobSpec
    allocation: Allocation | None = None
    progress: Progress | None = None
    #: why it is not running now (waiting for room, queued, starting again after a failure), or why it failed
    reason: str | None = None
    never_starts: bool = False  # the cluster can never hold it as it is: it waits for nodes to change


class EventOut(BaseModel):
    id: int
    at: float
    job: str | None
    kind: str
    message: str


class LogLine(BaseModel):
    step: int | None
    kind: Literal["window", "epoch", "event"]
    text: str
    event: int | None = None  # an event's number (for ``after_event``)


class OutputOut(BaseModel):
    """A piece of a job's own output (its tasks' lines, tagged ``[worker-1] ...``)."""

    text: str
    next: int  # the offset to ask from next
    dropped: int = 0  # bytes before this piece that the bounded log no longer holds


class ErrorOut(BaseModel):
    detail: str
    problems: list[str] | None = Field(None, description="422: every problem of the spec, one each")
