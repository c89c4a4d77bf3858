"""Standby workers on a real Ray cluster: a grow takes them, a shrink parks them,
their resources are reserved while they train, and the job's end leaves nothing."""

from __future__ import annotations

import dataclasses
import time
import types

import pytest
import ray
from ray._private.state import actors
from ray.util import placement_group, placement_group_table

from elasticps import ConfigError, JobConfig, TaskResources
from elasticps.examples import digits
from elasticps.runtime import relative_error, tasks, train_single_process
from elasticps.runtime import standby as standby_module
from elasticps.runtime.standby import StandbyPool
from tests import loops
from tests.helpers import kill_task, make_config, make_job, run_until_applied, wait_for

TOL = 1e-5
WORKER_CPU = 0.5  # tests.helpers' SMALL_TASKS
LONG = 2000  # epochs: a job that does not run out of steps while a test waits (a digits step: ~3 ms when quiet)


def _alive_actors() -> set[str]:
    return {a for a, info in actors().items() if info["State"] == "ALIVE"}


def _held_reservations() -> list[str]:
    return [pg for pg, info in placement_group_table().items() if info["state"] != "REMOVED"]


def _maps_shards_memory(pid: int) -> bool:
    """Whether process ``pid`` (on this machine) maps a PS shard's parameters in shared memory."""
    with open(f"/proc/{pid}/maps") as maps:
        return "eps-param-" in maps.read()


def _free_cpu_becomes(cpu: float) -> None:
    """Ray's free CPU (reported asynchronously) reaches ``cpu``."""
    wait_for(lambda: abs(ray.available_resources().get("CPU", 0.0) - cpu) < 1e-6, 30, f"{cpu:g} free CPU")


def test_a_grow_takes_the_standbys_a_shrink_parks_them_and_the_end_leaves_nothing(ray_local):
    before = _alive_actors()
    total = ray.cluster_resources()["CPU"]
    program = digits.program(epochs=50)
    job = make_job(1, 2, program, standby_workers=2)
    job.run(max_steps=2)
    wait_for(lambda: len(job.standbys()) == 2, 120, "the standbys to run")
    standby_pids = {t.pid for t in job.standbys()}
    first = {w.pid for w in job.workers}
    # 2 workers and a PS at 0.5 CPU each hold Ray's CPU; the standbys hold none
    _free_cpu_becomes(total - 3 * WORKER_CPU)
    started = len(_alive_actors() - before)
    assert started == 5  # a PS, two workers, two standbys

    run_until_applied(job, job.rescale(1, 4))
    job.run(max_steps=2)
    assert {w.pid for w in job.workers} == first | standby_pids  # the standbys' processes train
    assert len(_alive_actors() - before) == started  # and no process was started for the grow
    assert job.report().rescales[-1].new_tasks == 2 and not job.standbys()
    _free_cpu_becomes(total - 5 * WORKER_CPU)  # reserved for them while they train
    assert len(_held_reservations()) == 2

    run_until_applied(job, job.rescale(1, 2))
    job.run(max_steps=2)
    assert {w.pid for w in job.workers} == first
    assert {t.pid for t in job.standbys()} == standby_pids  # parked, not killed
    _free_cpu_becomes(total - 3 * WORKER_CPU)  # the reservations released
    assert not _held_reservations()
    # parked, they let go of the shard's parameters in shared memory (a shard may go away meanwhile)
    wait_for(lambda: not any(_maps_shards_memory(pid) for pid in standby_pids), 10, "the parked to let go")
    assert all(_maps_shards_memory(w.pid) for w in job.workers)  # those that train map it (the check sees it)

    run_until_applied(job, job.rescale(1, 4))  # the same processes again
    job.run(max_steps=2)
    assert {w.pid for w in job.workers} == first | standby_pids

    # exact: the same parameters as one process trained for as many steps
    ref = train_single_process(program, max_steps=job.step)
    assert relative_error(job.parameters(), ref.params) < TOL
    assert job.report().samples_seen == ref.samples

    job.shutdown()
    wait_for(lambda: not _alive_actors() - before, 30, "the job's actors, standbys included, to be gone")
    assert not _held_reservations()
    _free_cpu_becomes(total)


