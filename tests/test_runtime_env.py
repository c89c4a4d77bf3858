"""Shipping code with a job: a program that exists only in a temporary directory
runs on a real multi-node Ray cluster through the spec's runtime_env."""

from __future__ import annotations

import importlib.util
import json
import textwrap
import time

import pytest

from elasticps import ProgramError
from elasticps.manager import Store, parse_spec
from elasticps.manager.client import _with_working_dir
from elasticps.manager.service import Manager

pytestmark = pytest.mark.slow

PROGRAM = textwrap.dedent(
    """
    import os

    import torch
    from torch import nn
    from torch.utils.data import TensorDataset

    from elasticps import TrainingProgram


    def data(n, seed):
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(n, 16, generator=g)
        return TensorDataset(x, (x[:, :4] * 2).argmax(1))


    def program(epochs=4):
        assert os.environ["SHIPPED_FLAG"] == "on"  # env_vars reach the job's processes too
        return TrainingProgram(
            name="shipped",
            model=lambda: nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)),
            dataset=lambda: data(512, 0),
            eval_dataset=lambda: data(256, 1),
            loss=nn.functional.cross_entropy,
            metric=lambda out, y: float((out.argmax(1) == y).float().mean()),
            optimizer="adam",
            lr=0.01,
            batch_size=64,
            epochs=epochs,
        )
    """
)

SPEC = """
name: {name}
program: shipped_job_{tag}:program
ps: {{min: 1, max: 1, cpu: 0.5}}
workers: {{min: 2, max: 2, cpu: 1}}
"""


def test_a_program_shipped_in_a_working_dir_runs_on_a_multi_node_cluster(ray_cluster, tmp_path):
    tag = f"{time.time_ns()}"  # a module name nothing on this machine has
    code = tmp_path / "code"
    code.mkdir()
    (code / f"shipped_job_{tag}.py").write_text(PROGRAM)
    assert importlib.util.find_spec(f"shipped_job_{tag}") is None
    manager = Manager(Store(tmp_path / "m.db"), tmp_path / "work", report_interval_s=0.5, ship_roots=(tmp_path,))
    try:
        with pytest.raises(ProgramError, match="cannot import module"):  # without the code: refused at submit
            manager.submit(parse_spec(SPEC.format(name="plain", tag=tag)))
        text = _with_working_dir(SPEC.format(name="shipped", tag=tag), code)  # what `submit --working-dir` sends
        spec = json.loads(text)
        spec["runtime_env"]["env_vars"] = {"SHIPPED_FLAG": "on"}
        manager.submit(parse_spec(json.dumps(spec), "json"))
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and manager.store.get_job("shipped").state in ("pending", "running"):
            manager.step()
            time.sleep(0.5)
        rec = manager.store.get_job("shipped")
        assert rec.state == "finished", manager.store.events("shipped")
        report = manager.ended["shipped"]
        assert report.epoch == 4 and report.epoch_reports[-1].metric > 0.5  # it learned (chance: 0.25)
        assert set(report.placement.values()) <= {n.node_id for n in ray_cluster[1]}  # on the cluster's nodes
    finally:
        manager.shutdown()

    guarded = Manager(Store(tmp_path / "g.db"), tmp_path / "g", allow_programs=("elasticps.examples",))
    try:
        allowed = {**spec, "program": "elasticps.examples.digits:program"}  # an allowed program, with code shipped
        with pytest.raises(ProgramError, match="runtime_env is refused"):
            guarded.submit(parse_spec(json.dumps(allowed), "json"))
    finally:
        guarded.shutdown()


def test_a_program_fixed_and_described_again_is_read_afresh(ray_cluster, tmp_path):
    # a user fixes their module and submits again: the description is of the file as it is now
    from elasticps.manager.ray_runtime import _describe, _fetch
    from elasticps.manager.runtime import ProgramInfo
    from elasticps.manager.wire import decode

    env = {"env_vars": {"PYTHONPATH": str(tmp_path)}}  # the same environment: Ray would reuse its process

    def described() -> str:
        ref = _describe.options(runtime_env=env).remote("fixed_again:program", {})
        return decode(ProgramInfo, _fetch(ref, "the description", 120), "the description").name

    module = tmp_path / "fixed_again.py"
    module.write_text("from elasticps.examples import digits\nprogram = digits.program()\n")
    first = described()
    module.write_text("from elasticps.examples import digits\nprogram = digits.cnn_program()\n")
    assert (first, described()) == ("digits-mlp", "digits-cnn")
