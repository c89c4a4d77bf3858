"""The goals ``bench peers`` judges its figures by (issue 34), each True, False or
None where the run did not measure what it needs (a system left out, a
workload not run)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def goals(out: dict[str, Any]) -> dict[str, bool | None]:
    resize = out["resize"]

    def fewer(peer: str, system: str = "elasticps") -> bool | None:
        ours, lost = resize.get(system, {}).get("samples_lost"), resize.get(peer, {}).get("samples_lost")
        return None if ours is None or lost is None else ours * 20 <= lost

    dense = out["throughput"].get("dense_mlp_10m", {})
    ratios = [dense[w]["elasticps"] / dense[w]["ddp_gloo"] for w in ("2", "4") if "ddp_gloo" in dense.get(w, {})]
    emb = embedding_figures(out)
    per_w = [c for w, c in emb.items() if w != "table_mib"]

    def every_w(test: Callable[[dict[str, Any]], bool]) -> bool | None:
        cells = [c for c in per_w if None not in c.values()]
        return all(test(c) for c in cells) if cells and len(cells) == len(per_w) else None

    return {
        "resize_samples_lost_20x_fewer_than_ray_train": fewer("ray_train"),
        "resize_samples_lost_20x_fewer_than_torchrun": fewer("torchrun"),
        # with 2 standby workers, whose start (paid before the window) is in resize.elasticps_standby.before_window
        "resize_standby_samples_lost_20x_fewer_than_ray_train": fewer("ray_train", "elasticps_standby"),
        "resize_standby_samples_lost_20x_fewer_than_torchrun": fewer("torchrun", "elasticps_standby"),
        "dense_one_node_elasticps>=0.9x_ddp_at_W=2,4": all(r >= 0.9 for r in ratios) if ratios else None,
        # elasticps with the table on the PS (the figures: goal_figures.embedding)
        "embedding_elasticps>ddp_at_every_W": every_w(lambda c: c["elasticps"] > c["ddp_gloo"]),
        "embedding_elasticps_worker_peak<ddp_rank_peak_at_every_W": every_w(
            lambda c: c["elasticps_worker_peak_mib"] < c["ddp_gloo_worker_peak_mib"]
        ),
        "embedding_table>elasticps_worker_peak_at_every_W": every_w(
            lambda c: emb["table_mib"] > c["elasticps_worker_peak_mib"]
        ),
        "pushpull>=0.6x_memcpy": out["limit"]["pushpull_shm_over_memcpy"] >= 0.6 if out["limit"] else None,
    }


def embedding_figures(out: dict[str, Any]) -> dict[str, Any]:
    """What the embedding goals are judged on, per W: samples/s and the largest
    worker peak RSS of elasticps (the table on the PS) and DDP, elasticps's PS
    peak, and the table's size."""
    emb = out["throughput"].get("embedding", {})
    mem = out["memory"].get("embedding", {})
    figures: dict[str, Any] = {"table_mib": out["setup"]["table_mib"].get("embedding")}
    for w, row in emb.items():
        peaks = mem.get(w, {})
        figures[w] = {
            "elasticps": row.get("elasticps"),
            "ddp_gloo": row.get("ddp_gloo"),
            "elasticps_worker_peak_mib": peaks.get("elasticps", {}).get("worker_peak_mib"),
            "elasticps_ps_peak_mib": peaks.get("elasticps", {}).get("ps_peak_mib"),
            "ddp_gloo_worker_peak_mib": peaks.get("ddp_gloo", {}).get("worker_peak_mib"),
        }
    return figures
