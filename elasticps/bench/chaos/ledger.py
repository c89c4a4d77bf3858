"""What the manager acknowledged during a chaos run, and what was done to it."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Fault:
    at: float
    kind: str
    target: str


@dataclass
class Probe:
    """One API request made while the manager's store could not write (a held lock, a full disk)."""

    fault: str
    request: str  # e.g. "POST /jobs"
    status: int  # 0: no answer
    retry_after: str | None
    detail: str = ""


@dataclass
class Ledger:
    submitted: dict[str, int] = field(default_factory=dict)  # normal job -> program seed
    doomed: dict[str, str] = field(default_factory=dict)  # job meant to fail -> what its failure must name
    cancelled: set[str] = field(default_factory=set)
    faults: list[Fault] = field(default_factory=list)
    probes: list[Probe] = field(default_factory=list)
    manager_pids: list[int] = field(default_factory=list)  # every process the manager ran as
    refused: list[str] = field(default_factory=list)  # submits answered other than 201: 'name: status detail'
