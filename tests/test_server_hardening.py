"""A real `elasticps server` with its embedded Ray cluster, attacked as a local
user would: the token on its command line, the modes of its files, the pages
it serves, the ports its cluster opens, a full disk and a read-only workdir.
One server for the module (a start costs seconds)."""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.helpers import mount_tiny_tmpfs, server_url, spawn_elasticps, unmount

pytestmark = pytest.mark.slow

TOKEN = "t0ken-" + "x9" * 20  # 46 characters
JOB = """name: {name}
program: elasticps.examples.digits:program
args: {{epochs: 1}}
ps: {{min: 1, max: 1, cpu: 0.5}}
workers: {{min: 1, max: 1, cpu: 0.5}}
checkpoint_every_steps: 10
"""
YAML = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/yaml"}
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """The server, on a 32 MiB tmpfs where this machine lets the test mount one
    (so the full-disk test fills a real disk), else on a plain directory."""
    root = tmp_path_factory.mktemp("hardening")
    disk = root / "disk"
    mounted = mount_tiny_tmpfs(disk, "32m")
    workdir = disk / "state"
    workdir.mkdir(parents=True)
    (workdir / "token").write_text("f" * 64 + "\n")  # from an earlier start (this one is given --token)
    log = root / "server.log"
    args = ["server", "--workdir", str(workdir), "--port", "0", "--num-cpus", "4", "--interval-s", "1"]
    args += ["--shutdown-timeout-s", "5"]
    proc = spawn_elasticps([*args, "--token", TOKEN], log)
    url = server_url(log, proc)  # port 0: the port it took, printed once it listens
    deadline = time.monotonic() + 120
    while True:
        assert proc.poll() is None, log.read_text()
        try:
            if httpx.get(f"{url}/jobs", headers=AUTH, timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.3)
    yield {"url": url, "proc": proc, "workdir": workdir, "log": log, "disk": disk if mounted else None}
    proc.terminate()
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        proc.wait()
    if mounted:
        unmount(disk)


