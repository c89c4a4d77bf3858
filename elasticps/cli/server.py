"""``elasticps server``: the configuration manager (REST API, dashboard, control loop)."""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import socket
import sys
from pathlib import Path
from typing import Any

from elasticps.cli.common import (
    OBJECTIVE_HELP,
    PLACEMENT_HELP,
    POLICY_HELP,
    THRESHOLD_HELP,
    default_workdir,
    nonnegative_float,
    port,
    positive_float,
    positive_int,
)
from elasticps.errors import ConfigError


def _ship_roots(text: str | None) -> tuple[str, ...] | None:
    """``--ship-roots``: absolute directories (None: the default, the user's home)."""
    if text is None:
        return None
    roots = tuple(r.strip() for r in text.split(",") if r.strip())
    bad = [r for r in roots if not Path(r).is_absolute() or not Path(r).is_dir()]
    if bad or not roots:
        raise ConfigError(f"--ship-roots takes existing absolute directories, got {text!r}")
    return roots


def listening_at(output: str) -> str:
    """The URL that ``elasticps server`` printed in ``output`` once its socket
    listened ('' before): for a caller that starts it with ``--port 0``."""
    found = re.search(r"^elasticps manager on (http://\S+) ", output, re.M)
    return found.group(1) if found else ""


def _listen(host: str, port: int) -> socket.socket:
    """A listening socket on HOST:PORT (port 0: a free one), or a one-line error."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise ConfigError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    sock.listen(2048)
    return sock


def open_store(path: Path) -> Any:
    """The manager's store at ``path``, or a one-line error (a full disk, a file that is no database)."""
    import sqlite3

    from elasticps.manager import Store

    try:
        return Store(path)
    except sqlite3.Error as exc:
        raise ConfigError(f"cannot open the manager's database {path}: {exc}") from None


def cmd_server(args: argparse.Namespace) -> int:
    import threading

    from elasticps.manager.workdir import (
        URL_FILE,
        WorkdirLock,
        api_token,
        check_token,
        ray_token_auth,
        secure_workdir,
        without_token,
        write_token,
        write_url,
    )
    from elasticps.raycluster import LOOPBACK_ENV, check_address

    # refused before anything is made or started: a bad --ship-roots, a port in use, a Ray cluster not there
    ship_roots = _ship_roots(args.ship_roots)
    kube = [f for f, v in (("--kuberay-namespace", args.kuberay_namespace), ("--kuberay-group", args.kuberay_group),
                           ("--kubeconfig", args.kubeconfig)) if v is not None]  # fmt: skip
    if kube and not args.kuberay:
        raise ConfigError(f"{', '.join(kube)} without --kuberay NAME: they say which RayCluster to grow")
    kube_api = None
    if args.kuberay:  # credentials read now: a kubeconfig not there is said before anything starts
        from elasticps.k8s.deploy import api_client

        kube_api = api_client(args.kubeconfig)
    _listen(args.host, args.port).close()  # bound for good below, after the restart that sets Ray's auth up
    check_address(args.ray_address)
    workdir = Path(args.workdir)
    secure_workdir(workdir)  # 0700, files 0600, umask 077 here and in the Ray processes we start
    if args.ray_address in (None, "", "local"):
        os.environ[LOOPBACK_ENV] = "0"  # the embedded cluster's ports on loopback (read when Ray is imported)
    if args.token is not None:
        check_token(args.token)
        print(
            "warning: --token can be read by every local user (ps, /proc/PID/cmdline) while it is on a command "
            "line; the server takes it off its own now. Give it in $ELASTICPS_TOKEN or WORKDIR/token instead.",
            file=sys.stderr,
            flush=True,
        )
        os.environ["ELASTICPS_TOKEN"] = args.token
    elif os.environ.get("ELASTICPS_TOKEN"):
        check_token(os.environ["ELASTICPS_TOKEN"])
    # Ray's own token authentication for the cluster we start (docs/security.md). Ray reads
    # the variables once, when it is imported, so the process starts again with them set:
    # the same PID, the same arguments but --token (passed on in the environment instead).
    if (args.ray_address in (None, "", "local") and ray_token_auth(workdir)) or args.token is not None:
        sys.stdout.flush()
        os.execv(sys.executable, [sys.executable, "-m", "elasticps", *without_token(args.argv)])
    lock = WorkdirLock(workdir)  # one manager per workdir: a second one stops here
    store = open_store(workdir / "manager.db")  # a full disk: said before Ray starts
    # the token stays in this process's memory: not in the environment the Ray processes and jobs inherit
    given = os.environ.pop("ELASTICPS_TOKEN", None) or None
    if given is not None:  # the workdir's file names the token this server takes, for the clients that read it
        write_token(workdir, given)
    token = given or api_token(workdir)

    import uvicorn

    from elasticps.manager.api import LOOPBACK_HOSTS, create_app
    from elasticps.manager.service import Manager
    from elasticps.raycluster import ensure_ray
    from elasticps.sched import make_policy

    options: dict[str, float] = {"rescale_cost_s": args.rescale_cost_s} if args.rescale_cost_s is not None else {}
    if args.efficiency_threshold is not None:
        options["efficiency_threshold"] = args.efficiency_threshold
    make_policy(args.policy, objective=args.objective, **options)  # an option it lacks: refused before Ray starts
    listener = _listen(args.host, args.port)  # a port in use: refused before Ray starts
    port = listener.getsockname()[1]
    # Ray puts its driver's directory on the path of every process of every job, ahead of a job's shipped
    # working_dir: started from a folder that holds a module of the same name, the job would run that
    # copy, not the code pinned at its submit. From an empty folder of its own there is none to find.
    empty = workdir / ".ray-driver"  # no job's name: those start with a letter or digit
    empty.mkdir(exist_ok=True)  # 0700: secure_workdir's umask
    with contextlib.chdir(empty):
        # a job's output is kept for `elasticps logs` (elasticps.runtime.output); in the server's terminal it
        # would bury the server's own lines under every job's
        ensure_ray(args.ray_address, num_cpus=args.num_cpus, log_to_driver=args.job_output)
    allow = tuple(m.strip() for m in args.allow_programs.split(",") if m.strip()) if args.allow_programs else None
    manager = Manager(
        store, workdir, args.policy, args.objective, args.placement, policy_options=options,
        allow_programs=allow, ship_roots=ship_roots,
    )  # fmt: skip
    if args.kuberay:
        from elasticps.k8s.deploy import kuberay_growth

        # the capacity object watches Nodes and Pods; it lives as long as this call
        manager.growth, _kube_capacity = kuberay_growth(
            args.kuberay, args.kuberay_namespace, args.kuberay_group, on_change=manager.wake.set, api=kube_api
        )
    hosts = set(LOOPBACK_HOSTS) | set(args.allow_host or [])
    if args.host not in ("0.0.0.0", "::"):
        hosts.add(args.host)
    stop = threading.Event()
    loop = threading.Thread(target=manager.run, args=(args.interval_s, stop), name="elasticps-loop", daemon=True)
    loop.start()
    # The socket listens already, so a client started once these lines are out is queued, not refused.
    # (listening_at reads the first line back.)
    url_file = workdir / URL_FILE
    try:
        write_url(workdir, args.host, port)  # a client given this workdir finds the server on any port
        print(f"elasticps manager on http://{args.host}:{port} (state in {workdir})", flush=True)
        print(f"dashboard: http://{args.host}:{port}/#token={token}", flush=True)
        config = uvicorn.Config(create_app(manager, token, frozenset(hosts)), log_level="warning")
        uvicorn.Server(config).run(sockets=[listener])
    finally:
        # Everything a restart needs is in the store; if Ray went down with us (a signal to the
        # whole process group), calls into it would wait out Ray's own 60 s timeout, so give up sooner.
        stop.set()
        closer = threading.Thread(target=lambda: (loop.join(timeout=30), manager.shutdown()), daemon=True)
        closer.start()
        closer.join(timeout=args.shutdown_timeout_s)
        url_file.unlink(missing_ok=True)
        lock.release()
        if closer.is_alive():
            print(f"stopped without releasing every job (over {args.shutdown_timeout_s:g} s)", file=sys.stderr)
            os._exit(0)
    return 0


