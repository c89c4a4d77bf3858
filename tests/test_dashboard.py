"""The dashboard in a real headless Chromium, against a real server with real
jobs on a local Ray cluster in every state: running, finished, waiting (it can
never fit), failing (its program raises), cancelled. Then the manager is
restarted on the same store and the ended jobs still show their figures.

The screenshots are kept in ``$ELASTICPS_ARTIFACTS`` (default ``out/``); the
README's are copies of them (docs/img)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from contextlib import contextmanager
from html.parser import HTMLParser
from pathlib import Path

import pytest

from elasticps.manager import Store, parse_spec
from elasticps.manager.api import create_app
from elasticps.manager.dashboard import cluster
from elasticps.manager.service import Manager
from tests.helpers import serve_app

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
if CHROMIUM is None and not os.environ.get("CI"):
    pytest.skip("chromium is not installed (CI installs it)", allow_module_level=True)

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
    "--virtual-time-budget=5000",
    "--window-size=1400,1000",
]
TOKEN = "dashboard-test-token"
SPEC = "name: {name}\nprogram: elasticps.examples.digits:program\nargs: {args}\nworkers: {workers}\nps: {{cpu: 0.5}}\n"
JOBS = {
    "long": ("{epochs: 400}", "{min: 1, max: 2, cpu: 0.5}"),  # runs through the test
    "short": ("{epochs: 2}", "{min: 1, max: 2, cpu: 0.5}"),  # finishes in seconds
    "huge": ("{epochs: 2}", "{min: 1, max: 2, cpu: 64}"),  # a worker larger than any node now: waits, says why
    "broken": ("{seed: -5}", "{min: 1, max: 1, cpu: 0.5}"),  # its data order raises at the first step
    "dropped": ("{epochs: 400}", "{min: 1, max: 1, cpu: 0.5}"),  # cancelled before it starts
}
TIMESTAMP = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d$")


class Node:
    def __init__(self, tag: str, attrs: dict[str, str]) -> None:
        self.tag, self.attrs, self.children, self.parts = tag, attrs, [], []

    @property
    def text(self) -> str:
        return "".join(p if isinstance(p, str) else p.text for p in self.parts)

    def find(self, tag: str | None = None, **attrs: str) -> list[Node]:
        """Descendants with this tag and these attributes (``data_job`` for ``data-job``)."""
        want = {k.replace("_", "-"): v for k, v in attrs.items()}
        found = []
        for c in self.children:
            if (tag is None or c.tag == tag) and all(c.attrs.get(k) == v for k, v in want.items()):
                found.append(c)
            found += c.find(tag, **attrs)
        return found

    def by_id(self, ident: str) -> Node:
        (node,) = self.find(id=ident)
        return node


class _Tree(HTMLParser):
    VOID = frozenset({"meta", "link", "br", "img", "input", "hr", "col", "source", "wbr"})

    def __init__(self) -> None:
        super().__init__()
        self.root = Node("root", {})
        self.stack = [self.root]

    def handle_starttag(self, tag, attrs):
        node = Node(tag, {k: v or "" for k, v in attrs})
        self.stack[-1].children.append(node)
        self.stack[-1].parts.append(node)
        if tag not in self.VOID:
            self.stack.append(node)

    def handle_endtag(self, tag):
        for i in range(len(self.stack) - 1, 0, -1):
            if self.stack[i].tag == tag:
                del self.stack[i:]
                return

    def handle_data(self, data):
        self.stack[-1].parts.append(data)


def parse(html: str) -> Node:
    tree = _Tree()
    tree.feed(html)
    return tree.root


@contextmanager
def serve(manager: Manager):
    with serve_app(create_app(manager, token=TOKEN)) as url:
        yield f"{url}/"


def browse(url: str, profile: Path, shot: str | None = None) -> Node:
    """The page's DOM after its scripts ran; with ``shot``, a screenshot of it kept as that file."""
    assert CHROMIUM is not None, "CI must install chromium"
    run = [CHROMIUM, *FLAGS, f"--user-data-dir={profile}", "--dump-dom"]
    keep = Path(os.environ.get("ELASTICPS_ARTIFACTS", "out"))
    if shot is not None:
        keep.mkdir(parents=True, exist_ok=True)
        run.append(f"--screenshot={keep / shot}")
    dom = subprocess.run([*run, url], capture_output=True, text=True, timeout=120, check=True).stdout
    if shot is not None:
        assert (keep / shot).stat().st_size > 20_000
    return parse(dom)


