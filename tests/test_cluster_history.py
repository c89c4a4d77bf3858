"""The dashboard's cluster history outlives the manager: what one manager saw
is read back from the store by the next, bounded, and a store that cannot be
written never stops a round."""

from __future__ import annotations

import sqlite3

from elasticps.manager import Store
from elasticps.manager.history import RETRY_S, ClusterHistory
from elasticps.manager.reasons import Move
from elasticps.sched import ClusterView, NodeView, Resources


def _view(others_cpu: float) -> ClusterView:
    return ClusterView((NodeView("n1", Resources(cpu=8.0), Resources(cpu=others_cpu)),))


def test_a_new_history_on_the_same_store_shows_what_the_last_one_saw(tmp_path):
    store = Store(tmp_path / "m.db")
    first = ClusterHistory(store, max_samples=3, max_rounds=2)
    for t in range(5):
        first.sample(10.0 * t, _view(float(t)), {"n1": Resources(cpu=1.0)})
    for t in range(3):
        first.round(10.0 * t, {"a": Move("a", "grow", (1, 2), f"round {t}", f"a grows: round {t}")})
    first.sample(50.0, _view(1.0), {}, record=False)  # a page's read: returned, not recorded
    assert [s["at"] for s in first.samples()][-1] == 40.0
    first.sample(51.0, _view(1.0), {})  # the round's, 1 s later with the same nodes: not a repeat of the read's
    store.close()

    again = ClusterHistory(Store(tmp_path / "m.db"), max_samples=3, max_rounds=2)
    assert [s["at"] for s in again.samples()] == [30.0, 40.0, 51.0]  # the newest 3 saved, oldest first
    assert again.samples()[-2]["nodes"][0]["others_cpu"] == 4.0
    assert [r["moves"][0]["why"] for r in again.rounds()] == ["round 1", "round 2"]
    assert again.latest_moves()["a"]["at"] == 20.0


def test_a_store_that_cannot_be_written_keeps_the_history_in_memory(tmp_path):
    store = Store(tmp_path / "m.db")
    history = ClusterHistory(store)
    other = sqlite3.connect(tmp_path / "m.db")
    other.execute("BEGIN EXCLUSIVE")  # another process holds the write lock
    try:
        history.round(1.0, {"a": Move("a", "grow", (1, 2), "room", "a grows")})
    finally:
        other.rollback()
        other.close()
    assert [r["at"] for r in history.rounds()] == [1.0]
    assert ClusterHistory(store).rounds() == []  # it was not written
    history.round(1.0 + RETRY_S / 2, {"a": Move("a", "grow", (1, 2), "room", "a grows")})  # no write tried yet
    history.round(1.0 + RETRY_S, {"a": Move("a", "keep", (1, 2), "keep", "a keeps")})
    assert [r["at"] for r in ClusterHistory(store).rounds()] == [1.0 + RETRY_S]
    assert len(history.rounds()) == 3
