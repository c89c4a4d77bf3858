"""The CLI and the Client on bad input: every spec problem at once (with "did you mean"),
exit 2 for each; the Client finds the token as the CLI does, ships a working_dir, and
a 401 says where the token was looked for. The server of tests/test_cli_jobs.py
(in-memory runtime, no Ray)."""

from __future__ import annotations

import pytest

from elasticps.cli.main import main
from elasticps.errors import ConfigError
from elasticps.manager.client import Client, ManagerError
from elasticps.manager.spec import SpecError, parse_spec
from tests.test_cli_jobs import site  # noqa: F401  (the fixture)

TOKEN = "s3cret" * 3
TYPOS = """name: typo-job
program: elasticps.examples.digits:program
wokers: {min: 1, max: 2}
ps: {min: 1, cpux: 0.5, max: x}
runtime_env: {working_dirr: /tmp}
"""


@pytest.fixture
def cli(site, monkeypatch, capsys):  # noqa: F811
    monkeypatch.setenv("ELASTICPS_TOKEN", TOKEN)

    def run(*argv: str) -> tuple[int, str, str]:
        code = main([*argv, "--url", site[1]])
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return run


def test_every_problem_of_a_spec_at_once_with_did_you_mean():
    with pytest.raises(SpecError) as info:
        parse_spec(TYPOS)
    problems = info.value.problems
    assert "job spec field 'wokers': unknown field; did you mean 'workers'?" in problems
    assert "job spec field 'ps.cpux': unknown field; did you mean 'cpu'?" in problems  # nested
    assert "job spec field 'runtime_env.working_dirr': unknown field; did you mean 'working_dir'?" in problems
    assert any(p.startswith("job spec field 'ps.max': Input should be a valid integer") for p in problems)
    assert len(problems) == 4 and str(info.value).splitlines() == problems
    with pytest.raises(SpecError, match=r"colour': unknown field \(fields: name, program, "):
        parse_spec("name: a\nprogram: a.b:c\ncolour: red\n")
    # a block's own checks, said with the other errors of the block, not once they are mended
    mixed = "name: a\nprogram: a.b:c\nps: {min: 0, cpus: 1}\nworkers: {min: 3, max: 2, cpu: -1}\n"
    with pytest.raises(SpecError) as info:
        parse_spec(mixed)
    assert info.value.problems == [
        "job spec field 'ps.cpus': unknown field; did you mean 'cpu'?",
        "job spec field 'workers.cpu': Input should be greater than 0",
        "job spec field 'ps': min must be >= 1: a parameter-server job needs at least one PS and one worker",
        "job spec field 'workers': min (3) must be <= max (2)",
    ]


@pytest.mark.parametrize(
    ("text", "suffix", "line"),
    [
        (TYPOS, ".yaml", "error: job spec field 'wokers': unknown field; did you mean 'workers'?"),
        ("name: a\nprogram: [unclosed\n", ".yaml", "error: job spec is not valid YAML (line 3, column 1): "),
        ('{"name": "a",\n "program": }', ".json", "error: job spec is not valid JSON (line 2, column 13): "),
        ("- a list\n", ".yaml", "error: job spec must be a mapping"),
    ],
)
def test_cli_prints_a_line_per_problem_and_exits_2(cli, site, tmp_path, text, suffix, line):  # noqa: F811
    path = tmp_path / f"spec{suffix}"
    path.write_text(text)
    code, _, err = cli("submit", str(path))
    assert code == 2 and line in err, err
    if text == TYPOS:
        assert len(err.splitlines()) == 4 and all(e.startswith("error: job spec field '") for e in err.splitlines())
    assert "typo-job" not in [r.name for r in site[0].store.list_jobs()]


def test_a_missing_spec_file_or_working_dir_exits_2(cli, tmp_path):
    code, _, err = cli("submit", str(tmp_path / "nope.yaml"))
    assert code == 2 and "cannot read the job spec" in err
    (tmp_path / "s.yaml").write_text("name: wd\nprogram: a.b:c\n")
    code, _, err = cli("submit", str(tmp_path / "s.yaml"), "--working-dir", str(tmp_path / "nope"))
    assert code == 2 and "not a directory" in err


