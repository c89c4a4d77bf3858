"""``elasticps train``'s checks before any cluster starts: factory arguments, the local
cluster's CPUs, the user's package found in the current directory."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from elasticps.cli.local import _user_code_from_cwd, cmd_train, factory_args, job_config
from elasticps.cli.main import build_parser, main
from elasticps.errors import ConfigError


def test_factory_args_are_yaml_scalars_repeated_or_comma_separated():
    assert factory_args(["epochs=40", "lr=0.1,shuffle=true", "name=digits", "tag="]) == {
        "epochs": 40, "lr": 0.1, "shuffle": True, "name": "digits", "tag": "",
    }  # fmt: skip
    assert factory_args(["lr=1e-3,wd=-5E+2"]) == {"lr": 0.001, "wd": -500.0}  # YAML 1.1 left these strings
    with pytest.raises(ConfigError, match="expected NAME=VALUE"):
        factory_args(["epochs"])
    with pytest.raises(ConfigError, match="a number, a boolean or a string"):
        factory_args(["layers=[1, 2]"])
    with pytest.raises(ConfigError, match=r"--args epochs is given twice \(epochs=1 and 'epochs=2'\)"):
        factory_args(["epochs=1,epochs=2"])


def test_too_few_cpus_say_which_num_cpus_before_ray_starts(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    argv = [sys.executable, "-c", "import sys; from elasticps.cli.main import main; rc = main(sys.argv[1:]); "
            "assert 'ray' not in sys.modules; sys.exit(rc)",
            "train", "nothing.here:program", "--ps", "2", "--workers", "3", "--num-cpus", "2"]  # fmt: skip
    out = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert out.returncode == 2, out.stderr
    assert out.stderr == (
        "error: 2 PS x 3 workers need 5 CPUs (1 a task), more than --num-cpus 2: "
        "pass --num-cpus 5 (Ray shares the cores) or ask for fewer tasks\n"
    )


def test_a_runs_step_timeout_reaches_its_job_and_a_bad_one_is_refused_before_ray_starts(tmp_path):
    from elasticps.runtime.config import JobConfig

    def config(*extra: str) -> JobConfig:
        return job_config(build_parser().parse_args(["train", "nothing.here:program", *extra]))

    assert config("--step-timeout-s", "1800").step_timeout_s == 1800.0
    assert config().step_timeout_s == JobConfig().step_timeout_s
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    for bad in ("0", "-5", "inf", "nan", "ten"):
        argv = [sys.executable, "-c", "import sys; from elasticps.cli.main import main; sys.exit(main(sys.argv[1:]))",
                "train", "nothing.here:program", "--step-timeout-s", bad]  # fmt: skip
        out = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
        assert out.returncode == 2, out.stderr
        want = f"argument --step-timeout-s: expected a number of seconds > 0, got '{bad}'"
        assert want in out.stderr, out.stderr


def test_a_runs_standby_workers_reach_its_job_and_a_bad_count_is_refused():
    def parse(*extra: str):
        return build_parser().parse_args(["train", "nothing.here:program", *extra])

    assert job_config(parse("--standby-workers", "2")).standby_workers == 2
    assert job_config(parse()).standby_workers == 0
    for bad in ("-1", "1.5", "two"):
        with pytest.raises(SystemExit):
            parse("--standby-workers", bad)
    with pytest.raises(ConfigError, match=r"--standby-workers 3: .* more than --workers \(2\) are never used"):
        cmd_train(parse("--workers", "2", "--standby-workers", "3"))  # before a Ray cluster starts
    with pytest.raises(ConfigError, match="--standby-workers 1025: a job keeps at most 1024"):
        cmd_train(parse("--workers", "2000", "--standby-workers", "1025"))


def test_the_current_directory_is_on_the_path_for_the_driver_and_the_workers(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p != str(tmp_path)])
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    _user_code_from_cwd()
    assert sys.path[0] == str(tmp_path)
    assert os.environ["PYTHONPATH"].split(os.pathsep) == [str(tmp_path), "/elsewhere"]  # what Ray's workers inherit


def _train(tmp_path, *extra: str) -> subprocess.Popen:
    argv = [sys.executable, "-m", "elasticps", "train", "elasticps.examples.digits:program", "--num-cpus", "2",
            "--checkpoint-dir", str(tmp_path / "ckpt"), "--report-interval-s", "0.5", *extra]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": os.getcwd(), "RAY_AUTH_MODE": "disabled"}
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=tmp_path)


@pytest.mark.slow
def test_ctrl_c_stops_at_a_step_boundary_and_a_finished_run_starts_no_cluster(tmp_path):
    """Ctrl-C: one line saying where the checkpoint is and how to resume; that command
    then trains to the end; once more, it says 'already finished' without starting Ray."""
    import signal

    proc = _train(tmp_path, "--args", "epochs=2")
    lines = []
    for line in proc.stdout:  # the first progress line: training has started
        lines.append(line)
        if line.startswith("step "):
            proc.send_signal(signal.SIGINT)
            break
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, "".join(lines) + out
    assert "stopping at the next step boundary" in out
    resume = [ln for ln in out.splitlines() if "resume with: " in ln]
    assert resume and f"checkpoint in {tmp_path / 'ckpt'}" in resume[0], out
    assert resume[0].split("resume with: ")[1].endswith("--args epochs=2")

    done = _train(tmp_path, "--args", "epochs=2")
    out, _ = done.communicate(timeout=600)
    assert done.returncode == 0 and "finished at step" in out, out

    again = _train(tmp_path, "--args", "epochs=2")
    out, _ = again.communicate(timeout=120)
    assert again.returncode == 0, out
    assert out.startswith("already finished: ") and "epoch 2 of 2" in out, out
    assert "Ray" not in out and "running 1 PS" not in out  # no cluster was started


@pytest.mark.slow
def test_max_steps_ends_with_a_checkpoint_there_and_the_line_to_resume(tmp_path, capsys):
    from elasticps.runtime import CheckpointStore

    out, _ = _train(tmp_path, "--max-steps", "12", "--args", "model=cnn").communicate(timeout=300)
    assert f"stopped at step 12: checkpoint in {tmp_path / 'ckpt'}; resume with: " in out, out
    assert CheckpointStore(tmp_path / "ckpt").latest().step == 12
    out, _ = _train(tmp_path, "--max-steps", "5", "--args", "model=cnn").communicate(timeout=300)
    assert "resumed from checkpoint at step 12" in out and "stopped at step 17" in out, out
    # the model is the factory's with the arguments it trained with: export takes them too
    export = ["export", "--program", "elasticps.examples.digits:program", "--checkpoint-dir", str(tmp_path / "ckpt")]
    assert main([*export, "--args", "model=cnn", "--out", str(tmp_path / "m.pt")]) == 0
    assert (tmp_path / "m.pt").stat().st_size > 0
    assert main([*export, "--out", str(tmp_path / "other.pt")]) == 2  # the default (mlp) model did not train
    assert "is not of digits-mlp's model" in capsys.readouterr().err


@pytest.mark.slow
def test_a_loop_that_breaks_a_rule_says_so_once_without_rays_unhandled_errors(tmp_path):
    argv = [sys.executable, "-m", "elasticps", "train", "tests.loops:breaks_out_at", "--args", "step=5",
            "--num-cpus", "2"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": os.getcwd(), "RAY_AUTH_MODE": "disabled"}
    done = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    printed = done.stdout + done.stderr
    assert done.returncode == 2, printed
    assert printed.count("ProgramError: the loop over the DataLoader ended before epoch 0 did") == 1, printed
    assert "Unhandled error" not in printed
    # the user's line that broke it, once, on the error's own line (no traceback of elasticps's frames)
    where = re.findall(r"\(at \S*tests/loops\.py:\d+, in breaks_out_at: for _ in ept\.epochs", printed)
    assert len(where) == 1, printed
    assert "Traceback" not in printed, printed
