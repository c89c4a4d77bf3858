"""``elasticps.torch.tables_on_ps``: a model whose ``torch.nn.Embedding`` tables the
PS holds, built from its class as it is.

``model = ept.tables_on_ps(Recommender, users, items, dim)`` is
``Recommender(users, items, dim)`` in which every ``torch.nn.Embedding`` built
during the call, in the calling thread, is an
:class:`~elasticps.loop.embedding.Embedding`: in one process and in the
describe run that is ``nn.Embedding`` with a class of its own (the describe run
learns which tables the PS holds); in a job's worker it allocates nothing.

How: ``torch.nn.Embedding`` is one class object, whatever name the model's
code reaches it by (``nn.Embedding``, ``torch.nn.Embedding``, a ``from torch.nn
import Embedding`` bound at import), so the call replaces that class's
``__init__`` while it runs. The replacement gives an instance of exactly
``nn.Embedding`` the class ``Embedding`` *before* torch's ``__init__`` runs,
so a worker's weight is never allocated, and runs ``Embedding.__init__`` (its
checks included). Subclasses of ``nn.Embedding`` (a forward of their own),
``nn.EmbeddingBag`` and tables built by other threads are left as they are.
``__init__`` is put back when the last call running in the process returns or
raises.
"""

from __future__ import annotations

import functools
import inspect
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import torch

from elasticps.errors import ProgramError
from elasticps.loop import api
from elasticps.loop.embedding import Embedding, refused_options

M = TypeVar("M")

_SIGNATURE = inspect.signature(torch.nn.Embedding.__init__)
_lock = threading.Lock()
_installed: list[Any] = []  # the __init__ replaced, while calls run
_calls = 0  # calls running, in any thread
_local = threading.local()  # .frames: this thread's calls, innermost last: [min_rows, tables built]


def tables_on_ps(build: Callable[..., M], /, *args: Any, min_rows: int = 0, **kwargs: Any) -> M:
    """``build(*args, **kwargs)`` (a model class or a function that builds one)
    with the PS holding every ``torch.nn.Embedding`` of at least ``min_rows``
    rows that it builds: in a job's worker those allocate nothing, and a worker
    reads and pushes the rows its batch uses, as for ``elasticps.torch.Embedding``.
    Smaller tables stay ordinary ones each worker holds. A table with
    ``max_norm``, ``scale_grad_by_freq`` or ``sparse=True`` is refused (raise
    ``min_rows`` above its rows to leave it with the workers); so is a call that
    builds no table."""
    if not callable(build):
        raise ProgramError(f"tables_on_ps(build, ...): build is a {type(build).__name__}, not a class or function")
    if not (isinstance(min_rows, int) and min_rows >= 0):
        raise ProgramError(f"tables_on_ps: min_rows must be an int >= 0, got {min_rows!r}")
    frames = _frames()
    frame = [min_rows, 0]
    _install()
    frames.append(frame)
    try:
        model = build(*args, **kwargs)
    finally:
        frames.pop()
        _uninstall()
    api.rng_point()  # a worker draws no values for its tables: its generator goes where the describe run's was
    if frame[1] == 0:
        raise ProgramError(
            f"tables_on_ps({getattr(build, '__name__', build)!r}, ...) built no torch.nn.Embedding of at least "
            f"{min_rows} rows for the PS to hold (subclasses of nn.Embedding and nn.EmbeddingBag stay as they "
            "are): build the model directly"
        )
    return model


def _frames() -> list[list[int]]:
    if not hasattr(_local, "frames"):
        _local.frames = []
    return _local.frames


def _install() -> None:
    global _calls
    with _lock:
        if _calls == 0:
            original = torch.nn.Embedding.__dict__["__init__"]
            _installed.append(original)
            torch.nn.Embedding.__init__ = functools.wraps(original)(_converting(original))  # type: ignore[method-assign]
        _calls += 1


def _uninstall() -> None:
    global _calls
    with _lock:
        _calls -= 1
        if _calls == 0:
            torch.nn.Embedding.__init__ = _installed.pop()  # type: ignore[method-assign]


def _converting(original: Callable[..., None]) -> Callable[..., None]:
    def __init__(self: torch.nn.Embedding, *args: Any, **kwargs: Any) -> None:
        frames = _frames()
        if type(self) is not torch.nn.Embedding or not frames:
            return original(self, *args, **kwargs)
        given = _SIGNATURE.bind(self, *args, **kwargs).arguments
        frame = frames[-1]
        if given["num_embeddings"] < frame[0]:
            return original(self, *args, **kwargs)
        unsupported = refused_options(**given)
        if unsupported:
            rows = given["num_embeddings"]
            raise ProgramError(
                f"tables_on_ps: an nn.Embedding({rows}, {given['embedding_dim']}) with {unsupported}, which a "
                f"table the PS holds does not take; give tables_on_ps min_rows={rows + 1} to leave it (and "
                "every table as small) with the workers"
            )
        self.__class__ = Embedding
        Embedding.__init__(self, *args, **kwargs)  # type: ignore[arg-type]
        frame[1] += 1
        return None

    return __init__
