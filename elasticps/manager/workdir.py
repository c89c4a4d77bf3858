"""The manager's working directory: one manager at a time, and its secrets.

The directory is its owner's alone: 0700, and every file in it 0600 (the
database holds specs, whose ``runtime_env.env_vars`` are where users put
secrets). :func:`secure_workdir` sets the server's umask to 077 (the Ray
processes it starts inherit it, so checkpoints are 0600 too) and tightens
what a start finds there.

- ``manager.lock``: an exclusive ``flock`` held while a manager runs; a
  second manager on the same directory refuses to start (two managers would
  both drive the same jobs and checkpoint directories).
- ``token``: the API's bearer token, made at first start (0600).
- ``ray-token``: the embedded Ray cluster's token (Ray's own token
  authentication), made at first start (0600).
- ``jobs.d/NAME/``: each job's files (its checkpoints, output and pinned
  code, :mod:`elasticps.manager.pinning`). A job name cannot
  hold a dot, so no job's folder is ever a secret or the database; a workdir
  of the older layout (``NAME/`` beside the secrets) is moved on start.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
from pathlib import Path
from typing import IO

from elasticps.errors import ConfigError
from elasticps.private_dir import private_dir

TOKEN_FILE = "token"
RAY_TOKEN_FILE = "ray-token"
URL_FILE = "url"  # where the server running on this workdir listens (its port may be any free one)
LOCK_FILE = "manager.lock"
#: The shortest API token a server accepts from --token or $ELASTICPS_TOKEN (the one it makes has 64).
MIN_TOKEN_CHARS = 32
#: The folder of the jobs' own files: job names have no dots, so it is never one of theirs.
JOBS_DIR = "jobs.d"
#: A job's own output (elasticps.runtime.output.JobLog), in its folder.
OUTPUT_DIR = "output"


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
        private_dir(new.parent)
        os.replace(old, new)
        moved.append(name)
    return moved


def secure_workdir(workdir: str | Path) -> None:
    """umask 077 for this process and its children; ``workdir`` made (0700) if
    missing, and what is in it made its owner's alone (folders 0700, files 0600).
    A workdir that cannot be written is a :class:`ConfigError` naming it."""
    os.umask(0o077)
    path = Path(workdir)
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        for root, _dirs, files in os.walk(path):
            os.chmod(root, 0o700)
            for name in files:
                file = Path(root) / name
                if not file.is_symlink():
                    os.chmod(file, 0o600)
    except OSError as exc:
        raise ConfigError(f"cannot use {path.resolve()} as the workdir: {exc.strerror or exc}") from None


def check_token(token: str) -> str:
    """``token`` if long enough to be a secret, else a :class:`ConfigError`."""
    if len(token) < MIN_TOKEN_CHARS:
        raise ConfigError(
            f"the API token must be at least {MIN_TOKEN_CHARS} characters (got {len(token)}); "
            "leave it out and the server makes one in WORKDIR/token"
        )
    return token


def without_token(argv: list[str]) -> list[str]:
    """``argv`` without ``--token VALUE`` / ``--token=VALUE`` (or an abbreviation
    argparse takes for it, such as ``--tok``): what the server starts itself
    again with, so the token is not on its command line for other users to read."""
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        flag = arg.split("=", 1)[0]
        if len(flag) > 2 and "--token".startswith(flag):
            skip = "=" not in arg
            continue
        out.append(arg)
    return out


class WorkdirLock:
    """Holds ``workdir/manager.lock`` until :meth:`release` (or the process ends)."""

    def __init__(self, workdir: str | Path) -> None:
        self.path = Path(workdir) / LOCK_FILE
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
        self._file: IO[str] | None = os.fdopen(fd, "a+")  # held for the manager's life
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
    _write_secret(fd, secrets.token_hex(32))
    return read_secret(path)


def _write_secret(fd: int, value: str) -> None:
    """``value`` and a newline into the file open as ``fd`` (made 0600 by its caller), on disk before it returns."""
    with os.fdopen(fd, "w") as f:
        f.write(value + "\n")
        f.flush()
        os.fsync(f.fileno())


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


def write_token(workdir: str | Path, token: str) -> None:
    """``workdir/token`` holds ``token`` (0600), replacing what it held: a server
    given its token (``--token``, ``$ELASTICPS_TOKEN``) on a workdir that has a
    file from an earlier start would otherwise leave its clients a token it refuses."""
    path = Path(workdir) / TOKEN_FILE
    with contextlib.suppress(OSError):
        if path.read_text().strip() == token:
            return
    tmp = path.with_name(f".{TOKEN_FILE}.tmp")
    try:
        _write_secret(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), token)
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise ConfigError(f"cannot write the API token to {path}: {exc.strerror or exc}") from None


def client_token(token: str | None, workdir: str | Path | None) -> tuple[str | None, str]:
    """The token a client sends: the one given (``--token``), else ``$ELASTICPS_TOKEN``,
    else the workdir's token file (``workdir``, else ``$ELASTICPS_WORKDIR``, else
    ``elasticps-state``) if it exists; and where it came from (or, when none was found,
    where it was looked for), for a 401's message."""
    if token:
        return token, "the token given"
    if os.environ.get("ELASTICPS_TOKEN"):
        return os.environ["ELASTICPS_TOKEN"], "$ELASTICPS_TOKEN"
    path = client_workdir(workdir) / TOKEN_FILE
    if path.exists():
        return read_secret(path), str(path.resolve())
    return None, f"none found: looked in --token, $ELASTICPS_TOKEN and {path.resolve()}"


DEFAULT_WORKDIR = "elasticps-state"


def client_workdir(workdir: str | Path | None) -> Path:
    """The workdir a client reads: the one given, else ``$ELASTICPS_WORKDIR``, else ``elasticps-state``."""
    return Path(workdir or os.environ.get("ELASTICPS_WORKDIR", DEFAULT_WORKDIR))


def write_url(workdir: str | Path, host: str, port: int) -> Path:
    """Say where the server listens, for clients on this machine (an address for
    every interface is reached on loopback). The server removes it when it stops;
    one killed outright leaves it, and the next server on the workdir replaces it."""
    host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)
    path = Path(workdir) / URL_FILE
    path.write_text(f"http://{f'[{host}]' if ':' in host else host}:{port}\n")
    return path


def client_url(url: str | None, workdir: str | Path | None, default: str) -> str:
    """The manager's URL a client calls: the one given (``--url``), else
    ``$ELASTICPS_URL``, else what the server running on the workdir wrote, else ``default``."""
    if url:
        return url
    if os.environ.get("ELASTICPS_URL"):
        return os.environ["ELASTICPS_URL"]
    try:
        written = (client_workdir(workdir) / URL_FILE).read_text().strip()
    except OSError:
        written = ""
    return written or default