@pytest.mark.slow
def test_a_dead_standby_is_never_handed_out(ray_local):
    job = make_job(1, 1, digits.program(epochs=50), standby_workers=2)
    job.run(max_steps=1)
    wait_for(lambda: len(job.standbys()) == 2, 120, "the standbys to run")
    dead, alive = job.standbys()
    ray.kill(dead.handle, no_restart=True)
    run_until_applied(job, job.rescale(1, 3))  # one standby, and one fresh worker
    job.run(max_steps=1)
    pids = {w.pid for w in job.workers}
    assert alive.pid in pids and dead.pid not in pids and len(pids) == 3
    assert len(_held_reservations()) == 1  # the standby's; the fresh worker holds its CPU itself
    ref = train_single_process(digits.program(epochs=50), max_steps=job.step)
    assert relative_error(job.parameters(), ref.params) < TOL
    job.shutdown()
    assert not _held_reservations()


def test_a_killed_worker_from_the_standbys_releases_its_reservation_and_is_replaced_in_the_pool(ray_local):
    job = make_job(1, 1, digits.program(epochs=LONG), standby_workers=1)
    job.run(max_steps=1)
    wait_for(lambda: len(job.standbys()) == 1, 120, "the standby to run")
    run_until_applied(job, job.rescale(1, 2))
    [reservation] = _held_reservations()
    lost = job.workers[1].pid
    ray.kill(job.workers[1].handle, no_restart=True)
    job.run(max_steps=2)  # the step fails, the dead worker is dropped (and replaced)
    assert reservation not in _held_reservations()
    # the pool had lent it out: another standby is started in its place
    wait_for(lambda: job.run(max_steps=1) and len(job.standbys()) == 1, 60, "a new standby to run")
    assert job.standbys()[0].pid != lost
    job.shutdown()
    assert not _held_reservations()


def _one_standby_and_no_room(monkeypatch):
    """A 1x1 job with one standby running, and another task holding every CPU left: a grow takes the
    standby (the pool is told its node has room) and its reservation waits. Returns (job, standby, blocker)."""
    job = make_job(1, 1, digits.program(epochs=LONG), standby_workers=1)
    job.run(max_steps=1)
    wait_for(lambda: len(job.standbys()) == 1, 120, "the standby to run")
    [standby] = job.standbys()
    free = ray.cluster_resources()["CPU"] - 2 * WORKER_CPU
    _free_cpu_becomes(free)
    blocker = ray.remote(num_cpus=free)(_Blocker).remote()
    ray.get(blocker.ping.remote(), timeout=60)
    # the room the pool saw goes to another task before the reservation gets it (a race Ray cannot be made to lose)
    monkeypatch.setattr(standby_module, "fits_now", lambda needs, free: True)
    return job, standby, blocker


@pytest.mark.slow
def test_a_standby_whose_reservation_gets_no_room_goes_back_and_a_fresh_worker_takes_its_slot(ray_local, monkeypatch):
    job, standby, blocker = _one_standby_and_no_room(monkeypatch)
    job._rescale.config = dataclasses.replace(job.config, placement_timeout_s=2.0)  # its rescales' wait only
    request = job.rescale(1, 2)
    deadline = time.monotonic() + 60
    while not job.report().rescales and time.monotonic() < deadline:
        job.run(max_steps=10)
    [failed] = job.report().rescales
    assert failed.request_id == request and not failed.ok  # the fresh worker found no room either
    assert any("fresh workers take their slots" in e for e in job.report().events)
    assert [t.pid for t in job.standbys()] == [standby.pid] and not _held_reservations()
    ray.kill(blocker)
    run_until_applied(job, job.rescale(1, 2))  # with room, the standby is taken again
    assert standby.pid in {w.pid for w in job.workers}
    job.shutdown()
    assert not _held_reservations()


