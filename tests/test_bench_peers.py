"""``elasticps bench peers``: the resize arithmetic, and every system training the same job."""

from __future__ import annotations

import itertools
import os
import pickle
import time

import numpy as np
import pytest

from elasticps import load_program
from elasticps.bench.peers import report
from elasticps.bench.peers import run as peers
from elasticps.bench.peers.resize import Timeline, change_costs, summarize
from elasticps.bench.peers.workloads import Workload
from elasticps.bench.proc_stat import cpu_seconds
from elasticps.runtime.flat import flat_params


def _steady(timeline: Timeline, t0: float, t1: float, per_s: int, workers: int) -> None:
    """A point every 0.1 s from just after ``t0`` to ``t1`` at ``per_s`` samples/s."""
    n = round((t1 - t0) * 10)
    for i in range(1, n + 1):
        timeline.add(t0 + i / 10, per_s // 10, workers, 1.0)


def test_a_stall_loses_the_samples_the_slower_rate_would_have_trained():
    tl = Timeline("restart")
    _steady(tl, 0.0, 10.0, 100, 2)
    tl.mark(10.0, 4)
    _steady(tl, 15.0, 30.0, 200, 4)  # nothing from 10 s to 15 s: a restart
    [cost] = change_costs(tl)
    # full speed at the first step at 4 workers (15.1 s); behind 100/s * 5.1 s - the 20 samples of that step
    # (rates are taken over windows that do not fall on the 0.1 s grid: within 2%)
    assert cost["seconds_to_full_speed"] == pytest.approx(5.1)
    assert cost["samples_lost"] == pytest.approx(100 * 5.1 - 20, rel=0.02)
    assert cost["rate_before"] == pytest.approx(100, rel=0.02) and cost["rate_after"] == pytest.approx(200, rel=0.02)


def test_a_live_switch_loses_nothing_and_a_shrink_counts_against_the_new_rate():
    tl = Timeline("live")
    _steady(tl, 0.0, 10.0, 100, 2)
    tl.mark(10.0, 4)
    _steady(tl, 10.0, 20.0, 200, 4)
    tl.mark(20.0, 2)
    _steady(tl, 23.0, 33.0, 100, 2)  # a 3 s stall on the way down
    grow, shrink = change_costs(tl)
    assert grow["samples_lost"] == 0 and grow["seconds_to_full_speed"] == pytest.approx(0.1)
    assert shrink["samples_lost"] == pytest.approx(100 * 3.1 - 10, rel=0.02)
    assert summarize(tl)["samples_lost"] == pytest.approx((100 * 3.1 - 10) / 2, rel=0.02)


def test_the_cpu_new_processes_took_to_start_is_kept_with_its_change():
    tl = Timeline("live")
    _steady(tl, 0.0, 10.0, 100, 2)
    tl.mark(10.0, 4)
    tl.started(2.5)
    _steady(tl, 10.0, 20.0, 200, 4)
    tl.mark(20.0, 2)  # a shrink starts nothing
    _steady(tl, 20.0, 30.0, 100, 2)
    assert [c["start_cpu_s"] for c in change_costs(tl)] == [2.5, None]
    assert tl.to_json()["start_cpu_s"] == [2.5, None]
    before, t0 = cpu_seconds(os.getpid()), time.process_time()
    while time.process_time() - t0 < 0.05:  # 50 ms of this process's CPU
        pass
    after = cpu_seconds(os.getpid())
    assert before is not None and after is not None and after - before >= 0.03  # the kernel counts in 10 ms ticks
    assert cpu_seconds(2**22 + 1) is None  # above Linux's largest pid: no such process


def test_what_standbys_cost_before_the_window_is_kept_apart_and_judged_beside_the_peers():
    def grown(paid: dict[str, float]) -> Timeline:
        tl = Timeline("elasticps_standby", before_window=paid)
        _steady(tl, 0.0, 10.0, 100, 2)
        tl.mark(10.0, 4)
        _steady(tl, 10.5, 20.0, 200, 4)  # a 0.5 s stall
        return tl

    paid = {"standby_workers": 2, "standby_start_s": 4.0, "standby_start_cpu_s": 6.0}
    costs = summarize(grown(paid))
    assert costs["samples_lost"] == summarize(grown({}))["samples_lost"] > 0  # not counted in the losses
    assert costs["before_window"] == paid and grown(paid).to_json()["before_window"] == paid
    medians = peers._median_costs([grown(paid), grown({**paid, "standby_start_cpu_s": 8.0})])
    assert medians["before_window"]["standby_start_cpu_s"] == 7.0
    assert [r["before_window"]["standby_start_cpu_s"] for r in medians["repeats"]] == [6.0, 8.0]
    out = {
        "setup": {"table_mib": {}},
        "throughput": {},
        "memory": {},
        "limit": {},
        "resize": {
            "elasticps_standby": medians,
            "torchrun": {**medians, "samples_lost": 20 * medians["samples_lost"], "before_window": {}},
        },
    }
    goals = peers.goals(out)
    assert goals["resize_standby_samples_lost_20x_fewer_than_torchrun"] is True
    assert goals["resize_standby_samples_lost_20x_fewer_than_ray_train"] is None  # not run
    assert goals["resize_samples_lost_20x_fewer_than_torchrun"] is None  # elasticps without standbys: not run
    assert "paid before the timed window: standby_workers 2, standby_start_s 4" in report.table(out)


def test_steps_redone_after_a_restart_are_not_progress():
    rows = [(0.1 * i, i, 2, 1.0) for i in range(10)]  # steps 0..9
    rows += [(5.0 + 0.1 * i, 8 + i, 4, 1.0) for i in range(6)]  # restarted from step 8: 8, 9 redone
    tl = Timeline.from_steps("restart", rows, batch=32)
    assert sum(s for _, s, _, _ in tl.points) == 32 * 14  # steps 0..13, each once
    assert tl.points[10][0] == pytest.approx(5.2)  # step 10 is the first new one after the restart


def test_the_embedding_workload_is_a_large_table_and_a_small_mlp():
    workload = Workload("embedding")
    model = workload.program().build_model()
    table = model.table.weight.numel()
    rest = sum(p.numel() for p in model.parameters()) - table
    assert table == 16_000_000 and rest < 10_000
    # elasticps's version: the same model and initial parameters, its table held by the PS
    loop = load_program(workload.ps_table_loop())
    [held] = loop.tables.tables
    assert (held.lo, held.rows, held.dim) == (0, 1_000_000, 16) and workload.table_mib() == held.nbytes / 2**20
    np.testing.assert_array_equal(loop.initial_params(), flat_params(model))


def test_the_embedding_table_takes_the_rows_asked_for_in_every_process_it_is_rebuilt_in(tmp_path):
    from elasticps.bench.peers import torchrun, torchrun_train

    config = peers.PeersConfig(workloads=("embedding",), embedding_rows=3_000_000)
    workload = config.workload("embedding")
    assert workload.program().build_model().table.weight.shape == (3_000_000, 16)
    assert workload.table_mib() == 3_000_000 * 16 * 4 / 2**20
    assert peers.setup(config)["table_mib"] == {"embedding": workload.table_mib()}
    [held] = load_program(workload.ps_table_loop()).tables.tables
    assert held.rows == 3_000_000
    # DDP ranks and Ray actors receive the Workload pickled; torchrun's workers read it from their command line
    assert pickle.loads(pickle.dumps(workload)) == workload
    args = torchrun_train.parser().parse_args(torchrun.train_args(workload, tmp_path, 1))
    assert args.workload == workload and args.workload.rows == 3_000_000


def test_goals_without_ddp_say_unknown_instead_of_failing_the_run():
    out = {
        "resize": {},
        "throughput": {"dense_mlp_10m": {"2": {"elasticps": 900.0}, "4": {"elasticps": 1500.0, "ddp_gloo": 1000.0}}},
        "memory": {},
        "setup": {"table_mib": {}},
        "limit": {},
    }
    goals = peers.goals(out)
    assert goals["dense_one_node_elasticps>=0.9x_ddp_at_W=2,4"] is True  # W = 4 alone had DDP to compare with
    del out["throughput"]["dense_mlp_10m"]["4"]["ddp_gloo"]
    assert peers.goals(out)["dense_one_node_elasticps>=0.9x_ddp_at_W=2,4"] is None
    with pytest.raises(ValueError, match="embedding_rows must be >= 1"):
        peers.PeersConfig(embedding_rows=0)


@pytest.mark.slow
def test_a_run_of_some_systems_measures_those_alone():
    config = peers.PeersConfig(
        workloads=("embedding",),
        workers=(1,),
        ps_sweep=(1,),
        repeats=1,
        steps=2,
        three_nodes=False,
        resize_systems=(),
        limit_repeats=0,
        small=True,
        systems=("elasticps", "ddp_gloo"),
    )
    out = peers.run(config)
    assert set(out["throughput"]["embedding"]["1"]) == {"elasticps", "ddp_gloo"}
    assert set(out["throughput_detail"]["embedding"]["1"]) == {"elasticps_p1", "ddp_gloo", "elasticps_chosen_ps"}
    assert set(out["memory"]["embedding"]["1"]) == {"elasticps", "ddp_gloo"}
    assert out["goals"]["embedding_elasticps>ddp_at_every_W"] is not None


@pytest.fixture(scope="module")
def quick_run():
    # 2 s at each size: the tiny workload trains hundreds of steps in that time, enough to tell the rates apart
    config = peers.PeersConfig(
        workloads=("embedding",),
        workers=(2,),
        ps_sweep=(1,),
        repeats=1,
        steps=3,
        three_nodes=False,
        resize_systems=("elasticps", "elasticps_standby", "elasticps_import_now", "torchrun"),
        resize_hold_s=2.0,
        resize_repeats=1,
        limit_repeats=0,
        small=True,
    )
    return peers.run(config)


@pytest.mark.slow
def test_every_system_trains_the_same_job_and_the_json_has_the_published_layout(quick_run, tmp_path):
    out = quick_run
    assert set(out["throughput"]) == {"embedding"}
    for name, per_w in out["throughput"].items():
        assert set(per_w) == {"2"}
        assert set(per_w["2"]) == {"elasticps", "elasticps_dense", "ddp_gloo", "plain_ps"}
        assert all(v > 0 for v in per_w["2"].values())
        cell = out["throughput_detail"][name]["2"]
        # elasticps runs the loop whose table the PS holds; elasticps_dense the TrainingProgram
        assert cell["elasticps_p1"]["ps_table"] is True and cell["elasticps_dense_p1"]["ps_table"] is False
        labels = ("elasticps_p1", "elasticps_dense_p1", "ddp_gloo", "plain_ps")
        firsts = {k: cell[k]["first_loss"] for k in labels}
        lasts = {k: cell[k]["last_loss"] for k in labels}
        # the same model, data and batches: every system's losses agree (sync PS is exact)
        assert max(firsts.values()) - min(firsts.values()) < 1e-5, firsts
        assert max(lasts.values()) - min(lasts.values()) < 1e-4, lasts
        assert all(cell[k]["trained"] for k in firsts), cell
        # each system's peak RSS per worker, and per PS where it has one, beside its throughput
        peaks = out["memory"][name]["2"]
        assert set(peaks) == set(per_w["2"])
        assert all(p["worker_peak_mib"] > 50 for p in peaks.values()), peaks  # torch alone is more
        assert peaks["ddp_gloo"]["ps_peak_mib"] is None
        assert all(peaks[s]["ps_peak_mib"] > 50 for s in ("elasticps", "elasticps_dense", "plain_ps")), peaks
    assert out["setup"]["table_mib"] == {"embedding": 5_000 * 16 * 4 / 2**20}
    figures = out["goal_figures"]["embedding"]["2"]
    assert figures["elasticps_worker_peak_mib"] == out["memory"]["embedding"]["2"]["elasticps"]["worker_peak_mib"]
    assert out["goals"]["embedding_elasticps>ddp_at_every_W"] == (figures["elasticps"] > figures["ddp_gloo"])
    assert set(out["resize"]) == {"elasticps", "elasticps_standby", "elasticps_import_now", "torchrun"}
    assert "import_at_idle off" in out["resize"]["elasticps_import_now"]["how"]
    assert "import_at_idle" not in out["resize"]["elasticps"]["how"]
    for system, cost in out["resize"].items():
        assert cost["samples_lost"] >= 0 and cost["seconds_to_full_speed"] > 0, (system, cost)
        assert cost["trained"], system
        assert [c["to_workers"] for c in cost["repeats"][0]["changes"]] == [4, 2]
    # the standbys' start is paid before the timed window, and kept apart: their grow starts no process
    paid = out["resize"]["elasticps_standby"]["before_window"]
    assert paid["standby_workers"] == 2 and paid["standby_start_cpu_s"] > 0 and paid["standby_start_s"] > 0
    [grow, _] = out["resize"]["elasticps_standby"]["repeats"][0]["changes"]
    assert grow["start_cpu_s"] < paid["standby_start_cpu_s"] / 2, (grow, paid)
    assert out["resize"]["elasticps"]["before_window"] == {}
    assert out["trained"]
    assert "peak RSS, MiB (worker / PS): elasticps" in report.table(out)
    assert report.plot(out, tmp_path / "peers.png").stat().st_size > 0


@pytest.mark.slow
def test_ray_train_grows_its_worker_group_when_a_node_joins():
    # the grow only: Ray Train's shrink waits out a 60 s worker-group start timeout (see ray_train.py)
    config = peers.PeersConfig(
        workloads=(),
        three_nodes=False,
        resize_systems=("ray_train",),
        resize_sizes=(2, 4),
        resize_hold_s=3.0,
        resize_repeats=1,
        limit_repeats=0,
        small=True,
    )
    out = peers.run(config)
    cost = out["resize"]["ray_train"]
    assert cost["trained"]
    assert [c["to_workers"] for c in cost["repeats"][0]["changes"]] == [4]
    # a restart stalls: no progress from soon after the change until the new group trains, for longer than
    # any pause between steps before it. (Samples lost need not be > 0 on a loaded machine: they are counted
    # against the slower of the two rates, and 4 workers on 2 cores may train slower than 2 did.)
    timeline = out["resize_timelines"]["ray_train"]
    [(t_req, _)] = timeline["changes"]
    times = [t for t, _, _ in timeline["steps"]]
    before = [b - a for a, b in itertools.pairwise(times) if b <= t_req]
    after = [b - a for a, b in itertools.pairwise(times) if b > t_req]
    assert cost["seconds_to_full_speed"] > 0
    assert before and after and max(after) > max(1.0, 3 * max(before)), (max(before), max(after))


def test_a_resize_only_run_needs_no_worker_counts():
    config = peers.PeersConfig(workloads=(), workers=(), resize_systems=("elasticps",))
    assert config.workers == () and config.resize_systems == ("elasticps",)
    with pytest.raises(ValueError, match="workers, repeats and steps must be >= 1"):
        peers.PeersConfig(workloads=("embedding",), workers=())


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--workloads", "resnet"], "unknown workload 'resnet'"),
        (["--resize-systems", "horovod"], "unknown resize systems ['horovod']"),
        (["--workers", "0"], "workers, repeats and steps must be >= 1"),
        (["--workers", ""], "workers, repeats and steps must be >= 1"),
        (["--steps", "0"], "an integer above 0"),
        (["--repeats", "0"], "an integer above 0"),
        (["--workloads", "", "--resize-systems", ""], "nothing to measure"),
        (["--systems", "horovod"], "unknown systems ['horovod']"),
        (["--systems", "ddp_gloo"], "systems must include elasticps"),
        (["--systems", ""], "systems must include elasticps"),
        (["--model", "mlp10m"], "bench peers does not take --model (bench shapes does)"),
    ],
)
def test_bad_options_are_refused_before_anything_starts(args, says, capsys):
    from elasticps.cli import main

    try:
        code = main(["bench", "peers", "--quick", *args])
    except SystemExit as exc:  # argparse's own refusals
        code = exc.code
    assert code == 2 and says in capsys.readouterr().err


