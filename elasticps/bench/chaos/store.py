"""Faults on the manager's store: its disk full, its database locked by another
process. While either holds, the API is probed: it must answer (503 with
``Retry-After`` when it cannot write, never a 500), and a submit it acknowledges
must not be lost."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import httpx

from elasticps.bench.chaos.ledger import Probe

if TYPE_CHECKING:
    from elasticps.bench.chaos_bench import Chaos

#: Holds an exclusive transaction on the database at argv[1] until a line comes on stdin.
LOCKER = """
import sqlite3, sys
db = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=60)
db.execute("BEGIN EXCLUSIVE")
print("locked", flush=True)
sys.stdin.readline()
db.execute("COMMIT")
"""
#: How long a probe may wait for its answer (a submit resolves the program in a Ray task first).
PROBE_TIMEOUT_S = 120.0


def mount_disk(path: Path, size: str) -> bool:
    """A tmpfs of ``size`` on ``path`` for the manager's workdir (False where this machine will not mount one)."""
    path.mkdir(parents=True, exist_ok=True)
    mount = ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(path)]
    done = subprocess.run(mount, capture_output=True)
    return done.returncode == 0


def unmount_disk(path: Path) -> None:
    subprocess.run(["umount", "-l", str(path)], check=False, capture_output=True)


def full_disk(chaos: Chaos) -> str | None:
    """Fill the workdir's tmpfs to its last byte for ``hold_s`` (at least), then free it."""
    if not chaos.disk_mounted:
        return None
    filler = chaos.server.workdir / ".chaos-filler"
    with open(filler, "wb", buffering=0) as f:
        for chunk in (b"\0" * 65536, b"\0"):  # to the last byte
            with contextlib.suppress(OSError):
                while f.write(chunk):
                    pass
    try:
        held = _probe_for(chaos, "full_disk", chaos.cfg.hold_s)
    finally:
        filler.unlink()
    return f"workdir's disk full for {held:.0f} s"


def db_locked(chaos: Chaos) -> str | None:
    """An exclusive transaction on the manager's database, held by another process for ``hold_s`` (at least)."""
    db = chaos.server.workdir / "manager.db"
    locker = subprocess.Popen(
        [sys.executable, "-c", LOCKER, str(db)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert locker.stdout is not None
        if locker.stdout.readline().strip() != "locked":
            return None
        held = _probe_for(chaos, "db_locked", chaos.cfg.hold_s)
        locker.communicate("go\n", timeout=60)
    finally:
        if locker.poll() is None:
            locker.kill()
            locker.wait()
    return f"manager.db locked for {held:.0f} s"


def _probe_for(chaos: Chaos, fault: str, seconds: float) -> float:
    """Ask the API to list the jobs and to take a new one, again and again for
    ``seconds`` and until the first round of asks is answered (the fault holds
    meanwhile, so at least one of each meets it). Returns how long it probed."""
    start = time.monotonic()
    deadline = start + seconds
    while time.monotonic() < deadline:
        _probe(chaos, fault, "GET", "/jobs")
        name = chaos.next_name("probe")
        r = _probe(chaos, fault, "POST", "/jobs", json=chaos.cfg.spec(name, chaos.count % 4))
        if r is not None and r.status_code == 201:
            chaos.ledger.submitted[name] = chaos.count % 4
        time.sleep(max(0.0, min(1.0, deadline - time.monotonic())))  # not past the deadline: no probe follows
    return time.monotonic() - start


def _probe(chaos: Chaos, fault: str, method: str, path: str, **kw: object) -> httpx.Response | None:
    try:
        r = chaos.server.request(method, path, timeout=PROBE_TIMEOUT_S, **kw)
    except httpx.HTTPError as exc:
        chaos.ledger.probes.append(Probe(fault, f"{method} {path}", 0, None, f"no answer: {exc!r}"[:200]))
        return None
    detail = r.text[:200] if r.status_code >= 300 else ""
    chaos.ledger.probes.append(Probe(fault, f"{method} {path}", r.status_code, r.headers.get("Retry-After"), detail))
    return r
