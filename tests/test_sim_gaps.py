"""The gaps to the oracle split by truth surface and model kind add up to the whole gap."""

from __future__ import annotations

import json

import pytest

from elasticps.cli.main import main
from elasticps.sim import SimConfig, simulate, synthetic_workload
from elasticps.sim.gaps import format_gaps, gaps_by_group


def test_the_groups_add_up_to_each_policys_gap_and_cover_every_job():
    workload = synthetic_workload(40, seed=3)
    results = {p: simulate(workload, SimConfig(nodes=8, policy=p, seed=3, truth="mixed")) for p in ("static", "oracle")}
    rows = gaps_by_group(workload, results)
    assert sum(r["jobs"] for r in rows) == len(workload)
    assert {r["surface"] for r in rows} == {"saturation", "straggler", "grid"}
    gap = results["static"].metrics["avg_jct_s"] - results["oracle"].metrics["avg_jct_s"]
    assert sum(r["static"]["behind_oracle_s"] for r in rows) == pytest.approx(gap, abs=0.05 * len(rows))
    assert all(r["oracle"]["behind_oracle_s"] == 0 for r in rows)
    for r in rows:
        shares = [share for _, _, share in r["static"]["shapes"]]
        assert shares == sorted(shares, reverse=True) and 0 < sum(shares) <= 1.01
    table = format_gaps(rows, ["static", "oracle"]).splitlines()
    assert table[0].split()[:4] == ["surface", "kind", "jobs", "policy"] and len(table) == 1 + 2 * len(rows)


def test_the_gaps_need_the_oracle_and_one_seed(capsys, tmp_path):
    assert main(["sim", "--compare", "static,elastic", "--gaps", "--quiet"]) == 2
    assert "--gaps compares with the oracle on one seed" in capsys.readouterr().err
    assert main(["sim", "--compare", "static,oracle", "--seeds", "2", "--gaps", "--quiet"]) == 2
    out = tmp_path / "run.json"
    argv = ["sim", "--truth", "mixed", "--compare", "static,oracle", "--jobs", "30", "--nodes", "8"]
    assert main([*argv, "--gaps", "--quiet", "--json", str(out)]) == 0
    assert "s behind oracle" in capsys.readouterr().out
    rows = json.loads(out.read_text())["gaps_to_oracle"]
    assert sum(r["jobs"] for r in rows) == 30
