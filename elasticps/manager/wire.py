"""Plain data across the boundary between a job's processes and the manager.

A job's processes run the user's code; the manager must never run any of it.
Python objects that cross a process boundary by pickle can run code when they
are read (``__reduce__``), so nothing a job's process sends is unpickled by
the manager. The job's side answers with JSON text as ``bytes`` (which Ray
hands over as raw bytes, see :mod:`elasticps.manager.ray_runtime`), made by
:func:`answer`: ``{"ok": value}``, or ``{"error": {"type", "message",
"traceback"}}`` for any exception, ``BaseException`` included, so no exception
object ever travels either.

The manager's side parses that text (bounded in size) and builds its own
dataclasses from it with :func:`decode`, which follows the target's type hints
and checks every value on arrival: exact built-in types, ints within 2**53,
finite floats (except the figures that may honestly be NaN, such as a
diverged loss), strings and lists of bounded size.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import traceback
import types
import typing
from collections.abc import Callable
from functools import cache
from typing import Any

import numpy as np

from elasticps.errors import ConfigError, ElasticPSError, JobEndedError, JobFailedError, PlacementError, ProgramError

#: The most one answer may take; a job's report (2,000 windows, 500 events) is well under 1 MiB.
MAX_WIRE_BYTES = 16 * 1024 * 1024
MAX_INT = 2**53
MAX_STR = 64 * 1024
MAX_ITEMS = 100_000
#: Traceback text kept in an error record: its innermost lines, where the user's error is.
MAX_TRACEBACK = 8 * 1024
#: Fields whose float may be NaN or infinite: a diverged loss is a fact to show, not an attack.
NON_FINITE_OK = frozenset({"loss"})

#: elasticps's own errors, re-raised by name on the manager's side; any other is a JobFailedError.
KNOWN_ERRORS: dict[str, type[ElasticPSError]] = {
    cls.__name__: cls for cls in (ProgramError, ConfigError, PlacementError, JobFailedError, JobEndedError)
}

_PLAIN = (str, int, float, bool, type(None))
#: NumPy's scalars (our own figures are often computed with NumPy): sent as the built-in they hold.
_NUMPY_SCALARS = (np.float64, np.float32, np.int64, np.int32, np.bool_)


class NotPlainData(ProgramError):
    """A value that is not plain data where plain data must cross."""


# -- the job's side


def plain(value: Any, where: str = "value") -> Any:
    """``value`` as JSON-able built-ins: dataclasses become dicts, tuples lists.
    Every leaf must be of an exact built-in type (an ``int`` subclass is not an
    int here), else :class:`NotPlainData` names where it is."""
    kind = type(value)
    if kind in _PLAIN:
        return value
    if kind in _NUMPY_SCALARS:
        return value.item()
    if kind in (list, tuple):
        return [plain(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if kind is dict:
        for key in value:
            if type(key) is not str:
                raise NotPlainData(f"{where} has a key of type {type(key).__name__}, not str")
        return {k: plain(v, f"{where}.{k}") for k, v in value.items()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name), f"{where}.{f.name}") for f in dataclasses.fields(value)}
    raise NotPlainData(f"{where} is a {kind.__module__}.{kind.__qualname__}, not plain data")


def error_record(exc: BaseException) -> dict[str, str]:
    """What the manager learns of an exception: its type's name, its message and
    the innermost part of its traceback, as plain strings."""
    try:
        message = str(exc)
    except BaseException:  # a hostile __str__: the type's name must do
        message = "(its message could not be read)"
    try:
        trace = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    except BaseException:
        trace = ""
    return {
        "type": str(type(exc).__name__)[:200],
        "message": message[: MAX_STR // 4],
        "traceback": trace[-MAX_TRACEBACK:],
    }


def answer(call: Callable[[], Any], what: str = "answer") -> bytes:
    """Run ``call`` (job-side code) and say how it went, as JSON bytes: its plain
    result, or the error it raised, whatever its type."""
    try:
        text = json.dumps({"ok": plain(call(), what)}, allow_nan=True)
    except BaseException as exc:
        text = json.dumps({"error": error_record(exc)})
    return text.encode()


# -- the manager's side


class RemoteError(JobFailedError):
    """An error raised in a job's process, as plain text (see :func:`raise_remote`)."""

    def __init__(self, type_name: str, message: str, trace: str) -> None:
        super().__init__(f"{type_name}: {message}")
        self.type_name, self.message, self.remote_traceback = type_name, message, trace


def parse(raw: bytes, what: str) -> Any:
    """An answer made by :func:`answer`: its value, or the error it carries raised here."""
    if len(raw) > MAX_WIRE_BYTES:
        raise NotPlainData(f"{what}: {len(raw)} bytes, more than the {MAX_WIRE_BYTES} an answer may take")
    try:
        doc = json.loads(raw, parse_constant=float)
    except (ValueError, RecursionError) as exc:
        raise NotPlainData(f"{what} is not JSON: {str(exc)[:200]}") from None
    if type(doc) is not dict or len(doc) != 1 or not ({"ok", "error"} & doc.keys()):
        raise NotPlainData(f"{what} is not an answer")
    if "ok" in doc:
        return doc["ok"]
    err = doc["error"]
    if type(err) is not dict or any(type(err.get(k)) is not str for k in ("type", "message", "traceback")):
        raise NotPlainData(f"{what} carries an error record that is not plain text")
    raise_remote(err["type"][:200], err["message"][:MAX_STR], err["traceback"][-MAX_TRACEBACK:])


def raise_remote(type_name: str, message: str, trace: str) -> typing.NoReturn:
    """elasticps's own errors again under their own class; any other as a RemoteError."""
    known = KNOWN_ERRORS.get(type_name)
    if known is not None:
        exc = known(message)
        exc.remote_traceback = trace  # type: ignore[attr-defined]
        raise exc
    raise RemoteError(type_name, message, trace)


