"""The peers benchmark's JSON as a text table and a plot."""

from __future__ import annotations

from pathlib import Path
from typing import Any

SYSTEM_ORDER = (
    "elasticps",
    "elasticps_dense",
    "elasticps_standby",
    "elasticps_import_now",
    "ddp_gloo",
    "plain_ps",
    "ray_train",
    "torchrun",
)


def table(out: dict[str, Any]) -> str:
    lines = ["throughput, samples/s (median of repeats; comm share of a step in brackets)"]
    detail = out.get("throughput_detail", {})
    for name, per_w in out.get("throughput", {}).items():
        table_mib = out["setup"].get("table_mib", {}).get(name)
        table_text = f"; its table {table_mib:.0f} MiB" if table_mib is not None else ""
        lines.append(f"  {name}  ({out['setup']['workloads'].get(name, '')}{table_text})")
        for w, row in per_w.items():
            cell = detail.get(name, {}).get(w, {})
            chosen = cell.get("elasticps_chosen_ps")
            parts = []
            for system in SYSTEM_ORDER:
                if system not in row:
                    continue
                key = {"elasticps": f"elasticps_p{chosen}", "elasticps_dense": "elasticps_dense_p1"}.get(system, system)
                share = cell.get(key, {}).get("comm_share")
                label = f"elasticps P={chosen}" if system == "elasticps" else system
                parts.append(f"{label} {row[system]:.0f}" + (f" [{share:.0%}]" if share is not None else ""))
            p1 = cell.get("elasticps_p1", {}).get("samples_per_s")
            if chosen != 1 and p1 is not None:
                parts.append(f"(elasticps P=1 {p1:.0f})")
            lines.append(f"    W={w}: " + ", ".join(parts))
            peaks = out.get("memory", {}).get(name, {}).get(w, {})
            if table_mib is not None and peaks:
                lines.append("      peak RSS, MiB (worker / PS): " + ", ".join(_peaks(s, peaks[s]) for s in peaks))
    spread = {k: v for k, v in out.get("throughput_3node", {}).items() if k != "how"}
    if spread:
        lines.append("elasticps over 3 Ray nodes (" + out["throughput_3node"]["how"] + "), samples/s")
        for name, per_w in spread.items():
            lines.append(f"  {name}: " + ", ".join(f"W={w} {c['elasticps']:.0f}" for w, c in per_w.items()))
    if out.get("resize"):
        lines.append("resize 2 -> 4 -> 2 workers, per resize (median of repeats)")
        for system in SYSTEM_ORDER:
            r = out["resize"].get(system)
            if r:
                lines.append(
                    f"  {system:10s} {r['samples_lost']:8.0f} samples lost, "
                    f"{r['seconds_to_full_speed']:6.1f} s to full speed  ({r['how']})"
                )
                paid = r.get("before_window")
                if paid:
                    lines.append(
                        "    paid before the timed window: " + ", ".join(f"{k} {v:g}" for k, v in paid.items())
                    )
    limit = out.get("limit")
    if limit:
        lines.append(
            f"push+pull of {limit['payload_MB']:.0f} MB: shared memory {limit['pushpull_shm_MBps']:.0f} MB/s "
            f"({limit['pushpull_shm_over_memcpy']:.2f}x memcpy {limit['memcpy_MBps']:.0f} MB/s; "
            f"each end copying: {limit['pushpull_shm_copy_over_memcpy']:.2f}x); "
            f"object store one node {limit['pushpull_object_store_one_node_MBps']:.0f} MB/s, "
            f"two nodes {limit['pushpull_object_store_two_nodes_MBps']:.0f} MB/s"
        )
    machine = out.get("machine", {})
    if machine:
        lines.append(
            f"load average before / after: {machine['load_before'][0]:.2f} / {machine['load_after'][0]:.2f} "
            f"on {machine['cpus']} CPUs; {out.get('wall_s', 0) / 60:.1f} min"
        )
    for goal, ok in out.get("goals", {}).items():
        lines.append(f"goal {goal}: {'-' if ok is None else 'met' if ok else 'NOT met'}")
    emb = out.get("goal_figures", {}).get("embedding", {})
    for w, c in emb.items():
        if w != "table_mib" and None not in c.values():
            lines.append(
                f"  embedding W={w}: elasticps {c['elasticps']:.0f} vs ddp_gloo {c['ddp_gloo']:.0f} samples/s; "
                f"worker peak {c['elasticps_worker_peak_mib']:.0f} vs {c['ddp_gloo_worker_peak_mib']:.0f} MiB "
                f"(elasticps PS {c['elasticps_ps_peak_mib']:.0f} MiB); table {emb['table_mib']:.0f} MiB"
            )
    return "\n".join(lines)


def _peaks(system: str, cell: dict[str, float | None]) -> str:
    worker, ps = cell.get("worker_peak_mib"), cell.get("ps_peak_mib")
    return f"{system} {'-' if worker is None else f'{worker:.0f}'}" + ("" if ps is None else f" / {ps:.0f}")


def plot(out: dict[str, Any], path: Path) -> Path:
    """Bars of samples/s per workload and W, and each system's resize timeline."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = list(out.get("throughput", {}))
    panels = len(workloads) + (1 if out.get("resize_timelines") else 0)
    fig, axes = plt.subplots(1, max(1, panels), figsize=(5 * max(1, panels), 4), squeeze=False)
    for ax, name in zip(axes[0], workloads, strict=False):
        per_w = out["throughput"][name]
        systems = [s for s in SYSTEM_ORDER if any(s in row for row in per_w.values())]
        width = 0.8 / max(1, len(systems))
        for i, system in enumerate(systems):
            xs = [j + i * width for j in range(len(per_w))]
            ax.bar(xs, [row.get(system, 0) for row in per_w.values()], width, label=system)
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(per_w))], [f"W={w}" for w in per_w])
        ax.set_title(name)
        ax.set_ylabel("samples/s")
        ax.legend(fontsize=8)
    if out.get("resize_timelines"):
        ax = axes[0][-1]
        for system, tl in out["resize_timelines"].items():
            steps = tl["steps"]
            if not steps or not tl["changes"]:
                continue
            t0 = tl["changes"][0][0]
            ts, rates = _rolling(steps, 2.0)
            ax.plot([t - t0 for t in ts], rates, label=system)
        ax.axvline(0, color="grey", lw=0.5)
        ax.set_title("resize 2 -> 4 -> 2 (t = 0: grow asked)")
        ax.set_xlabel("s")
        ax.set_ylabel("samples/s (2 s window)")
        ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _rolling(steps: list[list[float]], window_s: float, every_s: float = 0.25) -> tuple[list[float], list[float]]:
    """Samples/s over the last ``window_s`` on a regular grid (stalls show as zero)."""
    if not steps:
        return [], []
    end = steps[-1][0]
    ts, rates = [], []
    t = steps[0][0]
    while t <= end:
        ts.append(t)
        rates.append(sum(s for u, s, _ in steps if t - window_s < u <= t) / window_s)
        t += every_s
    return ts, rates
