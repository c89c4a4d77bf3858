"""docs/walkthrough.md, run as written: each ``$ `` command in order, in an empty
directory, against a real manager with its embedded Ray cluster; each line the page
shows under a command must be printed by it, in that order (``...`` stands for any
text). The one change: the manager gets a free port, and ``ELASTICPS_URL`` names it."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "walkthrough.md"
TIMEOUT_S = 300


@dataclass
class Step:
    command: str
    expected: list[str] = field(default_factory=list)


def steps(text: str) -> list[Step]:
    """The page's console blocks as commands (a heredoc's body is part of its command)
    and the lines shown under each."""
    out: list[Step] = []
    for block in re.findall(r"```console\n(.*?)```", text, flags=re.S):
        lines = block.splitlines()
        i = 0
        while i < len(lines):
            line = lines[i]
            i += 1
            if line.startswith("$ "):
                command = line[2:]
                heredoc = re.search(r"<<'(\w+)'", command)
                if heredoc:
                    body = []
                    while lines[i] != heredoc.group(1):
                        body.append(lines[i])
                        i += 1
                    i += 1
                    command = "\n".join([command, *body, heredoc.group(1)])
                out.append(Step(command))
            elif line.strip():
                out[-1].expected.append(line)
    return out


def pattern(line: str) -> re.Pattern[str]:
    text = re.escape(line.rstrip())
    text = text.replace(re.escape("..."), ".*?")
    text = re.sub(r"(\\ )+", r"\\s+", text)
    return re.compile(text)


def check(step: Step, printed: list[str]) -> None:
    """Every expected line matches a printed line, in order."""
    at = 0
    for want in step.expected:
        rx = pattern(want)
        while at < len(printed) and not rx.fullmatch(printed[at].rstrip()):
            at += 1
        assert at < len(printed), f"$ {step.command}\nexpected a line like {want!r} in order; printed:\n" + "\n".join(
            printed
        )
        at += 1


def test_the_pages_parser_sees_every_command():
    parsed = steps(PAGE.read_text())
    commands = [s.command.split("\n")[0] for s in parsed]
    assert commands[0] == "elasticps server --num-cpus 4 &" and commands[-1] == "kill %1"
    assert any(s.command.endswith("\nSPEC") and "workers: {min: 1, max: 2, cpu: 1}" in s.command for s in parsed)
    assert pattern("digits  finished  ...  [###] 5/5 ...").fullmatch("digits  finished  1x2   [###] 5/5  8592  0.9")
    assert not pattern("step ... epoch 4 done").fullmatch("step 3 epoch 3 done")


@pytest.mark.slow
def test_the_walkthrough_runs_as_written(tmp_path):
    port = "8470"  # until the server printed the port it took
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": str(ROOT),
        "RAY_AUTH_MODE": "disabled",
    }
    for key in ("ELASTICPS_TOKEN", "ELASTICPS_WORKDIR"):
        env.pop(key, None)
    server: subprocess.Popen[str] | None = None
    try:
        for step in steps(PAGE.read_text()):
            if step.command.endswith("&"):  # the manager, in the background: its first lines
                # --port 0: it takes a free port and prints it once it listens (no port probed here and lost)
                command = step.command[:-1].replace("elasticps server", "elasticps server --port 0", 1)
                server = subprocess.Popen(
                    command, shell=True, cwd=tmp_path, env=env, text=True,
                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
                )  # fmt: skip
                printed = [server.stdout.readline() for _ in step.expected]
                found = re.match(r"elasticps manager on http://127\.0\.0\.1:(\d+) ", printed[0])
                assert found, printed
                port = found.group(1)
                env["ELASTICPS_URL"] = f"http://127.0.0.1:{port}"
                check(Step(step.command, [line.replace("8470", port) for line in step.expected]), printed)
                continue
            step = Step(step.command, [line.replace("8470", port) for line in step.expected])
            if step.command == "kill %1":
                assert server is not None
                os.killpg(server.pid, signal.SIGTERM)
                server.wait(timeout=60)
                server = None
                continue
            done = subprocess.run(
                ["bash", "-c", step.command], cwd=tmp_path, env=env, text=True, capture_output=True, timeout=TIMEOUT_S
            )
            printed = (done.stdout + done.stderr).splitlines()
            check(step, printed)
    finally:
        if server is not None:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(timeout=60)
