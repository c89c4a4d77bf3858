"""Zero-copy exchange between tasks on the same node, through POSIX shared memory.

In ``sync`` mode a worker's gradient buffer and a PS shard's parameter vector
live in shared memory. A task on the same node receives a :class:`ShmRef`
(a name and a range) instead of a copy and reads the bytes in place. The
bulk-synchronous barrier makes this safe: a worker writes its gradients only
while computing, the shard reads them only while updating, and the shard
writes its parameters only after every worker of the step has finished
reading them. Tasks on other nodes get copies through Ray's object store.

A segment is unlinked when its creator closes it. Segments of tasks that died
are swept: the creator's pid is part of the name, and :func:`sweep` removes
every elasticps segment whose creator is gone. Readers own nothing.
"""

from __future__ import annotations

import os
import re
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from multiprocessing import resource_tracker, shared_memory

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


class OwnedVector:
    """A float32 vector in a shared-memory segment that this process created."""

    def __init__(self, kind: str, numel: int) -> None:
        self.numel = numel
        self._shm = shared_memory.SharedMemory(name=new_name(kind), create=True, size=max(4, 4 * numel))
        self.array = np.ndarray((numel,), dtype=np.float32, buffer=self._shm.buf)
        self.array[:] = 0.0

    @property
    def name(self) -> str:
        return self._shm.name

    def ref(self, lo: int = 0, hi: int | None = None) -> ShmRef:
        return ShmRef(self.name, lo, self.numel if hi is None else hi)

    def close(self) -> None:
        """Release and unlink; only valid once nothing uses ``array`` any more."""
        del self.array
        try:
            self._shm.close()
            self._shm.unlink()
        except (FileNotFoundError, BufferError):
            pass


class Attachments:
    """Read access to other tasks' segments, attached once and kept (LRU)."""

    def __init__(self) -> None:
        self._open: OrderedDict[str, tuple[shared_memory.SharedMemory, np.ndarray]] = OrderedDict()

    def view(self, ref: ShmRef) -> np.ndarray:
        entry = self._open.get(ref.name)
        if entry is None:
            shm = shared_memory.SharedMemory(name=ref.name)
            # The creator owns the segment: do not let this process's tracker unlink it at exit.
            resource_tracker.unregister(shm._name, "shared_memory")  # type: ignore[attr-defined]
            entry = (shm, np.ndarray((shm.size // 4,), dtype=np.float32, buffer=shm.buf))
            self._open[ref.name] = entry
            while len(self._open) > MAX_ATTACHED:
                self._open.popitem(last=False)  # the mapping closes when no view is left
        else:
            self._open.move_to_end(ref.name)
        view = entry[1][ref.lo : ref.hi]
        view.flags.writeable = False
        return view

    def resolve(self, item: np.ndarray | ShmRef) -> np.ndarray:
        return self.view(item) if isinstance(item, ShmRef) else item
