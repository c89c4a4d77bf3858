"""Which running tasks a new shape keeps, and whether its new tasks have room.

A rescale asks for a shape with optional pins ``{task name: node}``. Tasks of
one kind are interchangeable processes (a PS shard's contents are set when
the shards are re-cut; a worker holds no state between steps), so a slot of
the new shape may be filled by any running task of its kind on the node the
slot wants. Keeping them is what makes a shrink, or a shape that only moves
tasks between names, start no process at all.

Pure functions: no Ray, no clock.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

#: Slack when comparing resource amounts.
EPS = 1e-9


def match_slots(have: Sequence[str], want: Sequence[str | None]) -> dict[int, int]:
    """``{slot: running task}`` for the slots that keep a running task.

    ``have[j]`` is the node running task ``j``; ``want[i]`` is the node slot
    ``i`` of the new shape is pinned to (None: anywhere). Pinned slots first:
    the task of the same index if it runs there, else an unused task on that
    node. Then unpinned slots: the task of the same index if unused, else any
    unused one. Slots left out need a new task.
    """
    out: dict[int, int] = {}
    used: set[int] = set()

    def take(i: int, j: int) -> None:
        out[i] = j
        used.add(j)

    pinned = [i for i, node in enumerate(want) if node is not None]
    for i in pinned:
        if i < len(have) and have[i] == want[i]:
            take(i, i)
    for i in pinned:
        if i not in out:
            j = next((j for j, node in enumerate(have) if j not in used and node == want[i]), None)
            if j is not None:
                take(i, j)
    for i, node in enumerate(want):
        if node is None:
            j = i if i < len(have) and i not in used else next((j for j in range(len(have)) if j not in used), None)
            if j is not None:
                take(i, j)
    return out


def fits_now(needs: Iterable[tuple[str, dict[str, float]]], free: dict[str, dict[str, float]]) -> bool:
    """Whether tasks needing ``(node, {resource: amount})`` all fit in what
    ``free`` (per node) has now."""
    total: dict[str, dict[str, float]] = {}
    for node, need in needs:
        per = total.setdefault(node, {})
        for key, amount in need.items():
            per[key] = per.get(key, 0.0) + amount
    return all(
        amount <= free.get(node, {}).get(key, 0.0) + EPS for node, per in total.items() for key, amount in per.items()
    )


def shards_that_fit(count: int, need: dict[str, float], pins: dict[int, str], free: dict[str, dict[str, float]]) -> int:
    """How many of tasks ``0..count-1`` fit in ``free`` (per node) now, in
    order, each needing ``need``: task i on its pinned node ``pins[i]`` if that
    node is alive, else on the first node with room."""
    placed: list[tuple[str, dict[str, float]]] = []
    for i in range(count):
        pin = pins.get(i)
        nodes = [pin] if pin in free else sorted(free)
        node = next((n for n in nodes if fits_now([*placed, (n, need)], free)), None)
        if node is None:
            return i
        placed.append((node, need))
    return count