@pytest.fixture(scope="module")
def site(ray_local, tmp_path_factory):
    """A manager with a job in every state, and its server's address."""
    tmp = tmp_path_factory.mktemp("dashboard")
    manager = Manager(Store(tmp / "m.db"), tmp / "work", report_interval_s=0.5)
    for name, (args, workers) in JOBS.items():
        spec = parse_spec(SPEC.format(name=name, args=args, workers=workers))
        if name == "huge":  # accepted when the cluster was larger (a submit now refuses it): stored as it was
            manager.store.add_job(spec, time.time(), manager.runtime.describe(spec))
        else:
            manager.submit(spec)
    manager.cancel("dropped")
    manager.step()
    deadline = time.monotonic() + 240  # a busy machine starts three jobs' processes slowly
    while time.monotonic() < deadline:
        time.sleep(0.5)
        manager.step()
        states = {r.name: r.state for r in manager.store.list_jobs()}
        if (
            states["short"] == "finished"
            and any(kind in ("error", "failed") for _, _, _, kind, _ in manager.store.events("broken"))
            and len(manager.store.curves("long")) >= 4  # stored, as the page reads them (a report may be a poll ahead)
        ):
            break
    try:
        with serve(manager) as url:
            yield manager, url, tmp
    finally:
        manager.shutdown()


def test_job_table_lists_running_first_with_progress_and_reasons(site):
    _, url, tmp = site
    page = browse(f"{url}#token={TOKEN}", tmp / "p1", shot="dashboard-jobs.png")
    assert page.by_id("error").text == ""
    active = [r.attrs["data-job"] for r in page.by_id("active-jobs").find("tr") if "data-job" in r.attrs]
    assert active[0] == "long" and set(active) >= {"long", "huge"}  # running on top, then the waiting
    ended = {r.attrs["data-job"]: r for r in page.by_id("ended-jobs").find("tr") if "data-job" in r.attrs}
    assert {"short", "dropped"} <= set(ended)  # folded under "Ended jobs"
    assert page.by_id("ended-count").text == str(len(ended))
    cells = {r.attrs["data-job"]: [td.text for td in r.find("td")] for r in page.find("tr") if "data-job" in r.attrs}
    long = cells["long"]
    assert long[1] == "running" and re.fullmatch(r"\d+ PS x \d+ W", long[2])
    assert re.fullmatch(r"\d+% epoch \d+/400", long[3])  # the bar's label
    duration = re.compile(r"\d+h \d\dm|(\d+m )?\d+s")
    assert duration.fullmatch(long[4]) and duration.fullmatch(long[5])  # elapsed, ETA
    assert float(long[6]) > 0  # samples/s
    short = cells["short"]
    assert short[1] == "finished" and short[3].startswith("100%") and 0 < float(short[7]) <= 1  # metric: accuracy
    assert cells["huge"][1] == "pending" and cells["huge"][8].startswith("cannot fit: a worker needs 64 CPU")
    assert "expected non-negative integer" in cells["broken"][8]  # failed, or waiting to start again: why
    assert "cancelled" in cells["dropped"][8]


