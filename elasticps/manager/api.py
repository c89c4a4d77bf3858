"""The manager's REST API (FastAPI; OpenAPI at ``/docs`` and ``/openapi.json``).

- ``POST /jobs``: submit a spec (YAML, or JSON with ``Content-Type: application/json``);
  400 names the bad field, 409 on a duplicate name.
- ``GET /jobs``, ``GET /jobs/{name}``, ``DELETE /jobs/{name}`` (cancel),
  ``PATCH /jobs/{name}`` (change min/max PS and workers).
- ``GET /events?job=&after=``: events in order.
- ``GET /metrics``: Prometheus text format.
- ``GET /``: the dashboard (nodes, jobs' shapes over time, throughput, loss);
  ``GET /api/overview`` its data.

Bound to 127.0.0.1 by default; on any other address a token is required and
every request must carry ``Authorization: Bearer <token>``.
"""

from __future__ import annotations

import hmac
from importlib import resources
from typing import Any

from fastapi import Depends, FastAPI, HTTPException, Request, Response
from fastapi.responses import HTMLResponse, PlainTextResponse
from pydantic import ValidationError

from elasticps.errors import ConfigError, ProgramError
from elasticps.manager.service import Manager
from elasticps.manager.spec import parse_spec
from elasticps.manager.store import JobRecord
from elasticps.runtime import JobReport

LOOPBACK = {"127.0.0.1", "localhost", "::1"}


def check_bind(host: str, token: str | None) -> None:
    """Refuse to serve on a non-loopback address without a token."""
    if host not in LOOPBACK and not token:
        raise ConfigError(
            f"binding {host} needs a token (--token or ELASTICPS_TOKEN); only 127.0.0.1 is open without one"
        )


def _job_json(rec: JobRecord, manager: Manager) -> dict[str, Any]:
    out: dict[str, Any] = {
        "name": rec.name,
        "state": rec.state,
        "submitted_at": rec.submitted_at,
        "updated_at": rec.updated_at,
        "spec": rec.spec.model_dump(),
    }
    allocations = manager.store.allocations(rec.name)
    if allocations:
        at, p, w, placement = allocations[-1]
        out["allocation"] = {"at": at, "num_ps": p, "num_workers": w, "placement": placement}
    report = manager.report(rec.name)
    if report is not None:
        last = report.windows[-1] if report.windows else None
        out["progress"] = {
            "step": report.step,
            "epoch": report.epoch,
            "epochs": report.epochs,
            "samples_per_s": last.samples_per_s if last else None,
            "loss": last.loss if last else None,
            "metric": report.epoch_reports[-1].metric if report.epoch_reports else None,
        }
    return out


