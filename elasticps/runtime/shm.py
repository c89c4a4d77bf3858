"""Zero-copy exchange between tasks on the same node, through POSIX shared memory.

In ``sync`` mode a worker's gradient buffer and a PS shard's parameter vector
live in shared memory. A task on the same node receives a :class:`ShmRef`
(a name and a range) instead of a copy and reads the bytes in place. The
bulk-synchronous barrier makes this safe: a worker writes its gradients only
while computing, the shard reads them only while updating, and the shard
writes its parameters only after every worker of the step has finished
reading them. Tasks on other nodes get copies through Ray's object store.

A segment is unlinked when its creator closes it or dies (Python's resource
tracker); readers do not own what they attach.
"""

from __future__ import annotations

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


def new_name(kind: str) -> str:
    return f"eps-{kind}-{uuid.uuid4().hex[:16]}"


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
