"""What the command line's modules share: JSON and YAML output, help texts,
argument types."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from elasticps.manager.workdir import DEFAULT_WORKDIR

POLICIES = ("static", "greedy", "optimus", "elastic")


def write_json(path: str | None, data: Any) -> None:
    text = json.dumps(data, indent=2, default=str)
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(text + "\n")
    print(text)


def output_file(path: str, option: str) -> Path:
    """Where ``option`` writes a file, its folder made: refused at once (a
    ConfigError naming the option) where no file can be written, not after the work."""
    from elasticps.errors import ConfigError

    out = Path(path)
    if not path or out.is_dir():
        raise ConfigError(f"{option} {path!r} is {'empty' if not path else 'a folder'}: give a file's name")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"{option} {path}: cannot make its folder {out.parent}: {exc.strerror}") from None
    return out


def output_dir(path: str, option: str) -> Path:
    """The folder ``option`` writes into, made: refused at once where it cannot be."""
    from elasticps.errors import ConfigError

    out = Path(path)
    if not path or (out.exists() and not out.is_dir()):
        raise ConfigError(f"{option} {path!r} is {'empty' if not path else 'a file'}: give a folder")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"{option} {path}: cannot make it: {exc.strerror}") from None
    return out


def plain(data: Any) -> Any:
    """API models as the JSON the API sent (for -o json|yaml)."""
    if isinstance(data, list):
        return [plain(x) for x in data]
    return data.model_dump(mode="json")


def dump(data: Any, fmt: str) -> str:
    if fmt == "yaml":
        import yaml

        return yaml.safe_dump(data, sort_keys=False).rstrip("\n")
    return json.dumps(data, indent=2)


def task_range(text: str) -> tuple[int, int]:
    """``"4"`` -> (4, 4); ``"2..8"`` -> (2, 8)."""
    lo, sep, hi = text.partition("..")
    try:
        low, high = int(lo), int(hi) if sep else int(lo)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected N or MIN..MAX, got {text!r}") from None
    if not 1 <= low <= high:  # a job needs at least one PS and one worker
        raise argparse.ArgumentTypeError(f"expected 1 <= MIN <= MAX, got {text!r}")
    return low, high


def _number(kind: type, low: float, strict: bool, what: str):
    """An argparse type: a ``kind`` above ``low`` (``strict``) or at least ``low``."""

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or value != value or (value <= low if strict else value < low):
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
        return value

    return parse


positive_int = _number(int, 0, True, "an integer above 0")
nonnegative_int = _number(int, 0, False, "an integer, 0 or more")
positive_float = _number(float, 0.0, True, "a number above 0")
nonnegative_float = _number(float, 0.0, False, "a number, 0 or more")


def port(text: str) -> int:
    """A TCP port, 0-65535 (0: any free one)."""
    value = nonnegative_int(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"expected a port, 0-65535, got {text!r}")
    return value


def share_of_jobs(text: str) -> float:
    """A share, 0..1."""
    value = nonnegative_float(text)
    if value > 1.0:
        raise argparse.ArgumentTypeError(f"expected a share of the jobs, 0..1, got {text!r}")
    return value


class DefaultsHelp(argparse.RawDescriptionHelpFormatter):
    """Help that shows each option's default (where it has one worth showing), and an
    epilog as written."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        shown = not any(action.default is v for v in (None, False, argparse.SUPPRESS)) and "default" not in text
        return f"{text} (default: %(default)s)" if shown and action.option_strings else text


def version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("elasticps")
    except PackageNotFoundError:  # run from a source tree that was not installed
        return "unknown"


POLICY_HELP = "static: the spec's counts; greedy, optimus: classic managers; elastic (default): see docs/scheduler.md"


OBJECTIVE_HELP = (
    "goodput (default): progress per second (samples/s x statistical efficiency); speed: samples/s; "
    "efficiency: goodput, growing a job only while it scales well"
)


THRESHOLD_HELP = (
    "efficiency objective: a job grows only while its relative gain per relative growth in its dominant share "
    "of the cluster stays at or above this (default 0.75; 1.0 is linear scaling)"
)


PLACEMENT_HELP = "locality (default): fewest PS bytes across nodes; spread, pack, optimus: the classic rules"


def default_workdir() -> str:
    return os.environ.get("ELASTICPS_WORKDIR", DEFAULT_WORKDIR)
