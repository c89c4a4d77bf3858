"""Which local directories a runtime_env may ship (elasticps.manager.shipping),
on real directories and symlinks."""

from __future__ import annotations

import pytest

from elasticps.errors import ConfigError
from elasticps.manager.shipping import ShipPolicy
from elasticps.manager.spec import RuntimeEnvSpec


@pytest.fixture
def tree(tmp_path):
    (tmp_path / "home" / "code" / "pkg").mkdir(parents=True)
    (tmp_path / "home" / "state").mkdir()  # the manager's workdir
    (tmp_path / "home" / "state" / "token").write_text("secret")
    (tmp_path / "outside").mkdir()
    return tmp_path


def policy(tree) -> ShipPolicy:
    return ShipPolicy.of((tree / "home",), tree / "home" / "state")


def check(tree, **env) -> None:
    policy(tree).check(RuntimeEnvSpec(**env))


def test_a_directory_under_a_root_ships(tree):
    check(tree, working_dir=str(tree / "home" / "code"), py_modules=[str(tree / "home" / "code" / "pkg")])
    check(tree, working_dir="s3://bucket/code.zip")  # fetched by Ray's workers, not read here


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("home/state", "is or holds the manager's workdir"),
        ("home", "is or holds the manager's workdir"),  # it holds the workdir
        ("home/code/../state", "is or holds the manager's workdir"),  # '..' resolved first
        ("outside", "is not under a directory this manager ships code from"),
        ("home/../outside", "is not under a directory this manager ships code from"),
        ("home/code/missing", "does not exist on the manager's machine"),
    ],
)
def test_refused_paths(tree, path, message):
    with pytest.raises(ConfigError, match=message):
        check(tree, working_dir=str(tree / path))
    with pytest.raises(ConfigError, match=r"'runtime_env.py_modules\[0\]'.*" + message):
        check(tree, py_modules=[str(tree / path)])


def test_a_path_outside_the_roots_is_told_where_the_roots_are_and_how_to_add_one(tree):
    with pytest.raises(ConfigError) as caught:
        check(tree, working_dir=str(tree / "outside"))
    roots = ", ".join(str(r) for r in policy(tree).roots)
    assert f"ships code from ({roots}); the server's operator adds one by starting it again with --ship-roots" in str(
        caught.value
    )


def test_outside_the_roots_existing_or_not_gets_the_same_answer(tree):
    answers = []
    for path in ("/etc", "/no/such/dir", str(tree / "outside"), str(tree / "outside" / "missing")):
        with pytest.raises(ConfigError) as caught:
            check(tree, working_dir=path)
        answers.append(str(caught.value).replace(repr(path), "PATH"))
    assert len(set(answers)) == 1, answers


def test_symlinks_are_followed_before_the_check(tree):
    (tree / "home" / "code" / "etc").symlink_to("/etc")
    with pytest.raises(ConfigError, match="holds a link 'etc' that leads out"):
        check(tree, working_dir=str(tree / "home" / "code"))
    (tree / "home" / "code" / "etc").unlink()
    (tree / "home" / "code" / "pkg" / "secrets").symlink_to(tree / "home" / "state")
    with pytest.raises(ConfigError, match="holds a link 'pkg/secrets' that leads out"):
        check(tree, working_dir=str(tree / "home" / "code"))
    (tree / "home" / "code" / "pkg" / "secrets").unlink()
    (tree / "home" / "code" / ".venv").mkdir()  # a virtualenv's python links out, but git ignores it: not shipped
    (tree / "home" / "code" / ".venv" / "python").symlink_to("/usr/bin/env")
    (tree / "home" / "code" / ".gitignore").write_text(".venv/\n")
    check(tree, working_dir=str(tree / "home" / "code"))
    (tree / "home" / "code" / "loop").symlink_to(tree / "home" / "code")
    with pytest.raises(ConfigError, match="holds a link 'loop' to a directory above it"):
        check(tree, working_dir=str(tree / "home" / "code"))
    (tree / "home" / "link").symlink_to(tree / "outside")  # a link that is itself the shipped path
    with pytest.raises(ConfigError, match="is not under a directory"):
        check(tree, working_dir=str(tree / "home" / "link"))


@pytest.mark.parametrize("path", ["relative/dir", "file:///etc"])
def test_only_absolute_local_paths_or_remote_uris(tree, path):
    with pytest.raises(ConfigError, match="must be an absolute path"):
        check(tree, working_dir=path)
