"""Exceptions raised by elasticps, each naming what went wrong."""


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
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
