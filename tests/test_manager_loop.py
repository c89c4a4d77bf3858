"""The manager's control loop on a real local Ray cluster with real jobs."""

from __future__ import annotations

import re
import time

import pytest

from elasticps import ProgramError
from elasticps.manager import Store, parse_spec
from elasticps.manager.service import Manager

# 80 epochs of digits (28 s here, growth included): a grown job's new PS takes ~6 s to start on this
# 2-core machine, and with 40 epochs a job once ended 6 s after the round that grew it, nothing applied.
SPEC = """
name: {name}
program: elasticps.examples.digits:program
ps: {{min: 1, max: 2, cpu: 0.5}}
workers: {{min: 1, max: 3, cpu: 0.5}}
args: {{epochs: 80}}
"""


@pytest.mark.slow  # 64 s: three jobs run to their end through the manager's loop
def test_jobs_are_started_observed_resized_and_finished(ray_local, tmp_path):
    store = Store(tmp_path / "m.db")
    manager = Manager(store, tmp_path / "work", report_interval_s=0.5)
    with pytest.raises(ProgramError, match="cannot import module"):
        manager.submit(parse_spec(SPEC.format(name="bad").replace("elasticps.examples.digits", "no.such")))
    # resolved in a Ray process, not here: the factory's error comes back named, nothing is stored
    with pytest.raises(ProgramError, match="raised ValueError"):
        manager.submit(parse_spec(SPEC.format(name="bad").replace("epochs: 80", "model: nope")))
    assert store.list_jobs() == []
    for name in ("a", "b"):
        manager.submit(parse_spec(SPEC.format(name=name)))
    decision = manager.step()
    assert decision == {"a": (1, 1), "b": (1, 1)}  # no observation yet: each starts at its minimum
    assert {j.name: j.state for j in store.list_jobs()} == {"a": "running", "b": "running"}

    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and store.list_jobs(("running", "pending")):
        manager.step()
        time.sleep(1.0)
    manager.shutdown()
    jobs = {j.name: j.state for j in store.list_jobs()}
    assert jobs == {"a": "finished", "b": "finished"}
    for name in ("a", "b"):
        obs = store.observations(name)
        assert obs and all(o[2] > 0 for o in obs)  # the loop read the jobs' reports
        kinds = [e[3] for e in store.events(name)]
        assert kinds[0] == "submitted" and "started" in kinds and kinds[-1] == "finished"
    # at least one job was grown once its speed had been seen (8 logical CPUs, 1 CPU per job at the start),
    # as the job itself reported ("rescaled 1x1 -> 2x1"; a job that ends a few steps later may report no window
    # at that shape); allocations are what the jobs reported running, never a shape that was only asked
    applied = {
        n: [
            (int(p), int(w))
            for *_, k, m in store.events(n)
            if k == "runtime"
            for p, w in re.findall(r"-> (\d+)x(\d+)", m)
        ]
        for n in ("a", "b")
    }
    assert any(p + w > 2 for n in applied for p, w in applied[n]), applied
    for name in ("a", "b"):
        assert {(p, w) for _, p, w, _ in store.allocations(name)} <= {(1, 1), *applied[name]}
    for name in ("a", "b"):  # every shape asked was applied before the next was asked
        asked = [m for *_, k, m in store.events(name) if k == "rescale"]
        applied = [m for *_, k, m in store.events(name) if k == "runtime" and "rescaled" in m]
        assert len(applied) >= len(asked) - 1, (asked, applied)
