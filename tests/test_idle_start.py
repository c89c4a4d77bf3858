"""A new task's imports at idle CPU priority (elasticps.idle_start): the hook
in a process of its own, and through a real launch on Ray."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from elasticps import idle_start
from elasticps.examples import digits
from elasticps.runtime import tasks
from elasticps.runtime.config import TaskResources

HOOK_VAR = "__RAY_WORKER_PROCESS_SETUP_HOOK_ENV_VAR"


def _hook_in_a_process(tmp_path, modules: str, raise_after_s: float | None = None) -> dict:
    """Run the hook as Ray would, in a fresh process; what it recorded, and
    the main thread's scheduling policy after it."""
    code = textwrap.dedent(
        f"""
        import json, os, sys
        from elasticps import idle_start
        if {raise_after_s!r} is not None:
            idle_start.RAISE_AFTER_S = {raise_after_s!r}
        idle_start.run()
        print(json.dumps({{
            "record": idle_start.record,
            "main_policy": os.sched_getscheduler(0),
            "imported": [m for m in {modules.split(",")!r} if m in sys.modules],
        }}))
        """
    )
    env = {**os.environ, idle_start.MODULES_ENV: modules, "PYTHONPATH": f"{tmp_path}:{os.getcwd()}"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_hook_imports_on_an_idle_thread_and_leaves_the_process_at_normal_priority(tmp_path):
    out = _hook_in_a_process(tmp_path, "torch,elasticps.runtime.worker")
    assert out["imported"] == ["torch", "elasticps.runtime.worker"]
    assert out["record"]["policy"] == "idle" and out["record"]["error"] is None
    assert out["main_policy"] == os.SCHED_OTHER  # the task itself trains at normal priority
    assert out["record"]["cpu_s"] > 0.1  # torch's import ran inside the hook, not after it


def test_a_module_that_fails_to_import_is_recorded_not_raised(tmp_path):
    (tmp_path / "broken_mod.py").write_text("raise RuntimeError('no such thing')\n")
    out = _hook_in_a_process(tmp_path, "json,broken_mod")
    assert out["record"]["error"] == "RuntimeError: no such thing"  # the actor's own import says it again
    assert out["imported"] == ["json"]


def test_an_import_past_its_time_is_put_back_at_normal_priority_where_allowed(tmp_path):
    (tmp_path / "slow_mod.py").write_text("import time\ntime.sleep(0.5)\n")
    out = _hook_in_a_process(tmp_path, "slow_mod", raise_after_s=0.05)
    assert out["imported"] == ["slow_mod"] and out["record"]["seconds"] >= 0.5
    assert "raised" in out["record"]  # tried; True where the process may raise a thread's priority


def test_the_runtime_env_names_the_hook_and_keeps_a_job_s_own():
    env = idle_start.runtime_env(["torch", "elasticps.runtime.ps"], {"env_vars": {"A": "1"}})
    assert env == {"env_vars": {HOOK_VAR: idle_start.HOOK, idle_start.MODULES_ENV: "torch,elasticps.runtime.ps"}}
    assert idle_start.runtime_env(["torch"], {"worker_process_setup_hook": "mine.setup"}) is None
    assert idle_start.runtime_env(["torch"], {"env_vars": {HOOK_VAR: "mine.setup"}}) is None


@pytest.mark.parametrize("kind", ["ps", "worker"])
def test_a_launched_task_imported_its_modules_at_idle_priority(ray_local, kind):
    ray = ray_local
    started = tasks.launch(kind, digits.program(), TaskResources(cpu=1.0), 1, None)
    plain = tasks.launch(kind, digits.program(), TaskResources(cpu=1.0), 1, None, import_at_idle=False)
    try:
        ray.get([started.ready_ref, plain.ready_ref], timeout=120)
        record = ray.get(started.handle.start_record.remote(), timeout=30)
        assert record["policy"] == "idle" and record["error"] is None
        assert record["modules"] == ["torch", f"elasticps.runtime.{kind}"]
        assert ray.get(plain.handle.start_record.remote(), timeout=30) is None
    finally:
        tasks.stop(started)
        tasks.stop(plain)
