"""The command line's own behaviour: version, and inputs that cannot work refused in one line."""

from __future__ import annotations

import subprocess
import sys

import pytest

from elasticps import __version__
from elasticps.cli.main import main


def test_version():
    out = subprocess.run([sys.executable, "-m", "elasticps.cli.main", "--version"], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == f"elasticps {__version__}"


def test_submit_of_a_missing_file_is_one_line_not_a_traceback(tmp_path):
    missing = tmp_path / "missing.yaml"
    with pytest.raises(SystemExit) as exc:
        main(["submit", str(missing), "--token", "t", "--url", "http://127.0.0.1:9"])
    assert str(exc.value) == f"error: cannot read the job spec {missing}: No such file or directory"