def _session(proc: subprocess.Popen) -> list[int]:
    """Every live process of the server's session: itself, Ray's and the jobs' processes."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[3]) == proc.pid:  # the session id
                pids.append(int(entry))
    return pids


def _wait_ended(url: str, names: list[str], timeout_s: float = 300) -> dict[str, str]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        states = {j["name"]: j["state"] for j in httpx.get(f"{url}/jobs", headers=AUTH, timeout=60).json()}
        if all(states.get(n) in ("finished", "failed", "cancelled") for n in names):
            return states
        time.sleep(0.5)
    raise AssertionError(f"jobs did not end: {states}")


def test_the_token_is_on_no_command_line_and_a_short_one_is_refused(server, tmp_path):
    assert "warning: --token can be read by every local user" in server["log"].read_text()
    # the workdir's token file held another (an earlier start's): it now names the one this server takes
    assert (server["workdir"] / "token").read_text().strip() == TOKEN
    pids = _session(server["proc"])
    assert len(pids) > 3  # the server and its Ray cluster
    for pid in pids:
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            environ = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue  # ended meanwhile
        assert TOKEN.encode() not in cmdline, (pid, cmdline)
        if pid != server["proc"].pid:  # nor in what Ray's processes (and the jobs) inherit
            assert TOKEN.encode() not in environ, pid
    done = subprocess.run(
        [sys.executable, "-m", "elasticps", "server", "--workdir", str(tmp_path / "w"), "--token", "short"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "at least 32 characters (got 5)" in done.stderr, done.stderr


def test_the_embedded_cluster_listens_on_loopback_only(server):
    inodes: dict[str, int] = {}
    for pid in _session(server["proc"]):
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    inodes[target[8:-1]] = pid
        except OSError:
            continue
    listening = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            cols = line.split()
            if cols[3] == "0A" and cols[9] in inodes:  # LISTEN, of one of our processes
                listening.append((cols[1].split(":")[0], inodes[cols[9]]))
    assert len(listening) >= 4, listening  # the API, GCS, raylet, workers
    loopback = re.compile(r"^(0100007F|00000000000000000000000001000000|0000000000000000FFFF00000100007F)$")
    wide = [(addr, pid, Path(f"/proc/{pid}/comm").read_text().strip()) for addr, pid in listening]
    assert all(loopback.match(addr) for addr, _, _ in wide), wide


def test_no_documentation_pages_and_the_schema_wants_the_token(server):
    url = server["url"]
    for page in ("/docs", "/redoc"):
        assert httpx.get(url + page, timeout=60).status_code == 404
    assert httpx.get(url + "/openapi.json", timeout=60).status_code == 401
    assert "paths" in httpx.get(url + "/openapi.json", headers=AUTH, timeout=60).json()
    assert httpx.get(url + "/events", params={"after": "99999999999999999999"}, headers=AUTH).status_code == 400


def test_jobs_named_token_and_ray_token_run_apart_and_every_file_is_the_owners(server):
    url, workdir = server["url"], server["workdir"]
    secrets = {n: (workdir / n).read_bytes() for n in ("token", "ray-token")}
    for name in ("token", "ray-token"):
        r = httpx.post(f"{url}/jobs", content=JOB.format(name=name), headers=YAML, timeout=180)
        assert r.status_code == 201, r.text
    states = _wait_ended(url, ["token", "ray-token"])
    assert states == {"token": "finished", "ray-token": "finished"}, server["log"].read_text()[-3000:]
    assert {n: (workdir / n).read_bytes() for n in ("token", "ray-token")} == secrets
    assert any((workdir / "jobs.d" / "token" / "checkpoints").glob("ckpt-*.npz"))
    assert any((workdir / "jobs.d" / "ray-token" / "checkpoints").glob("ckpt-*.npz"))
    modes = {}
    for path in [workdir, *workdir.rglob("*")]:
        if not path.is_symlink():
            modes[str(path.relative_to(workdir))] = stat.S_IMODE(path.stat().st_mode)
    assert {"manager.db", "manager.db-wal", "token", "ray-token", "manager.lock"} <= set(modes)
    loose = {p: oct(m) for p, m in modes.items() if m != (0o700 if (workdir / p).is_dir() else 0o600)}
    assert loose == {}, loose


def _fill(f) -> None:
    """Write to ``f`` until the disk has not one byte left."""
    for chunk in (b"\0" * 65536, b"\0"):
        try:
            while f.write(chunk):
                pass
        except OSError:
            pass


def test_a_full_disk_answers_503_and_leaves_no_temporary_checkpoint(server):
    """A real full disk: the workdir's 32 MiB tmpfs, filled to the last byte
    while a job writes checkpoints every 10 steps."""
    if server["disk"] is None:
        pytest.skip("cannot mount a tmpfs here; tests/test_manager_api.py simulates a full disk")
    url, disk, workdir = server["url"], server["disk"], server["workdir"]
    spec = JOB.format(name="filling").replace("epochs: 1", "epochs: 3")
    assert httpx.post(f"{url}/jobs", content=spec, headers=YAML, timeout=180).status_code == 201
    deadline = time.monotonic() + 120
    while not any((workdir / "jobs.d" / "filling" / "checkpoints").glob("ckpt-*.npz")):
        assert time.monotonic() < deadline, server["log"].read_text()[-3000:]
        time.sleep(0.2)
    filler = disk / "filler"
    with open(filler, "wb", buffering=0) as f:
        _fill(f)
        # a checkpoint being written while the disk filled frees its part when its write fails: once no
        # write is under way, what it freed is filled too, or the next submission finds room
        deadline = time.monotonic() + 30
        while list(workdir.rglob(".tmp-*")) and time.monotonic() < deadline:
            time.sleep(0.05)
        _fill(f)
    stored = []  # SQLite may store a submission in pages its log already holds: the next ones need new ones
    try:
        for i in range(20):
            started = time.monotonic()
            r = httpx.post(f"{url}/jobs", content=JOB.format(name=f"no-room-{i}"), headers=YAML, timeout=180)
            assert time.monotonic() - started < 30
            if r.status_code != 201:
                break
            stored.append(f"no-room-{i}")
        assert r.status_code == 503 and r.headers["Retry-After"] == "5", (stored, r.text)
        assert len(stored) < 5, stored
        assert httpx.get(f"{url}/jobs", headers=AUTH, timeout=60).status_code == 200
        assert list(workdir.rglob(".tmp-*")) == []  # checkpoint writes that failed took their files along
    finally:
        filler.unlink()
    for name in ["filling", *stored]:
        httpx.delete(f"{url}/jobs/{name}", headers=AUTH, timeout=30)
    events = httpx.get(f"{url}/events", params={"job": "filling"}, headers=AUTH, timeout=60).json()
    assert list(workdir.rglob(".tmp-*")) == [], [e["message"] for e in events]
    r = httpx.post(f"{url}/jobs", content=JOB.format(name="no-room"), headers=YAML, timeout=180)
    assert r.status_code == 201, r.text


def test_a_read_only_workdir_is_one_line_naming_it(tmp_path):
    ro = tmp_path / "ro"
    if not mount_tiny_tmpfs(ro, "1m"):
        pytest.skip("cannot mount a read-only tmpfs here")
    try:
        subprocess.run(["mount", "-o", "remount,ro", str(ro)], check=True)
        done = _server_on(ro)
    finally:
        unmount(ro)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and str(ro) in lines[0] and "Read-only" in lines[0], done.stderr


def test_a_workdir_with_no_room_for_its_database_is_one_line_before_ray_starts(tmp_path):
    full = tmp_path / "full"
    if not mount_tiny_tmpfs(full, "64k"):
        pytest.skip("cannot mount a tmpfs here")
    try:
        done = _server_on(full / "state")
    finally:
        unmount(full)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert lines[0].startswith(f"error: cannot open the manager's database {full / 'state' / 'manager.db'}: "), lines
    assert "Ray" not in done.stdout


def _server_on(workdir: Path) -> subprocess.CompletedProcess:
    """``elasticps server`` on ``workdir``, for a test where it refuses to start (any free port)."""
    args = [sys.executable, "-m", "elasticps", "server", "--workdir", str(workdir), "--port", "0"]
    return subprocess.run(args, capture_output=True, text=True, timeout=120)
