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

The security boundary (docs/security.md): every request but ``/healthz`` and
the static dashboard page carries ``Authorization: Bearer <token>``; the
``Host`` must be one this server answers to and an ``Origin``, when sent, must
be the server's own (no DNS rebinding, no cross-site requests); bodies are
JSON or YAML only, at most :data:`MAX_SPEC_BYTES`; and nothing a request
carries is imported or called in this process (the program is resolved in a
Ray process of its own). Parsing and every call that may block run off the
event loop. Every error is ``{"detail": "..."}`` with a 4xx status.
"""

from __future__ import annotations

import errno
import hmac
import sqlite3
from collections.abc import Callable
from importlib import resources
from typing import Any, Literal
from urllib.parse import urlsplit

from fastapi import Depends, FastAPI, HTTPException, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from pydantic import BaseModel

from elasticps.errors import ConfigError, ElasticPSError, ProgramError, UnschedulableError
from elasticps.manager import dashboard
from elasticps.manager.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from elasticps.manager.models import Allocation, ErrorOut, EventOut, JobOut, LogLine, OutputOut, Progress
from elasticps.manager.service import Manager
from elasticps.manager.spec import (
    MAX_INT,
    MAX_SPEC_BYTES,
    JobSpec,
    LimitsPatch,
    SpecError,
    parse_limits,
    parse_spec,
)  # fmt: skip
from elasticps.manager.states import IllegalTransition, JobInUse
from elasticps.manager.store import JobRecord
from elasticps.runtime import JobReport

LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
BODY_TYPES = {"application/json": "json", "application/yaml": "yaml"}
#: Seconds a client is asked to wait before trying again after a 503.
RETRY_AFTER_S = 5
#: Errors of the disk under the workdir: the request may succeed later, once an operator acts.
DISK_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO})


#: What ``/static/`` serves (elasticps/manager/static/), with its media type.
STATIC_FILES = {
    "dashboard.js": "text/javascript; charset=utf-8",
    "dashboard.css": "text/css; charset=utf-8",
    "uPlot.iife.min.js": "text/javascript; charset=utf-8",
    "uPlot.min.css": "text/css; charset=utf-8",
}


def _static(name: str) -> bytes:
    return resources.files("elasticps.manager").joinpath("static", name).read_bytes()


ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorOut} for code in (400, 401, 403, 404, 409, 413, 415, 422, 503)
}


#: Request bodies, read by hand (YAML or JSON), declared in the schema.
BODY_MODELS: tuple[type[BaseModel], ...] = (JobSpec, LimitsPatch)


def _body_schema(model: type[BaseModel]) -> dict[str, Any]:
    ref = {"$ref": f"#/components/schemas/{model.__name__}"}
    return {"requestBody": {"required": True, "content": {t: {"schema": ref} for t in BODY_TYPES}}}


def _with_body_models(app: FastAPI) -> None:
    """Put the request-body models (and the models they use) into the schema's
    components, where the bodies refer to them: FastAPI registers only the
    models it reads or answers with itself."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = build()
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            for model in BODY_MODELS:
                own = model.model_json_schema(ref_template="#/components/schemas/{model}")
                for name, sub in own.pop("$defs", {}).items():
                    components.setdefault(name, sub)
                components.setdefault(model.__name__, own)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def _job_json(rec: JobRecord, manager: Manager) -> JobOut:
    out = JobOut(
        name=rec.name,
        state=rec.state,  # type: ignore[arg-type]
        submitted_at=rec.submitted_at,
        updated_at=rec.updated_at,
        spec=rec.spec,
    )
    waiting = manager.waiting.get(rec.name) if rec.state in ("pending", "running") else None
    if waiting is not None:
        out.reason, out.never_starts = waiting.reason, waiting.never
    elif rec.state == "failed":
        out.reason = manager.store.last_event(rec.name, "failed")
    allocations = manager.store.allocations(rec.name)
    if allocations:
        at, p, w, placement = allocations[-1]
        out.allocation = Allocation(at=at, num_ps=p, num_workers=w, placement=placement)
    status = manager.statuses().get(rec.name)
    report = manager.ended.get(rec.name) if status is None else None
    if status is not None:
        last = status.windows[-1] if status.windows else None
        kept = manager.store.progress(rec.name) or {} if last is None else {}  # a poll with no new window
        epochs = rec.info.epochs if rec.info else 0
        out.progress = Progress(
            step=status.step, epoch=status.epoch, epochs=epochs,
            samples_per_s=last.samples_per_s if last else kept.get("samples_per_s"),
            loss=last.loss if last else kept.get("loss"), metric=status.metric, metrics=status.metrics,
        )  # fmt: skip
    elif report is not None:
        last = report.windows[-1] if report.windows else None
        out.progress = Progress(
            step=report.step, epoch=report.epoch, epochs=report.epochs,
            samples_per_s=last.samples_per_s if last else None, loss=last.loss if last else None,
            metric=report.epoch_reports[-1].metric if report.epoch_reports else None,
            metrics=report.metrics[-1].values if report.metrics else {},
        )  # fmt: skip
    return out