def add_parsers(sub: Any) -> None:
    """server"""
    server = sub.add_parser("server", help="run the configuration manager (REST API + control loop)")
    server.add_argument(
        "--workdir",
        default=default_workdir(),
        help="database, checkpoints, API token and Ray token go here; one manager per workdir "
        "(default $ELASTICPS_WORKDIR or elasticps-state)",
    )
    server.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine)")
    server.add_argument("--port", type=port, default=8470, help="port to listen on, 0-65535 (default 8470)")
    server.add_argument(
        "--token", help="the API's bearer token (default $ELASTICPS_TOKEN, else WORKDIR/token, made at first start)"
    )
    server.add_argument(
        "--allow-programs",
        metavar="MODULES",
        help="comma-separated modules whose programs may run (and their submodules); default: any importable one",
    )
    server.add_argument(
        "--ship-roots",
        metavar="DIRS",
        help="comma-separated directories a job's runtime_env may ship code from (never the workdir); "
        "default: your home directory",
    )
    server.add_argument(
        "--allow-host",
        action="append",
        metavar="NAME",
        help="a Host name clients may use besides loopback and --host (repeatable; '*' for any)",
    )
    server.add_argument("--ray-address", help="join this Ray cluster instead of starting a local one")
    server.add_argument(
        "--job-output",
        action="store_true",
        help="also print every job's output here, as Ray forwards it (default: only kept for `elasticps logs NAME`)",
    )
    server.add_argument(
        "--num-cpus", type=positive_int, help="logical CPUs of the embedded local Ray cluster (default: this machine's)"
    )
    server.add_argument(
        "--interval-s", type=positive_float, default=10.0, help="scheduling interval, seconds (default 10)"
    )
    server.add_argument(
        "--shutdown-timeout-s",
        type=nonnegative_float,
        default=20.0,
        help="on exit, give up stopping jobs after this many seconds (default 20)",
    )
    server.add_argument(
        "--rescale-cost-s",
        type=nonnegative_float,
        help="elastic: seconds a rescale is taken to cost (default 10; measured pauses here are < 1 s)",
    )
    server.add_argument(
        "--policy", default="elastic", choices=["static", "greedy", "optimus", "elastic"], help=POLICY_HELP
    )
    server.add_argument(
        "--objective", default="goodput", choices=["goodput", "speed", "efficiency"], help=OBJECTIVE_HELP
    )
    server.add_argument("--efficiency-threshold", type=float, help=THRESHOLD_HELP)
    server.add_argument(
        "--placement", default="locality", choices=["locality", "spread", "pack", "optimus"], help=PLACEMENT_HELP
    )
    server.add_argument("--kuberay", metavar="NAME", help="grow and shrink this KubeRay RayCluster's worker group")
    server.add_argument("--kuberay-namespace", help="its namespace (default: the pod's own, else 'default')")
    server.add_argument("--kuberay-group", help="its worker group (default: the first)")
    server.add_argument("--kubeconfig", help="Kubernetes credentials (default: in-cluster, else $KUBECONFIG)")
    server.set_defaults(func=cmd_server)
