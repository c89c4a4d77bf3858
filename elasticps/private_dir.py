"""Folders that only their owner may enter, whatever the process's umask.

``Path.mkdir(mode=0o700, parents=True)`` gives the mode to the last folder
only: the parents it makes take the umask's default (0755 under the usual
022). A job's driver on a Ray cluster the manager did not start runs under
that cluster's umask, so a job's folder made as the parent of its
checkpoints was readable by every local user (docs/security.md)."""

from __future__ import annotations

import os
from pathlib import Path


def private_dir(path: str | Path) -> Path:
    """``path`` and every folder made on the way to it, 0700; those that exist are left as they are."""
    path = Path(path)
    whole = Path(os.path.abspath(path))  # 'a/../b' makes b alone
    missing = []
    for folder in (whole, *whole.parents):
        if folder.exists():
            break
        missing.append(folder)
    for folder in reversed(missing):
        try:
            folder.mkdir(mode=0o700)
        except FileExistsError:
            continue  # made meanwhile by another process: not ours to change
        folder.chmod(0o700)  # a umask that masks more than 077 would take the owner's bits too
    return path
