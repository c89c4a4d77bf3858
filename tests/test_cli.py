"""The command line's own behaviour: version, and inputs that cannot work refused in one line."""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest

from elasticps import __version__
from elasticps.cli.main import main
from elasticps.errors import ConfigError


def test_version():
    out = subprocess.run([sys.executable, "-m", "elasticps.cli.main", "--version"], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == f"elasticps {__version__}"


def test_submit_of_a_missing_file_is_one_line_not_a_traceback(tmp_path, capsys):
    missing = tmp_path / "missing.yaml"
    assert main(["submit", str(missing), "--token", "t", "--url", "http://127.0.0.1:9"]) == 2
    assert capsys.readouterr().err == f"error: cannot read the job spec {missing}: No such file or directory\n"


def test_every_flag_and_argument_has_help():
    import argparse

    from elasticps.cli.main import build_parser

    missing = []

    def walk(parser: argparse.ArgumentParser, where: str) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(sub, f"{where} {name}")
            elif action.help is None and not isinstance(action, argparse._HelpAction):
                missing.append(f"{where} {action.option_strings or action.dest}")

    walk(build_parser(), "elasticps")
    assert missing == []


def test_bad_targets_and_thresholds_are_refused_before_any_work(capsys):
    assert main(["demo", "--objectives", "goodput,speed", "--target", "98"]) == 2  # a percentage, not a share
    assert "--target is an accuracy, 0..1, got 98" in capsys.readouterr().err
    assert main(["demo", "--cores-per-cpu", "0"]) == 2
    assert "--cores-per-cpu must be above 0, got 0" in capsys.readouterr().err
    assert main(["demo", "--objectives", "goodput", "--lr", "-0.1"]) == 2
    assert "--lr must be above 0, got -0.1" in capsys.readouterr().err
    assert main(["demo", "--objectives", "goodput", "--repeats", "0"]) == 2
    assert "--repeats must be at least 1, got 0" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # argparse, before anything runs
        main(["sim", "--jobs", "5", "--nodes", "2", "--quiet", "--efficiency-threshold", "-1"])
    assert "argument --efficiency-threshold: expected a number above 0, got '-1'" in capsys.readouterr().err


def test_a_server_option_its_policy_lacks_is_refused_before_ray_starts(tmp_path):
    args = ["server", "--workdir", str(tmp_path), "--policy", "static", "--rescale-cost-s", "5"]
    done = subprocess.run(
        [sys.executable, "-m", "elasticps", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == "error: policy 'static' has no option 'rescale_cost_s' (its options: none)"


def test_a_port_in_use_is_refused_in_one_line_before_ray_starts(tmp_path):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        args = ["server", "--workdir", str(tmp_path / "state"), "--port", str(port)]
        done = subprocess.run([sys.executable, "-m", "elasticps", *args], capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert done.stderr.strip() == f"error: cannot listen on 127.0.0.1:{port}: Address already in use"
    assert "Ray" not in done.stdout + done.stderr
    assert not (tmp_path / "state").exists()  # no workdir, no token files left for a server that never ran


def test_a_ray_address_malformed_or_with_nothing_there_is_refused_with_why(tmp_path):
    import socket

    from elasticps.raycluster import check_address

    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        closed = free.getsockname()[1]  # bound, not listening: a connection is refused
        with socket.socket() as gcs:
            gcs.bind(("127.0.0.1", 0))
            gcs.listen(1)
            check_address(f"127.0.0.1:{gcs.getsockname()[1]}")  # something listens: left to Ray
        refused = rf"cannot reach a Ray cluster at 127.0.0.1:{closed}: Connection refused \(tried for 1 s\)"
        with pytest.raises(ConfigError, match=refused):
            check_address(f"127.0.0.1:{closed}", refused_wait_s=1.0)
        for bad in ("bogus", "host:", ":6379", "host:0", "host:65536", "host:port"):
            with pytest.raises(ConfigError, match="expected HOST:PORT"):
                check_address(bad)
        with pytest.raises(ConfigError, match=r"an IPv6 host goes in brackets, \[::1\]:6379"):
            check_address("::1:6379")
        with pytest.raises(ConfigError, match=r"Ray Client \(ray://\) is not supported"):
            check_address("ray://127.0.0.1:10001")
        for passed in (None, "", "local", "auto"):
            check_address(passed)
        args = ["server", "--workdir", str(tmp_path / "state"), "--ray-address", f"127.0.0.1:{closed}"]
        server = subprocess.run([sys.executable, "-m", "elasticps", *args], capture_output=True, text=True, timeout=120)
        train = subprocess.run(
            [sys.executable, "-m", "elasticps", "train", "elasticps.examples.digits:program", "--ray-address", "bogus"],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    assert server.returncode == 2 and not (tmp_path / "state").exists()
    assert server.stderr.strip() == (
        f"error: cannot reach a Ray cluster at 127.0.0.1:{closed}: Connection refused (tried for 10 s)"
    )
    assert train.returncode == 2 and "Traceback" not in train.stderr
    assert train.stderr.strip() == "error: Ray address 'bogus': expected HOST:PORT (a Ray cluster's GCS), auto or local"


def test_a_ray_head_that_starts_listening_within_the_wait_is_not_refused():
    import socket
    import time

    from elasticps.raycluster import check_address

    with socket.socket() as gcs:
        gcs.bind(("127.0.0.1", 0))  # bound, not listening yet: refused, as a head still starting
        listen_at = time.monotonic() + 1.5
        timer = threading.Timer(1.5, gcs.listen, args=(1,))
        timer.start()
        try:
            check_address(f"127.0.0.1:{gcs.getsockname()[1]}", refused_wait_s=10.0)
            assert time.monotonic() >= listen_at  # it waited for the listener, and no longer than that
        finally:
            timer.cancel()


@pytest.mark.slow
def test_the_server_listens_before_it_prints_its_address(tmp_path):
    """A script that starts the server and calls it once the address is printed is
    queued, never refused (the walkthrough's submit came right after that line)."""
    import os
    import re
    import socket

    from tests.helpers import stop_session

    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    args = ["server", "--workdir", str(tmp_path / "state"), "--port", "0", "--num-cpus", "1"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "elasticps", *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env=env, start_new_session=True,
    )  # fmt: skip
    try:
        line = proc.stdout.readline()
        found = re.match(r"elasticps manager on http://127\.0\.0\.1:(\d+) ", line)
        assert found and found.group(1) != "0", line  # port 0: the port it took, not 0
        with socket.create_connection(("127.0.0.1", int(found.group(1))), timeout=10):
            pass
        # a client given the workdir finds the server on whatever port it took
        assert (tmp_path / "state" / "url").read_text() == f"http://127.0.0.1:{found.group(1)}\n"
        env.pop("ELASTICPS_URL", None)
        status = subprocess.run(
            [sys.executable, "-m", "elasticps", "status", "--workdir", str(tmp_path / "state")], capture_output=True,
            text=True, env=env, timeout=60,
        )  # fmt: skip
        assert status.returncode == 0 and status.stdout.startswith("JOB"), status.stdout + status.stderr
    finally:
        stop_session(proc)
    assert not (tmp_path / "state" / "url").exists()  # gone with the server: no stale address


@pytest.mark.parametrize(
    "argv",
    [
        ["server", "--port", "99999"],
        ["server", "--num-cpus", "-2"],
        ["server", "--interval-s", "0"],
        ["server", "--shutdown-timeout-s", "-1"],
        ["server", "--rescale-cost-s", "-1"],
        ["status", "--watch", "-1"],
        ["demo", "--epochs", "0"],
        ["train", "elasticps.examples.digits:program", "--max-steps", "0"],
        ["bench", "scheduler", "--rounds", "0"],
        ["bench", "scheduler", "--jobs", "-3"],
        ["bench", "manager", "--active", "0"],
        ["bench", "manager", "--ended", "-5"],
        ["bench", "chaos", "--faults", "0"],
        ["bench", "batches", "--seeds", "0"],
    ],
)
def test_a_value_out_of_range_is_refused_before_anything_starts(capsys, argv):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    option = next(a for a in argv if a.startswith("--"))
    assert exc.value.code == 2 and f"argument {option}: expected" in capsys.readouterr().err


@pytest.mark.slow
def test_a_module_in_the_servers_own_folder_is_not_what_its_jobs_import(tmp_path):
    """Ray puts its driver's folder on every job process's path, ahead of a job's shipped
    working_dir: a job would run the server folder's copy of a module, not the one pinned
    at its submit. Started in a folder holding a module, the server's jobs do not see it."""
    import os

    import httpx

    from tests.helpers import server_url, stop_session

    here = tmp_path / "project"
    here.mkdir()
    (here / "servers_copy.py").write_text("from elasticps.examples import digits\nprogram = digits.program()\n")
    token = "c" * 64
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "ELASTICPS_TOKEN": token}
    args = ["server", "--workdir", str(tmp_path / "state"), "--port", "0", "--num-cpus", "2"]
    log = tmp_path / "server.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "elasticps", *args], cwd=here, stdout=out, stderr=subprocess.STDOUT,
            env=env, start_new_session=True,
        )  # fmt: skip
    try:
        headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/yaml"}
        body = "name: shadow\nprogram: servers_copy:program\n"
        answer = httpx.post(f"{server_url(log, proc)}/jobs", content=body, headers=headers, timeout=120)
        assert answer.status_code == 400, answer.text
        assert "cannot import module 'servers_copy'" in answer.text and "--working-dir" in answer.text, answer.text
    finally:
        stop_session(proc)


@pytest.mark.parametrize("argv", [["status", "--bogus"], ["submit", "job.yaml", "--bogus", "1"], ["sim", "--bogus"]])
def test_an_unknown_option_is_refused_with_its_own_commands_usage(capsys, argv):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2
    assert err.startswith(f"usage: elasticps {argv[0]} ")
    assert f"elasticps {argv[0]}: error: unrecognized arguments: --bogus" in err


@pytest.mark.slow
def test_a_jobs_output_is_kept_for_logs_not_printed_in_the_servers_terminal(tmp_path):
    from elasticps.manager.client import Client
    from tests.helpers import server_url, spawn_elasticps, stop_session

    workdir = tmp_path / "state"
    args = ["server", "--workdir", str(workdir), "--port", "0", "--num-cpus", "2", "--interval-s", "1"]
    log = tmp_path / "server.log"
    proc = spawn_elasticps(args, log)
    try:
        client = Client(server_url(log, proc), (workdir / "token").read_text().strip(), timeout_s=60)
        client.submit(
            {
                "name": "printer",
                "program": "elasticps.examples.digits_loop:main",
                "args": {"epochs": 1, "log_interval": 20},
                "ps": {"min": 1, "max": 1, "cpu": 0.5},
                "workers": {"min": 1, "max": 1, "cpu": 0.5},
            }
        )
        assert client.wait("printer", timeout_s=240).state == "finished"
        printed = "".join(piece.text for piece in client.output("printer"))
        assert "[worker-0] Train Epoch: 0" in printed and "Test set: Average loss" in printed
    finally:
        stop_session(proc)
    assert "elasticps manager on http://" in log.read_text()
    assert "Train Epoch" not in log.read_text() and "Test set" not in log.read_text()


def test_nowhere_to_write_is_refused_before_any_work(tmp_path, capsys):
    afile = tmp_path / "afile"
    afile.write_text("")
    cases = [
        (["train", "elasticps.examples.digits:program", "--checkpoint-dir", str(afile)], "is a file: give a folder"),
        (["train", "elasticps.examples.digits:program", "--checkpoint-dir", ""], "'' is empty: give a folder"),
        (["train", "elasticps.examples.digits:program", "--checkpoint-dir", str(afile / "c")], "cannot make it"),
        (["export", "j", "--out", str(tmp_path)], "is a folder: give a file's name"),
        (["export", "j", "--out", str(afile / "m.pt")], "cannot make its folder"),
        (["sim", "--jobs", "2", "--nodes", "2", "--quiet", "--json", str(afile / "x.json")], "cannot make its folder"),
        (["sim", "--jobs", "2", "--nodes", "2", "--quiet", "--plot", str(afile)], "is a file: give a folder"),
    ]
    for argv, message in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("error: ") and message in err and len(err.splitlines()) == 1, err
    assert afile.read_text() == ""
    assert main(["export", "j", "--out", str(tmp_path / "m.pt"), "--args", "epochs=1"]) == 2
    assert capsys.readouterr().err == "error: export --args is for --program (a manager's job has its arguments)\n"


def test_an_export_behind_the_steps_its_job_reached_says_so(tmp_path, capsys):
    import time

    import numpy as np

    from elasticps.examples import digits
    from elasticps.manager import Store, parse_spec
    from elasticps.manager.workdir import job_dir
    from elasticps.runtime.checkpoint import Checkpoint, CheckpointStore
    from elasticps.runtime.data import DataPosition
    from elasticps.runtime.flat import flat_params
    from elasticps.runtime.shard_state import ShardState

    store = Store(tmp_path / "manager.db")  # a job that failed at step 4, its only checkpoint the one at its start
    store.add_job(parse_spec("name: j\nprogram: elasticps.examples.digits:program\n"), time.time())
    store.set_progress("j", {"step": 4, "epoch": 0})
    store.transition("j", "running", time.time())
    store.transition("j", "failed", time.time())
    store.close()
    aside = job_dir(tmp_path, "j") / "checkpoints" / "ckpt-0000000004.npz.corrupt"  # a damaged one set aside
    aside.parent.mkdir(parents=True)
    aside.write_bytes(b"not a checkpoint")
    assert main(["export", "j", "--workdir", str(tmp_path), "--out", str(tmp_path / "m.pt")]) == 2
    assert capsys.readouterr().err == "error: job 'j' (failed) has no checkpoint: it saved none before it ended\n"
    params = flat_params(digits.mlp()).astype(np.float32)
    at_start = Checkpoint(0, DataPosition(0, 0), ShardState(params, {}, {}), seed=0, optimizer="sgd", samples_seen=0)
    CheckpointStore(job_dir(tmp_path, "j") / "checkpoints").save(at_start)
    assert main(["export", "j", "--workdir", str(tmp_path), "--out", str(tmp_path / "m.pt")]) == 0
    said = capsys.readouterr()
    assert said.out.startswith(f"wrote {tmp_path / 'm.pt'}: digits-mlp, step 0, epoch 0")
    assert said.err == (
        "warning: j failed at step 4; its newest checkpoint is at step 0, so the 4 steps after it are not in this "
        "model\nwarning: step 0 is the model as it was built, before any training\n"
    )


def test_bad_ship_roots_are_refused_before_anything_is_made(tmp_path):
    args = ["server", "--workdir", str(tmp_path / "state"), "--port", "0", "--ship-roots", "relative/dir"]
    done = subprocess.run([sys.executable, "-m", "elasticps", *args], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert done.stderr == "error: --ship-roots takes existing absolute directories, got 'relative/dir'\n"
    assert not (tmp_path / "state").exists()


def test_kubernetes_options_without_kuberay_are_refused_before_anything_is_made(tmp_path):
    args = ["server", "--workdir", str(tmp_path / "state"), "--kuberay-group", "gpu", "--kubeconfig", "/nonexist"]
    done = subprocess.run([sys.executable, "-m", "elasticps", *args], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert done.stderr == (
        "error: --kuberay-group, --kubeconfig without --kuberay NAME: they say which RayCluster to grow\n"
    )
    assert not (tmp_path / "state").exists()
    # with --kuberay, credentials that are not there: one line, before Ray or the workdir
    args = ["server", "--workdir", str(tmp_path / "state"), "--kuberay", "elasticps", "--kubeconfig", "/nonexist"]
    done = subprocess.run([sys.executable, "-m", "elasticps", *args], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.startswith("error: no Kubernetes credentials: "), done.stderr
    assert len(done.stderr.splitlines()) == 1 and "Ray" not in done.stdout
    assert not (tmp_path / "state").exists()


def test_operators_mistakes_on_the_servers_files_are_one_line(tmp_path, monkeypatch):
    """A kubeconfig that is not there, a workdir whose database is no database:
    one line naming the file (what ``elasticps server`` prints as ``error: ...``);
    a token given to the server replaces the workdir's older one, for its clients."""
    from elasticps.cli.server import open_store
    from elasticps.k8s.deploy import api_client
    from elasticps.manager.workdir import api_token, write_token

    monkeypatch.delenv("KUBECONFIG", raising=False)
    with pytest.raises(ConfigError, match=r"^no Kubernetes credentials: not in a pod, and the kubeconfig /nonexist: "):
        api_client("/nonexist")
    (tmp_path / "kubeconfig").write_text("clusters: [unclosed\n")
    with pytest.raises(ConfigError, match=r"^no Kubernetes credentials: .* the kubeconfig .*kubeconfig: .*"):
        api_client(str(tmp_path / "kubeconfig"))
    (tmp_path / "kubeconfig").unlink()
    (tmp_path / "manager.db").write_bytes(b"not a database, " * 512)
    with pytest.raises(ConfigError, match=r"^cannot open the manager's database .*manager.db: file is not a database$"):
        open_store(tmp_path / "manager.db")
    old = api_token(tmp_path)
    given = "g" * 40
    write_token(tmp_path, given)
    assert api_token(tmp_path) == given != old
    assert oct((tmp_path / "token").stat().st_mode & 0o777) == "0o600"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["manager.db", "token"]  # no temporary file left