def test_job_detail_has_axes_curves_markers_events_and_log(site):
    manager, url, tmp = site
    page = browse(f"{url}#token={TOKEN}&job=long", tmp / "p2", shot="dashboard-job.png")
    assert page.by_id("error").text == ""
    assert page.by_id("job-title").text.startswith("long")
    charts = {f.attrs["data-chart"]: f for f in page.find("figure")}
    rate = charts["job:long:rate"]
    assert rate.attrs["data-x"] == "time" and rate.attrs["data-y"] == "samples/s"
    windows = len(manager.store.curves("long"))
    assert int(rate.attrs["data-points"]) >= 4 and int(rate.attrs["data-points"]) <= windows
    assert rate.find("canvas")  # uPlot drew it
    shape = charts["job:long:shape"]
    assert shape.attrs["data-y"] == "tasks" and int(shape.attrs["data-points"]) >= 4  # PS and workers, stepped
    assert charts["job:long:loss"].attrs["data-y"] == "loss"
    legend = charts["job:long:rate"].find("table")  # uPlot's legend: the series by name
    assert "samples/s" in legend[0].text
    events = [[td.text for td in tr.find("td")] for tr in page.by_id("job-events").find("tr") if tr.find("td")]
    assert any(kind == "started" for _, kind, _ in events)
    assert all(TIMESTAMP.match(at) for at, _, _ in events)
    assert re.search(r"step +\d+ +P=\d+ W=\d+ \d+ samples/s loss", page.by_id("job-log").text)


def test_cluster_view_shows_nodes_over_time_and_moves(site):
    _, url, tmp = site
    page = browse(f"{url}#token={TOKEN}&view=cluster", tmp / "p3", shot="dashboard-cluster.png")
    assert page.by_id("error").text == ""
    (node,) = [f for f in page.find("figure") if f.attrs["data-chart"].startswith("node:")]  # one Ray node here
    assert node.attrs["data-y"] == "CPUs" and int(node.attrs["data-points"]) >= 3
    rows = [[td.text for td in tr.find("td")] for tr in page.by_id("rounds").find("tr") if tr.find("td")]
    assert all(TIMESTAMP.match(r[0]) for r in rows)
    assert any(r[1] in JOBS and r[2] not in ("keep", "cannot fit") for r in rows)  # a start, a probe, a grow, ...
    assert any(r[1] == "huge" and r[2] == "cannot fit" and "64 CPU" in r[3] for r in rows)


def test_without_the_token_the_page_says_how_to_open_it(site):
    _, url, tmp = site
    page = browse(url, tmp / "p4")
    notice = page.by_id("notice")
    assert "hidden" not in notice.attrs and "needs the manager's token" in notice.text and "#token=" in notice.text
    assert not page.find("tr", data_job="long")  # nothing about jobs without it
    assert "hidden" in page.by_id("jobs-view").attrs  # nor an empty list, which would read as an empty cluster
    refused = browse(f"{url}#token=wrong-token", tmp / "p5")
    assert "refused" in refused.by_id("notice").text and "hidden" in refused.by_id("jobs-view").attrs


def test_after_a_restart_ended_jobs_keep_their_figures(site):
    manager, _, tmp = site
    manager.shutdown()
    saw = manager.history.samples()  # what the first manager's cluster view drew
    store = Store(tmp / "m.db")  # the same database, read by a new manager: nothing from memory
    again = Manager(store, tmp / "work", report_interval_s=0.5)
    try:
        with serve(again) as url:
            table = browse(f"{url}#token={TOKEN}", tmp / "p6")
            short = [td.text for td in table.find("tr", data_job="short")[0].find("td")]
            assert short[1] == "finished" and 0 < float(short[7]) <= 1 and float(short[6]) > 0
            page = browse(f"{url}#token={TOKEN}&job=short", tmp / "p7")
        seen = cluster(again)  # what the cluster view draws: the last manager's history, from the store
    finally:
        again.shutdown()
    assert len(saw) >= 3 and seen["samples"] == saw
    moves = [m for r in seen["rounds"] for m in r["moves"]]
    assert any(m["job"] == "huge" and m["action"] == "unfit" for m in moves)
    charts = {f.attrs["data-chart"]: f for f in page.find("figure")}
    assert int(charts["job:short:rate"].attrs["data-points"]) >= 1
    assert int(charts["job:short:metric"].attrs["data-points"]) >= 1
    assert page.by_id("job-summary").text.count("metric") == 1
