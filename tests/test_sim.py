"""The simulator: workloads, determinism, honest comparison, outputs."""

from __future__ import annotations

import dataclasses
import itertools
import json

import pytest

from elasticps import ConfigError
from elasticps.cli.main import main
from elasticps.sim import SimConfig, load_workload, simulate, synthetic_workload
from elasticps.sim.workload import WorkloadJob, save_workload


def test_workload_files_round_trip_and_bad_rows_are_named(tmp_path):
    jobs = synthetic_workload(5, seed=3)
    save_workload(jobs, tmp_path / "w.jsonl")
    assert load_workload(tmp_path / "w.jsonl") == jobs
    (tmp_path / "w.csv").write_text(
        "id,arrival_s,kind,samples,static_ps\na,0,mlp-small,1000,2\nb,5,resnet-like,1e6,1\n"
    )
    loaded = load_workload(tmp_path / "w.csv")
    assert [j.id for j in loaded] == ["a", "b"] and loaded[1].samples == 1e6
    (tmp_path / "bad.csv").write_text("id,arrival_s,kind,samples\na,0,gpt-9,1000\n")
    with pytest.raises(ConfigError, match="row 1: .*kind must be one of"):
        load_workload(tmp_path / "bad.csv")
    (tmp_path / "bad2.csv").write_text("id,arrival_s,kind,samples,colour\na,0,mlp-small,1,red\n")
    with pytest.raises(ConfigError, match=r"row 1: unknown fields \['colour'\]"):
        load_workload(tmp_path / "bad2.csv")
    # an all-reduce row's PS fields default to 0 (it has no PS), as the help says; given ones are still checked
    (tmp_path / "ar.jsonl").write_text('{"id": "g", "arrival_s": 0, "kind": "resnet50-allreduce", "samples": 1e5, '
                                       '"worker_gpu": 1}\n')  # fmt: skip
    [g] = load_workload(tmp_path / "ar.jsonl")
    assert (g.min_ps, g.max_ps, g.static_ps) == (0, 0, 0)
    (tmp_path / "ar2.csv").write_text("id,arrival_s,kind,samples,worker_gpu,max_ps\ng,0,resnet50-allreduce,1e5,1,2\n")
    with pytest.raises(ConfigError, match="all-reduce kind has no PS"):
        load_workload(tmp_path / "ar2.csv")


def test_every_job_finishes_and_the_run_is_reproducible():
    work = synthetic_workload(40, seed=1)
    a = simulate(work, SimConfig(nodes=8, policy="elastic", seed=2))
    b = simulate(work, SimConfig(nodes=8, policy="elastic", seed=2))
    assert a.metrics["jobs"] == 40
    assert a.metrics == {
        **b.metrics,
        "decision_median_ms": a.metrics["decision_median_ms"],
        "decision_p99_ms": a.metrics["decision_p99_ms"],
    }
    assert a.metrics["p50_jct_s"] <= a.metrics["p99_jct_s"] <= a.metrics["makespan_s"]
    assert 0 < a.metrics["mean_utilization"] <= 1.0


def test_a_lone_job_takes_what_the_model_says_it_should():
    # one mlp-small job alone on a big cluster: the static shape (1 PS x 2 workers) vs dynamic growth
    job = WorkloadJob(id="a", arrival_s=0, kind="mlp-small", samples=5e7, static_ps=1, static_workers=2)
    static = simulate([job], SimConfig(nodes=4, policy="static", tenant_max_share=0))
    elastic = simulate([job], SimConfig(nodes=4, policy="elastic", tenant_max_share=0))
    assert elastic.metrics["avg_jct_s"] < 0.8 * static.metrics["avg_jct_s"]
    assert max(p + w for _, p, w in elastic.allocations["a"]) > 3


def test_dynamic_policies_beat_static_on_a_loaded_cluster():
    work = synthetic_workload(120, seed=5)
    jct = {p: simulate(work, SimConfig(nodes=12, policy=p, seed=5)).metrics["avg_jct_s"] for p in ("static", "elastic")}
    assert jct["elastic"] < 0.8 * jct["static"]


def test_locality_placement_moves_fewer_bytes_than_spread():
    work = synthetic_workload(80, seed=7)
    by = {m: simulate(work, SimConfig(nodes=12, placement=m, seed=7)).metrics for m in ("locality", "spread")}
    assert by["locality"]["cross_node_bytes"] < 0.7 * by["spread"]["cross_node_bytes"]


