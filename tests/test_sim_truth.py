"""Ground truths that are not the fitted form: each surface differs from the
Optimus form where it should, the grid gives back what was measured, the
default changes nothing, and a run under each truth works end to end."""

from __future__ import annotations

import json
import statistics

import pytest

from elasticps import ConfigError
from elasticps.bench.explore_bench import load_grid
from elasticps.cli.main import main
from elasticps.cli.sim import TRUTHS as CLI_TRUTHS
from elasticps.sched.synthetic import kind_speed, optimus_samples_per_s
from elasticps.sim import SimConfig, simulate, synthetic_workload
from elasticps.sim.truth import (
    GRID_PATH,
    MEASURED_NOISE,
    NIC_SHARDS,
    OPTIMUS_TRUTH,
    SURFACES,
    TRUTHS,
    make_truth,
)
from elasticps.sim.workload import KINDS

RESNET, VGG = KINDS["resnet-like"], KINDS["vgg-like"]
LOCAL = 0.25
MIXED = make_truth("mixed", seed=0)


def same_run(a, b) -> bool:
    """Two runs' results alike but for how long the decisions took."""
    skip = {"decision_median_ms", "decision_p99_ms"}
    return {k: v for k, v in a.metrics.items() if k not in skip} == {
        k: v for k, v in b.metrics.items() if k not in skip
    } and a.allocations == b.allocations


def test_the_optimus_truth_is_the_fitted_form_itself():
    for kind in (RESNET, VGG, KINDS["resnet50-allreduce"]):
        p_range = (0,) if kind.allreduce else (1, 3, 8)
        for p in p_range:
            for w in (1, 5, 16):
                for cross in (0.0, 0.4, 1.0):
                    expected = kind_speed(kind, p, w, cross, LOCAL, 2 * kind.batch)
                    assert OPTIMUS_TRUTH.speed("optimus", kind, p, w, cross, LOCAL, 2 * kind.batch, p) == expected
                    # an all-reduce kind keeps its own form under every truth
                    if kind.allreduce:
                        assert MIXED.speed("grid", kind, p, w, cross, LOCAL, None, p) == kind_speed(
                            kind, p, w, cross, LOCAL
                        )


def test_saturation_more_shards_on_one_node_stop_helping_and_worker_growth_stops_early():
    def sat(p: int, w: int, busiest: int) -> float:
        return MIXED.speed("saturation", VGG, p, w, 1.0, LOCAL, None, busiest)

    def opt(p: int, w: int) -> float:
        return kind_speed(VGG, p, w, 1.0, LOCAL)

    # with no more than NIC_SHARDS shards on any node it is the Optimus form exactly
    assert sat(8, 4, NIC_SHARDS) == opt(8, 4) and sat(2, 4, 2) == opt(2, 4)
    # 8 shards on one node: the PS term is paid 8 / 2 = 4 times; 2 -> 8 shards gains
    # 40% under Optimus and nothing here (the per-PS t4 term even costs)
    assert opt(8, 4) > 1.3 * opt(2, 4)
    assert sat(8, 4, 8) < sat(2, 4, 2)
    # growth in workers on that node's bandwidth stops early: the best w is lower
    best_w_sat = max(range(1, 17), key=lambda w: sat(8, w, 8))
    best_w_opt = max(range(1, 17), key=lambda w: opt(8, w))
    assert best_w_sat < best_w_opt
    # one more worker past that point: slower here, still faster under Optimus
    assert sat(8, best_w_sat + 1, 8) < sat(8, best_w_sat, 8) and opt(8, best_w_sat + 1) > opt(8, best_w_sat)


def test_stragglers_more_ps_eventually_slow_the_job_and_workers_add_less():
    def strag(p: int, w: int) -> float:
        return MIXED.speed("straggler", RESNET, p, w, 1.0, LOCAL)

    def opt(p: int, w: int) -> float:
        return kind_speed(RESNET, p, w, 1.0, LOCAL)

    assert strag(1, 1) == pytest.approx(opt(1, 1))  # one shard, one worker: no one to wait for
    assert opt(8, 4) > opt(4, 4) and strag(8, 4) < strag(4, 4)  # 4 -> 8 PS: faster under Optimus, slower here
    assert strag(1, 16) / strag(1, 1) < opt(1, 16) / opt(1, 1)  # the slowest of 16 workers holds each step
    assert all(strag(p, w) < opt(p, w) for p in (2, 4, 8) for w in (2, 8, 16))


