"""Free resources per Kubernetes node, kept current by watching Nodes and Pods.

Two threads list, then watch, Nodes and Pods (all namespaces) through the
official client, and re-list when a watch expires (HTTP 410) or breaks. Every
pod bound to a node and not finished holds its requests there: other
tenants' pods, and our own Ray pods (told apart by labels), which the
manager already accounts for through Ray.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from elasticps.errors import failure_text
from elasticps.k8s.resources import holds_resources, node_schedulable, pod_request, to_resources
from elasticps.sched import ClusterView, NodeView, Resources
from elasticps.sched.types import total_of

log = logging.getLogger("elasticps.k8s")
MAX_RETRY_S = 30.0  # the longest pause between two lists while the API server fails


class KubeCapacity:
    """Nodes' allocatable resources and what pods request on each.

    ``ours``: labels that mark our own pods (e.g. ``{"ray.io/cluster": "elasticps"}``);
    ``on_change``: called (from a watch thread) when a node or a pod that holds
    resources appears, changes or goes.
    """

    def __init__(
        self,
        api_client: Any,
        ours: dict[str, str] | None = None,
        on_change: Callable[[], None] | None = None,
        watch_timeout_s: int = 60,
    ) -> None:
        from kubernetes import client

        self.core = client.CoreV1Api(api_client)
        self.ours = dict(ours or {})
        self.on_change = on_change
        self.watch_timeout_s = watch_timeout_s
        self._lock = threading.Lock()
        self._nodes: dict[str, dict[str, Any]] = {}
        self._pods: dict[str, dict[str, Any]] = {}  # "namespace/name" -> pod
        self._synced = {"nodes": threading.Event(), "pods": threading.Event()}
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.errors: list[str] = []
        self._failing: dict[str, int] = {}  # failures in a row of each watch, while it fails

    # -- lifecycle
    def start(self) -> KubeCapacity:
        for kind, lister in (("nodes", self.core.list_node), ("pods", self.core.list_pod_for_all_namespaces)):
            t = threading.Thread(target=self._run, args=(kind, lister), name=f"k8s-watch-{kind}", daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def wait_synced(self, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        for kind, ev in self._synced.items():
            if not ev.wait(max(0.0, deadline - time.monotonic())):
                raise TimeoutError(f"could not list {kind} within {timeout_s:g} s: {self.errors[-1:] or 'no answer'}")

    def stop(self, timeout_s: float = 0.2) -> None:
        """Stop watching: each thread gets ``timeout_s`` to end (one between two
        calls to the server does). A watch blocked on the server (the usual case:
        waiting did nothing but add seconds) ends by itself within
        ``watch_timeout_s``; its daemon thread applies nothing after this."""
        self._stop.set()
        for t in self._threads:
            t.join(timeout=timeout_s)

    # -- reading
    def view(self) -> ClusterView:
        """Schedulable nodes: capacity = allocatable, used by others = requests of pods not ours."""
        with self._lock:
            nodes = dict(self._nodes)
            pods = list(self._pods.values())
        others: dict[str, list[Resources]] = {}
        for pod in pods:
            if holds_resources(pod) and not self.is_ours(pod):
                others.setdefault(pod["spec"]["nodeName"], []).append(pod_request(pod["spec"]))
        out = [
            NodeView(name, to_resources(node.get("status", {}).get("allocatable")), total_of(others.get(name, [])))
            for name, node in nodes.items()
            if node_schedulable(node)
        ]
        return ClusterView(tuple(sorted(out, key=lambda n: n.name)))

    def free(self) -> dict[str, Resources]:
        """Per schedulable node: allocatable minus what every pod holds, ours included."""
        with self._lock:
            pods = list(self._pods.values())
        ours: dict[str, list[Resources]] = {}
        for pod in pods:
            if holds_resources(pod) and self.is_ours(pod):
                ours.setdefault(pod["spec"]["nodeName"], []).append(pod_request(pod["spec"]))
        return {n.name: (n.available - total_of(ours.get(n.name, []))).clamped() for n in self.view().nodes}

    def pods(self, labels: dict[str, str], namespace: str | None = None) -> list[dict[str, Any]]:
        """The pods carrying all of ``labels`` (in ``namespace`` if given)."""
        with self._lock:
            pods = list(self._pods.values())
        return [
            p
            for p in pods
            if _has_labels(p, labels) and (namespace is None or p["metadata"].get("namespace") == namespace)
        ]

    def is_ours(self, pod: dict[str, Any]) -> bool:
        return bool(self.ours) and _has_labels(pod, self.ours)

    # -- watching
    def _run(self, kind: str, lister: Callable[..., Any]) -> None:
        from kubernetes import watch
        from kubernetes.client.exceptions import ApiException

        store = self._nodes if kind == "nodes" else self._pods
        while not self._stop.is_set():
            try:
                listing = json.loads(lister(_preload_content=False).data)
                fresh = {_key(o): o for o in listing.get("items") or []}
                with self._lock:
                    changed = fresh.keys() != store.keys() or any(fresh[k] != store[k] for k in fresh)
                    store.clear()
                    store.update(fresh)
                if changed:
                    self._changed()
                self._synced[kind].set()
                w = watch.Watch()
                for event in w.stream(
                    lister,
                    resource_version=listing["metadata"]["resourceVersion"],
                    timeout_seconds=self.watch_timeout_s,
                    deserialize=False,
                ):
                    if self._stop.is_set():
                        w.stop()
                        break
                    self._apply(store, event)
                    self._recovered(kind)
                self._recovered(kind)  # a watch that ran its time out: working again (a list alone is not)
            except ApiException as exc:
                if exc.status != 410:  # 410 Gone: the watch expired; list again
                    self._error(kind, exc)
            except Exception as exc:  # a broken connection: list again after a pause
                self._error(kind, exc)

    def _apply(self, store: dict[str, dict[str, Any]], event: dict[str, Any]) -> None:
        if self._stop.is_set():
            return
        kind, obj = event.get("type"), event.get("object") or {}
        if kind == "ERROR":
            from kubernetes.client.exceptions import ApiException

            raise ApiException(status=obj.get("code", 500), reason=obj.get("message", "watch error"))
        if kind == "BOOKMARK":
            return
        key = _key(obj)
        with self._lock:
            if kind == "DELETED":
                store.pop(key, None)
            else:
                store[key] = obj
        self._changed()

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change()

    def _recovered(self, kind: str) -> None:
        """The watch of ``kind`` delivered an event or ran its time out: a run of failures, if any, is over."""
        if self._failing.pop(kind, 0):
            log.warning("watching %s again", kind)

    def _error(self, kind: str, exc: Exception) -> None:
        """A failed list or watch: said once when a run of failures starts (the
        API server down is a failure a second, for minutes), then listed again
        after a pause that doubles up to ``MAX_RETRY_S``."""
        why = failure_text(exc)
        self.errors.append(f"{kind}: {why}")
        del self.errors[:-20]
        n = self._failing[kind] = self._failing.get(kind, 0) + 1
        pause = min(MAX_RETRY_S, 2.0 ** (n - 1))
        if n == 1:
            log.warning("watching %s failed (%s); listing again, every %g-%g s while it fails", kind, why, pause,
                        MAX_RETRY_S)  # fmt: skip
        else:
            log.debug("watching %s failed again (%s)", kind, why)
        self._stop.wait(pause)


def _key(obj: dict[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}".lstrip("/")


def _has_labels(obj: dict[str, Any], labels: dict[str, str]) -> bool:
    have = (obj.get("metadata") or {}).get("labels") or {}
    return all(have.get(k) == v for k, v in labels.items())
