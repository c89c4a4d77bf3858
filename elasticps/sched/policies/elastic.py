"""``elastic``: the project's policy. Fair across jobs, aware of what a rescale
costs, and slow to shrink.

0. **Admission.** Running jobs keep at least their minimum; waiting jobs are
   admitted shortest estimated remaining time first (at their minimum shape),
   with ageing: the estimate is divided by ``1 + waited_s / ageing_s``, so a
   long job is not passed over for ever.
1. **Fair target.** From every admitted job's minimum, repeatedly give one more
   task to the job with the largest gain in log utility per dominant share of
   the task (greedy proportional fairness: a job at half speed gains more from
   a task than a fast one with the same absolute speed-up), while the gain is
   at least ``min_gain`` (and, under the ``efficiency`` objective, while the
   marginal efficiency stays at or above the threshold). Room still left once
   no job gains ``min_gain`` from it (nobody waits for it: every job that
   fits is admitted) goes, the same way, to any job it speeds up at all: on
   a mostly idle cluster, a few per cent on every job are worth more than
   idle nodes (light workload, 8 seeds: 1721 -> 1698 s when added, the
   oracle 1683 s; docs/simulator.md). But only a gain of at least
   ``spare_z`` (0.25) standard errors of the two speeds it compares
   (``JobView.speed_sd``): on a real measured grid whose shapes vary 14%
   between passes, a 1% gain seen in one pass is noise, and taking it put
   the replay's worst walk at 78% of the best, not 93% (docs/scheduler.md),
   while a fleet prior fitted on thousands of reports knows a 1% gain.
   Where no step of 1, 2 or 4 tasks pays, a job may leap to a larger shape
   it has run (``JobView.measured``): a measured best past a dip that no
   step crosses is not left unreached for want of a path.
   ``time_weight`` > 0
   also weighs the gain by the job's remaining time to that power (long jobs
   grow first); 0 by default: in the simulator it was as good or better on
   every workload measured (contended 300 x 32, seeds 0-3: 2533/2034/2721/2270 s
   vs 2550/2033/2810/2356 s with 1; light 1000 x 256 equal; half GPU jobs,
   seeds 0-1: 4593/5161 s vs 5207/5599 s).
2. **Rescale cost.** A running job moves to a bigger target only if the
   predicted time saved on its remaining work exceeds ``cost_factor`` x what
   the move costs it: ``rescale_cost_s`` of standing still, or, where the
   job's rescales were measured (``JobView.rescale_pause_s``), its pause plus
   what training at the old speed while the new tasks start loses against
   the new one (``rescale_launch_s`` x (1 - old speed / new speed)). Nor
   for a gain smaller than ``move_z`` (0.5) standard errors of the two
   speeds it compares (``JobView.speed_sd``): with 14% pass-to-pass noise on
   a flat measured surface, moving for a gain seen in one pass chased the
   noise (``--truth grid``: 88-359 rescales a seed where the oracle made
   5-25; 0.5 against 1 and 2 in docs/simulator.md).
3. **Hysteresis.** A running job shrinks only after ``shrink_rounds``
   consecutive rounds wishing it, unless the room is needed to admit a waiting
   job. Jobs held at their current shape keep it; the others share the rest.
4. **Exploration.** Room left over goes to jobs whose speed model is still
   unsure, moving them to the shape the model would learn most from.
5. **Joint search** (``joint_trades`` > 0; off by default). Before 4, at
   most that many trades of a task between two jobs where the one that takes
   gains more log-utility than the one that gives loses
   (:mod:`elasticps.sched.joint`), within every rule above. It finds little
   to trade and did not lower the simulated JCTs (docs/simulator.md, "A
   joint search after the greedy growth").
"""

from __future__ import annotations

import math

from elasticps.errors import ConfigError
from elasticps.sched.joint import trade
from elasticps.sched.objectives import (
    DEFAULT_EFFICIENCY_THRESHOLD,
    Objective,
    marginal_efficiency,
    utility,
)
from elasticps.sched.policies.base import PolicyState, admission_order, admit, grow, objective_of, task_share
from elasticps.sched.types import ClusterView, Decision, JobView, Resources, total_of


