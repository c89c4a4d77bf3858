"""Exceptions raised by elasticps, each naming what went wrong."""

import json
import re

#: A terminal's colour codes, which Ray puts in its errors' text.
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_TRACEBACK = "Traceback (most recent call last):"
#: The most errors :func:`error_chain` follows (a chain built in a loop may be long).
MAX_CHAIN = 32


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


class TrainingFunctionError(Exception):
    """A user's loop raised, in a worker: what it raised, as text (it crosses
    processes; :func:`loop_error_text`). ``rule_broken``: it was, or was raised
    from or while handling, a :class:`ProgramError` (a rule of
    ``elasticps.torch`` broken): the same code breaks it again after any restart."""

    def __init__(self, text: str, rule_broken: bool = False) -> None:
        super().__init__(text)
        self.rule_broken = rule_broken


class UnschedulableError(ConfigError):
    """The job can never run on this cluster (a task larger than every node,
    or a minimum shape larger than all nodes together)."""


class JobEndedError(ConfigError):
    """The job has ended, so it can no longer be changed."""


def error_chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and the errors it was raised from (``raise ... from``) or while
    handling (``__context__``), a Ray task's error's ``cause`` among them: each
    once, at most ``MAX_CHAIN``."""
    out: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and len(out) < MAX_CHAIN and all(current is not e for e in out):
        out.append(current)
        cause = getattr(current, "cause", None)  # a user's error may have a `cause` of its own, of any type
        current = current.__cause__ or current.__context__ or (cause if isinstance(cause, BaseException) else None)
    return out


def broke_a_rule(exc: BaseException) -> bool:
    """``exc`` comes from elasticps's judgement that the program is wrong: a
    :class:`ProgramError` (or an error marked ``rule_broken``, from a user's
    loop in another process) is ``exc`` or among the errors it was raised from
    or while handling (a loop that wraps it in its own error)."""
    return any(isinstance(e, ProgramError) or getattr(e, "rule_broken", False) is True for e in error_chain(exc))


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


_OBJECT_AT = re.compile(r"<[^<>]* object at 0x[0-9a-f]+>:? ?")


def failure_text(exc: BaseException, width: int = 300) -> str:
    """One line for a client library's error, the same each time it fails the
    same way: an HTTP error's status and reason where it has them (Kubernetes'
    ``ApiException``, whose text runs on with the reply's headers and body), else
    its first line without the object addresses a connection error names."""
    status, reason = getattr(exc, "status", None), getattr(exc, "reason", None)
    if isinstance(status, int) and isinstance(reason, str) and reason:
        said = _status_message(getattr(exc, "body", None))  # a Kubernetes Status: what the server says went wrong
        return one_line(f"{status} {reason}" + (f": {said}" if said else ""), width)
    return one_line(_OBJECT_AT.sub("", str(exc)), width) or type(exc).__name__


def _status_message(body: object) -> str:
    """The ``message`` of a JSON error body (Kubernetes' Status object), else ''."""
    if isinstance(body, bytes):
        body = body.decode("utf-8", "replace")
    if not isinstance(body, str):
        return ""
    try:
        message = json.loads(body).get("message")
    except (ValueError, AttributeError):
        return ""
    return message if isinstance(message, str) else ""


def loop_error_text(exc: BaseException) -> str:
    """What a user's loop raised, as its job says it: where a rule of
    ``elasticps.torch`` was broken (:func:`broke_a_rule`), the rule's text and
    the line of the user's code that broke it, on one line (the frames of
    elasticps and torch between them say nothing the user can change); else the
    traceback without elasticps's own frames (the worker's thread, its hooks
    around ``backward()`` and the like)."""
    import os
    import sys
    import traceback

    ours = os.path.dirname(os.path.abspath(__file__)) + os.sep
    torch = sys.modules.get("torch")
    framework = (ours, os.path.dirname(torch.__file__) + os.sep) if torch is not None and torch.__file__ else (ours,)
    rule = next((e for e in error_chain(exc) if isinstance(e, ProgramError)), None)
    if rule is not None:
        frames = [f for f in traceback.extract_tb(rule.__traceback__) if not f.filename.startswith(framework)]
        if not frames:
            return f"{type(rule).__name__}: {rule}"
        last, here = frames[-1], os.getcwd() + os.sep
        path = last.filename.removeprefix(here)  # code shipped with the job runs from its unpacked folder
        return f"{type(rule).__name__}: {rule} (at {path}:{last.lineno}, in {last.name}: {last.line})"
    lines: list[str] = []
    for part in traceback.TracebackException.from_exception(exc).format():
        if not part.lstrip().startswith(f'File "{ours}'):
            lines.append(part)
    return "".join(lines)
