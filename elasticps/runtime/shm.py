"""Zero-copy exchange between tasks on the same node, through POSIX shared memory.

In ``sync`` mode a worker's gradient buffer and a PS shard's parameter vector
live in shared memory. A task on the same node receives a :class:`ShmRef`
(a name and a range) instead of a copy and reads the bytes in place. The
bulk-synchronous barrier makes this safe: a worker writes its gradients only
while computing, the shard reads them only while updating, and the shard
writes its parameters only after every worker of the step has finished
reading them. Tasks on other nodes get copies through Ray's object store.

A file is unlinked when its creator closes it. Segments of tasks that died
are swept: the creator's pid is part of the name, and :func:`sweep` removes
every elasticps segment whose creator is gone. Readers own nothing.
"""

from __future__ import annotations

import contextlib
import os
import re
import uuid
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

MAX_ATTACHED = 64


@dataclass(frozen=True)
class ShmRef:
    """Elements ``[lo, hi)`` of the float32 vector in segment ``name``."""

    name: str
    lo: int
    hi: int

    @property
    def nbytes(self) -> int:
        return 4 * (self.hi - self.lo)


SHM_DIR = "/dev/shm"
_NAME = re.compile(r"^eps-[a-z]+-(\d+)-[0-9a-f]+$")


def new_name(kind: str) -> str:
    return f"eps-{kind}-{os.getpid()}-{uuid.uuid4().hex[:12]}"


def sweep(directory: str = SHM_DIR) -> int:
    """Unlink elasticps segments whose creating process is gone; returns how many."""
    removed = 0
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return 0
    for name in names:
        m = _NAME.match(name)
        if m is None or _pid_alive(int(m.group(1))):
            continue
        try:
            os.unlink(os.path.join(directory, name))
            removed += 1
        except FileNotFoundError:
            pass
    return removed


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def available() -> bool:
    """Whether this node has a shared-memory file system (Linux's /dev/shm)."""
    return os.path.isdir(SHM_DIR) and os.access(SHM_DIR, os.W_OK)


class OwnedVector:
    """A float32 vector in a shared-memory file that this process created.

    Mappings are plain ``numpy.memmap`` objects: a mapping lives as long as any
    array viewing it, so nothing here can unmap memory that is still in use.
    """

    def __init__(self, kind: str, numel: int) -> None:
        self.numel = numel
        self.name = new_name(kind)
        self.path = os.path.join(SHM_DIR, self.name)
        fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            os.ftruncate(fd, max(4, 4 * numel))
        finally:
            os.close(fd)
        self.array: np.ndarray = np.memmap(self.path, dtype=np.float32, mode="r+", shape=(numel,))

    def ref(self, lo: int = 0, hi: int | None = None) -> ShmRef:
        return ShmRef(self.name, lo, self.numel if hi is None else hi)

    def close(self) -> None:
        """Unlink the file; memory is freed when the last view of it is gone."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)


class Attachments:
    """Read-only mappings of other tasks' vectors, opened once and kept (LRU)."""

    def __init__(self) -> None:
        self._open: OrderedDict[str, np.ndarray] = OrderedDict()

    def view(self, ref: ShmRef) -> np.ndarray:
        array = self._open.get(ref.name)
        if array is None:
            array = np.memmap(os.path.join(SHM_DIR, ref.name), dtype=np.float32, mode="r")
            self._open[ref.name] = array
            while len(self._open) > MAX_ATTACHED:
                self._open.popitem(last=False)  # unmapped once no view of it is left
        else:
            self._open.move_to_end(ref.name)
        return array[ref.lo : ref.hi]

    def resolve(self, item: np.ndarray | ShmRef) -> np.ndarray:
        return self.view(item) if isinstance(item, ShmRef) else item
