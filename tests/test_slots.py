"""Which running tasks a new shape keeps (pure: no Ray)."""

from __future__ import annotations

from elasticps.runtime.slots import fits_now, match_slots, shards_that_fit


def test_a_slot_keeps_the_task_of_its_index_where_it_runs():
    # 3 workers on a, b, b; the new shape wants a, b, b: nothing starts
    assert match_slots(["a", "b", "b"], ["a", "b", "b"]) == {0: 0, 1: 1, 2: 2}


def test_a_shrink_that_renames_tasks_starts_none():
    # 2x4 -> 1x3 as placement numbers it: the workers on b become worker-0 and worker-1
    assert match_slots(["a", "a", "b", "b"], ["b", "b", "a"]) == {0: 2, 1: 3, 2: 0}


def test_a_slot_on_a_node_with_no_unused_task_needs_a_new_one():
    # worker-2 moves from c to a; a's only task already fills worker-0
    assert match_slots(["a", "b", "c"], ["a", "b", "a"]) == {0: 0, 1: 1}


def test_pinned_slots_are_matched_before_unpinned_ones():
    # slot 0 could take task 0 (on a), but slot 1 must be on a: slot 0 takes task 1
    assert match_slots(["a", "b"], [None, "a"]) == {1: 0, 0: 1}


def test_unpinned_growth_keeps_every_task_and_adds_the_rest():
    assert match_slots(["a", "b"], [None, None, None]) == {0: 0, 1: 1}


def test_fits_now_adds_up_tasks_per_node():
    free = {"a": {"CPU": 2.0}, "b": {"CPU": 0.5}}
    assert fits_now([("a", {"CPU": 1.0}), ("a", {"CPU": 1.0})], free)
    assert not fits_now([("a", {"CPU": 1.0}), ("a", {"CPU": 1.5})], free)  # 2.5 > 2 on a
    assert not fits_now([("b", {"CPU": 1.0})], free)
    assert not fits_now([("c", {"CPU": 1.0})], free)  # a node not in the free list has nothing free
    assert fits_now([], free)


def test_shards_that_fit_count_in_order_pinned_ones_on_their_node_others_anywhere():
    free = {"a": {"CPU": 2.5, "GPU": 1.0}, "b": {"CPU": 0.99}, "c": {"CPU": 4.0, "GPU": 0.0}}
    cpu = {"CPU": 1.0}
    assert shards_that_fit(9, cpu, {}, free) == 6  # 2 on a, none on b, 4 on c
    assert shards_that_fit(3, {"CPU": 1.0, "GPU": 1.0}, {}, free) == 1  # only a has a GPU
    assert shards_that_fit(3, {"CPU": 0.5, "GPU": 0.0}, {}, free) == 3  # a resource asked at 0 does not count
    assert shards_that_fit(3, cpu, {0: "b"}, free) == 0  # the first is pinned where it does not fit
    assert shards_that_fit(3, cpu, {0: "a", 1: "a", 2: "a"}, free) == 2  # room elsewhere does not help
    assert shards_that_fit(3, cpu, {1: "gone"}, free) == 3  # a pin to a node not alive: anywhere
    assert shards_that_fit(2, cpu, {}, {}) == 0