def test_cli_compare_writes_json_and_plots(tmp_path, capsys):
    out = tmp_path / "cmp.json"
    assert (
        main(
            [
                "sim",
                "--jobs",
                "30",
                "--nodes",
                "6",
                "--compare",
                "static,elastic",
                "--quiet",
                "--json",
                str(out),
                "--plot",
                str(tmp_path / "plots"),
            ]
        )
        == 0
    )
    table = capsys.readouterr().out
    assert "static" in table and "elastic" in table and "avg_jct_s" in table
    data = json.loads(out.read_text())
    assert set(data) == {"static", "elastic"} and data["elastic"]["jobs"] == 30
    for name in ("jct_cdf.png", "utilization.png", "allocations_elastic.png"):
        assert (tmp_path / "plots" / name).stat().st_size > 5000


def test_elastic_is_within_one_percent_of_the_best_policy_on_the_documented_workload():
    # docs/simulator.md "Two kinds of round": 300 synthetic jobs on 32 nodes, seed 0 (elastic is the best there
    # and on all 8 seeds of docs/results/sim-rounds-contended.json, but one seed moves 1-2% with any code change)
    work = synthetic_workload(300, seed=0)
    jct = {
        p: simulate(work, SimConfig(nodes=32, policy=p, seed=0)).metrics["avg_jct_s"]
        for p in ("static", "greedy", "optimus", "elastic")
    }
    assert jct["elastic"] <= 1.01 * min(jct.values()), jct
    assert jct["elastic"] < 0.7 * jct["static"]


def test_the_oracle_bounds_the_others_and_elastic_captures_most_of_its_gain():
    """The oracle makes elastic's decisions knowing every true speed; on the light workload (few jobs for
    the nodes), what elastic does without knowing is measured against it."""
    from elasticps.sim import gain_captured

    work = synthetic_workload(300, seed=1)
    # rounds at ticks only: when rounds happen is not this test's subject, and event rounds take 4x as long
    config = SimConfig(nodes=96, seed=1, event_rounds=False)
    results = {p: simulate(work, dataclasses.replace(config, policy=p)) for p in ("static", "elastic", "oracle")}
    jct = {p: r.metrics["avg_jct_s"] for p, r in results.items()}
    assert jct["oracle"] < jct["elastic"] < jct["static"], jct
    share = gain_captured(results)
    assert share["static"] == 0.0 and share["oracle"] == 1.0
    assert 0.6 <= share["elastic"] < 1.0, share
    assert gain_captured({"elastic": results["elastic"]}) == {}  # needs static and oracle to mean anything


def test_a_round_starts_waiting_jobs_when_a_job_arrives_or_ends_as_the_live_manager_does():
    """Manager.run starts waiting jobs at once when a job is submitted or ends; so does the simulator by
    default (elasticps.sched.rounds). Rounds at ticks only leave an arriving job waiting for the next tick."""
    work = synthetic_workload(30, seed=5)
    tick = 300.0
    runs = {
        e: simulate(work, SimConfig(nodes=64, policy="static", seed=5, interval_s=tick, event_rounds=e))
        for e in (True, False)
    }
    starts = {e: {j: h[0][0] for j, h in r.allocations.items() if h} for e, r in runs.items()}
    arrival = {j.id: j.arrival_s for j in work}
    # an empty cluster (30 jobs on 64 nodes): with event rounds every job starts as it arrives
    assert all(starts[True][j] == arrival[j] for j in arrival), starts[True]
    # at ticks only, a job arriving between two ticks waits for the next one
    late = [j for j in arrival if starts[False][j] > arrival[j]]
    assert late and all(starts[False][j] - arrival[j] <= tick for j in late)
    assert runs[True].metrics["avg_jct_s"] < runs[False].metrics["avg_jct_s"]
    # a job that ends frees room at once: on a full cluster the next one starts at that moment
    full = simulate(work, SimConfig(nodes=2, node_cpu=64, policy="static", seed=5, tenant_change_s=1e12))
    ends = {h[-1][0] for h in full.allocations.values()}
    first = {j: h[0][0] for j, h in full.allocations.items()}
    waited = [j for j in first if first[j] > arrival[j]]
    assert waited and all(first[j] in ends for j in waited), (waited, sorted(ends))
    # those rounds never change a running job's shape: elastic does only at a tick (tenants never change);
    # between ticks only placement's compaction may move one onto fewer nodes, at the same shape
    moving = simulate(work, SimConfig(nodes=2, node_cpu=64, seed=5, interval_s=tick, tenant_change_s=1e12))
    changes = [
        t1
        for h in moving.allocations.values()
        for (_, *a), (t1, *b) in itertools.pairwise(h)
        if sum(a) and sum(b) and a != b
    ]
    assert changes and all(t % tick == 0 for t in changes), changes