def create_app(manager: Manager, token: str | None = None) -> FastAPI:
    app = FastAPI(title="elasticps manager", version="0.1.0")

    def auth(request: Request) -> None:
        if token is None:
            return
        given = request.headers.get("authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
            raise HTTPException(status_code=401, detail="missing or wrong bearer token")

    deps = [Depends(auth)]

    @app.post("/jobs", status_code=201, dependencies=deps)
    async def submit(request: Request) -> dict[str, Any]:
        body = (await request.body()).decode()
        fmt = "json" if "json" in request.headers.get("content-type", "") else "yaml"
        try:
            spec = parse_spec(body, fmt)  # type: ignore[arg-type]
            rec = manager.submit(spec)
        except ConfigError as exc:
            status = 409 if "already exists" in str(exc) else 400
            raise HTTPException(status_code=status, detail=str(exc)) from exc
        except ProgramError as exc:
            raise HTTPException(status_code=400, detail=f"job spec field 'program': {exc}") from exc
        return _job_json(rec, manager)

    @app.get("/jobs", dependencies=deps)
    def list_jobs() -> list[dict[str, Any]]:
        return [_job_json(r, manager) for r in manager.store.list_jobs()]

    @app.get("/jobs/{name}", dependencies=deps)
    def get_job(name: str) -> dict[str, Any]:
        try:
            return _job_json(manager.store.get_job(name), manager)
        except KeyError:
            raise HTTPException(status_code=404, detail=f"no job named {name!r}") from None

    @app.delete("/jobs/{name}", dependencies=deps)
    def cancel(name: str) -> dict[str, Any]:
        try:
            rec = manager.store.get_job(name)
        except KeyError:
            raise HTTPException(status_code=404, detail=f"no job named {name!r}") from None
        if rec.state in ("finished", "failed", "cancelled"):
            raise HTTPException(status_code=409, detail=f"job {name!r} has already {rec.state}")
        manager.cancel(name)
        return _job_json(manager.store.get_job(name), manager)

    @app.patch("/jobs/{name}", dependencies=deps)
    def set_limits(name: str, body: dict[str, Any]) -> dict[str, Any]:
        """Change min/max: ``{"ps": {"min": 1, "max": 2}, "workers": {"min": 1, "max": 4}}``."""
        unknown = set(body) - {"ps", "workers"}
        if unknown:
            raise HTTPException(status_code=400, detail=f"job limits field '{sorted(unknown)[0]}': not a limit")
        try:
            rec = manager.store.get_job(name)
        except KeyError:
            raise HTTPException(status_code=404, detail=f"no job named {name!r}") from None
        limits = {}
        for kind in ("ps", "workers"):
            if kind in body:
                cur = getattr(rec.spec, kind)
                part = body[kind] if isinstance(body[kind], dict) else {}
                limits[kind] = (int(part.get("min", cur.min)), int(part.get("max", cur.max)))
        try:
            rec = manager.set_limits(name, limits.get("ps"), limits.get("workers"))
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "spec"
            raise HTTPException(status_code=400, detail=f"job spec field '{where}': {first['msg']}") from exc
        return _job_json(rec, manager)

    @app.get("/jobs/{name}/logs", dependencies=deps)
    def logs(name: str, after_step: int = -1) -> list[dict[str, Any]]:
        """The job's progress as log lines (windows, epochs, runtime events) from
        this manager's run of it; ``after_step`` keeps the lines after that step."""
        try:
            manager.store.get_job(name)
        except KeyError:
            raise HTTPException(status_code=404, detail=f"no job named {name!r}") from None
        report = manager.report(name)
        return [] if report is None else job_log_lines(report, after_step)

    @app.get("/events", dependencies=deps)
    def events(job: str | None = None, after: int = 0) -> list[dict[str, Any]]:
        return [
            {"id": i, "at": at, "job": j, "kind": kind, "message": msg}
            for i, at, j, kind, msg in manager.store.events(job, after)
        ]

    @app.get("/metrics", response_class=PlainTextResponse, dependencies=deps)
    def metrics() -> Response:
        lines = ["# HELP elasticps_jobs Jobs by state.", "# TYPE elasticps_jobs gauge"]
        counts: dict[str, int] = {}
        for rec in manager.store.list_jobs():
            counts[rec.state] = counts.get(rec.state, 0) + 1
        for state in ("pending", "running", "finished", "failed", "cancelled"):
            lines.append(f'elasticps_jobs{{state="{state}"}} {counts.get(state, 0)}')
        lines += ["# HELP elasticps_job_tasks Tasks of a running job.", "# TYPE elasticps_job_tasks gauge"]
        lines += [
            "# HELP elasticps_job_samples_per_second Latest throughput.",
            "# TYPE elasticps_job_samples_per_second gauge",
        ]
        for name, live in sorted(manager.live.items()):
            c = live.controller
            lines.append(f'elasticps_job_tasks{{job="{name}",kind="ps"}} {len(c.ps)}')
            lines.append(f'elasticps_job_tasks{{job="{name}",kind="worker"}} {len(c.workers)}')
            report = c.report()
            if report.windows:
                lines.append(f'elasticps_job_samples_per_second{{job="{name}"}} {report.windows[-1].samples_per_s:.3f}')
        return PlainTextResponse("\n".join(lines) + "\n", media_type="text/plain; version=0.0.4")

    @app.get("/healthz")
    def healthz() -> dict:
        """Liveness and readiness (no token: it says nothing about jobs)."""
        return {"ok": True}

    @app.get("/", response_class=HTMLResponse)
    def dashboard() -> HTMLResponse:
        # the page itself is static; its data comes from /api/overview (token in the URL fragment)
        return HTMLResponse(resources.files("elasticps.manager").joinpath("dashboard.html").read_text())

    @app.get("/api/overview", dependencies=deps)
    def overview() -> dict[str, Any]:
        return manager.overview()

    return app


def job_log_lines(report: JobReport, after_step: int = -1) -> list[dict[str, Any]]:
    """Windows and epochs of a report as ``{"step", "kind", "text"}`` lines, in
    step order, then the runtime's events (which carry no step)."""
    lines: list[dict[str, Any]] = []
    for w in report.windows:
        if w.last_step > after_step:
            t = w.mean_step_times
            text = (
                f"P={w.num_ps} W={w.num_workers} {w.samples_per_s:.0f} samples/s loss {w.loss:.4f} "
                f"step ms: compute {t.compute_s * 1e3:.1f} pull {t.pull_s * 1e3:.1f} push {t.push_s * 1e3:.1f} "
                f"update {t.update_s * 1e3:.1f} wait {t.wait_s * 1e3:.1f}"
            )
            lines.append({"step": w.last_step, "kind": "window", "text": text})
    for e in report.epoch_reports:
        if e.step > after_step:
            metric = f", metric {e.metric:.4f}" if e.metric is not None else ""
            lines.append(
                {"step": e.step, "kind": "epoch", "text": f"epoch {e.epoch} done in {e.elapsed_s:.1f} s{metric}"}
            )
    lines.sort(key=lambda line: (line["step"], line["kind"] != "window"))
    if after_step < 0:
        lines += [{"step": None, "kind": "event", "text": msg} for msg in report.events]
    return lines