def test_the_grid_surface_gives_back_the_measured_medians_at_measured_shapes():
    runs, _, _ = load_grid(GRID_PATH)
    median = {shape: statistics.median(v) for shape, v in runs.items()}
    best_measured = max(median.values())
    for kind in (RESNET, VGG):
        best_optimus = max(optimus_samples_per_s(kind, p, w) for p in range(1, 9) for w in range(1, 17))
        scale = best_optimus / best_measured
        for (p, w), speed in median.items():  # a simulated shape counts twice the grid's tasks: 2p - 1, 2w - 1
            assert MIXED.speed("grid", kind, 2 * p - 1, 2 * w - 1, 1.0, LOCAL) == pytest.approx(speed * scale)
        best = max(MIXED.speed("grid", kind, p, w, 0.5, LOCAL) for p in range(1, 9) for w in range(1, 17))
        assert best == pytest.approx(best_optimus)  # the kind's best stays its Optimus best
    # between measured shapes: between their speeds; beyond the grid: its edge, nothing extrapolated
    between = MIXED.speed("grid", RESNET, 2, 1, 1.0, LOCAL)  # grid (1.5, 1): halfway between (1, 1) and (2, 1)
    low, high = sorted(MIXED.speed("grid", RESNET, p, 1, 1.0, LOCAL) for p in (1, 3))
    assert between == pytest.approx((low + high) / 2)
    assert MIXED.speed("grid", RESNET, 8, 16, 1.0, LOCAL) == MIXED.speed("grid", RESNET, 7, 15, 1.0, LOCAL)
    # a hole of the grid ((4, 8) was never measured) takes its row's largest measured w, (4, 6)
    assert MIXED.speed("grid", RESNET, 7, 15, 1.0, LOCAL) == MIXED.speed("grid", RESNET, 7, 11, 1.0, LOCAL)


def test_grid_and_mixed_report_with_the_measured_noise():
    assert OPTIMUS_TRUTH.noise(0.05) == 0.05
    assert make_truth("grid").noise(0.05) == MEASURED_NOISE == MIXED.noise(0.05) == 0.14


def test_mixed_draws_every_surface_per_job_reproducibly():
    work = synthetic_workload(40, seed=1)
    drawn = [MIXED.surface(j.id, KINDS[j.kind]) for j in work]
    assert set(drawn) == set(SURFACES)
    assert drawn == [make_truth("mixed", seed=0).surface(j.id, KINDS[j.kind]) for j in work]
    assert drawn != [make_truth("mixed", seed=1).surface(j.id, KINDS[j.kind]) for j in work]
    a = simulate(work, SimConfig(nodes=8, seed=2, truth="mixed"))
    b = simulate(work, SimConfig(nodes=8, seed=2, truth="mixed"))
    grid = simulate(work, SimConfig(nodes=8, seed=2, truth="grid"))
    assert a.metrics["jobs"] == 40 and same_run(a, b)
    assert a.metrics["avg_jct_s"] != grid.metrics["avg_jct_s"]
    assert a.config["truth"] == "mixed"


def test_optimus_is_the_default_and_changes_nothing(tmp_path):
    argv = ["sim", "--jobs", "20", "--nodes", "4", "--compare", "static,elastic,oracle", "--quiet", "--json"]
    assert main([*argv, str(tmp_path / "default.json")]) == 0
    assert main([*argv, str(tmp_path / "optimus.json"), "--truth", "optimus"]) == 0
    default, optimus = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("default", "optimus"))
    for policy in default:
        for run in (default, optimus):
            for key in ("decision_median_ms", "decision_p99_ms"):
                run[policy].pop(key)
        assert default[policy] == optimus[policy] and default[policy]["config"]["truth"] == "optimus"


def test_a_bad_truth_is_refused_in_one_line_listing_the_valid_ones(capsys):
    assert CLI_TRUTHS == TRUTHS
    with pytest.raises(SystemExit) as exc:
        main(["sim", "--truth", "grids"])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert exc.value.code == 2 and err.endswith("no truth 'grids': did you mean 'grid'? (truths: optimus, grid, mixed)")
    with pytest.raises(ConfigError, match=r"no truth 'real' \(truths: optimus, grid, mixed\)"):
        simulate(synthetic_workload(2), SimConfig(nodes=2, truth="real"))
    with pytest.raises(ConfigError, match="not a grid written by 'elasticps bench shapes'"):
        make_truth("grid", grid_path=GRID_PATH.parent / "no-such-grid.json")