def _http_error(exc: Exception, name: str | None = None) -> HTTPException:
    """The one mapping from errors to statuses."""
    if isinstance(exc, KeyError):
        return HTTPException(404, f"no job named {name!r}")
    if isinstance(exc, (IllegalTransition, JobInUse)):
        return HTTPException(409, str(exc))
    if isinstance(exc, ProgramError):
        return HTTPException(400, f"job spec field 'program': {exc}")
    if isinstance(exc, UnschedulableError):  # well-formed, but no cluster of these nodes can hold it
        return HTTPException(422, str(exc))
    if isinstance(exc, ConfigError):
        return HTTPException(409 if "already exists" in str(exc) else 400, str(exc))
    return HTTPException(400, str(exc))


async def _read_body(request: Request) -> tuple[bytes, Literal["json", "yaml"]]:
    """The body, if of an accepted type and at most MAX_SPEC_BYTES (else 415/413)."""
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    fmt = BODY_TYPES.get(ctype)
    if fmt is None:
        raise HTTPException(415, f"Content-Type must be one of {', '.join(BODY_TYPES)} (got {ctype or 'none'!r})")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_SPEC_BYTES:
            raise HTTPException(413, f"body is larger than {MAX_SPEC_BYTES} bytes")
        chunks.append(chunk)
    return b"".join(chunks), fmt  # type: ignore[return-value]


