"""A Python client of the manager's REST API (what the CLI uses)."""

from __future__ import annotations

import os
from typing import Any

import httpx

from elasticps.errors import ElasticPSError

DEFAULT_URL = "http://127.0.0.1:8470"


class ManagerError(ElasticPSError):
    """The manager answered with an error."""


class Client:
    def __init__(self, url: str | None = None, token: str | None = None, timeout_s: float = 30.0) -> None:
        token = token or os.environ.get("ELASTICPS_TOKEN")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.Client(
            base_url=url or os.environ.get("ELASTICPS_URL", DEFAULT_URL), headers=headers, timeout=timeout_s
        )

    def _call(self, method: str, path: str, **kw: Any) -> Any:
        try:
            r = self.http.request(method, path, **kw)
        except httpx.HTTPError as exc:
            raise ManagerError(f"cannot reach the manager at {self.http.base_url}: {exc}") from exc
        if r.status_code >= 400:
            detail = (
                r.json().get("detail", r.text)
                if r.headers.get("content-type", "").startswith("application/json")
                else r.text
            )
            raise ManagerError(f"{r.status_code}: {detail}")
        return r.json()

    def submit(self, spec_text: str, json_body: bool = False) -> dict[str, Any]:
        ctype = "application/json" if json_body else "application/yaml"
        return self._call("POST", "/jobs", content=spec_text, headers={"Content-Type": ctype})

    def jobs(self) -> list[dict[str, Any]]:
        return self._call("GET", "/jobs")

    def job(self, name: str) -> dict[str, Any]:
        return self._call("GET", f"/jobs/{name}")

    def cancel(self, name: str) -> dict[str, Any]:
        return self._call("DELETE", f"/jobs/{name}")

    def scale(
        self, name: str, ps: tuple[int, int] | None = None, workers: tuple[int, int] | None = None
    ) -> dict[str, Any]:
        """New (min, max) limits of a job's PS and/or workers; the scheduler
        chooses the shape within them at its next round."""
        body = {kind: {"min": r[0], "max": r[1]} for kind, r in (("ps", ps), ("workers", workers)) if r is not None}
        if not body:
            raise ValueError("scale: give ps and/or workers")
        return self._call("PATCH", f"/jobs/{name}", json=body)

    def delete(self, name: str) -> dict[str, Any]:
        """Forget an ended job; its name can be used again."""
        return self._call("POST", f"/jobs/{name}/delete")

    def retry(self, name: str) -> dict[str, Any]:
        return self._call("POST", f"/jobs/{name}/retry")

    def events(self, job: str | None = None, after: int = 0) -> list[dict[str, Any]]:
        params: dict[str, Any] = {"after": after}
        if job:
            params["job"] = job
        return self._call("GET", "/events", params=params)

    def logs(self, name: str, after_step: int = -1) -> list[dict[str, Any]]:
        return self._call("GET", f"/jobs/{name}/logs", params={"after_step": after_step})
