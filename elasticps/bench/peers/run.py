"""``elasticps bench peers``: every system measured in one interleaved run.

Within each repeat every system runs once per (workload, W), in an order
rotated from repeat to repeat, so a machine whose speed drifts during the run
moves every system alike; each figure is the median over repeats. The
driver runs on a ``ray.cluster_utils.Cluster`` it starts: a head node for the
one-node runs, and nodes added for the runs that need more (the 3-node
elasticps runs, Ray Train's resize) and removed after.

elasticps runs at P = 1 and at each P of ``ps_sweep``; its figure in
``throughput`` is the P with the highest median (a small sweep, said in
``throughput_detail``), beside P = 1's. A workload with an embedding table
runs on elasticps as a user runs it, the table on the PS (its loop with
``elasticps.torch.Embedding``); ``elasticps_dense`` is its TrainingProgram at
P = 1, where every worker pulls and pushes the whole table. ``memory``: the
largest peak RSS among each run's worker and PS processes, beside the
throughput (``setup.table_mib``: the table's own size).
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from elasticps.bench.peers import ddp, elasticps_ps, plain_ps, ray_train, torchrun
from elasticps.bench.peers.common import NODE_OBJECT_STORE_BYTES, RunResult, add_node
from elasticps.bench.peers.goals import embedding_figures, goals
from elasticps.bench.peers.resize import Timeline, summarize
from elasticps.bench.peers.workloads import EMBEDDING_ROWS, NAMES, Workload

THROUGHPUT_SYSTEMS = ("elasticps", "elasticps_dense", "ddp_gloo", "plain_ps")
#: What a resize run may measure; the controls run only when named: ``elasticps_import_now``
#: is elasticps with ``JobConfig.import_at_idle`` off.
RESIZE_SYSTEMS = ("elasticps", "elasticps_standby", "elasticps_import_now", "ray_train", "torchrun")
RESIZE_CONTROLS = ("elasticps_import_now",)
DEFAULT_RESIZE_SYSTEMS = tuple(s for s in RESIZE_SYSTEMS if s not in RESIZE_CONTROLS)
STANDBY_WORKERS = 2  # elasticps_standby: the grow's two new workers, started before the timed window
HEAD_CPUS = 8
NODE_CPUS = 4


@dataclass(frozen=True)
class PeersConfig:
    workloads: tuple[str, ...] = NAMES
    workers: tuple[int, ...] = (1, 2, 4)
    ps_sweep: tuple[int, ...] = (1, 2)
    repeats: int = 3
    steps: int = 20
    warmup: int = 2
    threads: int = 1
    three_nodes: bool = True
    resize_workload: str = "dense_mlp_10m"
    resize_sizes: tuple[int, ...] = (2, 4, 2)
    resize_hold_s: float = 20.0
    resize_repeats: int = 3
    resize_systems: tuple[str, ...] = DEFAULT_RESIZE_SYSTEMS
    limit_repeats: int = 10  # 0: no push+pull measurement
    small: bool = False  # the workloads' small versions (tests)
    #: the throughput runs' systems; a table too large to replicate cheaply leaves out
    #: those that do (elasticps_dense, plain_ps: a copy per worker and per PS)
    systems: tuple[str, ...] = THROUGHPUT_SYSTEMS
    embedding_rows: int = EMBEDDING_ROWS

    def __post_init__(self) -> None:
        unknown_systems = set(self.systems) - set(THROUGHPUT_SYSTEMS)
        if unknown_systems:
            raise ValueError(f"unknown systems {sorted(unknown_systems)}; choose from {', '.join(THROUGHPUT_SYSTEMS)}")
        if "elasticps" not in self.systems:
            raise ValueError("systems must include elasticps: every figure is elasticps beside its peers")
        if self.embedding_rows < 1:
            raise ValueError(f"embedding_rows must be >= 1, got {self.embedding_rows}")
        if not self.workloads and not self.resize_systems:
            raise ValueError("nothing to measure: no workloads and no resize systems")
        for name in (*self.workloads, self.resize_workload):
            if name not in NAMES:
                raise ValueError(f"unknown workload {name!r}; choose from {', '.join(NAMES)}")
        unknown = set(self.resize_systems) - set(RESIZE_SYSTEMS)
        if unknown:
            raise ValueError(f"unknown resize systems {sorted(unknown)}; choose from {', '.join(RESIZE_SYSTEMS)}")
        # worker counts matter only to throughput runs: a resize-only run needs none
        if (self.workloads and min(self.workers, default=0) < 1) or self.repeats < 1 or self.steps < 1:
            raise ValueError("workers, repeats and steps must be >= 1")

    def workload(self, name: str) -> Workload:
        return Workload(name, self.small, self.embedding_rows)


QUICK = PeersConfig(
    workers=(2,),
    repeats=1,
    steps=4,
    resize_hold_s=6.0,
    resize_repeats=1,
    limit_repeats=3,
)


def run(config: PeersConfig, say: Callable[[str], None] = lambda _: None, cluster: Any = None) -> dict[str, Any]:
    """Every measurement of ``config``; ``cluster``: a running ``ray.cluster_utils.Cluster``
    the driver is connected to (else one is started and shut down here)."""
    own = cluster is None
    if own:
        cluster = start_cluster()
    load_before = os.getloadavg()
    started = time.time()
    try:
        runs = throughput_runs(config, say)
        spread = three_node_runs(config, cluster, say) if config.three_nodes else {}
        timelines = resize_runs(config, cluster, say)
        limit = limits(config, cluster) if config.limit_repeats > 0 else {}
    finally:
        if own:
            stop_cluster(cluster)
    out = {
        "setup": setup(config),
        "machine": {"cpus": os.cpu_count(), "load_before": load_before, "load_after": os.getloadavg()},
        "wall_s": time.time() - started,
        "throughput": throughput_table(runs),
        "throughput_detail": throughput_detail(runs),
        "memory": memory_table(runs),
        "throughput_3node": spread,
        "resize": {system: _median_costs(tls) for system, tls in timelines.items()},
        "resize_timelines": {system: tls[-1].to_json() for system, tls in timelines.items()},
        "limit": limit,
        "trained": all(
            r.trained for per_w in runs.values() for per in per_w.values() for rs in per.values() for r in rs
        )
        and all(_trained(t) for tls in timelines.values() for t in tls),
    }
    out["goals"] = goals(out)
    out["goal_figures"] = {"embedding": embedding_figures(out)}
    return out


def setup(config: PeersConfig) -> dict[str, Any]:
    workloads = [config.workload(name) for name in config.workloads]
    return {
        "config": asdict(config),
        "workloads": {w.name: w.describe() for w in workloads},
        "table_mib": {w.name: w.table_mib() for w in workloads if w.table_mib() is not None},
        "elasticps_with_a_table": "the table on the PS: the workload's loop with elasticps.torch.Embedding "
        "(a worker reads its batch's rows); elasticps_dense: its TrainingProgram at P = 1 (nn.EmbeddingBag: "
        "every worker pulls and pushes the whole table, as DDP and the plain PS replicate it)",
        "memory": "the largest peak RSS (VmHWM) among a run's worker (DDP rank) and PS processes, median of repeats",
        "same_for_every_system": "model, data and its order, global batch, optimizer, torch threads per process; "
        "1 CPU (Ray's num_cpus) per PS or worker task; DDP ranks are plain processes",
        "comm_share": "1 - (forward/backward + optimizer update) / step wall time; DDP's forward/backward timed "
        "without its all-reduce (no_sync)",
        "elasticps_ps": f"P = 1 and the best of P in {list(config.ps_sweep)} by median (a sweep)",
        "object_store_bytes_per_node": NODE_OBJECT_STORE_BYTES,
    }


# ------------------------------------------------------------------ throughput
Runs = dict[str, dict[int, dict[str, list[RunResult]]]]  # workload -> W -> label -> repeats


def throughput_runs(config: PeersConfig, say: Callable[[str], None]) -> Runs:
    runs: Runs = {}
    for r in range(config.repeats):
        for name in config.workloads:
            workload = config.workload(name)
            for w in config.workers:
                labels = [f"elasticps_p{p}" for p in config.ps_sweep]
                dense = workload.ps_table_loop() is not None and "elasticps_dense" in config.systems
                labels += ["elasticps_dense_p1"] if dense else []
                labels += [system for system in ("ddp_gloo", "plain_ps") if system in config.systems]
                shift = r % len(labels)
                for label in labels[shift:] + labels[:shift]:
                    result = _one(label, workload, w, config)
                    say(f"repeat {r + 1}/{config.repeats} {name} W={w} {label}: {result.samples_per_s:.0f} samples/s")
                    runs.setdefault(name, {}).setdefault(w, {}).setdefault(label, []).append(result)
    return runs


def _one(label: str, workload: Workload, w: int, config: PeersConfig) -> RunResult:
    kw = {"steps": config.steps, "warmup": config.warmup, "threads": config.threads}
    if label.startswith("elasticps_dense_p"):
        return elasticps_ps.run(workload, w, num_ps=int(label.removeprefix("elasticps_dense_p")), **kw)
    if label.startswith("elasticps_p"):
        tables = workload.ps_table_loop() is not None
        return elasticps_ps.run(workload, w, num_ps=int(label.removeprefix("elasticps_p")), ps_table=tables, **kw)
    return (ddp if label == "ddp_gloo" else plain_ps).run(workload, w, **kw)


def _median(results: list[RunResult]) -> float:
    return statistics.median(r.samples_per_s for r in results)


def _systems(per: dict[str, list[RunResult]]) -> dict[str, str]:
    """Each system of ``THROUGHPUT_SYSTEMS`` that ran, and the label whose runs it
    stands for (elasticps: its P with the highest median)."""
    eps = max((k for k in per if k.startswith("elasticps_p")), key=lambda k: _median(per[k]))
    labels = {"elasticps": eps, "elasticps_dense": "elasticps_dense_p1", "ddp_gloo": "ddp_gloo", "plain_ps": "plain_ps"}
    return {system: label for system, label in labels.items() if label in per}


def throughput_table(runs: Runs) -> dict[str, dict[str, dict[str, float]]]:
    table: dict[str, dict[str, dict[str, float]]] = {}
    for name, per_w in runs.items():
        for w, per in per_w.items():
            table.setdefault(name, {})[str(w)] = {s: _median(per[label]) for s, label in _systems(per).items()}
    return table


def memory_table(runs: Runs) -> dict[str, dict[str, dict[str, dict[str, float | None]]]]:
    """``{workload: {W: {system: {worker_peak_mib, ps_peak_mib}}}}``, medians of repeats."""

    def med(values: list[float | None]) -> float | None:
        known = [v for v in values if v is not None]
        return statistics.median(known) if known else None

    table: dict[str, dict[str, dict[str, dict[str, float | None]]]] = {}
    for name, per_w in runs.items():
        for w, per in per_w.items():
            table.setdefault(name, {})[str(w)] = {
                system: {
                    "worker_peak_mib": med([r.worker_peak_mib for r in per[label]]),
                    "ps_peak_mib": med([r.ps_peak_mib for r in per[label]]),
                }
                for system, label in _systems(per).items()
            }
    return table


def throughput_detail(runs: Runs) -> dict[str, Any]:
    detail: dict[str, Any] = {}
    for name, per_w in runs.items():
        for w, per in per_w.items():
            cell: dict[str, Any] = {}
            for label, results in per.items():
                shares = [r.comm_share for r in results if r.comm_share is not None]
                cell[label] = {
                    "samples_per_s": _median(results),
                    "repeats": [r.samples_per_s for r in results],
                    "comm_share": statistics.median(shares) if shares else None,
                    "trained": all(r.trained for r in results),
                    "first_loss": results[0].losses[0],
                    "last_loss": results[0].losses[-1],
                }
                if "ps_table" in results[0].detail:  # elasticps: the table on the PS, or in every worker
                    cell[label]["ps_table"] = results[0].detail["ps_table"]
            cell["elasticps_chosen_ps"] = int(_systems(per)["elasticps"].removeprefix("elasticps_p"))
            detail.setdefault(name, {})[str(w)] = cell
    return detail


def three_node_runs(config: PeersConfig, cluster: Any, say: Callable[[str], None]) -> dict[str, Any]:
    """elasticps with its PS on the head node and its workers spread over two other nodes."""
    import ray

    nodes = [add_node(cluster, num_cpus=NODE_CPUS) for _ in range(2)]
    cluster.wait_for_nodes()
    try:
        head = ray.get_runtime_context().get_node_id()
        others = [n["NodeID"] for n in ray.nodes() if n["Alive"] and n["NodeID"] != head]
        out: dict[str, Any] = {"how": "PS on the head node, workers alternating over two other Ray nodes"}
        for name in config.workloads:
            workload = config.workload(name)
            for w in config.workers:
                pins = {"ps-0": head, **{f"worker-{i}": others[i % 2] for i in range(w)}}
                tables = workload.ps_table_loop() is not None
                results = [
                    elasticps_ps.run(workload, w, config.steps, config.warmup, config.threads, 1, pins, tables)
                    for _ in range(config.repeats)
                ]
                say(f"3 nodes {name} W={w} elasticps: {_median(results):.0f} samples/s")
                out.setdefault(name, {})[str(w)] = {"elasticps": _median(results)}
        return out
    finally:
        for node in nodes:
            cluster.remove_node(node)


# ---------------------------------------------------------------------- resize
def resize_runs(config: PeersConfig, cluster: Any, say: Callable[[str], None]) -> dict[str, list[Timeline]]:
    workload = config.workload(config.resize_workload)
    systems = list(config.resize_systems)
    skipped = ray_train.available()
    if skipped and "ray_train" in systems:
        say(f"ray_train skipped: {skipped}")
        systems.remove("ray_train")
    timelines: dict[str, list[Timeline]] = {}
    for r in range(config.resize_repeats):
        shift = r % max(1, len(systems))
        for system in systems[shift:] + systems[:shift]:
            args = (workload, config.resize_sizes, config.resize_hold_s, config.threads, say)
            if system == "elasticps":
                tl = elasticps_ps.resize(*args)
            elif system == "elasticps_standby":
                tl = elasticps_ps.resize(*args, standby=STANDBY_WORKERS)
            elif system == "elasticps_import_now":
                tl = elasticps_ps.resize(*args, import_at_idle=False)
            elif system == "torchrun":
                tl = torchrun.resize(*args)
            else:
                tl = ray_train.resize(*args, cluster=cluster)
            costs = summarize(tl)
            say(f"resize {system}: {costs['samples_lost']:.0f} samples lost, {costs['seconds_to_full_speed']:.1f} s")
            timelines.setdefault(system, []).append(tl)
    return timelines


def _median_costs(timelines: list[Timeline]) -> dict[str, Any]:
    each = [summarize(t) for t in timelines]
    paid = list(dict.fromkeys(k for c in each for k in c["before_window"]))  # in the order the system gave them
    return {
        "samples_lost": statistics.median(c["samples_lost"] for c in each),
        "seconds_to_full_speed": statistics.median(c["seconds_to_full_speed"] for c in each),
        # what the system paid before the timed window (standbys' start): not in samples_lost
        "before_window": {
            k: statistics.median(c["before_window"][k] for c in each if k in c["before_window"]) for k in paid
        },
        "repeats": [
            {k: c[k] for k in ("samples_lost", "seconds_to_full_speed", "changes", "before_window")} for c in each
        ],
        "trained": all(_trained(t) for t in timelines),
        "how": each[0]["how"],
    }


def _trained(timeline: Timeline) -> bool:
    losses = [x for x in timeline.losses() if x == x]
    k = max(1, len(losses) // 4)
    return len(losses) >= 2 and statistics.fmean(losses[-k:]) < statistics.fmean(losses[:k])


# ---------------------------------------------------------------------- limits
def limits(config: PeersConfig, cluster: Any) -> dict[str, Any]:
    """Push+pull of 40 MB against memcpy, on one node (read in place, and copied:
    :func:`~elasticps.bench.pushpull_bench.pushpull`) and between two Ray nodes."""
    import ray

    from elasticps.bench import pushpull_bench

    repeats = config.limit_repeats
    out: dict[str, Any] = {"payload_MB": pushpull_bench.PAYLOAD_FLOATS * 4 / 1e6}
    out["memcpy_MBps"] = pushpull_bench.memcpy_mbps(repeats)
    out["pushpull_shm"] = pushpull_bench.pushpull(repeats, shared=True)
    out["pushpull_shm_copy"] = pushpull_bench.pushpull(repeats, shared=True, read="copy")
    out["pushpull_shm_MBps"] = out["pushpull_shm"]["MBps"]
    out["pushpull_object_store_one_node_MBps"] = pushpull_bench.pushpull(repeats, shared=False)["MBps"]
    node = add_node(cluster, num_cpus=NODE_CPUS)
    cluster.wait_for_nodes()
    try:
        head = ray.get_runtime_context().get_node_id()
        other = next(n["NodeID"] for n in ray.nodes() if n["Alive"] and n["NodeID"] != head)
        out["pushpull_object_store_two_nodes_MBps"] = pushpull_bench.pushpull(
            repeats, shared=False, nodes=(head, other)
        )["MBps"]
    finally:
        cluster.remove_node(node)
    out["pushpull_shm_over_memcpy"] = out["pushpull_shm_MBps"] / out["memcpy_MBps"]
    out["pushpull_shm_copy_over_memcpy"] = out["pushpull_shm_copy"]["MBps"] / out["memcpy_MBps"]
    return out


# --------------------------------------------------------------------- cluster
def start_cluster() -> Any:
    import ray
    from ray.cluster_utils import Cluster

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    if ray.is_initialized():
        ray.shutdown()
    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": HEAD_CPUS,
            "include_dashboard": False,
            "object_store_memory": NODE_OBJECT_STORE_BYTES,
        },
    )
    # Ray Train's helpers find their cluster through the state API, which picks the newest cluster on the
    # machine unless RAY_ADDRESS names one: with other clusters running here it must name ours
    ray.init(address=cluster.address, logging_level="ERROR", runtime_env={"env_vars": {"RAY_ADDRESS": cluster.address}})
    return cluster


def stop_cluster(cluster: Any) -> None:
    import ray

    ray.shutdown()
    cluster.shutdown()