def create_app(manager: Manager, token: str, allowed_hosts: frozenset[str] | set[str] = LOOPBACK_HOSTS) -> FastAPI:
    """The API. ``allowed_hosts``: names the ``Host`` header may carry (``"*"`` for any)."""
    if not token:
        raise ConfigError("the API needs a token")
    app = FastAPI(title="elasticps manager", version="0.2.0", docs_url=None, redoc_url=None, openapi_url=None)
    _with_body_models(app)
    any_host = "*" in allowed_hosts

    @app.middleware("http")
    async def boundary(request: Request, call_next: Any) -> Any:
        host = urlsplit(f"//{request.headers.get('host', '')}").hostname or ""
        # /healthz says nothing about jobs: probes (a kubelet's carries the pod's IP) may call it by any name
        if not any_host and host not in allowed_hosts and request.url.path != "/healthz":
            return JSONResponse({"detail": f"Host {host!r} is not one this manager answers to"}, status_code=403)
        origin = request.headers.get("origin")
        if origin is not None and urlsplit(origin).netloc != request.headers.get("host", ""):
            return JSONResponse({"detail": f"cross-origin request from {origin!r} refused"}, status_code=403)
        length = request.headers.get("content-length", "0")
        if not length.isdigit() or int(length) > MAX_SPEC_BYTES:
            return JSONResponse({"detail": f"body is larger than {MAX_SPEC_BYTES} bytes"}, status_code=413)
        return await call_next(request)

    @app.exception_handler(RequestValidationError)
    async def bad_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        return JSONResponse({"detail": f"field '{where}': {first['msg']}"}, status_code=400)

    @app.exception_handler(SpecError)
    async def bad_spec(request: Request, exc: SpecError) -> JSONResponse:
        """422 with every problem: ``detail`` one a line, ``problems`` as a list."""
        return JSONResponse({"detail": str(exc), "problems": exc.problems}, status_code=422)

    def unavailable(detail: str) -> JSONResponse:
        return JSONResponse({"detail": detail}, status_code=503, headers={"Retry-After": str(RETRY_AFTER_S)})

    @app.exception_handler(sqlite3.OperationalError)
    async def database_unavailable(request: Request, exc: sqlite3.OperationalError) -> JSONResponse:
        # "database is locked" (another process holds it), "database or disk is full", "disk I/O error"
        return unavailable(f"the manager's database cannot be written now ({exc}); try again")

    @app.exception_handler(OSError)
    async def disk_unavailable(request: Request, exc: OSError) -> JSONResponse:
        if exc.errno not in DISK_ERRNOS:
            raise exc
        return unavailable(f"the manager's disk cannot be written now ({exc.strerror}); try again")

    def auth(request: Request) -> None:
        given = request.headers.get("authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
            raise HTTPException(status_code=401, detail="missing or wrong bearer token")

    deps = [Depends(auth)]

    def command(run: Callable[[], JobRecord], name: str | None = None) -> JobOut:
        """Run a manager command; its errors as HTTP errors (a missing job is a 404 when one is named)."""
        try:
            return _job_json(run(), manager)
        except SpecError:
            raise  # bad_spec: a 422 listing every problem
        except ElasticPSError as exc:
            raise _http_error(exc, name) from exc
        except KeyError as exc:
            if name is None:
                raise
            raise _http_error(exc, name) from exc

    def job_or_404(name: str) -> JobRecord:
        try:
            return manager.store.get_job(name)
        except KeyError:
            raise HTTPException(404, f"no job named {name!r}") from None

    @app.post(
        "/jobs", status_code=201, dependencies=deps, response_model=JobOut, responses=ERRORS,
        openapi_extra=_body_schema(JobSpec),
    )  # fmt: skip
    async def submit(request: Request) -> JobOut:
        """Submit a job spec (YAML or JSON)."""
        body, fmt = await _read_body(request)
        return await run_in_threadpool(command, lambda: manager.submit(parse_spec(body, fmt)))

    @app.get("/jobs", dependencies=deps, response_model=list[JobOut], responses=ERRORS)
    def list_jobs() -> list[JobOut]:
        return [_job_json(r, manager) for r in manager.store.list_jobs()]

    @app.get("/jobs/{name}", dependencies=deps, response_model=JobOut, responses=ERRORS)
    def get_job(name: str) -> JobOut:
        return _job_json(job_or_404(name), manager)

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
        openapi_extra=_body_schema(LimitsPatch),
    )  # fmt: skip
    async def set_limits(name: str, request: Request) -> JobOut:
        """Change min/max: ``{"ps": {"min": 1, "max": 2}, "workers": {"min": 1, "max": 4}}``."""
        body, fmt = await _read_body(request)
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


def job_log_lines(report: JobReport, after_step: int = -1, after_event: int | None = None) -> list[dict[str, Any]]:
    """Windows and epochs of a report as ``{"step", "kind", "text"}`` lines, in
    step order, then the runtime's events (which carry no step, but their
    number: ``event``): those from ``after_event`` on, or with no
    ``after_event`` all of them if ``after_step`` is negative."""
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
    if after_event is not None or after_step < 0:
        first = max(0, report.events_total - len(report.events))  # the number of the oldest event kept
        lines += [
            {"step": None, "kind": "event", "text": msg, "event": first + i}
            for i, msg in enumerate(report.events)
            if first + i >= (after_event or 0)
        ]
    return lines
