"""The manager's REST API (FastAPI; its OpenAPI schema at ``/openapi.json``, with the token).

- ``POST /jobs``: submit a spec (``application/yaml`` or ``application/json``);
  400 names the bad field, 409 on a duplicate name, 422 (with the numbers) if
  the cluster can never hold the job.
- ``GET /jobs``, ``GET /jobs/{name}``; ``DELETE /jobs/{name}`` cancels (idempotent,
  final; 409 for a job that already finished or failed); ``PATCH /jobs/{name}``
  changes min/max PS and workers; ``POST /jobs/{name}/retry`` queues a failed job again.
- ``GET /jobs/{name}/logs`` (progress), ``GET /jobs/{name}/output?after=`` (what the
  job printed), ``GET /events?job=&after=``, ``GET /metrics``.
- ``GET /``: the dashboard (``/#token=...``), its files under ``/static/``; its data:
  ``GET /api/overview`` (the job table), ``/api/jobs/{name}`` (one job), ``/api/cluster``.
- No ``/docs`` or ``/redoc``: FastAPI's pages load their scripts from a CDN
  into this origin, which holds the token.

The security boundary around it is :mod:`elasticps.manager.api_boundary`;
its schema's error answers and request bodies :mod:`elasticps.manager.api_schema`;
its answers about a job :mod:`elasticps.manager.job_replies`.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib import resources
from typing import Any

from fastapi import Depends, FastAPI, HTTPException, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse, PlainTextResponse, Response

from elasticps.errors import ConfigError, ElasticPSError
from elasticps.manager import dashboard
from elasticps.manager.api_boundary import LOOPBACK_HOSTS, guard, http_error, read_body
from elasticps.manager.api_schema import ERRORS, body_schema, with_body_models
from elasticps.manager.job_replies import job_json, job_log_lines
from elasticps.manager.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from elasticps.manager.models import EventOut, JobOut, LogLine, OutputOut
from elasticps.manager.service import Manager
from elasticps.manager.spec import MAX_INT, JobSpec, LimitsPatch, SpecError, parse_limits, parse_spec
from elasticps.manager.store import JobRecord

#: What ``/static/`` serves (elasticps/manager/static/), with its media type.
STATIC_FILES = {
    "dashboard.js": "text/javascript; charset=utf-8",
    "dashboard.css": "text/css; charset=utf-8",
    "uPlot.iife.min.js": "text/javascript; charset=utf-8",
    "uPlot.min.css": "text/css; charset=utf-8",
}


def _static(name: str) -> bytes:
    return resources.files("elasticps.manager").joinpath("static", name).read_bytes()


def create_app(manager: Manager, token: str, allowed_hosts: frozenset[str] | set[str] = LOOPBACK_HOSTS) -> FastAPI:
    """The API. ``allowed_hosts``: names the ``Host`` header may carry (``"*"`` for any)."""
    if not token:
        raise ConfigError("the API needs a token")
    app = FastAPI(title="elasticps manager", version="0.2.0", docs_url=None, redoc_url=None, openapi_url=None)
    with_body_models(app)
    auth = guard(app, token, allowed_hosts)
    deps = [Depends(auth)]

    def command(run: Callable[[], JobRecord], name: str | None = None) -> JobOut:
        """Run a manager command; its errors as HTTP errors (a missing job is a 404 when one is named)."""
        try:
            return job_json(run(), manager)
        except SpecError:
            raise  # bad_spec: a 422 listing every problem
        except ElasticPSError as exc:
            raise http_error(exc, name) from exc
        except KeyError as exc:
            if name is None:
                raise
            raise http_error(exc, name) from exc

    def job_or_404(name: str) -> JobRecord:
        try:
            return manager.store.get_job(name)
        except KeyError:
            raise HTTPException(404, f"no job named {name!r}") from None

    @app.post(
        "/jobs", status_code=201, dependencies=deps, response_model=JobOut, responses=ERRORS,
        openapi_extra=body_schema(JobSpec),
    )  # fmt: skip
    async def submit(request: Request) -> JobOut:
        """Submit a job spec (YAML or JSON)."""
        body, fmt = await read_body(request)
        return await run_in_threadpool(command, lambda: manager.submit(parse_spec(body, fmt)))

    @app.get("/jobs", dependencies=deps, response_model=list[JobOut], responses=ERRORS)
    def list_jobs() -> list[JobOut]:
        return [job_json(r, manager) for r in manager.store.list_jobs()]

    @app.get("/jobs/{name}", dependencies=deps, response_model=JobOut, responses=ERRORS)
    def get_job(name: str) -> JobOut:
        return job_json(job_or_404(name), manager)

    @app.delete("/jobs/{name}", dependencies=deps, response_model=JobOut, responses=ERRORS)
    def cancel(name: str) -> JobOut:
        """Cancel: final and idempotent; 409 if the job already finished or failed."""
        return command(lambda: manager.cancel(name), name)

    @app.post("/jobs/{name}/delete", dependencies=deps, response_model=JobOut, responses=ERRORS)
    def delete(name: str) -> JobOut:
        """Forget an ended job (record, history, checkpoints); its name can be used again. 409 if not ended."""
        return command(lambda: manager.delete(name), name)

    @app.post("/jobs/{name}/retry", dependencies=deps, response_model=JobOut, responses=ERRORS)
    def retry(name: str) -> JobOut:
        """Run a failed or cancelled job again: it resumes from its latest intact checkpoint."""
        return command(lambda: manager.retry(name), name)

    @app.patch(
        "/jobs/{name}", dependencies=deps, response_model=JobOut, responses=ERRORS,
        openapi_extra=body_schema(LimitsPatch),
    )  # fmt: skip
    async def set_limits(name: str, request: Request) -> JobOut:
        """Change min/max: ``{"ps": {"min": 1, "max": 2}, "workers": {"min": 1, "max": 4}}``."""
        body, fmt = await read_body(request)
        return await run_in_threadpool(command, lambda: manager.set_limits(name, parse_limits(body, fmt)), name)

    @app.get("/jobs/{name}/logs", dependencies=deps, response_model=list[LogLine], responses=ERRORS)
    def logs(
        name: str,
        after_step: int = Query(-1, ge=-1, le=MAX_INT),
        after_event: int | None = Query(None, ge=0, le=MAX_INT),
    ) -> list[dict[str, Any]]:
        """The job's progress as log lines (windows, epochs, runtime events) from
        this manager's run of it; ``after_step`` keeps the lines after that step;
        ``after_event`` the events from that number on (without it: every event,
        when ``after_step`` is negative)."""
        job_or_404(name)
        report = manager.report(name)
        return [] if report is None else job_log_lines(report, after_step, after_event)

    @app.get("/jobs/{name}/output", dependencies=deps, response_model=OutputOut, responses=ERRORS)
    def output(name: str, after: int = Query(0, ge=0, le=MAX_INT)) -> OutputOut:
        """What the job's driver, PS and workers printed (tagged by task), and the
        traceback of a failure, from byte ``after`` on; the newest 1 MiB is kept."""
        job_or_404(name)
        text, nxt, dropped = manager.output(name, after)
        return OutputOut(text=text, next=nxt, dropped=dropped)

    @app.get("/events", dependencies=deps, response_model=list[EventOut], responses=ERRORS)
    def events(job: str | None = Query(None, max_length=63), after: int = Query(0, ge=0, le=MAX_INT)) -> list[EventOut]:
        if job is not None:
            job_or_404(job)  # a name with no job has no events to show, and says so: not an empty list
        rows = manager.store.events(job, after)
        return [EventOut(id=i, at=at, job=j, kind=kind, message=msg) for i, at, j, kind, msg in rows]

    @app.get("/metrics", response_class=PlainTextResponse, dependencies=deps)
    def metrics() -> Response:
        """Prometheus exposition (prometheus_client): jobs, tasks, samples, rescales, CPUs, decision time."""
        return Response(manager.metrics.exposition(), media_type=METRICS_CONTENT_TYPE)

    @app.get("/openapi.json", dependencies=deps, include_in_schema=False)
    def openapi() -> dict[str, Any]:
        """The schema, for clients and code generators (no documentation pages: see the module's notes)."""
        return app.openapi()

    @app.get("/healthz")
    def healthz() -> dict:
        """Liveness and readiness (no token: it says nothing about jobs)."""
        return {"ok": True}

    @app.get("/", response_class=HTMLResponse)
    def dashboard_page() -> HTMLResponse:
        # the page itself is static; its data comes from /api/* (token in the URL fragment)
        return HTMLResponse(_static("dashboard.html").decode())

    @app.get("/static/{name}")
    def static(name: str) -> Response:
        """The dashboard's script, styles and its vendored charting library (no token: nothing secret)."""
        if name not in STATIC_FILES:
            raise HTTPException(404, f"no static file {name!r}")
        return Response(_static(name), media_type=STATIC_FILES[name], headers={"Cache-Control": "no-cache"})

    @app.get("/api/overview", dependencies=deps)
    def overview() -> dict[str, Any]:
        """The job table (running first) and each node's CPUs now."""
        return dashboard.overview(manager)

    @app.get("/api/jobs/{name}", dependencies=deps, responses=ERRORS)
    def job_view(name: str, log_lines: int = Query(40, ge=0, le=1000)) -> dict[str, Any]:
        """One job for the dashboard: shapes, curves, rescales, events and its log's tail."""
        try:
            detail = dashboard.job_detail(manager, name)
        except KeyError:
            raise HTTPException(404, f"no job named {name!r}") from None
        report = manager.report(name)
        detail["log"] = (job_log_lines(report) if report is not None else [])[-log_lines:] if log_lines else []
        return detail

    @app.get("/api/cluster", dependencies=deps)
    def cluster_view() -> dict[str, Any]:
        """Nodes over time (ours, other tenants', free) and the latest rounds' moves and why."""
        return dashboard.cluster(manager)

    return app
