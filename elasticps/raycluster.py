"""Connecting to Ray: an embedded local cluster by default, or an existing one.

An embedded cluster serves this machine alone, so every port of it listens on
loopback: its node address is 127.0.0.1 (Ray's switch for that is
``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``, read when Ray is imported; its gRPC
servers then bind the node address instead of every interface) and its
dashboard is off.
"""

from __future__ import annotations

import logging
import os
import sys

log = logging.getLogger("elasticps")

#: Read by Ray at import: "0" makes the node's address loopback (a one-machine cluster).
LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


def ensure_ray(address: str | None = None, num_cpus: int | None = None, log_to_driver: bool = True) -> None:
    """Start an embedded local Ray cluster (on loopback), or join ``address``; no-op if connected.
    ``log_to_driver``: print what Ray's worker processes print in this process's terminal."""
    local = address in (None, "", "local")
    if local and "ray" not in sys.modules:
        os.environ[LOOPBACK_ENV] = "0"
    import ray

    if ray.is_initialized():
        return
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    kwargs: dict = {"include_dashboard": False, "logging_level": "ERROR", "log_to_driver": log_to_driver}
    if local:
        if os.environ.get(LOOPBACK_ENV) != "0":
            log.info("Ray was imported before the embedded cluster was set up: its ports listen on every interface")
        ray.init(address="local", num_cpus=num_cpus, _node_ip_address="127.0.0.1", **kwargs)
    else:
        ray.init(address=address, **kwargs)
