"""Plots of simulation results (PNG, matplotlib's Agg backend)."""

from __future__ import annotations

from pathlib import Path

from elasticps.sim.results import SimResult


def write_plots(results: dict[str, SimResult], directory: str | Path, max_jobs: int = 12) -> list[Path]:
    """JCT CDF per policy, utilization over time, and allocations of a few jobs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    paths = []

    fig, ax = plt.subplots(figsize=(6, 4))
    for name, r in results.items():
        xs = sorted(v / 3600 for v in r.jct_s)
        ax.plot(
            xs, [(i + 1) / len(xs) for i in range(len(xs))], label=f"{name} (avg {r.metrics['avg_jct_s'] / 3600:.2f} h)"
        )
    ax.set_xlabel("job completion time (h)")
    ax.set_ylabel("fraction of jobs")
    ax.set_title("JCT CDF")
    ax.grid(alpha=0.3)
    ax.legend()
    paths.append(out / "jct_cdf.png")
    fig.savefig(paths[-1], dpi=110, bbox_inches="tight")
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6, 4))
    for name, r in results.items():
        ax.plot([t / 3600 for t, _ in r.utilization], [u for _, u in r.utilization], label=name, lw=1)
    ax.set_xlabel("time (h)")
    ax.set_ylabel("CPU allocated / available")
    ax.set_title("utilization")
    ax.set_ylim(0, 1.05)
    ax.grid(alpha=0.3)
    ax.legend()
    paths.append(out / "utilization.png")
    fig.savefig(paths[-1], dpi=110, bbox_inches="tight")
    plt.close(fig)

    for name, r in results.items():
        fig, ax = plt.subplots(figsize=(6, 4))
        for job_id in sorted(r.allocations)[:max_jobs]:
            hist = r.allocations[job_id]
            if not hist:
                continue
            ts = [t / 3600 for t, _, _ in hist]
            tasks = [p + w for _, p, w in hist]
            ax.step(ts, tasks, where="post", lw=1, label=job_id)
        ax.set_xlabel("time (h)")
        ax.set_ylabel("PS + workers")
        ax.set_title(f"allocations per job ({name}, first {max_jobs} jobs)")
        ax.grid(alpha=0.3)
        paths.append(out / f"allocations_{name}.png")
        fig.savefig(paths[-1], dpi=110, bbox_inches="tight")
        plt.close(fig)
    return paths
