"""The demo's HTML report: the comparison table, plots (PNG, inlined) and events."""

from __future__ import annotations

import base64
import html
import io
from pathlib import Path
from typing import TYPE_CHECKING, Any

from elasticps.demo.summary import base_name

if TYPE_CHECKING:
    from elasticps.demo.experiment import ScenarioResult


def _png(fig: Any) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    return base64.b64encode(buf.getvalue()).decode()


def figures(results: dict[str, ScenarioResult]) -> dict[str, str]:
    """Name -> base64 PNG: CPUs over time per policy, accuracy and throughput
    over time, and job completion times side by side."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = sorted({n for r in results.values() for n in r.jobs})
    colours = {n: f"C{i}" for i, n in enumerate(names)}
    styles = ["--", "-", ":", "-."]
    out: dict[str, str] = {}

    # one column per policy or objective, one row per repeat
    rows, cols = _grid(list(results))
    fig, axes = plt.subplots(
        len(rows), len(cols), figsize=(5.5 * len(cols), 3.6 * len(rows)), sharey=True, squeeze=False
    )
    for policy, r in results.items():
        ax = axes[rows.index(_repeat(policy))][cols.index(base_name(policy))]
        ts = [s.t for s in r.timeline]
        stacks = [[_tasks(s.jobs.get(n)) for s in r.timeline] for n in names]
        stacks.append([s.tenant_cpu for s in r.timeline])
        ax.stackplot(ts, stacks, labels=[*names, "other tenant"], colors=[*colours.values(), "0.7"], step="post")
        ax.axhline(r.cluster_cpus, color="k", lw=0.8)
        ax.set_title(f"{policy}: CPUs held (cluster {r.cluster_cpus:g})")
    for ax in axes[-1]:
        ax.set_xlabel("seconds since submission")
    for row in axes:
        row[0].set_ylabel("CPUs")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.tight_layout(rect=(0, 0.2 / (3.6 * len(rows)) + 0.02, 1, 1))
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=8, bbox_to_anchor=(0.5, 0.0))
    out["cpus"] = _png(fig)
    plt.close(fig)

    for key, label in (("metric", "test accuracy"), ("samples_per_s", "samples/s")):
        fig, ax = plt.subplots(figsize=(7, 3.6))
        for (policy, r), style in zip(results.items(), styles, strict=False):
            for n in names:
                pts = [(s.t, s.jobs[n][key]) for s in r.timeline if n in s.jobs and s.jobs[n][key] is not None]
                pts = [(t, v) for t, v in pts if _running_or_done(r, n, t)]
                if pts:
                    ax.plot(*zip(*pts, strict=True), style, color=colours[n], label=f"{n} {policy}", lw=1.2)
        ax.set_xlabel("seconds since submission")
        ax.set_ylabel(label)
        if key == "metric":
            ax.set_ylim(0.8, 1.0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, ncol=2)
        out[key] = _png(fig)
        plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 3.2))
    width = 0.8 / max(1, len(results))
    for i, (policy, r) in enumerate(results.items()):
        xs = [k + i * width for k in range(len(names))]
        ax.bar(xs, [r.jobs[n]["total_s"] for n in names], width, label=policy)
    ax.set_xticks([k + width * (len(results) - 1) / 2 for k in range(len(names))], names)
    ax.set_ylabel("job completion time (s)")
    ax.legend()
    out["jct"] = _png(fig)
    plt.close(fig)
    return out


def _repeat(key: str) -> str:
    return key.partition(" #")[2]


def _grid(keys: list[str]) -> tuple[list[str], list[str]]:
    """The repeats (rows) and the policies or objectives (columns) that result
    keys such as ``static #2`` name, in first-seen order."""
    return list(dict.fromkeys(_repeat(k) for k in keys)), list(dict.fromkeys(base_name(k) for k in keys))


def _write_pngs(imgs: dict[str, str], directory: Path) -> None:
    """Rendered figures (name -> base64 PNG) as ``directory/NAME.png``."""
    directory.mkdir(parents=True, exist_ok=True)
    for name, data in imgs.items():
        (directory / f"{name}.png").write_bytes(base64.b64decode(data))


def _tasks(job: dict[str, Any] | None) -> int:
    return job["num_ps"] + job["num_workers"] if job and job["state"] == "running" else 0


def _running_or_done(r: ScenarioResult, name: str, t: float) -> bool:
    return t <= r.jobs[name]["total_s"] + 1.0


def write_html(
    results: dict[str, ScenarioResult],
    path: Path,
    table_text: str,
    setup: dict[str, Any],
    plots: Path | None = None,
) -> Path:
    """The report at ``path``; with ``plots``, its figures also as PNG files
    there (cpus.png, metric.png, samples_per_s.png, jct.png)."""
    imgs = figures(results)
    if plots is not None:
        _write_pngs(imgs, plots)
    img = {k: f'<img alt="{k}" src="data:image/png;base64,{v}">' for k, v in imgs.items()}
    events = "".join(
        f"<tr><td>{html.escape(policy)}</td><td>{at:.1f}</td><td>{html.escape(job or 'cluster')}</td>"
        f"<td>{html.escape(msg)}</td></tr>"
        for policy, r in results.items()
        for at, job, _, msg in r.events
    )
    setup_rows = "".join(f"<tr><td>{html.escape(k)}</td><td>{html.escape(str(v))}</td></tr>" for k, v in setup.items())
    page = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>elasticps demo: static vs elastic</title>
<style>body{{font-family:sans-serif;max-width:1200px;margin:2em auto;color:#222}}
table{{border-collapse:collapse}}td,th{{padding:2px 8px;border-bottom:1px solid #ddd;text-align:left}}
pre{{background:#f6f6f6;padding:1em}}img{{max-width:100%}}</style></head><body>
<h1>elasticps demo: three jobs, another tenant leaves</h1>
<p>Another tenant holds CPUs on every node; three jobs (a CNN on scikit-learn's digits) are submitted;
the tenant ends. Under <b>elastic</b> the manager gives the freed CPUs to the jobs; under <b>static</b>
each job keeps the shape it started with.</p>
<h2>Per job</h2><pre>{html.escape(table_text)}</pre>
<p>Utilization: the share of the job's step time its workers spend computing.
Mean CPUs: CPU-seconds held divided by the job's completion time.</p>
<h2>CPUs held over time</h2>{img["cpus"]}
<h2>Job completion times</h2>{img["jct"]}
<h2>Test accuracy</h2>{img["metric"]}
<h2>Throughput</h2>{img["samples_per_s"]}
<h2>Setup</h2><table>{setup_rows}</table>
<h2>Events</h2><table><tr><th>policy</th><th>s</th><th>job</th><th>event</th></tr>{events}</table>
</body></html>
"""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(page)
    return path
