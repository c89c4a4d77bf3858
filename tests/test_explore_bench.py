"""The probe walk replayed against grids of speeds (``bench explore``), and the
measured grid's own helpers and a tiny real run (``bench shapes``)."""

from __future__ import annotations

import itertools
import json
import math
import os
import random

import pytest

from elasticps.bench import explore_bench, shapes_bench
from elasticps.errors import ConfigError
from elasticps.sched.synthetic import MODEL_KINDS
from elasticps.sim.jobs import spanned_speed


def _grid_file(tmp_path, kind, noise=0.05, seed=0):
    """A grid like the one 'bench shapes' writes, from a simulator kind's true
    speed on nodes of 4 CPUs, each shape measured twice with noise."""
    rng = random.Random(seed)
    grid = []
    for p, w in shapes_bench.grid_shapes(4, 8, 10):
        nodes = math.ceil((p + w) / 4)
        speed = spanned_speed(kind, p, w, nodes, 0.25)
        runs = [speed * (1 + rng.gauss(0, noise)) for _ in range(2)]
        grid.append({"ps": p, "workers": w, "samples_per_s": speed, "runs": runs, "nodes": nodes})
    path = tmp_path / f"grid-{kind.name}.json"
    path.write_text(json.dumps({"workload": {"global_batch": kind.batch}, "grid": grid}))
    return path


def test_grid_shapes_and_walk_order():
    shapes = shapes_bench.grid_shapes(3, 4, 5)
    assert (1, 4) in shapes and (2, 3) in shapes and (2, 4) not in shapes and (3, 3) not in shapes
    order = shapes_bench.walk_order(shapes)
    assert sorted(order) == sorted(shapes)
    steps = [abs(a[0] - b[0]) + abs(a[1] - b[1]) for a, b in itertools.pairwise(order)]
    assert max(steps) <= 2  # a snake: each shape close to the one before


@pytest.mark.parametrize("kind", MODEL_KINDS, ids=lambda k: k.name)
def test_the_walk_finds_a_near_best_shape_within_eight_probes(tmp_path, kind):
    out = explore_bench.run(_grid_file(tmp_path, kind))
    assert out["policy_knowing_grid"]["of_best"] >= 0.99  # growth crosses the node-boundary dips
    for walk in out["walks"]:
        assert walk["path"][0] == walk["start"]
        for k, share in walk["of_best_after"].items():
            assert 0 < share <= 1.0 + 1e-9, (k, share)
    assert out["mean_of_best_after"]["8"] >= 0.85, out["mean_of_best_after"]


def test_a_grid_that_is_not_one_is_refused(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"grid": [{"ps": 1}]}')
    with pytest.raises(ConfigError, match="not a grid"):
        explore_bench.run(bad)
    zero = tmp_path / "zero.json"
    zero.write_text('{"grid": [{"ps": 1, "workers": 1, "runs": [0.0]}]}')
    with pytest.raises(ConfigError, match="speed > 0"):
        explore_bench.run(zero)


@pytest.mark.slow
def test_shapes_bench_measures_a_real_job_on_a_multi_node_cluster():
    out = shapes_bench.run(max_ps=1, max_workers=2, max_tasks=3, steps=1, nodes=2, node_cpus=2, batch=64)
    assert [(g["ps"], g["workers"]) for g in out["grid"]] == [(1, 1), (1, 2)]
    for g in out["grid"]:
        assert len(g["runs"]) == 2 and all(v > 0 for v in g["runs"])  # measured forward and back
        assert 1 <= g["nodes"] <= 2
    assert out["best"]["samples_per_s"] == max(g["samples_per_s"] for g in out["grid"])


@pytest.mark.parametrize("model", sorted(shapes_bench.MODELS))
def test_every_shapes_model_builds_a_program_at_the_asked_batch(model):
    description, build = shapes_bench.MODELS[model]
    program = build(32)
    assert program.batch_size == 32
    assert sum(p.numel() for p in program.model().parameters()) > 0
    assert len(program.build_dataset()) == 32 * 64
    assert "parameters" in description


def test_shapes_bench_refuses_an_unknown_model_before_starting_anything():
    with pytest.raises(ValueError, match="unknown model 'resnet'.*mlp10m"):
        shapes_bench.run(model="resnet")


