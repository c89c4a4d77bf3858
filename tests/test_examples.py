"""Every job spec in examples/ is valid, and its program loads with its args."""

from __future__ import annotations

from pathlib import Path

import pytest

from elasticps import load_program
from elasticps.manager import parse_spec

EXAMPLES = sorted((Path(__file__).resolve().parent.parent / "examples").glob("*.yaml"))


def test_there_are_examples():
    assert len(EXAMPLES) >= 4


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_spec_is_valid_and_its_program_loads(path):
    spec = parse_spec(path.read_text())
    program = load_program(spec.program, spec.args)
    assert program.batch_size > 0 and program.epochs >= 1
    assert spec.ps.min <= spec.ps.max and spec.workers.min <= spec.workers.max
