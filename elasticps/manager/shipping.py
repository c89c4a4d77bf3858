"""Which local paths a job may ship with its ``runtime_env``.

The manager uploads a spec's ``working_dir`` and ``py_modules`` directories to
the Ray cluster, reading them with its own permissions, so a spec could ask it
to ship ``/etc`` or the manager's own workdir (its tokens and database). A
path is shipped only if, once its symlinks and ``..`` are resolved, it lies
under one of the operator's roots (``elasticps server --ship-roots``; by
default the home directory of the user the manager runs as), neither is nor
holds the manager's workdir, and no symlink among the files Ray would ship
leads out of the roots or into the workdir (Ray's packager follows links;
what ``.gitignore`` excludes is not shipped, so not checked).

A path outside the roots gets the same answer whether it exists or not, so the
answer tells nothing about the manager's machine. Remote URIs (``s3://``,
``https://``, ...) are fetched by Ray's workers, not read here; ``file://`` is
a local path in disguise and is refused.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from elasticps.errors import ConfigError
from elasticps.manager.spec import RuntimeEnvSpec

log = logging.getLogger("elasticps.manager")

#: Entries a shipped directory may hold (Ray's own limit on a package is its size).
MAX_SHIPPED_ENTRIES = 100_000


def default_ship_roots() -> tuple[Path, ...]:
    return (Path.home(),)


@dataclass(frozen=True)
class ShipPolicy:
    roots: tuple[Path, ...]
    workdir: Path

    @classmethod
    def of(cls, roots: tuple[str | Path, ...] | None, workdir: str | Path) -> ShipPolicy:
        chosen = default_ship_roots() if roots is None else roots
        return cls(tuple(Path(r).resolve() for r in chosen), Path(workdir).resolve())

    def check(self, env: RuntimeEnvSpec | None) -> None:
        """A ConfigError naming the field unless every local path of ``env`` may be shipped."""
        if env is None:
            return
        entries = [("working_dir", env.working_dir)] if env.working_dir else []
        entries += [(f"py_modules[{i}]", p) for i, p in enumerate(env.py_modules)]
        for field, given in entries:
            scheme, sep, _ = given.partition("://")
            if sep and scheme.lower() != "file":
                continue  # fetched by Ray's workers from where it lives
            self._check_local(field, given)

    def _check_local(self, field: str, given: str) -> None:
        def refuse(why: str) -> ConfigError:
            return ConfigError(f"job spec field 'runtime_env.{field}': {given[:200]!r} {why}")

        if given.partition("://")[1] or not Path(given).is_absolute():
            raise refuse("must be an absolute path of a directory on the manager's machine")
        real = Path(given).resolve()
        if not self._under_roots(real):
            roots = ", ".join(str(r) for r in self.roots) or "none"
            raise refuse(
                f"is not under a directory this manager ships code from ({roots}); the server's operator adds "
                "one by starting it again with --ship-roots DIR[,DIR...]"
            )
        if self._touches_workdir(real):
            raise refuse("is or holds the manager's workdir (its tokens and database); ship a directory that does not")
        if not real.exists():
            raise refuse("does not exist on the manager's machine")
        if real.is_dir():
            self._check_links(real, refuse)

    def _check_links(self, top: Path, refuse) -> None:  # type: ignore[no-untyped-def]
        """Every symlink among the files Ray would ship (it walks the tree as here,
        skipping what ``.gitignore`` and ``.rayignore`` exclude, following links)."""
        from ray._private.runtime_env.packaging import _dir_travel

        seen = 0

        def visit(entry: Path) -> None:
            nonlocal seen
            seen += 1
            if seen > MAX_SHIPPED_ENTRIES:
                raise refuse(f"holds more than {MAX_SHIPPED_ENTRIES} files and directories")
            if entry.is_symlink():
                target, rel = entry.resolve(), str(entry.relative_to(top))[:200]
                if not self._under_roots(target) or self._touches_workdir(target):
                    raise refuse(f"holds a link {rel!r} that leads out of the directories it may ship")
                here = entry.parent.resolve()
                if target == here or target in here.parents:  # Ray's packager would walk it for ever
                    raise refuse(f"holds a link {rel!r} to a directory above it")

        try:
            _dir_travel(top, [], visit, include_gitignore=True, logger=log)
        except OSError as exc:
            raise refuse(f"could not be read: {exc.strerror or exc}") from None

    def _under_roots(self, real: Path) -> bool:
        return any(real == root or root in real.parents for root in self.roots)

    def _touches_workdir(self, real: Path) -> bool:
        work = self.workdir
        return real == work or work in real.parents or real in work.parents