def test_bench_shapes_command_checks_its_options_before_starting_anything(capsys):
    import re

    from elasticps.cli import main

    def refused(*argv: str) -> str:
        """What the command said on stderr, refusing ``argv`` with exit status 2."""
        try:
            code = main(list(argv))
        except SystemExit as exc:  # argparse's own refusals
            code = exc.code
        assert code == 2, argv
        return capsys.readouterr().err

    assert "three numbers" in refused("bench", "shapes", "--grid-limits", "4,6")
    assert "invalid choice: 'resnet'" in refused("bench", "shapes", "--model", "resnet")
    assert "expected a number above 0" in refused("bench", "shapes", "--cores-per-task", "0")
    for limits in ("0,8,10", "4,8,1", "4,8"):
        assert "error: --grid-limits: three numbers" in refused("bench", "shapes", "--grid-limits", limits)
    err = refused("bench", "shapes", "--grid-limits", "4,8,13")
    assert re.search("error: bench shapes: .*exceeds the cluster's 12 CPUs|would use", err)
    err = refused("bench", "shapes", "--cores-per-task", str(os.cpu_count()))
    assert re.search("error: bench shapes: the largest shape's 10 tasks .* contended machine", err)
    assert "bench shapes does not take --embedding-rows" in refused("bench", "shapes", "--embedding-rows", "3000000")
    assert "bench explore does not take --batch" in refused("bench", "explore", "--batch", "64")
    err = refused("bench", "peers", "--rounds", "5")
    assert "bench peers does not take --rounds (bench scheduler, manager does)" in err
    assert "bench scheduler does not take --faults" in refused("bench", "scheduler", "--faults", "3")
    # given with its default value, it is refused all the same
    assert "bench peers does not take --seed" in refused("bench", "peers", "--seed", "0")
    assert "--heatmap: the PNG file" in refused("bench", "explore", "--heatmap", "")


def test_every_bench_option_names_the_benchmarks_it_is_for():
    from elasticps.cli.experiments import _BENCH_OPTIONS
    from elasticps.cli.main import build_parser, subcommand

    bench = subcommand(build_parser(), "bench")
    benchmarks = set(next(a for a in bench._actions if a.dest == "what").choices)
    assert {a.dest for a in bench._actions} - {"help", "what", "json"} == set(_BENCH_OPTIONS)
    assert all(set(whats) <= benchmarks for whats in _BENCH_OPTIONS.values())


def test_bench_shapes_command_passes_its_options_to_the_benchmark(monkeypatch, tmp_path):
    from elasticps.cli import main
    from elasticps.cli.main import build_parser, subcommand

    seen = {}
    monkeypatch.setattr(shapes_bench, "run", lambda *a, **kw: seen.update(args=a, kw=kw) or {"grid": []})
    out = tmp_path / "grid.json"
    argv = ["bench", "shapes", "--model", "embedding16m", "--batch", "128", "--cores-per-task", "0.1"]
    assert main([*argv, "--grid-limits", "3,5,7", "--steps", "4", "--json", str(out)]) == 0
    assert seen["args"] == () and {k: v for k, v in seen["kw"].items() if k != "say"} == {
        "max_ps": 3,
        "max_workers": 5,
        "max_tasks": 7,
        "model": "embedding16m",
        "batch": 128,
        "cores_per_task": 0.1,
        "steps": 4,
    }
    assert json.loads(out.read_text()) == {"grid": []}
    # what is not given is left to the benchmark's own defaults, written once there
    assert main(["bench", "shapes", "--json", str(out)]) == 0
    assert set(seen["kw"]) == {"say"}
    # the command offers exactly the benchmark's models
    bench = subcommand(build_parser(), "bench")
    [model] = [a for a in bench._actions if a.dest == "model"]
    assert sorted(model.choices) == sorted(shapes_bench.MODELS)


def test_explore_draws_the_grid_with_its_best_and_the_walks_choices(tmp_path, capsys):
    from elasticps.cli import main

    grid = _grid_file(tmp_path, MODEL_KINDS[0])
    png = tmp_path / "img" / "grid.png"
    out = tmp_path / "explore.json"
    assert main(["bench", "explore", "--grid", str(grid), "--heatmap", str(png), "--json", str(out)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    assert f"heatmap: {png}" in capsys.readouterr().err