def test_the_server_answers_422_with_the_list(site, monkeypatch):  # noqa: F811
    monkeypatch.setenv("ELASTICPS_TOKEN", TOKEN)
    with pytest.raises(ManagerError) as info:
        Client(site[1]).submit(TYPOS)
    assert info.value.status == 422 and len(info.value.problems) == 4
    assert "job spec field 'ps.cpux': unknown field; did you mean 'cpu'?" in info.value.problems


def test_client_reads_the_workdir_token_and_a_401_says_where_it_looked(site, tmp_path, monkeypatch):  # noqa: F811
    monkeypatch.delenv("ELASTICPS_TOKEN", raising=False)
    monkeypatch.delenv("ELASTICPS_WORKDIR", raising=False)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ManagerError) as info:
        Client(site[1]).jobs()
    message = str(info.value)
    assert info.value.status == 401 and "none found: looked in --token, $ELASTICPS_TOKEN and " in message
    assert str(tmp_path / "elasticps-state" / "token") in message
    workdir = tmp_path / "state"
    workdir.mkdir()
    (workdir / "token").write_text(TOKEN + "\n")
    (workdir / "token").chmod(0o600)
    assert {j.name for j in Client(site[1], workdir=workdir).jobs()} >= {"alpha", "beta"}
    monkeypatch.setenv("ELASTICPS_WORKDIR", str(workdir))  # as the CLI's default
    assert Client(site[1]).jobs()
    (workdir / "token").write_text("wrong" * 8)
    with pytest.raises(ManagerError, match=f"401: .*token: {workdir / 'token'}"):
        Client(site[1]).jobs()


def test_client_submit_ships_a_working_dir(site, tmp_path, monkeypatch):  # noqa: F811
    monkeypatch.setenv("ELASTICPS_TOKEN", TOKEN)
    code = tmp_path / "code"
    code.mkdir()
    monkeypatch.chdir(tmp_path)
    client = Client(site[1])
    spec = "name: shipped\nprogram: elasticps.examples.digits:program\n"
    # the test's manager ships code from no directory (--ship-roots): its refusal names the field as sent
    with pytest.raises(ManagerError, match=f"400: job spec field 'runtime_env.working_dir': '{code}' is not under"):
        client.submit(spec, working_dir="code")  # made absolute
    with pytest.raises(ConfigError, match="not a directory"):
        client.submit(spec, working_dir=tmp_path / "none")


def test_a_client_finds_the_url_given_then_the_environments_then_the_workdirs(tmp_path, monkeypatch):
    from elasticps.manager.workdir import client_url, write_url

    monkeypatch.delenv("ELASTICPS_URL", raising=False)
    monkeypatch.delenv("ELASTICPS_WORKDIR", raising=False)
    default = "http://127.0.0.1:8470"
    assert client_url(None, tmp_path, default) == default  # no server wrote one
    write_url(tmp_path, "0.0.0.0", 41801)  # every interface: reached on loopback from here
    assert client_url(None, tmp_path, default) == "http://127.0.0.1:41801"
    monkeypatch.setenv("ELASTICPS_WORKDIR", str(tmp_path))
    assert client_url(None, None, default) == "http://127.0.0.1:41801"
    monkeypatch.setenv("ELASTICPS_URL", "http://10.0.0.5:9000")
    assert client_url(None, tmp_path, default) == "http://10.0.0.5:9000"
    assert client_url("http://given:1", tmp_path, default) == "http://given:1"
    write_url(tmp_path, "::", 5)
    monkeypatch.delenv("ELASTICPS_URL")
    assert client_url(None, tmp_path, default) == "http://[::1]:5"


@pytest.mark.parametrize(
    ("status", "guess"),
    [
        (404, "is --url (or $ELASTICPS_URL) the manager's address?"),
        (502, "a proxy in front of the manager, and the manager behind it down?"),
    ],
)
def test_a_url_that_is_some_other_web_server_is_said_so_not_its_page(tmp_path, status, guess):
    """``--url`` at another HTTP server (its 404 page): one line saying what
    answered, not the page's HTML as if it were the manager's error."""
    import http.server
    import threading

    class Pages(http.server.BaseHTTPRequestHandler):  # every path is an HTML error page of this status
        def do_GET(self) -> None:
            self.send_error(status)

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Pages)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        with pytest.raises(ManagerError) as err:
            Client(url=url, token="t" * 40, workdir=tmp_path).jobs()
    finally:
        server.shutdown()
        server.server_close()
    said = f"{url} answered GET /jobs with {status} and a web page, not an elasticps manager's JSON: {guess}"
    assert str(err.value) == said
