"""A measured speed grid as a heatmap (``elasticps bench explore --heatmap``).

Each cell is a (#PS, #workers) shape's median samples/s as a share of the
grid's best (``bench shapes``), with its figure written in; the best shape is
outlined, and each replayed walk's choice after its last probe count is marked
(one dot per walk that chose the shape, ``bench explore``). Shapes the grid did
not measure (p + w above its largest) are blank.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any


def heatmap(explore: dict[str, Any], runs: dict[tuple[int, int], list[float]], path: Path) -> Path:
    """Draw ``runs`` (the grid's passes per shape) with ``explore``'s walks onto ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    median = {shape: statistics.median(v) for shape, v in runs.items()}
    best = max(median.values())
    max_ps, max_workers = max(p for p, _ in median), max(w for _, w in median)
    share = np.full((max_ps, max_workers), np.nan)
    for (p, w), v in median.items():
        share[p - 1, w - 1] = v / best
    fig, ax = plt.subplots(figsize=(1.0 + 0.8 * max_workers, 1.2 + 0.7 * max_ps))
    image = ax.imshow(share, origin="lower", cmap="viridis", vmin=min(0.5, float(np.nanmin(share))), vmax=1.0)
    for (p, w), v in median.items():
        ax.text(w - 1, p - 1, f"{v:.0f}", ha="center", va="center", fontsize=8, color="w" if v / best < 0.8 else "k")
    bp, bw = max(median, key=median.__getitem__)
    ax.add_patch(plt.Rectangle((bw - 1.5, bp - 1.5), 1, 1, fill=False, edgecolor="red", linewidth=2))
    last = max(int(k) for k in explore["mean_of_best_after"])
    chosen: dict[tuple[int, int], int] = {}
    for walk in explore["walks"]:
        p, w = walk["choice_after"][str(last)]
        chosen[(p, w)] = chosen.get((p, w), 0) + 1
    for (p, w), n in chosen.items():
        ax.scatter([w - 1.3 + 0.12 * i for i in range(n)], [p - 1.3] * n, s=14, color="red", zorder=3)
    ax.set_xticks(range(max_workers), [str(w) for w in range(1, max_workers + 1)])
    ax.set_yticks(range(max_ps), [str(p) for p in range(1, max_ps + 1)])
    ax.set_xlabel("workers")
    ax.set_ylabel("PS")
    workload = explore.get("workload", {})
    name = workload.get("model_name")
    model = f"{name}, batch {workload.get('global_batch')}" if name else Path(explore["grid"]).stem
    worst = explore["min_of_best_after"][str(last)]
    title = f"{model}: samples/s, colour the share of the best (outlined)"
    ax.set_title(f"{title}\ndots: the walks' choices after {last} probes (worst {worst:.0%})", fontsize=8)
    fig.colorbar(image, ax=ax, fraction=0.04, label="share of the best")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