@pytest.mark.slow
def test_a_cancelled_grow_gives_its_standby_back(ray_local, monkeypatch):
    job, standby, blocker = _one_standby_and_no_room(monkeypatch)
    job.rescale(1, 2)
    job.run(max_steps=2)
    assert not job.standbys() and len(_held_reservations()) == 1  # taken for the grow, waiting for room
    run_until_applied(job, job.rescale(1, 1))  # a newer request replaces the grow
    assert [t.pid for t in job.standbys()] == [standby.pid] and not _held_reservations()
    ray.kill(blocker)
    run_until_applied(job, job.rescale(1, 2))
    assert standby.pid in {w.pid for w in job.workers}
    job.shutdown()
    assert not _held_reservations()


@pytest.mark.slow
def test_a_standby_that_dies_while_its_reservation_waits_is_not_switched_in(ray_local, monkeypatch):
    job, standby, blocker = _one_standby_and_no_room(monkeypatch)
    request = job.rescale(1, 2)
    job.run(max_steps=2)
    assert not job.standbys()  # taken
    kill_task(standby.handle)
    ray.kill(blocker)  # the reservation comes; the standby it was for is dead
    for _ in range(3):  # the switch finds the standby dead and starts the change again with a fresh worker
        job.prepare()  # (waiting without training: a job's steps differ from one process's by rounding only)
        job.run(max_steps=1)
        if any(r.request_id == request and r.ok for r in job.report().rescales):
            break
    assert len(job.workers) == 2 and standby.pid not in {w.pid for w in job.workers}
    assert all(tasks.is_alive(w.handle, 10.0) for w in job.workers)
    assert not any("step" in e and "failed" in e and "rescale" not in e for e in job.report().events)
    ref = train_single_process(digits.program(epochs=LONG), max_steps=job.step)
    assert relative_error(job.parameters(), ref.params) < TOL, job.report().events
    job.shutdown()
    assert not _held_reservations()


@pytest.mark.slow
def test_a_killed_job_drivers_standby_reservation_is_released_by_the_managers_close(ray_local):
    """A placement group belongs to the Ray job, not to the actor that made it:
    the job driver's death leaves its standby's reservation held until the
    manager's close releases what is named after that actor."""
    from elasticps.manager.ray_runtime import RayJobRuntime
    from elasticps.manager.runtime import Launch

    before = _alive_actors()
    total = ray.cluster_resources()["CPU"]
    config = make_config(standby_workers=1)
    launch = Launch("pgleak", "elasticps.examples.digits:program", {"epochs": LONG}, config, (1, 1), {})
    handle = RayJobRuntime().start(launch)
    # the driver, a PS, a worker and the standby run; the job trains on meanwhile
    wait_for(lambda: len(_alive_actors() - before) == 4, 120, "the job's actors and its standby to run")
    step = handle.poll(0, 0).step
    wait_for(lambda: handle.poll(0, 0).step > step + 2, 60, "a few more steps")
    handle.rescale(1, 2, {})  # takes the standby: a reservation, made inside the driver's actor
    wait_for(lambda: handle.poll(0, 0).num_workers == 2, 60, "the grow")
    [reservation] = _held_reservations()
    assert placement_group_table()[reservation]["name"].startswith(f"elasticps-standby:{handle.actor._actor_id.hex()}:")

    ray.kill(handle.actor, no_restart=True)  # the driver dies (a crash, OOM): its workers die with it
    wait_for(lambda: not _alive_actors() - before, 30, "the job's actors to be gone")
    assert _held_reservations() == [reservation]  # but not its reservation
    handle.close()
    assert not _held_reservations()
    _free_cpu_becomes(total)


def test_release_orphans_removes_one_owners_reservations_only(ray_local):
    mine = placement_group([{"CPU": 0.1}], name="elasticps-standby:aa:1:x")
    other = placement_group([{"CPU": 0.1}], name="elasticps-standby:aab:1:x")  # an owner whose id starts alike
    ray.get([mine.ready(), other.ready()], timeout=30)
    assert standby_module.release_orphans("aa") == 1
    assert _held_reservations() == [other.id.hex()]
    assert standby_module.release_orphans("aab:1") == 1 and not _held_reservations()


