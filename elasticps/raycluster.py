"""Connecting to Ray: an embedded local cluster by default, or an existing one."""

from __future__ import annotations

import os

import ray


def ensure_ray(address: str | None = None, num_cpus: int | None = None) -> None:
    """Start an embedded local Ray cluster, or join ``address``; no-op if connected."""
    if ray.is_initialized():
        return
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    kwargs: dict = {"include_dashboard": False, "logging_level": "ERROR", "log_to_driver": True}
    if address in (None, "", "local"):
        ray.init(address="local", num_cpus=num_cpus, **kwargs)
    else:
        ray.init(address=address, **kwargs)
