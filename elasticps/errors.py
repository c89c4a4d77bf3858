"""Exceptions raised by elasticps, each naming what went wrong."""

import re

#: A terminal's colour codes, which Ray puts in its errors' text.
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_TRACEBACK = "Traceback (most recent call last):"


class ElasticPSError(Exception):
    """Base class of every elasticps error."""


class ProgramError(ElasticPSError, ValueError):
    """The training program or its reference is invalid."""


class ConfigError(ElasticPSError, ValueError):
    """A runtime configuration or rescale request is invalid."""


class PlacementError(ElasticPSError):
    """A task could not be placed on its node within the timeout."""


class JobFailedError(ElasticPSError):
    """The job cannot continue (user code raised, or nothing is left to run it)."""


class UserCodeError(JobFailedError):
    """The program's own code raised in a task (no task or node was lost)."""


class UnschedulableError(ConfigError):
    """The job can never run on this cluster (a task larger than every node,
    or a minimum shape larger than all nodes together)."""


class JobEndedError(ConfigError):
    """The job has ended, so it can no longer be changed."""


def error_text(exc: BaseException) -> str:
    """``Type: first line`` of ``exc`` (Ray's errors run to many lines: the first says what)."""
    lines = _ANSI.sub("", str(exc)).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


def one_line(text: str, width: int = 400) -> str:
    """An error's text for a table cell or an event: its first line and, where
    it carries a traceback, the traceback's last line (what was raised), without
    a terminal's colour codes, cut at ``width`` characters. The whole text
    belongs in the job's output."""
    lines = [ln.strip() for ln in _ANSI.sub("", text).splitlines() if ln.strip()]
    if not lines:
        return ""
    out = lines[0].removesuffix(_TRACEBACK).rstrip()
    if len(lines) > 1 and lines[-1] not in out:
        out = f"{out} ... {lines[-1]}"
    return out if len(out) <= width else out[: width - 3] + "..."