def test_a_grid_comparison_runs_end_to_end_and_no_policy_beats_the_bound(tmp_path, capsys):
    out = tmp_path / "grid.json"
    argv = ["sim", "--truth", "grid", "--compare", "elastic,oracle", "--jobs", "40", "--nodes", "8", "--quiet"]
    assert main([*argv, "--json", str(out)]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith("oracle vs elastic: ")
    data = json.loads(out.read_text())
    for policy in ("elastic", "oracle"):
        assert data[policy]["config"]["truth"] == "grid" and data[policy]["jobs"] == 40
        assert data[policy]["gap_to_bound"] > 0
    assert data["oracle"]["avg_jct_s"] < data["elastic"]["avg_jct_s"]


def test_a_users_own_grid_is_the_truth_the_simulator_follows(tmp_path, capsys):
    """--truth-grid: a grid measured elsewhere. Here a PS-heavy job (speed grows with PS, falls with
    workers): the oracle, deciding with the truth, runs its jobs with more PS than workers."""
    rows = [{"ps": p, "workers": w, "runs": [100.0 * p / w]} for p in range(1, 5) for w in range(1, 5)]
    path = tmp_path / "ps-heavy.json"
    path.write_text(json.dumps({"grid": rows}))
    work = synthetic_workload(20, seed=3)
    own = simulate(work, SimConfig(nodes=16, seed=3, policy="oracle", truth="grid", truth_grid=str(path)))
    default = simulate(work, SimConfig(nodes=16, seed=3, policy="oracle", truth="grid"))
    shapes = [(p, w) for history in own.allocations.values() for _, p, w in history if p + w > 0]
    ps_heavy = sum(p > w for p, w in shapes)
    assert shapes and ps_heavy > 0.8 * len(shapes), shapes
    assert own.config["truth_grid"] == str(path) and own.metrics["avg_jct_s"] != default.metrics["avg_jct_s"]
    # through the CLI; and refused where no grid is read
    argv = ["sim", "--truth", "grid", "--truth-grid", str(path), "--jobs", "5", "--nodes", "4", "--quiet"]
    assert main(argv) == 0
    assert main(["sim", "--truth-grid", str(path), "--jobs", "5", "--nodes", "4", "--quiet"]) == 2
    assert "read only by the grid and mixed truths" in capsys.readouterr().err


def test_the_kind_oracle_knows_the_kinds_surfaces_not_the_jobs():
    """Under grid every job of a kind follows one surface: the kind oracle is the
    oracle. Under mixed it judges each job by the mean of the three surfaces, so it
    runs jobs of one kind alike, where the oracle fits each to its own surface."""
    from elasticps.sched.speed import SpeedModel
    from elasticps.sim.jobs import SimJob, oracle_speed

    assert MIXED.surfaces_of(VGG) == SURFACES and make_truth("grid").surfaces_of(VGG) == ("grid",)
    assert OPTIMUS_TRUTH.surfaces_of(VGG) == ("optimus",) == MIXED.surfaces_of(KINDS["resnet50-allreduce"])
    spec = synthetic_workload(1, seed=0)[0]
    job = SimJob(spec, VGG, spec.samples, SpeedModel(VGG.batch), batch=VGG.batch, surface="saturation")
    config = SimConfig(nodes=8)
    mean = oracle_speed(job, config, MIXED, SURFACES)
    each = [oracle_speed(SimJob(spec, VGG, 1, SpeedModel(VGG.batch), surface=s), config, MIXED) for s in SURFACES]
    assert mean(3, 4) == pytest.approx(statistics.fmean(f(3, 4) for f in each))
    assert oracle_speed(job, config, MIXED)(3, 4) == each[SURFACES.index("saturation")](3, 4) != mean(3, 4)
    work = synthetic_workload(40, seed=1)
    runs = {
        (truth, policy): simulate(work, SimConfig(nodes=8, seed=2, truth=truth, policy=policy))
        for truth in ("grid", "mixed")
        for policy in ("oracle", "kind-oracle")
    }
    assert same_run(runs["grid", "oracle"], runs["grid", "kind-oracle"])
    assert runs["mixed", "oracle"].allocations != runs["mixed", "kind-oracle"].allocations
