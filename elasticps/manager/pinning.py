"""A job's code, pinned at submit.

At submit, each local directory a job's ``runtime_env`` ships (``working_dir``,
``py_modules``) is zipped as Ray packages it, into the job's folder
(``jobs.d/NAME/code/_ray_pkg_<sha1>.zip``, 0600), and the stored spec names
the package by its content-addressed URI (``gcs://_ray_pkg_<sha1>.zip``, the
hash of the zip) instead of the directory. Every start of the job (its first,
a restart after a failure, a retry, a restarted manager's) then runs that
package, uploaded from the folder to a Ray cluster that lacks it; the
directory is not read again, so a model file changed on disk after submit
does not meet the job's checkpoints. A new submit pins the code as it is then.

A local file in ``py_modules`` (a wheel, a single module) and remote URIs are
left as given: Ray reads them at each start.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path
from typing import Any

from elasticps.manager.spec import RuntimeEnvSpec
from elasticps.private_dir import private_dir

log = logging.getLogger("elasticps.manager")

#: The folder, in a job's folder, of its pinned packages.
CODE_DIR = "code"
_SCHEME = "gcs://"


def pin(env: RuntimeEnvSpec, folder: Path) -> tuple[RuntimeEnvSpec, list[str]]:
    """``env`` with its local directories zipped into ``folder`` and named by
    their packages' URIs, and one line a directory saying what was pinned."""
    from ray._private import ray_constants

    pinned: list[str] = []

    def one(field: str, path: str, include_parent_dir: bool, excludes: list[str]) -> str:
        if "://" in path or not Path(path).is_dir():
            return path
        uri = _package(folder, path, include_parent_dir, excludes)
        pinned.append(f"{field} {path} as {uri}")
        return uri

    working_dir = env.working_dir and one(
        "working_dir", env.working_dir, False, ray_constants.get_runtime_env_default_excludes()
    )  # what Ray leaves out of a working_dir (.git, ...), as it would
    modules = [one(f"py_modules[{i}]", p, True, []) for i, p in enumerate(env.py_modules)]
    return env.model_copy(update={"working_dir": working_dir, "py_modules": modules}), pinned


def _package(folder: Path, directory: str, include_parent_dir: bool, excludes: list[str]) -> str:
    from ray._private.runtime_env.packaging import create_package, get_uri_for_package

    private_dir(folder)
    tmp = folder / f".tmp-{os.getpid()}-{threading.get_ident()}.zip"
    try:
        create_package(directory, tmp, include_gitignore=True, include_parent_dir=include_parent_dir,
                       excludes=excludes, logger=log)  # fmt: skip
        os.chmod(tmp, 0o600)
        uri = get_uri_for_package(tmp)
        os.replace(tmp, folder / uri.removeprefix(_SCHEME))
    finally:
        tmp.unlink(missing_ok=True)
    return uri


def upload_pinned(runtime_env: dict[str, Any], folder: str | Path) -> None:
    """Upload to the connected Ray cluster each pinned package of ``runtime_env``
    that it lacks (a package lives in the cluster only while something uses it)."""
    from ray._private.runtime_env.packaging import package_exists, pin_runtime_env_uri, upload_package_to_gcs

    uris = [runtime_env.get("working_dir") or "", *runtime_env.get("py_modules", [])]
    for uri in uris:
        if not uri.startswith(_SCHEME):
            continue
        stored = Path(folder) / uri.removeprefix(_SCHEME)
        if not stored.is_file():
            continue  # not pinned here: named by the user, Ray finds it or says it cannot
        pin_runtime_env_uri(uri)  # kept while the job's processes start
        if not package_exists(uri):
            upload_package_to_gcs(uri, stored.read_bytes())


def unpacked(env: RuntimeEnvSpec, folder: str | Path, into: str | Path) -> list[str]:
    """The directories to put on ``sys.path`` for a job's code as pinned in
    ``folder``, each package unzipped under ``into`` (``elasticps export``);
    a spec from before code was pinned gives its local ``working_dir``."""
    import zipfile

    paths = []
    for i, given in enumerate([env.working_dir or "", *env.py_modules]):
        stored = Path(folder) / given.removeprefix(_SCHEME)
        if given.startswith(_SCHEME) and stored.is_file():
            target = Path(into) / f"package-{i}"
            with zipfile.ZipFile(stored) as z:
                z.extractall(target)
            paths.append(str(target))
        elif i == 0 and given and Path(given).is_dir():
            paths.append(given)
    return paths