def test_bench_peers_command_passes_systems_and_table_rows_to_the_run(monkeypatch):
    from elasticps.cli import main

    class Seen(Exception):
        pass

    def run(config, say):
        raise Seen(config)

    monkeypatch.setattr(peers, "run", run)
    with pytest.raises(Seen) as seen:
        main(["bench", "peers", "--systems", "elasticps,ddp_gloo", "--embedding-rows", "3000000"])
    [config] = seen.value.args
    assert config.systems == ("elasticps", "ddp_gloo") and config.embedding_rows == 3_000_000
    # the control with import_at_idle off runs when named, not by default
    assert "elasticps_import_now" not in config.resize_systems
    with pytest.raises(Seen) as seen:
        main(["bench", "peers", "--workloads", "", "--resize-systems", "elasticps,elasticps_import_now"])
    [config] = seen.value.args
    assert config.resize_systems == ("elasticps", "elasticps_import_now") and config.workloads == ()


def test_the_import_now_control_is_a_job_with_import_at_idle_off(monkeypatch):
    from elasticps.bench.peers import elasticps_ps

    class Started(Exception):
        pass

    def job(program, config, *args, **kwargs):  # what the run would start, recorded before anything starts
        raise Started(config)

    class Workload:
        def program(self):
            return None

    monkeypatch.setattr(elasticps_ps, "JobController", job)
    seen = {}
    for idle in (True, False):
        with pytest.raises(Started) as started:
            elasticps_ps.resize(Workload(), (2, 4), 1.0, import_at_idle=idle)
        [config] = started.value.args
        seen[idle] = config.import_at_idle
    assert seen == {True: True, False: False}
    with pytest.raises(ValueError, match="one control at a time"):
        elasticps_ps.resize(Workload(), (2, 4), 1.0, standby=2, import_at_idle=False)
