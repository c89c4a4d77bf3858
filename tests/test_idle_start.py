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
from tests.helpers import make_job, run_until_applied

HOOK_VAR = "__RAY_WORKER_PROCESS_SETUP_HOOK_ENV_VAR"


def _hook_in_a_process(tmp_path, modules: str, raise_after_s: float | None = None) -> dict:
    """Run the hook as Ray would, in a fresh process; what it recorded, and
    every thread's scheduling policy after it."""
    code = textwrap.dedent(
        f"""
        import json, os, sys
        from elasticps import idle_start
        def policy(tid):
            try:
                return os.sched_getscheduler(int(tid))
            except OSError:  # a thread that ended meanwhile
                return None
        idle_start.run()
        print(json.dumps({{
            "record": idle_start.record,
            "policies": sorted(p for p in map(policy, os.listdir("/proc/self/task")) if p is not None),
            "imported": [m for m in {modules.split(",")!r} if m in sys.modules],
        }}))
        """
    )
    env = {**os.environ, idle_start.MODULES_ENV: modules, "PYTHONPATH": f"{tmp_path}:{os.getcwd()}"}
    if raise_after_s is not None:
        env[idle_start.RAISE_AFTER_ENV] = str(raise_after_s)
    env.pop("OMP_NUM_THREADS", None)  # numpy's BLAS starts a helper thread per core: none may stay idle
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_hook_imports_on_an_idle_thread_and_leaves_every_thread_at_normal_priority(tmp_path):
    out = _hook_in_a_process(tmp_path, "torch,elasticps.runtime.worker")
    assert out["imported"] == ["torch", "elasticps.runtime.worker"]
    assert out["record"]["policy"] == "idle" and out["record"]["error"] is None
    # the task trains at normal priority, and so do the threads its imports started (numpy's BLAS helpers)
    assert set(out["policies"]) == {os.SCHED_OTHER} and out["record"]["idle_threads_left"] == 0, out
    assert out["record"]["cpu_s"] > 0.1  # torch's import ran inside the hook, not after it


def test_a_module_that_fails_to_import_is_recorded_not_raised(tmp_path):
    (tmp_path / "broken_mod.py").write_text("raise RuntimeError('no such thing')\n")
    out = _hook_in_a_process(tmp_path, "json,broken_mod")
    assert out["record"]["error"] == "RuntimeError: no such thing"  # the actor's own import says it again
    assert out["imported"] == ["json"]


def _may_raise_priority() -> bool:
    """CAP_SYS_NICE, or an RLIMIT_NICE that allows nice 0 (what leaving SCHED_IDLE needs)."""
    import resource

    with open("/proc/self/status") as status:
        caps = next(line for line in status if line.startswith("CapEff:"))
    return bool(int(caps.split()[1], 16) >> 23 & 1) or resource.getrlimit(resource.RLIMIT_NICE)[0] >= 20


def test_an_import_past_its_time_is_put_back_at_normal_priority_where_allowed(tmp_path):
    (tmp_path / "slow_mod.py").write_text("import time\ntime.sleep(0.5)\n")
    out = _hook_in_a_process(tmp_path, "slow_mod", raise_after_s=0.05)
    assert out["imported"] == ["slow_mod"] and out["record"]["seconds"] >= 0.5
    assert out["record"]["raised"] is _may_raise_priority()


def test_the_runtime_env_names_the_hook_and_keeps_a_job_s_own():
    env = idle_start.runtime_env(["torch", "elasticps.runtime.ps"], {"env_vars": {"A": "1"}}, 2, 30.0)
    assert env == {
        "env_vars": {
            HOOK_VAR: idle_start.HOOK,
            idle_start.MODULES_ENV: "torch,elasticps.runtime.ps",
            idle_start.RAISE_AFTER_ENV: "30",
            "OMP_NUM_THREADS": "2",  # as Ray sets it for a 2-CPU task, before numpy reads it
        }
    }
    assert (
        "OMP_NUM_THREADS"
        not in idle_start.runtime_env(["torch"], {"env_vars": {"OMP_NUM_THREADS": "4"}}, 0, 1)["env_vars"]
    )  # the job's own is kept
    assert idle_start.runtime_env(["torch"], {"worker_process_setup_hook": "mine.setup"}, 1, 1) is None
    assert idle_start.runtime_env(["torch"], {"env_vars": {HOOK_VAR: "mine.setup"}}, 1, 1) is None


@pytest.mark.parametrize("kind", ["ps", "worker"])
def test_a_launched_task_imported_its_modules_at_idle_priority(ray_local, kind):
    ray = ray_local
    started = tasks.launch(kind, digits.program(), TaskResources(cpu=1.0), 1, None, idle_import_s=30.0)
    plain = tasks.launch(kind, digits.program(), TaskResources(cpu=1.0), 1, None)
    try:
        ray.get([started.ready_ref, plain.ready_ref], timeout=120)
        record = ray.get(started.handle.start_record.remote(), timeout=30)
        assert record["policy"] == "idle" and record["error"] is None
        assert record["modules"] == ["torch", f"elasticps.runtime.{kind}"]
        assert ray.get(plain.handle.start_record.remote(), timeout=30) is None
    finally:
        tasks.stop(started)
        tasks.stop(plain)


def test_a_job_s_first_tasks_start_as_usual_and_a_grow_s_at_idle_priority(ray_local):
    ray = ray_local
    # the job waits for its first tasks (and for a restore's): only tasks started while it trains
    # import at idle priority; JobConfig.import_at_idle=False starts those as usual too
    records = {}
    for at_idle in (True, False):
        job = make_job(1, 1, import_at_idle=at_idle)
        try:
            job.run(max_steps=2)
            run_until_applied(job, job.rescale(2, 2))
            records[at_idle] = [ray.get(t.handle.start_record.remote(), timeout=30) for t in job.ps + job.workers]
        finally:
            job.shutdown()
    first, grown = records[True][:1] + records[True][2:3], records[True][1:2] + records[True][3:]
    assert first == [None, None], records  # ps-0 and worker-0
    assert [r["policy"] for r in grown] == ["idle", "idle"], records  # ps-1 and worker-1
    assert records[False] == [None] * 4
