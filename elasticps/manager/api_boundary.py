"""The API's security boundary (docs/security.md) and its errors: every request but ``/healthz`` and
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
from typing import Any, Literal
from urllib.parse import urlsplit

from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from elasticps.errors import ConfigError, ProgramError, UnschedulableError
from elasticps.manager.spec import MAX_SPEC_BYTES, SpecError
from elasticps.manager.states import IllegalTransition, JobInUse

LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})

BODY_TYPES = {"application/json": "json", "application/yaml": "yaml"}

#: Seconds a client is asked to wait before trying again after a 503.
RETRY_AFTER_S = 5

#: Errors of the disk under the workdir: the request may succeed later, once an operator acts.
DISK_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO})


def guard(app: FastAPI, token: str, allowed_hosts: frozenset[str] | set[str]) -> Callable[[Request], None]:
    """Put the boundary around ``app``: the ``Host``, ``Origin`` and body-size
    checks, and every error as ``{"detail": ...}``; returns the dependency that
    checks the bearer token."""
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

    return auth


def http_error(exc: Exception, name: str | None = None) -> HTTPException:
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


async def read_body(request: Request) -> tuple[bytes, Literal["json", "yaml"]]:
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
