"""The plain-data boundary between a job's processes and the manager
(elasticps.manager.wire), without Ray: what the job's side sends, what the
manager's side accepts."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from elasticps.errors import ConfigError, JobFailedError
from elasticps.manager.runtime import JobStatus, ProgramInfo
from elasticps.manager.wire import MAX_INT, NotPlainData, RemoteError, answer, decode, parse, plain, with_trace
from elasticps.runtime import JobReport, WindowReport
from elasticps.runtime.reports import StepTimes


class Sneaky(int):
    def __reduce__(self):
        raise AssertionError("pickled")


class Fatal(BaseException):
    pass


def window(**kw) -> WindowReport:
    base = dict(first_step=1, last_step=4, steps=4, samples=256, elapsed_s=0.5, samples_per_s=512.0, loss=0.7,
                mean_step_times=StepTimes(0.1, 0.01, 0.01, 0.0, 0.0), num_ps=1, num_workers=2)  # fmt: skip
    return WindowReport(**{**base, **kw})


def test_a_status_goes_through_as_json_and_comes_back_equal():
    st = JobStatus("running", False, 4, 0, 1, 2, {"ps-0": "n1"}, {"ps-0": "n1"}, windows=[window()],
                   noise_scale=float(np.float64(3.5)), remaining_samples=int(np.int64(10)))  # fmt: skip
    raw = answer(lambda: st)
    assert decode(JobStatus, parse(raw, "status")) == st
    report = JobReport("j", "running", "sync", 4, 0, 0, 1, 256, 1, 2, (1, 2), {"ps-0": "n1"}, windows=[window()])
    assert decode(JobReport, parse(answer(lambda: report), "report")) == report


def test_the_job_side_sends_only_exact_built_in_types():
    with pytest.raises(NotPlainData, match=r"program.epochs is a tests.test_wire.Sneaky, not plain data"):
        plain({"epochs": Sneaky(3)}, "program")
    with pytest.raises(NotPlainData, match=r"events\[0\] is a builtins.object"):
        plain(JobStatus("running", False, 0, 0, 1, 1, {}, {}, events=[object()]), "status")  # type: ignore[list-item]
    assert plain({"x": np.float32(0.5), "n": np.int64(3), "t": (1, 2)}) == {"x": 0.5, "n": 3, "t": [1, 2]}


def test_every_error_crosses_as_text_whatever_its_type():
    def boom():
        raise Fatal("it escapes except Exception")

    doc = json.loads(answer(boom))
    assert doc["error"]["type"] == "Fatal" and "it escapes" in doc["error"]["message"]
    assert 'raise Fatal("it escapes except Exception")' in doc["error"]["traceback"]
    with pytest.raises(RemoteError, match="Fatal: it escapes") as caught:
        parse(answer(boom), "x")
    assert 'raise Fatal("it escapes' in with_trace(caught.value)  # the user's line comes along
    from elasticps.errors import ProgramError
    from elasticps.program import load_program

    for ref in ("elasticps.examples.digits:nothere", "nosuch.mod:program"):  # no user frame: the message alone
        with pytest.raises(ProgramError) as caught:
            parse(answer(lambda ref=ref: load_program(ref)), "x")
        assert with_trace(caught.value) == str(caught.value) and "\n" not in str(caught.value)
    with pytest.raises(ConfigError, match="no"):  # elasticps's own errors keep their class
        parse(answer(lambda: (_ for _ in ()).throw(ConfigError("no"))), "x")


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"\x80\x05K\x01.", "is not JSON"),  # a pickle
        (b'{"ok": 1, "error": 2}', "is not an answer"),
        (b'{"error": {"type": 1, "message": "m", "traceback": ""}}', "not plain text"),
        (b"[" * 100_000 + b"]" * 100_000, "is not JSON"),  # nested past the parser's depth
    ],
)
def test_the_manager_refuses_what_is_not_a_plain_answer(raw, message):
    with pytest.raises(NotPlainData, match=message):
        parse(raw, "answer")


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"name": "p", "batch_size": 64, "epochs": 10**400, "samples_per_epoch": 5}, "epochs must be an integer"),
        ({"name": "p", "batch_size": 64, "epochs": MAX_INT + 1, "samples_per_epoch": 5}, "within 2"),
        ({"name": "p", "batch_size": True, "epochs": 1, "samples_per_epoch": 5}, "batch_size must be an integer"),
        ({"name": "p", "batch_size": 1.0, "epochs": 1, "samples_per_epoch": 5}, "batch_size must be an integer"),
        ({"name": ["p"], "batch_size": 1, "epochs": 1, "samples_per_epoch": 5}, "name must be a str"),
        ({"name": "p" * 70_000, "batch_size": 1, "epochs": 1, "samples_per_epoch": 5}, "at most"),
        ({"name": "p", "batch_size": 1, "epochs": 1, "samples_per_epoch": 5, "extra": 1}, "unknown fields"),
    ],
)
def test_the_manager_checks_every_value_on_arrival(data, message):
    with pytest.raises(NotPlainData, match=message):
        decode(ProgramInfo, data, "info")


def test_figures_must_be_finite_except_a_diverged_loss():
    ok = plain(window(loss=math.nan))
    assert math.isnan(decode(WindowReport, ok).loss)
    with pytest.raises(NotPlainData, match="samples_per_s must be a finite number"):
        decode(WindowReport, {**ok, "samples_per_s": math.inf})
    status = plain(JobStatus("running", False, 0, 0, 1, 1, {}, {}))
    assert decode(JobStatus, {**status, "metric": math.nan}).metric is None  # an unknown figure, not a NaN
    with pytest.raises(JobFailedError):  # NotPlainData is a ProgramError; the job side's failures are its own
        raise RemoteError("X", "y", "")


def test_a_trace_shows_the_users_frames_where_they_ship_them_and_not_pythons_own():
    from elasticps.errors import ProgramError
    from elasticps.program import load_program

    def factory(epochs: int):
        raise AssertionError("not called")

    with pytest.raises(ProgramError) as caught:  # the arguments' check: inspect.py's frames, the user's none
        parse(answer(lambda: load_program(factory, {"epoch": 3})), "x")
    said = str(caught.value)
    assert with_trace(caught.value) == said and "missing a required argument: 'epochs'" in said
    shipped = "/tmp/ray/session_1/runtime_resources/working_dir_files/_ray_pkg_ab12cd/mine/train.py"
    err = RemoteError("KeyError", "'x'", f'Traceback (most recent call last):\n  File "{shipped}", line 3, in main\n')
    assert 'File "<working_dir>/mine/train.py", line 3, in main' in with_trace(err)
