"""Another tenant of the demo's Ray cluster: a separate driver holding CPUs.

Run as ``python -m elasticps.demo.tenant --address A --per-node 2 --seconds 45``:
it connects to the cluster as its own Ray job, starts ``per-node`` one-CPU
actors on every node that has CPUs, each doing real work within its CPU
limit, writes ``--ready-file`` once they all run, and ends after
``--seconds``, or as soon as ``--leave-file`` exists (its actors die with it,
and their CPUs are free again).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from elasticps.runtime.cpu_limit import CpuLimit


@ray.remote(num_cpus=1)
class Busy:
    """Multiplies matrices, within ``cpu_limit`` cores, until killed."""

    def __init__(self, cpu_limit: float | None) -> None:
        self.limit = CpuLimit(cpu_limit)

    def ready(self) -> bool:
        return True

    def work(self) -> int:
        a = np.random.default_rng(0).random((128, 128), dtype=np.float32)
        rounds = 0
        while True:
            with self.limit.held():
                for _ in range(10):
                    a = np.tanh(a @ a)
            rounds += 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m elasticps.demo.tenant")
    parser.add_argument("--address", required=True)
    parser.add_argument("--per-node", type=int, default=2)
    parser.add_argument("--cpu-limit", type=float, default=None)
    parser.add_argument("--seconds", type=float, required=True, help="leave after this long at most")
    parser.add_argument("--ready-file", type=Path)
    parser.add_argument("--leave-file", type=Path, help="leave as soon as this file exists")
    args = parser.parse_args(argv)
    ray.init(address=args.address, log_to_driver=False, namespace="other-tenant")
    nodes = sorted(n["NodeID"] for n in ray.nodes() if n["Alive"] and n["Resources"].get("CPU", 0) > 0)
    actors = [
        Busy.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote(args.cpu_limit)
        for node in nodes
        for _ in range(args.per_node)
    ]
    ray.get([a.ready.remote() for a in actors], timeout=120)
    for a in actors:
        a.work.remote()
    if args.ready_file:
        args.ready_file.write_text(f"{len(actors)}\n")
    deadline = time.monotonic() + args.seconds
    while time.monotonic() < deadline and not (args.leave_file and args.leave_file.exists()):
        time.sleep(0.2)
    ray.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