_FRAME = re.compile(r'^\s*File "([^"]+)"')


#: Where Ray unpacks a job's shipped working_dir: shown as the user's own folder, ``<working_dir>/``.
_SHIPPED = re.compile(r'[^"\s]*/runtime_resources/working_dir_files/_ray_pkg_[0-9a-f]+/')


@cache
def _folders() -> tuple[str, str, tuple[str, ...]]:
    """elasticps's folder, Python's library, and the installed packages' (inside the library, or not)."""
    import os
    import sysconfig

    import elasticps

    installed = {sysconfig.get_path("purelib"), sysconfig.get_path("platlib")}
    return (
        os.path.dirname(elasticps.__file__) + os.sep,
        sysconfig.get_path("stdlib").rstrip(os.sep) + os.sep,
        tuple(p.rstrip(os.sep) + os.sep for p in installed if p),
    )


def _users(path: str) -> bool:
    """A frame on the user's side: their code or a package they use (torch's module
    that raised), not Python's import machinery or library (``inspect`` binding
    arguments), nor elasticps's own (installed or not)."""
    ours, stdlib, installed = _folders()
    if path.startswith(("<", ours)):
        return False
    return not path.startswith(stdlib) or path.startswith(installed)


def with_trace(exc: BaseException, lines: int = 6) -> str:
    """The error's message and, if it came from a job's process, the innermost
    lines of the first traceback of its chain, where one of them is the user's
    code (elasticps's own checks and Python's import machinery say no more than
    the message: a missing module, a missing attribute)."""
    trace = getattr(exc, "remote_traceback", "") or ""
    first = re.split(r"\n(?:The above exception was the direct cause|During handling of the above)", trace)[0]
    every = [ln for ln in first.splitlines() if ln.strip()]
    users = [i for i, ln in enumerate(every) if (m := _FRAME.match(ln)) and _users(m.group(1))]
    if not users:
        return str(exc)
    excerpt = every[users[-1] :]  # from the innermost frame of the user's code to what was raised
    if len(excerpt) > lines:
        excerpt = [*excerpt[:2], "  ...", *excerpt[2 - lines :]]
    return f"{exc}\n" + _SHIPPED.sub("<working_dir>/", "\n".join(excerpt))[-1200:]


def decode(cls: Any, data: Any, where: str = "value") -> Any:
    """``data`` (parsed JSON) checked against the type ``cls`` and built into it.
    Dataclasses are built field by field (fields left out take their defaults);
    anything unexpected is a :class:`NotPlainData` naming where it is."""
    origin, args = typing.get_origin(cls), typing.get_args(cls)
    if origin in (typing.Union, types.UnionType):
        if data is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        if len(inner) == 1:
            if inner[0] is float and type(data) is float and not math.isfinite(data):
                return None  # an optional figure that is not finite is an unknown one
            return decode(inner[0], data, where)
        for option in inner:  # e.g. int | float
            try:
                return decode(option, data, where)
            except NotPlainData:
                continue
        raise NotPlainData(f"{where} is none of {cls}")
    if cls is int:
        if type(data) is not int or abs(data) > MAX_INT:
            raise NotPlainData(f"{where} must be an integer within 2**53, got {_shown(data)}")
        return data
    if cls is float:
        if type(data) is int and abs(data) <= MAX_INT:
            return float(data)
        if type(data) is not float or not (math.isfinite(data) or where.rpartition(".")[2] in NON_FINITE_OK):
            raise NotPlainData(f"{where} must be a finite number, got {_shown(data)}")
        return data
    if cls is bool or cls is str:
        if type(data) is not cls or (cls is str and len(data) > MAX_STR):
            raise NotPlainData(f"{where} must be a {cls.__name__} (at most {MAX_STR} characters), got {_shown(data)}")
        return data
    if origin is list:
        if type(data) is not list or len(data) > MAX_ITEMS:
            raise NotPlainData(f"{where} must be a list of at most {MAX_ITEMS} items, got {_shown(data)}")
        return [decode(args[0], v, f"{where}[{i}]") for i, v in enumerate(data)]
    if origin is tuple:
        if type(data) is not list or len(data) != len(args):
            raise NotPlainData(f"{where} must be a list of {len(args)} items, got {_shown(data)}")
        return tuple(decode(a, v, f"{where}[{i}]") for i, (a, v) in enumerate(zip(args, data, strict=True)))
    if origin is dict:
        if type(data) is not dict or len(data) > MAX_ITEMS:
            raise NotPlainData(f"{where} must be a mapping of at most {MAX_ITEMS} items, got {_shown(data)}")
        return {decode(args[0], k, f"{where} key"): decode(args[1], v, f"{where}.{k}") for k, v in data.items()}
    if dataclasses.is_dataclass(cls):
        if type(data) is not dict:
            raise NotPlainData(f"{where} must be a mapping, got {_shown(data)}")
        hints = _hints(cls)
        unknown = data.keys() - hints.keys()
        if unknown:
            raise NotPlainData(f"{where} has unknown fields {sorted(unknown)[:5]}")
        return cls(**{k: decode(hints[k], v, f"{where}.{k}") for k, v in data.items()})
    raise TypeError(f"decode cannot check {cls!r}")  # a type of ours the wire does not carry: a bug here


@cache
def _hints(cls: type) -> dict[str, Any]:
    names = {f.name for f in dataclasses.fields(cls) if f.init}
    return {k: v for k, v in typing.get_type_hints(cls).items() if k in names}


def _shown(data: Any) -> str:
    """A short description of a parsed JSON value for an error message."""
    text = repr(data) if type(data) in _PLAIN else type(data).__name__
    return text[:60]