class ElasticPolicy:
    name = "elastic"

    def __init__(
        self,
        objective: str = "goodput",
        min_gain: float = 0.02,
        rescale_cost_s: float = 10.0,
        cost_factor: float = 2.0,
        shrink_rounds: int = 3,
        efficiency_threshold: float = DEFAULT_EFFICIENCY_THRESHOLD,
        time_weight: float = 0.0,
        ageing_s: float = 3600.0,
        jumps: tuple[int, ...] = (1, 2, 4),
        spare_z: float = 0.25,
        move_z: float = 0.5,
        joint_trades: int = 0,
    ) -> None:
        self.objective = Objective.parse(objective)
        self.min_gain = min_gain
        self.rescale_cost_s = rescale_cost_s
        self.cost_factor = cost_factor
        self.shrink_rounds = shrink_rounds
        if not efficiency_threshold > 0:
            raise ConfigError(f"efficiency threshold must be above 0, got {efficiency_threshold:g}")
        self.efficiency_threshold = efficiency_threshold
        self.time_weight = time_weight
        self.ageing_s = ageing_s
        self.jumps = jumps
        self.spare_z = spare_z
        self.move_z = move_z
        if joint_trades < 0:
            raise ConfigError(f"joint trades is a count of trades a round may make, at least 0, got {joint_trades}")
        self.joint_trades = joint_trades

    def _score(self, total: Resources, min_gain: float | None = None, memo: dict | None = None, z: float = 0.0):
        """The score of a job's next tasks, None below ``min_gain`` (the policy's by
        default) or below ``z`` standard errors of the two speeds compared
        (``JobView.speed_sd``); ``memo`` holds utilities already worked out this round."""
        floor = math.log1p(self.min_gain if min_gain is None else min_gain)
        memo = {} if memo is None else memo

        def score(job: JobView, old: tuple[int, int], new: tuple[int, int]) -> float | None:
            obj = objective_of(job, self.objective)
            u_old, u_new = _memo_utility(memo, job, old, obj), _memo_utility(memo, job, new, obj)
            if u_new <= 0:
                return None
            if u_old <= 0:
                return 1e9
            gain = math.log(u_new / u_old)
            if gain < floor:
                return None
            if (
                z
                and job.speed_sd is not None
                and gain < math.log1p(z * math.hypot(job.speed_sd(*old), job.speed_sd(*new)))
            ):
                return None
            if self.time_weight:
                # ~ time saved on the remaining work: T_rem * (1 - u_old/u_new) ~ T_rem * gain
                gain *= (job.remaining_samples / u_old) ** self.time_weight
            if obj is Objective.EFFICIENCY and (
                marginal_efficiency(
                    u_old,
                    u_new,
                    job.resources(*old).dominant_share(total),
                    job.resources(*new).dominant_share(total),
                )
                < self.efficiency_threshold
            ):
                return None
            return gain / task_share(job, old, new, total)

        return score

    def decide(
        self, jobs: list[JobView], cluster: ClusterView, state: PolicyState | None = None
    ) -> tuple[Decision, PolicyState]:
        state = state or PolicyState()
        total, available = cluster.capacity, cluster.available
        memo: dict = {}  # one job's utility at one shape, worked out once this round
        score, any_gain = self._score(total, memo=memo), self._score(total, 0.0, memo, self.spare_z)

        # 1. the fair target on the whole pool, then what nobody gains min_gain from to any gain at all
        admitted, left = admit(jobs, available, order=self._order)
        target, spare = grow(jobs, dict(admitted), left, score, pairs=True, jumps=self.jumps, leaps=True)
        target, _ = grow(jobs, target, spare, any_gain, pairs=True, jumps=self.jumps, leaps=True)

        # 2-3. which running jobs keep their current shape this round
        waiting_need = total_of(j.resources(*admitted[j.id]) for j in jobs if j.current is None and j.id in admitted)
        wishes: dict[str, int] = {}
        held: dict[str, tuple[int, int]] = {}
        for job in admission_order(jobs):
            cur = job.current
            if cur is None or job.id not in target:
                continue
            tgt = target[job.id]
            if tgt == cur:
                held[job.id] = cur
            elif tgt[0] < cur[0] or tgt[1] < cur[1]:
                wishes[job.id] = state.shrink_wishes.get(job.id, 0) + 1
                if wishes[job.id] < self.shrink_rounds:
                    held[job.id] = cur
            elif not self._worth_moving(job, cur, tgt):
                held[job.id] = cur
        held = self._fit_held(jobs, held, available, waiting_need)

        # the others share what the held jobs leave, up to their targets
        reserved = total_of(j.resources(*held[j.id]) for j in jobs if j.id in held)
        rest = [j for j in jobs if j.id not in held]
        decision, left = admit(rest, available - reserved, order=self._order)
        caps = {job_id: shape for job_id, shape in target.items() if job_id not in held}
        decision, left = grow(rest, decision, left, any_gain, caps, pairs=True, jumps=self.jumps, leaps=True)
        # room the held jobs did not take
        decision, left = grow(rest, decision, left, score, pairs=True, jumps=self.jumps, leaps=True)
        decision.update(held)
        if self.joint_trades:
            decision, left = self._trade(jobs, decision, left, total, memo)
        self._keep_unneeded_room(jobs, decision, available)
        left = self._explore(jobs, decision, available)
        # a probe may take fewer tasks than the job held: room it frees admits whoever still waits
        late, _ = admit([j for j in jobs if j.id not in decision], left, order=self._order)
        decision.update(late)
        return decision, PolicyState(shrink_wishes=wishes)

    def _trade(
        self, jobs: list[JobView], decision: Decision, left: Resources, total: Resources, memo: dict
    ) -> tuple[Decision, Resources]:
        """5. The joint search (:mod:`elasticps.sched.joint`), with
        ``joint_trades`` > 0: trades of tasks between admitted jobs where the
        one that takes gains more log-utility than the one that gives loses
        (at least ``min_gain``). A waiting job gives down to its minimum; a
        running one no lower than its current shape or its decided one, per
        kind (no shrink the hysteresis did not pass: a held job only takes).
        A job takes only a step the spare-room rule would grow it by, and a
        running job ends where the move pays for its rescale (or where it is).
        In an admission round running jobs are pinned by their limits."""
        any_gain = self._score(total, 0.0, memo, self.spare_z)

        def gain(job: JobView, old: tuple[int, int], new: tuple[int, int]) -> float:
            obj = objective_of(job, self.objective)
            u_old, u_new = _memo_utility(memo, job, old, obj), _memo_utility(memo, job, new, obj)
            if u_old <= 0 or u_new <= 0:
                return 1e9 if u_new > u_old else (-1e9 if u_new < u_old else 0.0)
            g = math.log(u_new / u_old)
            if self.time_weight:
                g *= (job.remaining_samples / min(u_old, u_new)) ** self.time_weight
            return g

        def pays(job: JobView, new: tuple[int, int]) -> bool:
            return job.current is None or new == job.current or self._worth_moving(job, job.current, new)

        def may_take(job: JobView, old: tuple[int, int], new: tuple[int, int]) -> bool:
            return any_gain(job, old, new) is not None and pays(job, new)

        def may_give(job: JobView, old: tuple[int, int], new: tuple[int, int]) -> bool:
            return pays(job, new)

        floor, cap = {}, {}
        for job in jobs:
            if job.id not in decision:
                continue
            p, w = job.min_ps, job.min_workers
            if job.current is not None:
                p = max(p, min(decision[job.id][0], job.current[0]))
                w = max(w, min(decision[job.id][1], job.current[1]))
            floor[job.id] = (p, w)
            cap[job.id] = (job.max_ps, job.max_workers)
        decision, left, _ = trade(
            jobs, decision, left, total, gain, floor, cap, may_take, may_give, (1,), self.joint_trades,
            math.log1p(self.min_gain),
        )  # fmt: skip
        return decision, left

    @staticmethod
    def _explore(jobs: list[JobView], decision: Decision, available: Resources) -> Resources:
        """4. Exploration: room nobody else took goes to jobs whose speed model is
        still unsure, to the first of their probes (``JobView.explore``, then
        ``JobView.probes``) that fits in it (a probe may also take fewer tasks of
        a kind). Returns the room left."""
        left = _room_left(jobs, decision, available)
        for job in admission_order(jobs):
            if job.id not in decision:
                continue
            cur = decision[job.id]
            for nxt in dict.fromkeys(s for s in (job.explore, *job.probes) if s is not None):
                if nxt == cur:
                    continue
                if not job.allows(*nxt):
                    continue
                extra = job.resources(nxt[0] - cur[0], nxt[1] - cur[1])
                if extra.fits_in(left):
                    decision[job.id] = nxt
                    left = left - extra
                    break
        return left

    def _order(self, jobs) -> list[JobView]:
        """Running jobs first (by arrival), then waiting jobs by aged remaining time."""

        def key(job: JobView) -> tuple:
            if job.current is not None:
                return (0, job.arrival, 0.0, job.id)
            speed = job.speed(job.min_ps, job.min_workers)
            remaining = job.remaining_samples / speed if speed > 0 else math.inf
            return (1, 0.0, remaining / (1.0 + job.waited_s / self.ageing_s), job.id)

        return sorted(jobs, key=key)

    def _keep_unneeded_room(self, jobs: list[JobView], decision: Decision, available: Resources) -> None:
        """A running job keeps its shape instead of moving to one that takes less
        room, when nobody took that room this round and the move does not pay
        for its rescale (``_worth_moving``): it would pause the job to free room
        that sits idle. Under the efficiency objective freeing CPUs is the point,
        so there the job moves."""
        smaller = []  # running jobs whose new shape takes less of some resource
        for job in jobs:
            cur, new = job.current, decision.get(job.id)
            if cur is not None and new is not None and (new[0] < cur[0] or new[1] < cur[1]) and job.allows(*cur):
                smaller.append(job)
        if not smaller:
            return
        left = _room_left(jobs, decision, available)
        for job in admission_order(smaller):
            cur, new = job.current, decision[job.id]
            assert cur is not None
            if objective_of(job, self.objective) is Objective.EFFICIENCY or self._worth_moving(job, cur, new):
                continue
            extra = job.resources(cur[0] - new[0], cur[1] - new[1])
            if extra.fits_in(left):
                decision[job.id] = cur
                left = left - extra

    def _worth_moving(self, job: JobView, cur: tuple[int, int], tgt: tuple[int, int]) -> bool:
        """Whether the time ``tgt`` saves on the job's remaining work is more
        than ``cost_factor`` x what the move costs it (``_move_cost_s``)."""
        obj = objective_of(job, self.objective)
        u_cur, u_tgt = utility(job, *cur, obj), utility(job, *tgt, obj)
        if u_cur <= 0:
            return True
        u_tgt = max(u_tgt, 1e-12)
        if self.move_z and job.speed_sd is not None and u_tgt > u_cur:
            noise = math.hypot(job.speed_sd(*cur), job.speed_sd(*tgt))
            if math.isfinite(noise) and math.log(u_tgt / u_cur) < math.log1p(self.move_z * noise):
                return False  # a gain inside the noise of the two speeds: the move would chase it
        saved = job.remaining_samples / u_cur - job.remaining_samples / u_tgt
        return saved > self.cost_factor * self._move_cost_s(job, u_cur, u_tgt)

    def _move_cost_s(self, job: JobView, u_cur: float, u_tgt: float) -> float:
        """The time a move from utility ``u_cur`` to ``u_tgt`` adds to the job's
        completion: ``rescale_cost_s`` unless its rescales were measured; then
        the pause, plus the launch during which it makes ``u_cur`` progress
        where the new shape would make ``u_tgt``."""
        if job.rescale_pause_s is None:
            return self.rescale_cost_s
        return job.rescale_pause_s + job.rescale_launch_s * max(0.0, 1.0 - u_cur / u_tgt)

    @staticmethod
    def _fit_held(
        jobs: list[JobView], held: dict[str, tuple[int, int]], available: Resources, waiting_need: Resources
    ) -> dict[str, tuple[int, int]]:
        """Release holds, largest first, until the held shapes and the waiting
        jobs' minimums fit (other tenants may have taken room since)."""
        by_id = {j.id: j for j in jobs}
        need = {job_id: by_id[job_id].resources(*shape) for job_id, shape in held.items()}
        used = waiting_need + total_of(need.values())
        held = dict(held)
        for job_id in sorted(held, key=lambda i: (-need[i].dominant_share(available), i)):
            if used.fits_in(available):
                break
            used = used - need[job_id]
            del held[job_id]
        return held


def _memo_utility(memo: dict, job: JobView, shape: tuple[int, int], objective: Objective) -> float:
    """``utility`` of ``job`` at ``shape``, worked out once a round (``memo``)."""
    key = (job.id, shape)
    if key not in memo:
        memo[key] = utility(job, *shape, objective)
    return memo[key]


def _room_left(jobs: list[JobView], decision: Decision, available: Resources) -> Resources:
    """What of ``available`` is left once every job of ``decision`` has its shape."""
    by_id = {j.id: j for j in jobs}
    left = available
    for job_id, shape in decision.items():
        left = left - by_id[job_id].resources(*shape)
    return left
