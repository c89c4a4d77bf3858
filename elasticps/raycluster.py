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
import socket
import sys
import time

from elasticps.errors import ConfigError

log = logging.getLogger("elasticps")

#: Read by Ray at import: "0" makes the node's address loopback (a one-machine cluster).
LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
#: How long a refused connection to a Ray address is tried again, and how often.
REFUSED_WAIT_S = 10.0
REFUSED_RETRY_S = 0.5


def check_address(address: str | None, timeout_s: float = 5.0, refused_wait_s: float = REFUSED_WAIT_S) -> None:
    """A ConfigError, soon, for a Ray address that is malformed or where nothing
    listens: ``ray.init`` would raise a ValueError traceback for the one and retry for
    minutes on the other. A refused connection is tried again for ``refused_wait_s``
    (a head that is starting, as a cluster's pods come up together, listens within
    seconds); a host that does not resolve or answer fails at once (after
    ``timeout_s``). ``None``, ``local`` and ``auto`` (Ray finds it) pass."""
    if address in (None, "", "local", "auto"):
        return
    if address.startswith("ray://"):  # Ray Client: the job's driver would run here, far from its tasks
        raise ConfigError(
            f"Ray address {address!r}: Ray Client (ray://) is not supported; run elasticps on a node of the "
            "cluster and give its GCS address, HOST:PORT (port 6379 by default), or auto"
        )
    host, sep, port = address.rpartition(":")
    if ":" in host and not (host.startswith("[") and host.endswith("]")):
        raise ConfigError(f"Ray address {address!r}: an IPv6 host goes in brackets, [::1]:6379")
    host = host.strip("[]")  # an IPv6 host: [::1]:6379
    if not (sep and host and port.isdigit() and 0 < int(port) < 65536):
        raise ConfigError(f"Ray address {address!r}: expected HOST:PORT (a Ray cluster's GCS), auto or local")
    deadline = time.monotonic() + refused_wait_s
    while True:
        try:
            socket.create_connection((host, int(port)), timeout=timeout_s).close()
            return
        except ConnectionRefusedError as exc:
            if time.monotonic() >= deadline:
                raise ConfigError(
                    f"cannot reach a Ray cluster at {address}: {exc.strerror} (tried for {refused_wait_s:g} s)"
                ) from None
            log.info("nothing listens at %s yet (a Ray head starting?): trying again", address)
            time.sleep(min(REFUSED_RETRY_S, max(0.0, deadline - time.monotonic())))
        except OSError as exc:
            why = exc.strerror or type(exc).__name__  # a timeout has no strerror
            raise ConfigError(f"cannot reach a Ray cluster at {address}: {why}") from None


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
        check_address(address)
        ray.init(address=address, **kwargs)
