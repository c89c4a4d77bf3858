"""Standby workers: worker processes started ahead, for a grow to take.

A new worker's cost is its process's start: Ray's worker process, ``import
torch``, the program's model and dataset. Ray starts a fresh process for every
new actor, so a grow pays it while the job trains on the same cores. A job
with ``JobConfig.standby_workers = N`` starts N workers at its start, in the
background, asking Ray for no resources (``num_cpus=0``): they wait, built,
holding nothing Ray counts.

A grow takes a standby for a worker slot (:meth:`StandbyPool.take`) when one
runs on the node the slot is pinned to (any node if unpinned) and that node
has room now; else it starts a fresh worker as before. Before the standby
trains, a placement group of one bundle (the worker's resources, pinned to the
standby's node by its ``ray.io/node-id`` label) reserves what a fresh worker
would hold, so Ray's accounting and other tenants see it used; the switch
waits for it as it waits for a fresh worker to run. A reservation not ready
when the change would give up (``placement_timeout_s``: the room went to
another task meanwhile) sends its standby back to the pool, and a fresh
worker, which Ray may place elsewhere, takes the slot
(:meth:`StandbyPool.swap_late`); a change cancelled (a newer request replaced
it) gives the standbys it took back too (:meth:`StandbyPool.put_back`).
The task carries the reservation
(:attr:`~elasticps.runtime.tasks.Task.reservation`): whatever ends the task
releases it (:func:`tasks.stop`, :func:`tasks.retire_tasks`).

A shrink gives workers that came from the pool back to it
(:meth:`StandbyPool.park`): the reservation is released, the process stays.
Workers started fresh hold their resources in the actor itself and are
retired as before. A standby that died is dropped, never handed out; the
job's end retires the pool (:meth:`StandbyPool.close`); a standby taken, parked or given
back after that is retired, its reservation released.

A placement group belongs to the Ray job, not to the actor that made it: when
the process that runs the job (the manager's job driver actor) dies, its
workers die with it but their reservations would hold their resources for the
Ray job's whole life. So each reservation is named after its owner,
``elasticps-standby:<actor or job id>:<pool token>:<uuid>``, and whoever ends
that process, or the job's own shutdown, removes what is left of them
(:func:`release_orphans`): with the actor's id, every pool of that process;
with :attr:`StandbyPool.owner`, that pool's alone (two jobs of one Python
driver share its job id, never a pool token).
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable

import ray
from ray._raylet import PlacementGroupID
from ray.util import placement_group, placement_group_table
from ray.util.placement_group import PlacementGroup

from elasticps.runtime import tasks
from elasticps.runtime.config import TaskResources
from elasticps.runtime.slots import fits_now

NODE_ID_LABEL = "ray.io/node-id"  # the label Ray gives every node: its id
RESERVATION_PREFIX = "elasticps-standby"  # the name of every standby's reservation starts so


def process_owner() -> str:
    """Who the reservations this process makes are named after: the Ray actor
    it runs in (a manager's job driver), else its Ray job (a Python driver)."""
    context = ray.get_runtime_context()
    return context.get_actor_id() or context.get_job_id()


def release_orphans(owner: str) -> int:
    """Remove every standby reservation named after ``owner`` (an actor's or
    job's id, or a pool's :attr:`StandbyPool.owner`) that is not removed yet;
    returns how many."""
    prefix = f"{RESERVATION_PREFIX}:{owner}:"
    mine = [pg for pg, info in placement_group_table().items()
            if info["state"] != "REMOVED" and (info.get("name") or "").startswith(prefix)]  # fmt: skip
    for pg in mine:
        tasks.release(PlacementGroup(PlacementGroupID(bytes.fromhex(pg))))
    return len(mine)


class StandbyPool:
    """Up to ``size`` constructed workers that hold no Ray resources.

    ``liveness_timeout_s``: how long a standby may take to answer a ping
    before it is taken for dead. The job's loop takes, parks and fills;
    other threads may read :meth:`idle` (every method holds the pool's lock)."""

    def __init__(self, size: int, liveness_timeout_s: float) -> None:
        self.size = size
        self.liveness_timeout_s = liveness_timeout_s
        self._starting: list[tasks.PendingTask] = []  # started, not known to run yet
        self._idle: list[tasks.Task] = []  # running, waiting to be taken
        self.nodes_used: set[str] = set()  # where standbys ran: swept at the job's end
        self.owner: str | None = None  # what its reservations are named after, once it made one
        self.closed = False  # retired: nothing taken, parked or given back is kept
        self._token = uuid.uuid4().hex[:12]
        self._lock = threading.RLock()

    def count(self) -> int:
        """Standbys started or running, not taken."""
        return len(self._starting) + len(self._idle)

    def fill(self, start: Callable[[], tasks.PendingTask], taken: int = 0) -> int:
        """Start standbys (``start()`` starts one, not waiting) up to ``size``,
        less the ``taken`` ones (training as workers, or taken for a change);
        returns how many."""
        with self._lock:
            n = 0 if self.closed else max(0, self.size - self.count() - taken)
            self._starting += [start() for _ in range(n)]
            return n

    def idle(self) -> list[tasks.Task]:
        """The standbys that run now (those started are looked at, not waited for)."""
        with self._lock:
            self._settle()
            return list(self._idle)

    def take(
        self,
        node: str | None,
        resources: TaskResources,
        claimed: list[tuple[str, dict[str, float]]],
        suspect: Callable[[str], bool] = lambda node: False,
    ) -> tasks.PendingTask | None:
        """A running, alive standby on ``node`` (any node if None) whose node
        has room now for ``resources`` beside ``claimed`` (what standbys
        taken for the same change will hold: appended to), with its
        reservation asked for; None if there is none. A standby on a
        ``suspect`` node (tasks died there lately: its raylet may be going)
        is not taken: it stays in the pool, and a fresh worker is placed by Ray."""
        with self._lock:
            return None if self.closed else self._take(node, resources, claimed, suspect)

    def _take(
        self,
        node: str | None,
        resources: TaskResources,
        claimed: list[tuple[str, dict[str, float]]],
        suspect: Callable[[str], bool],
    ) -> tasks.PendingTask | None:
        self._settle()
        need = resources.as_ray_resources()
        free = tasks.free_now()
        for t in list(self._idle):
            if (node is not None and t.node_id != node) or suspect(t.node_id):
                continue
            if not fits_now([*claimed, (t.node_id, need)], free):
                continue
            self._idle.remove(t)
            if not tasks.is_alive(t.handle, self.liveness_timeout_s):
                tasks.kill(t.handle)  # dead or hung: never handed out
                continue
            claimed.append((t.node_id, need))
            if self.owner is None:
                self.owner = f"{process_owner()}:{self._token}"
            name = f"{RESERVATION_PREFIX}:{self.owner}:{uuid.uuid4().hex}"
            reservation = placement_group([need], name=name, bundle_label_selector=[{NODE_ID_LABEL: t.node_id}])
            return tasks.PendingTask(
                "worker",
                t.handle,
                reservation.ready(),
                t.node_id,
                resources,
                reservation=reservation,
                info={"node_id": t.node_id, "pid": t.pid},
            )
        return None

    def park(self, dropped: list[tasks.Task]) -> list[tasks.Task]:
        """Take back the workers of ``dropped`` that came from the pool (they
        hold a reservation), releasing it, while the pool has room; returns
        the tasks left to retire."""
        rest: list[tasks.Task] = []
        with self._lock:
            if self.closed:  # the job ends: its caller retires them all
                return list(dropped)
            for t in dropped:
                if t.kind == "worker" and t.reservation is not None and self.count() < self.size:
                    tasks.release(t.reservation)
                    t.handle.park.remote()  # it lets go of the shards' memory; a dead one is found at take
                    self._idle.append(tasks.Task("worker", t.handle, t.node_id, t.pid))
                else:
                    rest.append(t)
        return rest

    def swap_late(self, pending: dict[int, tasks.PendingTask], start: Callable[[int], tasks.PendingTask]) -> int:
        """For a change about to give up: each standby of ``pending`` (``{slot:
        pending task}``, changed in place) whose reservation is not ready
        comes back to the pool (its reservation released) and ``start(slot)``
        starts a fresh worker in its slot instead; returns how many."""
        late = [i for i, p in pending.items() if p.reservation is not None and not tasks.all_ready([p])]
        with self._lock:
            for i in late:
                self.put_back(pending[i])
                pending[i] = start(i)
        return len(late)

    def put_back(self, taken: tasks.PendingTask) -> None:
        """A standby taken (:meth:`take`) for a change that will not use it:
        its reservation released, back in the pool if the pool has room, else stopped."""
        with self._lock:
            tasks.release(taken.reservation)
            if taken.info is not None and self.count() < self.size and not self.closed:
                self._idle.append(tasks.Task("worker", taken.handle, taken.info["node_id"], taken.info["pid"]))
            elif self.closed:
                tasks.retire([taken.handle])
            else:
                tasks.kill(taken.handle)

    def close(self) -> None:
        """Retire every standby (they release their shared memory first)."""
        with self._lock:
            self.closed = True
            self._settle()
            tasks.retire([t.handle for t in self._idle] + [p.handle for p in self._starting])
            self._starting, self._idle = [], []

    def _settle(self) -> None:
        """Move standbys that run now from starting to idle; drop those whose start failed."""
        if not self._starting:
            return
        refs = [p.ready_ref for p in self._starting]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        done = set(ready)
        still: list[tasks.PendingTask] = []
        for p in self._starting:
            if p.ready_ref not in done:
                still.append(p)
                continue
            try:
                t = tasks.to_task(p)
            except ray.exceptions.RayError:
                tasks.kill(p.handle)
                continue
            self._idle.append(t)
            self.nodes_used.add(t.node_id)
        self._starting = still
