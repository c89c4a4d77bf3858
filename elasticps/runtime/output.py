"""A job's own output: what its driver, PS and workers print, tagged by task
(``[worker-1] ...``), kept in a bounded log in the job's folder.

Each process of a job tees its ``sys.stdout`` and ``sys.stderr`` (and so
Python's logging to them, and tracebacks) into complete lines. The driver
writes its own lines and those its tasks send it (an actor call every
:data:`SEND_EVERY_S`) to a :class:`JobLog`: wherever a task runs, its output
reaches the driver, on the manager's node, which alone writes the files. The
streams still go where they went before (Ray's worker logs).

A :class:`JobLog` is a folder of files named by the byte offset of their first
byte in the job's whole output; a new file starts when the newest passes half
of ``max_bytes`` and the oldest beyond ``max_bytes`` are removed, so a reader
can follow by offset and is told how much was dropped.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from elasticps.private_dir import private_dir

#: What a job's output log keeps at most (the newest output).
MAX_LOG_BYTES = 1 << 20
#: Longest line kept (longer ones are cut).
MAX_LINE = 4096
#: A task's lines are sent to the driver this often.
SEND_EVERY_S = 0.2
#: How long a task waits for the driver to have written its last lines (:func:`flush_now`).
FLUSH_WAIT_S = 5.0

_FILE = re.compile(r"^(\d{15})\.log$")


class JobLog:
    """A job's output files in ``directory`` (made 0700; files 0600)."""

    def __init__(self, directory: str | os.PathLike[str], max_bytes: int = MAX_LOG_BYTES) -> None:
        self.dir = Path(directory)
        self.max_bytes = max_bytes
        self._lock = threading.Lock()

    def _files(self) -> list[tuple[int, Path]]:
        try:
            names = os.listdir(self.dir)
        except FileNotFoundError:
            return []
        return sorted((int(m.group(1)), self.dir / n) for n in names if (m := _FILE.match(n)))

    def write(self, lines: list[str]) -> None:
        data = "".join(line[:MAX_LINE] + "\n" for line in lines).encode("utf-8", "replace")
        if not data:
            return
        with self._lock:
            private_dir(self.dir)
            files = self._files()
            start, path = files[-1] if files else (0, self.dir / f"{0:015d}.log")
            size = path.stat().st_size if path.exists() else 0
            if size >= self.max_bytes // 2:
                start, size = start + size, 0
                path = self.dir / f"{start:015d}.log"
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            with os.fdopen(fd, "ab") as f:
                f.write(data)
            for _, old in self._files()[:-2]:  # the newest two: at most about max_bytes
                old.unlink(missing_ok=True)

    def read(self, after: int = 0, limit: int = 256 * 1024) -> tuple[str, int, int]:
        """``(text, next offset, bytes dropped before it)``: the output from byte
        ``after`` on (whole lines, at most ``limit`` bytes; from the oldest kept
        if ``after`` was dropped)."""
        files = self._files()
        if not files:
            return "", after, 0
        dropped = max(0, files[0][0] - after)
        pos, chunks, taken = max(after, files[0][0]), [], 0
        for start, path in files:
            with contextlib.suppress(FileNotFoundError), open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if start + size <= pos:
                    continue
                f.seek(max(0, pos - start))
                data = f.read(max(0, limit - taken))
                cut = data.rfind(b"\n") + 1  # whole lines only
                chunks.append(data[:cut])
                taken += cut
                pos = start + max(0, pos - start) + cut
                if cut < len(data) or taken >= limit:
                    break
        return b"".join(chunks).decode("utf-8", "replace"), pos, dropped


class _Lines:
    """Complete lines from a process's streams, tagged, handed to ``send`` in
    batches: at once (``every_s`` None) or from a daemon thread."""

    def __init__(self, tag: str, send: Callable[[list[str]], Any], every_s: float | None) -> None:
        self.tag, self.send = tag, send
        self._partial: dict[str, str] = {}
        self._ready: list[str] = []
        self._lock = threading.Lock()
        self._sending = threading.RLock()  # a print from within send() sends again
        self._last_sent: Any = None
        self._every_s = every_s
        if every_s is not None:
            threading.Thread(target=self._loop, name="elasticps-output", daemon=True).start()

    def add(self, stream: str, text: str) -> None:
        with self._lock:
            head, *rest = (self._partial.pop(stream, "") + text).split("\n")
            if rest:
                *done, tail = [head, *rest]
                self._ready += [f"[{self.tag}] {line}" for line in done]
                head = tail
            if head:
                self._partial[stream] = head[: MAX_LINE * 4]
        if self._every_s is None:
            self.flush()

    def flush(self) -> Any:
        """Hand the complete lines to ``send``; what it returned for the last lines
        sent (now or before: a flush racing the background one waits for it)."""
        with self._sending:
            with self._lock:
                ready, self._ready = self._ready, []
            if ready:
                with contextlib.suppress(Exception):  # the driver may be gone; the streams still have it all
                    self._last_sent = self.send(ready)
            return self._last_sent

    def _loop(self) -> None:
        stop = threading.Event()
        while not stop.wait(self._every_s):
            self.flush()


class _Tee:
    """A text stream that writes through to ``original`` and tells ``lines`` too."""

    def __init__(self, original: TextIO, lines: _Lines, name: str) -> None:
        self._original, self._lines, self._name = original, lines, name

    def write(self, text: str) -> int:
        n = self._original.write(text)
        self._lines.add(self._name, text)
        return n

    def flush(self) -> None:
        self._original.flush()

    def __getattr__(self, attr: str) -> Any:  # fileno, isatty, encoding, ...: the original's
        return getattr(self._original, attr)


_lines: _Lines | None = None  # this process's, once captured


def capture(tag: str, send: Callable[[list[str]], Any], every_s: float | None = SEND_EVERY_S) -> None:
    """Tee this process's stdout and stderr into tagged lines for ``send`` (once per process)."""
    global _lines
    if isinstance(sys.stdout, _Tee):
        return
    _lines = lines = _Lines(tag, send, every_s)
    sys.stdout = _Tee(sys.stdout, lines, "stdout")  # type: ignore[assignment]
    sys.stderr = _Tee(sys.stderr, lines, "stderr")  # type: ignore[assignment]


def flush_now(timeout_s: float = FLUSH_WAIT_S) -> None:
    """Send this process's complete lines now and wait (at most ``timeout_s``) until
    its job's driver has written them: a task about to be stopped, or whose job is
    about to be reported ended, would otherwise take its last lines with it."""
    if _lines is None:
        return
    sent = _lines.flush()
    if sent is not None:
        import ray

        with contextlib.suppress(Exception):
            ray.wait([sent], timeout=timeout_s)


@dataclass(frozen=True)
class TaskOutput:
    """Where a task process sends its output: its job's driver (an actor with
    ``write_output``), under the task's name."""

    driver: Any
    task: str

    def install(self) -> None:
        driver = self.driver
        capture(self.task, lambda lines: driver.write_output.remote(lines))


_driver: Any = None  # in a job's driver process: its own actor handle, for the tasks it starts


def serve_tasks(driver: Any) -> None:
    """In a job's driver: tasks started from now on send their output to ``driver``."""
    global _driver
    _driver = driver


def for_task(task: str | None) -> TaskOutput | None:
    """What a task named ``task`` is started with (None outside a job's driver)."""
    return TaskOutput(_driver, task) if _driver is not None and task else None
