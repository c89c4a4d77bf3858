"""A round's first step: poll every job running here and record what it says.

New windows become speed observations; runtime events become stored events;
a shape becomes the job's allocation once a poll shows it applied (never
when it is merely asked for); rescale records feed the metrics and what
rescales cost here; an ended job gets its final state, or starts again from
its latest checkpoint if it failed by bad luck (see :class:`JobTable`).
Called with the manager's lock held.
"""

from __future__ import annotations

from dataclasses import dataclass

from elasticps.errors import ElasticPSError, ProgramError, one_line
from elasticps.manager.isolation import window_problem
from elasticps.manager.live import JobTable, LiveJob
from elasticps.manager.metrics import ManagerMetrics
from elasticps.manager.rescale_costs import RescaleCosts
from elasticps.manager.runtime import JobStatus
from elasticps.manager.states import JobState
from elasticps.manager.store import Rescale, Store
from elasticps.tables import shape_text

#: Said of a job failed for good by its program's own error.
OWN_ERROR = "not started again: its code would meet the same error"


@dataclass
class Observer:
    """A round's polls (see the module's docstring): :meth:`collect` records
    what each job running here says, and retires those that ended."""

    store: Store
    jobs: JobTable
    metrics: ManagerMetrics
    rescale_costs: RescaleCosts  # fed with each rescale record

    def collect(self, now: float) -> bool:
        """Poll every job here: record new speed observations, store runtime
        events, record applied allocations, retire jobs that ended (True if one did).

        A job's first measurement at a new shape does not start a round: the
        job measured first would explore first and take the room that others,
        measured a moment later, would have shared (tried in the demo: their
        completion times got worse). Exploration moves at the interval."""
        jobs = self.jobs
        news = False
        for name, live in list(jobs.live.items()):
            try:
                st = live.handle.poll(live.last_step, live.events_seen, live.rescales_seen)
            except ProgramError as exc:  # its answer was not plain data: the program's doing, not bad luck
                jobs.retire(name, live, JobState.FAILED, now, f"job failed: {exc}")
                news = True
                continue
            except ElasticPSError as exc:  # the job's driver is gone: nothing of it runs any more
                self._drop_unapplied(name, live, now)
                jobs.stopped_by_failure(name, live, now, str(exc))
                news = True
                continue
            live.status = st
            bad = next((p for p in map(window_problem, st.windows) if p), None)
            if bad is not None:
                jobs.retire(name, live, JobState.FAILED, now, f"job failed: {bad}")
                news = True
                continue
            for w, end in zip(st.windows, window_ends(st.windows, now), strict=True):
                if w.last_step > live.last_step:
                    self.store.record_observation(
                        name, end, w.num_ps, w.num_workers, w.samples_per_s, w.batch_size, w.nodes, w.cross,
                        step=w.last_step, epoch=st.epoch, loss=w.loss, metric=st.metric,
                    )  # fmt: skip
                    live.last_step = w.last_step
                    t = w.mean_step_times
                    total = t.compute_s + t.pull_s + t.push_s + t.update_s + t.wait_s
                    if total > 0:
                        live.compute_share = t.compute_s / total
                    jobs.progressed(name, w.last_step)
            for text in st.events:
                self.store.add_event(now, name, event_kind(text), text)
                if text.partition(": ")[2].startswith("rescale to") and "failed" in text:
                    live.asked, live.asked_placement = (st.num_ps, st.num_workers), dict(st.placement)
            live.events_seen = st.events_total
            if st.windows or st.ended:
                self._keep_progress(name, st)
            self._count_rescales(name, st, now)
            live.rescales_seen = st.rescales_total
            applied = (st.num_ps, st.num_workers, st.placement)
            if st.state == "running" and st.num_ps and applied != live.applied:
                self.store.record_allocation(name, now, *applied)
                live.applied = applied
            elif st.ended and st.num_ps and live.applied is None and st.windows:
                # it ran and ended between two polls: its shape from when its first window began
                self.store.record_allocation(name, window_ends(st.windows, now)[0] - st.windows[0].elapsed_s, *applied)
                live.applied = applied
            if st.ended:
                if st.state == "finished":
                    metric = f", metric {st.metric:.6g}" if st.metric is not None else ""
                    jobs.retire(name, live, JobState.FINISHED, now, f"job finished at step {st.step}{metric}")
                elif st.state == "failed" and st.fatal:  # its own error (before a step, a rule): again fails again
                    why = f"job failed: {one_line(st.error or '')}; {OWN_ERROR}"
                    jobs.retire(name, live, JobState.FAILED, now, why)
                elif st.state == "failed":
                    jobs.stopped_by_failure(name, live, now, one_line(st.error or "") or "unknown error")
                else:  # stopped without being cancelled: start it again from its checkpoint
                    jobs.release(name, live)
                news = True  # its room is free
        return news

    def _drop_unapplied(self, name: str, live: LiveJob, now: float) -> None:
        """The job's driver is gone with a rescale asked and not applied (the shape
        it last ran is not the one asked): the job's log says it was dropped, as
        the driver itself says of a job that ended first (it cannot, gone)."""
        if live.applied is not None and live.applied[:2] != live.asked:
            shape = shape_text(*live.asked)
            self.store.add_event(now, name, "rescale", f"the rescale to {shape} was dropped: the job's driver is gone")

    def _count_rescales(self, name: str, st: JobStatus, now: float) -> None:
        """Store the poll's new rescale records; feed the metrics and what rescales cost here."""
        for rec in st.rescales:
            self.store.record_rescale(
                name, now,
                Rescale(now, rec.at_step, rec.from_shape, rec.to_shape, rec.pause_s, rec.tasks_start_s, rec.ok),
            )  # fmt: skip
            if rec.ok:
                self.metrics.rescale_pause_seconds.observe(rec.pause_s)
                if rec.tasks_start_s is not None:
                    self.metrics.rescale_launch_seconds.observe(rec.tasks_start_s)
            self.rescale_costs.observe(name, rec)

    def _keep_progress(self, name: str, st: JobStatus) -> None:
        """Store the job's latest progress, so it is shown after it ended and after a restart."""
        last = st.windows[-1] if st.windows else None
        kept = self.store.progress(name) or {}
        self.store.set_progress(
            name,
            {
                "step": st.step,
                "epoch": st.epoch,
                "samples_per_s": last.samples_per_s if last else kept.get("samples_per_s"),
                "loss": last.loss if last else kept.get("loss"),
                "metric": st.metric if st.metric is not None else kept.get("metric"),
                "remaining_samples": st.remaining_samples,
            },
        )


def window_ends(windows: list, now: float) -> list[float]:
    """When each window of one poll ended, about: the last one now, each earlier
    one as long before as the later ones lasted (a poll may bring several)."""
    ends, t = [], now
    for w in reversed(windows):
        ends.append(t)
        t -= w.elapsed_s
    return ends[::-1]


def event_kind(text: str) -> str:
    """The stored kind of a runtime event: task and node losses stand out."""
    if "died" in text or "is gone" in text:
        return "loss"
    if "checkpoint" in text and "damaged" in text:
        return "checkpoint"
    return "runtime"
