"""The manager's working directory: one manager at a time, and its secrets.

- ``manager.lock``: an exclusive ``flock`` held while a manager runs; a
  second manager on the same directory refuses to start (two managers would
  both drive the same jobs and checkpoint directories).
- ``token``: the API's bearer token, made at first start (0600).
- ``ray-token``: the embedded Ray cluster's token (Ray's own token
  authentication), made at first start (0600).
- ``jobs.d/NAME/``: each job's files (its checkpoints). A job name cannot
  hold a dot, so no job's folder is ever a secret or the database; a workdir
  of the older layout (``NAME/`` beside the secrets) is moved on start.
"""

from __future__ import annotations

import fcntl
import os
import secrets
from pathlib import Path
from typing import IO

from elasticps.errors import ConfigError

TOKEN_FILE = "token"
RAY_TOKEN_FILE = "ray-token"
LOCK_FILE = "manager.lock"
#: The folder of the jobs' own files: job names have no dots, so it is never one of theirs.
JOBS_DIR = "jobs.d"


def job_dir(workdir: str | Path, name: str) -> Path:
    """Where job ``name`` keeps its files (its checkpoints in ``checkpoints/``)."""
    return Path(workdir) / JOBS_DIR / name


def migrate_job_dirs(workdir: str | Path, names: list[str]) -> list[str]:
    """Move the folders of jobs ``names`` from the older layout (``workdir/NAME``)
    to :func:`job_dir`; the names moved. A job with a folder in both places is
    refused (which of them holds its checkpoints is not ours to guess)."""
    moved = []
    for name in names:
        old, new = Path(workdir) / name, job_dir(workdir, name)
        if not old.is_dir() or old.is_symlink():
            continue
        if new.exists():
            raise ConfigError(f"job {name!r} has files in both {old} and {new}; keep one of them and start again")
        new.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.replace(old, new)
        moved.append(name)
    return moved


class WorkdirLock:
    """Holds ``workdir/manager.lock`` until :meth:`release` (or the process ends)."""

    def __init__(self, workdir: str | Path) -> None:
        self.path = Path(workdir) / LOCK_FILE
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file: IO[str] | None = open(self.path, "a+")  # noqa: SIM115 (held for the manager's life)
        try:
            fcntl.flock(self._file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._file.seek(0)
            holder = self._file.read().strip() or "another process"
            self._file.close()
            self._file = None
            raise ConfigError(
                f"another elasticps manager ({holder}) is using {Path(workdir).resolve()}; "
                "stop it first, or give this one another --workdir"
            ) from None
        self._file.seek(0)
        self._file.truncate()
        self._file.write(f"pid {os.getpid()}")
        self._file.flush()

    def release(self) -> None:
        if self._file is not None:
            fcntl.flock(self._file, fcntl.LOCK_UN)
            self._file.close()
            self._file = None


def secret_file(workdir: str | Path, name: str) -> str:
    """The secret in ``workdir/name``, made (32 random bytes, hex, mode 0600) if missing."""
    path = Path(workdir) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return read_secret(path)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32) + "\n")
        f.flush()
        os.fsync(f.fileno())
    return read_secret(path)


def read_secret(path: str | Path) -> str:
    path = Path(path)
    if path.stat().st_mode & 0o077:
        raise ConfigError(f"{path} is readable by other users; run: chmod 600 {path}")
    value = path.read_text().strip()
    if not value:
        raise ConfigError(f"{path} is empty")
    return value


def ray_token_auth(workdir: str | Path) -> bool:
    """Set this process's environment for Ray's token authentication with the
    token in ``workdir/ray-token`` (made, 0600, if missing). Ray reads these
    variables once, when it is imported: True if they changed (then the process
    must start again, or not have imported Ray yet)."""
    path = str((Path(workdir) / RAY_TOKEN_FILE).resolve())
    if os.environ.get("RAY_AUTH_MODE") == "token" and os.environ.get("RAY_AUTH_TOKEN_PATH") == path:
        return False
    secret_file(workdir, RAY_TOKEN_FILE)
    os.environ.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=path)
    os.environ.pop("RAY_AUTH_TOKEN", None)
    return True


def api_token(workdir: str | Path) -> str:
    return secret_file(workdir, TOKEN_FILE)


def client_token(token: str | None, workdir: str | Path | None) -> str | None:
    """The token a client sends: ``--token``, else ``$ELASTICPS_TOKEN``, else the workdir's file if readable."""
    if token:
        return token
    if os.environ.get("ELASTICPS_TOKEN"):
        return os.environ["ELASTICPS_TOKEN"]
    path = Path(workdir or os.environ.get("ELASTICPS_WORKDIR", DEFAULT_WORKDIR)) / TOKEN_FILE
    return read_secret(path) if path.exists() else None


DEFAULT_WORKDIR = "elasticps-state"
