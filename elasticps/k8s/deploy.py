"""Wiring for ``elasticps server --kuberay NAME``: credentials, capacity watch, growth."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from elasticps.errors import ConfigError
from elasticps.k8s.capacity import KubeCapacity
from elasticps.k8s.kuberay import KubeRay, KubeRayGrowth

SA_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def api_client(kubeconfig: str | None = None) -> Any:
    """In-cluster credentials (the pod's service account), else a kubeconfig file."""
    from kubernetes import client, config

    if kubeconfig is None:
        try:
            config.load_incluster_config()
            return client.ApiClient()
        except config.ConfigException:
            pass
    try:
        return config.new_client_from_config(config_file=kubeconfig)
    except (config.ConfigException, OSError) as exc:
        where = kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config"
        raise ConfigError(f"no Kubernetes credentials: not in a pod, and the kubeconfig {where}: {exc}") from None


def kuberay_growth(
    name: str,
    namespace: str | None = None,
    group: str | None = None,
    kubeconfig: str | None = None,
    on_change: Callable[[], None] | None = None,
) -> tuple[KubeRayGrowth, KubeCapacity]:
    """Start watching the cluster's capacity; return the growth hook and the watcher (stop it at the end)."""
    if namespace is None:
        namespace = SA_NAMESPACE.read_text().strip() if SA_NAMESPACE.exists() else "default"
    client = api_client(kubeconfig)
    # the client retries a refused connection three times, urllib3 logging each try: while the API server
    # is down, the watches' and the growth's own one line each is what the server's log needs
    logging.getLogger("urllib3.connectionpool").setLevel(logging.ERROR)
    kuberay = KubeRay(client, namespace, name, group)
    from kubernetes.client.exceptions import ApiException

    try:
        kuberay.worker_group()  # fail now, clearly, if the RayCluster or its group is not there
    except ApiException as exc:
        raise ConfigError(f"cannot read RayCluster {namespace}/{name}: {exc.status} {exc.reason}") from exc
    capacity = KubeCapacity(client, ours={"ray.io/cluster": name}, on_change=on_change).start()
    capacity.wait_synced()
    return KubeRayGrowth(capacity, kuberay), capacity
