"""Wiring for ``elasticps server --kuberay NAME``: credentials, capacity watch, growth."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from elasticps.errors import ConfigError, one_line
from elasticps.k8s.capacity import KubeCapacity
from elasticps.k8s.kuberay import KubeRay, KubeRayGrowth

SA_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def api_client(kubeconfig: str | None = None) -> Any:
    """In-cluster credentials (the pod's service account), else a kubeconfig file;
    a :class:`ConfigError` in one line where neither gives any. The client does
    not retry a refused connection itself (urllib3 would log each try): the
    watches list again and the growth tries again next round, each saying so once."""
    import yaml
    from kubernetes import client, config

    settings = client.Configuration()
    settings.retries = 0
    if kubeconfig is None:
        try:
            config.load_incluster_config(client_configuration=settings)
            return client.ApiClient(settings)
        except config.ConfigException:
            pass
    try:
        config.load_kube_config(config_file=kubeconfig, client_configuration=settings, persist_config=False)
    except (config.ConfigException, OSError, yaml.YAMLError) as exc:
        where = kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config"
        why = one_line(str(exc), 300)
        raise ConfigError(f"no Kubernetes credentials: not in a pod, and the kubeconfig {where}: {why}") from None
    return client.ApiClient(settings)


def kuberay_growth(
    name: str,
    namespace: str | None = None,
    group: str | None = None,
    kubeconfig: str | None = None,
    on_change: Callable[[], None] | None = None,
    api: Any = None,
) -> tuple[KubeRayGrowth, KubeCapacity]:
    """Start watching the cluster's capacity; return the growth hook and the watcher (stop it at the end).
    ``api``: a client made already (:func:`api_client`), else one from ``kubeconfig``."""
    if namespace is None:
        namespace = SA_NAMESPACE.read_text().strip() if SA_NAMESPACE.exists() else "default"
    client = api if api is not None else api_client(kubeconfig)
    kuberay = KubeRay(client, namespace, name, group)
    from kubernetes.client.exceptions import ApiException

    try:
        kuberay.worker_group()  # fail now, clearly, if the RayCluster or its group is not there
    except ApiException as exc:
        raise ConfigError(f"cannot read RayCluster {namespace}/{name}: {exc.status} {exc.reason}") from exc
    capacity = KubeCapacity(client, ours={"ray.io/cluster": name}, on_change=on_change).start()
    capacity.wait_synced()
    return KubeRayGrowth(capacity, kuberay), capacity