def test_a_closed_pool_keeps_nothing_it_is_given_back():
    from elasticps.runtime.tasks import Task

    pool = StandbyPool(2, 1.0)
    pool.close()
    from_pool = Task("worker", "h1", "n", 1, reservation="r1")
    assert pool.park([from_pool]) == [from_pool]  # the caller retires it and releases its reservation
    assert not pool.idle()
    assert pool.take(None, TaskResources(cpu=0.5), []) is None
    assert pool.fill(lambda: pytest.fail("a closed pool starts no standby")) == 0


class _Blocker:
    def ping(self) -> bool:
        return True


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"standby_workers": -1}, "standby_workers must be 0..1024, got -1"),
        ({"standby_workers": 1025}, "standby_workers must be 0..1024, got 1025"),
        ({"standby_workers": 1.5}, "standby_workers must be an int"),
        ({"standby_workers": True}, "standby_workers must be an int"),
        ({"standby_workers": 1, "worker_resources": TaskResources(cpu=1, gpu=1)}, "CPU workers only"),
    ],
)
def test_standby_workers_is_checked(kw, match):
    with pytest.raises(ConfigError, match=match):
        JobConfig(**kw)


def test_a_users_own_loop_refuses_standbys():
    with pytest.raises(ConfigError, match="standby_workers needs a TrainingProgram"):
        make_job(1, 1, loops.scheduled_mlp, standby_workers=1)


class _Handle:
    """A task's handle that records the calls made to it (``handle.park.remote()``)."""

    def __init__(self, name: str, calls: list[str]) -> None:
        self.name, self.calls = name, calls

    def __getattr__(self, method: str):
        return types.SimpleNamespace(remote=lambda *a: self.calls.append(f"{self.name}.{method}"))


def test_the_pool_parks_only_workers_that_came_from_it_and_only_up_to_its_size(monkeypatch):
    from elasticps.runtime.tasks import Task

    calls: list[str] = []
    monkeypatch.setattr(tasks, "release", lambda reservation: calls.append(f"release {reservation}"))
    pool = StandbyPool(1, 1.0)
    h = [_Handle(f"h{i}", calls) for i in range(5)]
    fresh = Task("worker", h[0], "n", 1)  # it holds its CPU itself: parked, it would keep it
    ps = Task("ps", h[1], "n", 2, reservation="r1")
    from_pool = [Task("worker", h[i], "n", i, reservation=f"r{i}") for i in (3, 4)]
    assert pool.park([fresh, ps, *from_pool]) == [fresh, ps, from_pool[1]]  # the pool holds one
    [parked] = pool.idle()
    assert (parked.handle, parked.pid, parked.reservation) == (h[3], 3, None)
    assert calls == ["release r3", "h3.park"]  # its reservation released, the shards' memory let go


def test_a_standby_on_a_suspect_node_stays_in_the_pool_and_one_elsewhere_is_taken(monkeypatch):
    """Tasks died on node a lately (its raylet may be going): a grow takes the standby on b, not
    the one on a, though a's comes first and has room; asked for a's node, it takes none."""
    from elasticps.runtime.tasks import Task

    calls: list[str] = []
    monkeypatch.setattr(tasks, "release", lambda reservation: calls.append(f"release {reservation}"))
    monkeypatch.setattr(tasks, "free_now", lambda: {"a": {"CPU": 4.0}, "b": {"CPU": 4.0}})
    monkeypatch.setattr(tasks, "is_alive", lambda handle, timeout_s: True)
    monkeypatch.setattr(standby_module, "placement_group", lambda bundles, **kw: types.SimpleNamespace(ready=list))
    pool = StandbyPool(2, 1.0)
    on_a, on_b = _Handle("on_a", calls), _Handle("on_b", calls)
    pool.park([Task("worker", on_a, "a", 1, reservation="ra"), Task("worker", on_b, "b", 2, reservation="rb")])
    suspect = lambda node: node == "a"  # noqa: E731
    cpu = TaskResources(cpu=1.0)
    assert pool.take("a", cpu, [], suspect) is None
    taken = pool.take(None, cpu, [], suspect)
    assert taken is not None and (taken.handle, taken.wanted_node) == (on_b, "b")
    assert [t.handle for t in pool.idle()] == [on_a]  # kept, for when the node is trusted again
    assert pool.take(None, cpu, []).handle is on_a  # no node suspect: it is taken
