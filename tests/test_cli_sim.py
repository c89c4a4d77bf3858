"""``elasticps sim`` on the command line: every argument checked before anything runs,
a one-line verdict against the baseline, defaults and the workload format in --help."""

from __future__ import annotations

import dataclasses

import pytest

from elasticps.cli.main import main
from elasticps.cli.sim import SIM_POLICIES, WORKLOAD_HELP, verdict
from elasticps.sched.policies import POLICIES
from elasticps.sim.workload import KINDS, WorkloadJob


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--compare", "static,elastc"], "argument --compare: no policy 'elastc': did you mean 'elastic'? "
         "(policies: static, greedy, optimus, elastic, pollux, tiresias, oracle, kind-oracle)"),
        (["--compare", ","], "argument --compare: give one or more policies"),
        (["--compare", "static,static"], "a policy named twice"),
        (["--policy", "polux"], "argument --policy: invalid choice: 'polux'"),
        (["--jobs", "0"], "argument --jobs: expected an integer above 0, got '0'"),
        (["--nodes", "-3"], "argument --nodes: expected an integer above 0, got '-3'"),
        (["--node-cpu", "nan"], "argument --node-cpu: expected a number above 0, got 'nan'"),
        (["--interval-s", "0"], "argument --interval-s: expected a number above 0"),
        (["--rescale-pause-s", "-1"], "argument --rescale-pause-s: expected a number, 0 or more"),
        (["--gpu-jobs", "1.5"], "argument --gpu-jobs: expected a share of the jobs, 0..1, got '1.5'"),
        (["--seeds", "0"], "argument --seeds: expected an integer above 0"),
        (["--job-spread", "-0.1"], "argument --job-spread: expected a number, 0 or more"),
    ],
)  # fmt: skip
def test_a_bad_argument_fails_at_once_naming_it(capsys, argv, message):
    with pytest.raises(SystemExit) as exc:
        main(["sim", *argv])
    assert exc.value.code == 2 and message in capsys.readouterr().err


def test_every_policy_is_listed_oracle_pollux_and_tiresias_included():
    from elasticps.sim.config import ORACLES

    assert set(SIM_POLICIES) == {*POLICIES, *ORACLES} and {"pollux", "tiresias", "oracle"} <= set(SIM_POLICIES)


def test_a_missing_or_bad_workload_is_one_line_before_any_run(tmp_path, capsys):
    assert main(["sim", "--workload", str(tmp_path / "none.csv")]) == 2
    assert capsys.readouterr().err == f"error: --workload {tmp_path / 'none.csv'}: no such file\n"
    bad = tmp_path / "bad.csv"
    bad.write_text("id,arrival_s,kind,samples\nj1,0,resnet-lik,1000\n")
    assert main(["sim", "--workload", str(bad), "--compare", "static,elastic"]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "kind must be one of" in err and "resnet-lik" in err


def test_verdict_against_static_else_the_first():
    assert verdict({"static": 1000.0, "elastic": 640.0}) == "elastic vs static: -36% avg JCT"
    assert verdict({"elastic": 500.0, "static": 1000.0, "oracle": 450.0}) == (
        "elastic vs static: -50% avg JCT; oracle vs static: -55% avg JCT"
    )
    assert verdict({"goodput": 100.0, "speed": 125.0}) == "speed vs goodput: +25% avg JCT"


def test_a_comparison_ends_with_its_verdict(capsys):
    assert main(["sim", "--jobs", "6", "--nodes", "2", "--compare", "elastic,static", "--quiet"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("elastic vs static: ") and last.endswith("% avg JCT"), last


def test_help_shows_defaults_and_documents_the_workload(capsys):
    with pytest.raises(SystemExit):
        main(["sim", "--help"])
    text = " ".join(capsys.readouterr().out.split())  # as wrapped at any terminal width
    assert "number of jobs (default: 300)" in text and "(default: 0.0)" in text and "(default: elastic)" in text
    assert "(default: None)" not in text and "(default: False)" not in text
    for field in dataclasses.fields(WorkloadJob):  # every column the loader takes, and every model kind
        assert f" {field.name} " in WORKLOAD_HELP or f" {field.name}," in WORKLOAD_HELP, field.name
    for kind in KINDS:
        assert f"  {kind} " in WORKLOAD_HELP, kind


def test_tick_rounds_only_reaches_the_simulator_and_changes_the_run(tmp_path):
    import json

    argv = ["sim", "--jobs", "20", "--nodes", "4", "--policy", "static", "--quiet", "--json"]
    assert main([*argv, str(tmp_path / "two.json")]) == 0
    assert main([*argv, str(tmp_path / "ticks.json"), "--tick-rounds-only"]) == 0
    two, ticks = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("two", "ticks"))
    assert two["config"]["event_rounds"] is True and ticks["config"]["event_rounds"] is False
    assert two["avg_jct_s"] < ticks["avg_jct_s"]  # jobs start as room frees, not at the next tick


def test_gpu_jobs_without_gpu_nodes_say_which_option_is_missing(capsys):
    assert main(["sim", "--gpu-jobs", "0.5", "--jobs", "5"]) == 2
    assert "give the nodes GPUs too (--node-gpu N)" in capsys.readouterr().err


def test_an_option_no_policy_of_the_run_takes_is_refused(capsys):
    cases = [
        (["--policy", "static", "--joint-trades", "4"], "--joint-trades: no policy run here (static) takes it"),
        (
            ["--compare", "static,greedy", "--objective", "efficiency", "--efficiency-threshold", "0.5"],
            "run here (static, greedy) takes it",
        ),
        (["--policy", "tiresias", "--objective", "speed"], "(those that do: optimus, elastic, kind-oracle, oracle)"),
        (["--policy", "pollux", "--objectives", "goodput,speed"], "--objectives: no policy run here (pollux)"),
    ]
    for extra, message in cases:
        assert main(["sim", "--jobs", "3", "--nodes", "2", "--quiet", *extra]) == 2, extra
        err = capsys.readouterr().err
        assert err.startswith("error: ") and message in err and len(err.splitlines()) == 1, err
    # taken by one policy of the run (the oracle decides with elastic's code): runs
    both = ["--compare", "static,oracle", "--joint-trades", "4"]
    assert main(["sim", "--jobs", "3", "--nodes", "2", "--quiet", *both]) == 0
    assert "oracle vs static" in capsys.readouterr().out


def test_options_that_do_not_go_together_are_refused_not_ignored(tmp_path, capsys):
    jobs = tmp_path / "jobs.csv"
    jobs.write_text("id,arrival_s,kind,samples\nj1,0,resnet-like,1000\n")
    cases = [
        (["--policy", "oracle", "--compare", "static,elastic"], "--policy and --compare"),
        (["--workload", str(jobs), "--jobs", "10"], "--jobs sizes a generated workload"),
        (["--workload", str(jobs), "--adaptive-jobs", "0.5"], "--adaptive-jobs applies to the synthetic workload"),
        (["--objective", "speed", "--efficiency-threshold", "0.5"], "is for the efficiency objective"),
    ]
    for extra, message in cases:
        assert main(["sim", "--nodes", "2", "--quiet", *extra]) == 2, extra
        err = capsys.readouterr().err
        assert err.startswith("error: ") and message in err and len(err.splitlines()) == 1, err
    assert main(["sim", "--workload", str(jobs), "--nodes", "2", "--quiet", "--policy", "static"]) == 0
    threshold = ["--objectives", "goodput,efficiency", "--efficiency-threshold", "0.6", "--jobs", "3"]
    assert main(["sim", "--nodes", "2", "--quiet", *threshold]) == 0
