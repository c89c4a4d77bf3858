"""A typed Python client of the manager's REST API (what the CLI uses).

```python
from elasticps.manager.client import Client

client = Client()                # $ELASTICPS_URL; the token as the CLI finds it ($ELASTICPS_TOKEN, the workdir's file)
job = client.submit(Path("examples/digits-mlp.yaml"), working_dir="my_project")
for line in client.logs(job.name, follow=True):    # until the job ends
    print(line.text)
print(client.wait(job.name).state)                 # "finished"
client.scale(job.name, workers=(2, 8))
print(client.metrics())                            # Prometheus text
```

Answers are the API's own pydantic models (:mod:`elasticps.manager.models`);
an error answer raises :class:`ManagerError` with its status and detail (a
spec's 422 lists every problem in ``problems``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx

from elasticps.errors import ElasticPSError
from elasticps.manager.models import ENDED, EventOut, JobOut, LogLine, OutputOut
from elasticps.manager.spec import NAME_RE, NAME_RULE, JobSpec, load_document
from elasticps.manager.workdir import client_token, client_url

DEFAULT_URL = "http://127.0.0.1:8470"


class ManagerError(ElasticPSError):
    """The manager answered with an error (or could not be reached)."""

    def __init__(self, message: str, status: int | None = None, problems: list[str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.problems = problems or []


class Client:
    """``token``: else ``$ELASTICPS_TOKEN``, else the token file of ``workdir`` (else of
    ``$ELASTICPS_WORKDIR``, else of ``elasticps-state``): as the CLI finds it."""

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        timeout_s: float = 30.0,
        workdir: str | Path | None = None,
    ) -> None:
        token, self.token_source = client_token(token, workdir)
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.Client(base_url=client_url(url, workdir, DEFAULT_URL), headers=headers, timeout=timeout_s)

    def _request(self, method: str, path: str, **kw: Any) -> httpx.Response:
        try:
            r = self.http.request(method, path, **kw)
        except httpx.HTTPError as exc:
            raise ManagerError(f"cannot reach the manager at {self.http.base_url}: {exc}") from exc
        kind = r.headers.get("content-type", "")
        is_json = kind.startswith("application/json")
        if kind.startswith("text/html"):  # the API answers JSON (its errors too) or, for /metrics, plain text
            guess = (
                "a proxy in front of the manager, and the manager behind it down?"
                if r.status_code in (502, 503, 504)
                else "is --url (or $ELASTICPS_URL) the manager's address?"
            )
            raise ManagerError(
                f"{self.http.base_url} answered {method} {path} with {r.status_code} and a web page, not an "
                f"elasticps manager's JSON: {guess}",
                r.status_code,
            )
        if r.status_code >= 400:
            detail = r.json().get("detail", r.text) if is_json else r.text
            if r.status_code == 401:
                detail = f"{detail} (token: {self.token_source})"
            problems = r.json().get("problems") if r.status_code == 422 else None
            raise ManagerError(f"{r.status_code}: {detail}", r.status_code, problems)
        return r

    def _job(self, method: str, path: str, **kw: Any) -> JobOut:
        return JobOut.model_validate(self._request(method, path, **kw).json())

    # -- commands
    def submit(
        self,
        spec: JobSpec | Mapping[str, Any] | Path | str,
        json_body: bool = False,
        working_dir: str | Path | None = None,
    ) -> JobOut:
        """Submit a job: a :class:`JobSpec`, a dict, a spec file (``Path``;
        ``.json`` or YAML) or spec text (YAML, or JSON with ``json_body``).
        ``working_dir``: ship this directory's code with the job (sets
        ``runtime_env.working_dir``, made absolute: the manager reads it, so a path
        on the manager's machine)."""
        if isinstance(spec, JobSpec):
            text, json_body = spec.model_dump_json(exclude_none=True), True
        elif isinstance(spec, Mapping):
            text, json_body = json.dumps(dict(spec)), True
        elif isinstance(spec, Path):
            try:
                text = spec.read_text()
            except OSError as exc:
                raise ManagerError(f"cannot read the job spec {spec}: {exc.strerror}") from None
            json_body = spec.suffix == ".json"
        else:
            text = spec
        if working_dir is not None:
            text, json_body = _with_working_dir(text, Path(working_dir)), True
        ctype = "application/json" if json_body else "application/yaml"
        return self._job("POST", "/jobs", content=text, headers={"Content-Type": ctype})

    def cancel(self, name: str) -> JobOut:
        return self._job("DELETE", f"/jobs/{_name(name)}")

    def retry(self, name: str) -> JobOut:
        return self._job("POST", f"/jobs/{_name(name)}/retry")

    def delete(self, name: str) -> JobOut:
        """Forget an ended job; its name can be used again."""
        return self._job("POST", f"/jobs/{_name(name)}/delete")

    def scale(self, name: str, ps: tuple[int, int] | None = None, workers: tuple[int, int] | None = None) -> JobOut:
        """New (min, max) limits of a job's PS and/or workers; the scheduler
        chooses the shape within them at its next round."""
        body = {kind: {"min": r[0], "max": r[1]} for kind, r in (("ps", ps), ("workers", workers)) if r is not None}
        if not body:
            raise ValueError("scale: give ps and/or workers")
        return self._job("PATCH", f"/jobs/{_name(name)}", json=body)

    # -- reads
    def jobs(self) -> list[JobOut]:
        return [JobOut.model_validate(j) for j in self._request("GET", "/jobs").json()]

    def job(self, name: str) -> JobOut:
        return self._job("GET", f"/jobs/{_name(name)}")

    def detail(self, name: str) -> dict[str, Any]:
        """What the dashboard shows of a job: its row (state, shape, progress, ETA, reason),
        shapes over time, curves, rescales, events and log tail (``GET /api/jobs/{name}``)."""
        return self._request("GET", f"/api/jobs/{_name(name)}").json()

    def events(self, job: str | None = None, after: int = 0) -> list[EventOut]:
        params: dict[str, Any] = {"after": after}
        if job is not None:
            params["job"] = _name(job)
        return [EventOut.model_validate(e) for e in self._request("GET", "/events", params=params).json()]

    def logs(self, name: str, after_step: int = -1, follow: bool = False, poll_s: float = 2.0) -> Iterator[LogLine]:
        """The job's log lines after ``after_step``; with ``follow``, new ones
        as they come, until the job has ended."""
        last, events = after_step, 0
        while True:
            ended = follow and self.job(name).state in ENDED  # read first: no line written before the end is lost
            for line in self.log_page(name, last, events):
                if line.step is not None:
                    last = max(last, line.step)
                if line.event is not None:  # each event once, however many polls it takes the job to step
                    events = max(events, line.event + 1)
                yield line
            if not follow or ended:
                return
            time.sleep(poll_s)

    def output(self, name: str, after: int = 0, follow: bool = False, poll_s: float = 1.0) -> Iterator[OutputOut]:
        """The job's own output (what its tasks printed, tagged by task) from byte
        ``after`` on; with ``follow``, new pieces as they come, until the job has ended."""
        while True:
            ended = follow and self.job(name).state in ENDED
            piece = self.output_page(name, after)
            after = piece.next
            if piece.text or piece.dropped:
                yield piece
            if not follow or ended:
                return
            time.sleep(poll_s)

    def output_page(self, name: str, after: int = 0) -> OutputOut:
        return OutputOut.model_validate(
            self._request("GET", f"/jobs/{_name(name)}/output", params={"after": after}).json()
        )

    def log_page(self, name: str, after_step: int = -1, after_event: int = 0) -> list[LogLine]:
        """One read of the job's log: lines after step ``after_step``, events from number ``after_event`` on."""
        params = {"after_step": after_step, "after_event": after_event}
        return [
            LogLine.model_validate(x) for x in self._request("GET", f"/jobs/{_name(name)}/logs", params=params).json()
        ]

    def wait(self, name: str, timeout_s: float | None = None, poll_s: float = 1.0) -> JobOut:
        """Block until the job has ended (finished, failed or cancelled); its last state."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            job = self.job(name)
            if job.state in ENDED:
                return job
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"job {name} is still {job.state} after {timeout_s:g} s")
            time.sleep(poll_s)

    def metrics(self) -> str:
        """The manager's metrics in the Prometheus text format."""
        return self._request("GET", "/metrics").text


def _with_working_dir(text: str, directory: Path) -> str:
    """The spec (YAML or JSON text) with ``runtime_env.working_dir`` set to ``directory``, as JSON."""
    from elasticps.errors import ConfigError

    if not directory.is_dir():
        raise ConfigError(f"working_dir {directory}: not a directory")
    data = load_document(text, "yaml")  # YAML reads JSON too; a SpecError says where it is wrong
    if not isinstance(data, dict):
        raise ConfigError("the job spec must be a mapping")
    env = data.get("runtime_env") or {}
    if not isinstance(env, dict):
        raise ConfigError("job spec field 'runtime_env': must be a mapping")
    data["runtime_env"] = {**env, "working_dir": str(directory.resolve())}
    return json.dumps(data)


def _name(name: str) -> str:
    """A job's name as it goes into a request's path: refused unless it is one
    a job can have, so that no name reaches another endpoint (``a/delete``)."""
    if not NAME_RE.fullmatch(name):
        raise ManagerError(f"no job can be named {name!r}: a name is {NAME_RULE}")
    return name