def test_a_workload_that_can_never_fit_is_refused_at_once_not_simulated_for_ever(capsys):

    assert main(["sim", "--jobs", "5", "--nodes", "1", "--node-cpu", "4", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "job job-00000 cannot fit" in err and "1 nodes x 4 CPU" in err and "Traceback" not in err
    work = synthetic_workload(3, seed=0)
    big = [dataclasses.replace(work[0], static_ps=8, static_workers=16, max_ps=8, max_workers=16)]
    with pytest.raises(ConfigError, match="static shape"):
        simulate(big, SimConfig(nodes=2, policy="static"))
    simulate(big, SimConfig(nodes=2, policy="elastic"))  # elastic may run it smaller


def test_progress_is_one_line_per_tenth_when_not_a_terminal(capsys):
    from elasticps.cli.sim import _progress_printer

    progress = _progress_printer("elastic")
    for done in range(101):
        progress(done * 60.0, done, 100)
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 11 and "\r" not in "".join(lines) and lines[-1].endswith("100/100 jobs done")


def test_the_gpu_all_reduce_kind_dips_at_a_node_boundary_and_the_model_learns_it():
    from elasticps.sched import Observation, SpeedModel
    from elasticps.sched.synthetic import GPU_KINDS
    from elasticps.sim.jobs import spanned_speed

    kind = GPU_KINDS[0]

    def speed(w: int) -> float:  # 4 GPUs per node, as few nodes as hold them
        return spanned_speed(kind, 0, w, -(-w // 4), 0.25)

    assert speed(5) < speed(4) < speed(8)  # the example: 4 on one node beats 5 on two, 8 on two beats both
    model = SpeedModel(kind.batch, span=lambda p, w: -(-w // 4))
    model.fit([Observation(0, w, speed(w), -(-w // 4)) for w in (1, 2, 4, 6, 8)])
    assert model.predict(0, 5) < model.predict(0, 4) < model.predict(0, 12)
    assert model.predict(0, 12) == pytest.approx(speed(12), rel=0.05)


def test_a_workload_with_gpu_jobs_runs_and_reports_how_they_were_spread():
    work = synthetic_workload(40, seed=2, gpu_share=0.5)
    gpu = [j for j in work if j.worker_gpu > 0]
    assert gpu and all(j.max_ps == 0 and j.static_ps == 0 for j in gpu)
    plain = synthetic_workload(40, seed=2)
    same = [(a.id, a.kind, a.samples) for a in work if a.worker_gpu == 0]
    assert same == [(a.id, a.kind, a.samples) for a in plain if a.id in {s[0] for s in same}]  # PS jobs unchanged
    result = simulate(work, SimConfig(nodes=8, node_gpu=4, policy="elastic", seed=2))
    assert result.metrics["jobs"] == 40 and 0.0 <= result.metrics["gpu_jobs_over_spread"] <= 1.0
    # compaction: never spread wider than the room left that round would need
    assert result.metrics["gpu_jobs_avoidably_spread"] == 0.0
    spread = simulate(work, SimConfig(nodes=8, node_gpu=4, policy="elastic", placement="spread", seed=2))
    assert spread.metrics["gpu_jobs_avoidably_spread"] > 0.02  # the metric sees what a careless placer does (4.8%)
    with pytest.raises(ConfigError, match="cannot fit: a worker needs 4 CPU, 1 GPU"):
        simulate(work, SimConfig(nodes=8, policy="elastic"))  # GPU jobs and no GPUs: refused, not a hang
    with pytest.raises(ConfigError, match="all-reduce kind has no PS"):
        dataclasses.replace(gpu[0], max_ps=2)


def test_adaptive_batch_jobs_make_the_three_objectives_differ(capsys):
    """Jobs whose batch may grow 8x and whose noise scale starts near their batch:
    goodput finishes them sooner than speed (which takes the largest batch, however
    little each sample then teaches), efficiency spends fewer CPU-hours than goodput."""
    work = synthetic_workload(60, seed=4, adaptive_share=1.0)
    assert all(j.max_batch > 0 and j.noise_scale > 0 for j in work)
    assert synthetic_workload(60, seed=4) == [dataclasses.replace(j, max_batch=0, noise_scale=0.0) for j in work]
    config = SimConfig(nodes=16, seed=4, event_rounds=False)  # as above: ticks only, for time
    objectives = ("goodput", "speed", "efficiency")
    runs = {o: simulate(work, dataclasses.replace(config, objective=o)).metrics for o in objectives}
    assert runs["goodput"]["avg_jct_s"] < 0.8 * runs["speed"]["avg_jct_s"]
    assert runs["efficiency"]["cpu_hours"] < runs["goodput"]["cpu_hours"]
    assert all(r["batch_changes"] > 0 for r in runs.values())
    # the same through the CLI's table
    assert main(["sim", "--jobs", "20", "--nodes", "8", "--adaptive-jobs", "1", "--objectives", "goodput,speed",
                 "--quiet"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert "batch_changes" in out and out.splitlines()[1].startswith("goodput") and "speed" in out
    with pytest.raises(SystemExit):  # argparse: "no objective 'fastest' (objectives: goodput, ...)", exit 2
        main(["sim", "--jobs", "5", "--objectives", "goodput,fastest", "--quiet"])
    assert "no objective 'fastest': (objectives: goodput, speed, efficiency)" in capsys.readouterr().err


def _result(avg_jct_s: float, cpu_hours: float = 1.0):
    from elasticps.sim import SimResult

    return SimResult({}, {"avg_jct_s": avg_jct_s, "cpu_hours": cpu_hours}, [], [], {})


def test_a_seed_summary_counts_wins_among_non_oracle_policies_and_averages_the_gain():
    from elasticps.sim.seeds import seeds_verdict, summarize

    per_seed = {
        0: {n: _result(v) for n, v in {"static": 100.0, "greedy": 60.0, "elastic": 50.0, "oracle": 40.0}.items()},
        1: {n: _result(v) for n, v in {"static": 100.0, "greedy": 70.0, "elastic": 70.0, "oracle": 40.0}.items()},
        2: {n: _result(v) for n, v in {"static": 200.0, "greedy": 90.0, "elastic": 110.0, "oracle": 100.0}.items()},
    }
    summary = summarize(per_seed)
    # the oracle beats everyone on every seed but never counts as a win; a tie counts for both
    assert summary["elastic"]["best_non_oracle"] == 2 and summary["greedy"]["best_non_oracle"] == 2
    assert summary["static"]["best_non_oracle"] == 0 and "best_non_oracle" not in summary["oracle"]
    assert summary["greedy"]["mean_avg_jct_s"] == pytest.approx(220.0 / 3)
    # elastic's gain: 50/60, 30/60, 90/100
    assert summary["elastic"]["mean_gain_captured"] == pytest.approx((50 / 60 + 30 / 60 + 0.9) / 3)
    assert summary["elastic"]["min_gain_captured"] == pytest.approx(0.5)
    without_oracle = summarize({s: {n: r for n, r in res.items() if n != "oracle"} for s, res in per_seed.items()})
    assert "mean_gain_captured" not in without_oracle["elastic"]  # no oracle: no gain to capture
    with pytest.raises(ValueError, match="same policies"):
        summarize({0: per_seed[0], 1: {"static": _result(1.0)}})
    # one line: greedy and elastic won 2 seeds each, greedy's mean is lower (220/3 against 230/3);
    # against static -40%, -30%, -55%; gain 40/60, 30/60, 110/100
    assert seeds_verdict(summary) == (
        "greedy: the lowest avg JCT but the oracle's on 2 of 3 seeds; against static -42% on average, "
        "-30% on its worst seed; 76% of the oracle's gain (worst seed 50%)"
    )


def test_a_seed_summary_gives_each_runs_change_against_the_first():
    from elasticps.sim.seeds import summarize

    per_seed = {
        0: {"goodput": _result(100.0, cpu_hours=50.0), "efficiency": _result(110.0, cpu_hours=40.0)},
        1: {"goodput": _result(200.0, cpu_hours=80.0), "efficiency": _result(180.0, cpu_hours=72.0)},
    }
    summary = summarize(per_seed)
    assert "avg_jct_vs_first" not in summary["goodput"]
    assert summary["goodput"]["mean_cpu_hours"] == pytest.approx(65.0)
    jct, cpu = summary["efficiency"]["avg_jct_vs_first"], summary["efficiency"]["cpu_hours_vs_first"]
    assert (jct["min"], jct["max"]) == (pytest.approx(-0.1), pytest.approx(0.1)) and jct["mean"] == pytest.approx(0)
    assert (cpu["min"], cpu["max"]) == (pytest.approx(-0.2), pytest.approx(-0.1))
    assert cpu["mean"] == pytest.approx(-0.15)


def test_cli_seeds_runs_each_seed_and_summarizes(tmp_path, capsys):
    out = tmp_path / "seeds.json"
    args = ["sim", "--jobs", "20", "--nodes", "4", "--compare", "static,elastic,oracle", "--quiet"]
    assert main([*args, "--seed", "5", "--seeds", "2", "--json", str(out)]) == 0
    table = capsys.readouterr().out
    assert "best non-oracle" in table and "of 2" in table and "gap to bound" in table
    assert "the lowest avg JCT but the oracle's on" in table.strip().splitlines()[-1]
    data = json.loads(out.read_text())
    assert set(data["per_seed"]) == {"5", "6"} and set(data["summary"]) == {"static", "elastic", "oracle"}
    elastic = data["summary"]["elastic"]
    assert elastic["worst_p99_jct_s"] >= elastic["mean_p99_jct_s"] and elastic["worst_gap_to_bound"] > 0
    one = simulate(synthetic_workload(20, seed=6), SimConfig(nodes=4, policy="elastic", seed=6))
    assert data["per_seed"]["6"]["elastic"]["avg_jct_s"] == pytest.approx(one.metrics["avg_jct_s"])
    with pytest.raises(SystemExit):  # argparse, exit 2
        main([*args, "--seeds", "0"])
    assert "argument --seeds: expected an integer above 0, got '0'" in capsys.readouterr().err
    assert main([*args, "--seeds", "2", "--plot", str(tmp_path / "plots")]) == 2
    assert "not with --plot or --workload" in capsys.readouterr().err


def test_job_speed_spread_makes_jobs_of_one_kind_differ_reproducibly():
    # the same job five times, each alone (an hour apart), at its static shape
    work = [
        WorkloadJob(id=f"j{i}", arrival_s=3600.0 * i, kind="mlp-small", samples=1e6, static_ps=1, static_workers=2)
        for i in range(5)
    ]

    def jcts(spread: float) -> list[float]:
        config = SimConfig(nodes=4, policy="static", tenant_max_share=0, job_speed_spread=spread)
        return [round(x, 6) for x in simulate(work, config).jct_s]

    assert len(set(jcts(0.0))) == 1  # every job of a kind alike
    spread = jcts(0.3)
    assert len(set(spread)) == 5 and spread == jcts(0.3)
    with pytest.raises(ConfigError, match="at least 0"):
        simulate(work, SimConfig(nodes=4, job_speed_spread=-0.1))


def test_a_round_on_the_tenants_change_restarts_the_interval_as_the_live_manager_does(monkeypatch):
    """Manager.run decides at once when other tenants take or free room, and its interval runs from that
    round: the next full round comes a whole interval later. So does the simulator's."""
    from elasticps.sim import scheduling

    rounds: list[tuple[float, tuple[float, ...]]] = []  # (when, the tenants' CPUs per node then)
    make_policy = scheduling.make_policy

    def recording(*args, **kwargs):
        policy = make_policy(*args, **kwargs)
        decide = policy.decide

        def decide_and_record(views, cluster, state):
            if views:  # the lone job arrived at 0: its age is the clock
                rounds.append((views[0].age_s, tuple(n.used_by_others.cpu for n in cluster.nodes)))
            return decide(views, cluster, state)

        monkeypatch.setattr(policy, "decide", decide_and_record)
        return policy

    monkeypatch.setattr(scheduling, "make_policy", recording)
    job = WorkloadJob(id="a", arrival_s=0, kind="mlp-small", samples=2e8, static_ps=1, static_workers=2)
    tick = 300.0
    simulate([job], SimConfig(nodes=32, policy="static", interval_s=tick, tenant_change_s=500, event_rounds=False))
    changes = [i for i in range(1, len(rounds)) if rounds[i][1] != rounds[i - 1][1]]
    assert len(changes) >= 3, rounds  # the tenants changed, between the ticks
    assert any(rounds[i][0] % tick for i in changes), rounds
    for (t0, _), (t1, _), i in zip(rounds, rounds[1:], range(1, len(rounds)), strict=False):
        if i not in changes:  # a tick: a whole interval after the round before it, whatever made that round
            assert t1 - t0 == pytest.approx(tick), (i, rounds)
        else:
            assert t1 - t0 <= tick + 1e-6
