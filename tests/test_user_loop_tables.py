"""Embedding tables the PS holds and no worker does (elasticps.torch.Embedding,
and an unedited model built by elasticps.torch.tables_on_ps): the cut of the
flat vector, rows read and gradients summed across shard boundaries, a loop
through live rescales and faults against one process on a real Ray cluster,
what a worker holds, and what is refused."""

from __future__ import annotations

import contextlib
import copy
import functools
import os
import pickle
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import ray
import torch

import elasticps.torch as ept
from elasticps import ProgramError, load_program
from elasticps.loop import api
from elasticps.loop.embedding import RowClient, tables_of
from elasticps.loop.rows import RowPush, Table, Tables, read_rows, sum_pushes
from elasticps.runtime import relative_error, tasks
from elasticps.runtime.flat import shard_bounds
from elasticps.runtime.ps import PSShard
from elasticps.runtime.steps import Waits
from tests import loops
from tests.helpers import kill_task, make_job, run_until_applied
from tests.test_user_loop_faults import reference

TOL = 1e-5


def test_rows_and_dense_runs_across_shard_boundaries_give_back_the_flat_vector():
    # dense 0-5, a 4x3 table at 5-17, dense 17-20, a 3x2 table at 20-26, dense 26-30
    tables = Tables((Table(5, 4, 3), Table(20, 3, 2)))
    flat = np.arange(30, dtype=np.float32) + 1
    dense = np.concatenate([flat[0:5], flat[17:20], flat[26:30]])
    for num_shards in (1, 2, 3, 4, 7):
        bounds = shard_bounds(30, num_shards)  # cuts rows in the middle
        # a shard's dense elements are the worker's range of the dense vector
        for (lo, hi), (dlo, dhi) in zip(bounds, tables.dense_bounds(bounds), strict=True):
            np.testing.assert_array_equal(tables.compact(flat[lo:hi], lo), dense[dlo:dhi])
        for table in tables.tables:
            ids = np.array([3, 0, 2] if table.rows == 4 else [2, 0])
            got = sum(read_rows(flat[lo:hi], lo, table, ids) for lo, hi in bounds)
            want = flat[table.lo : table.hi].reshape(table.rows, table.dim)[ids]
            np.testing.assert_array_equal(got, want)
        # two workers' pushes: dense gradients summed, each one's rows added where the shard holds them
        pushes = [(np.full(12, 0.5, np.float32), [(0, np.array([1, 3]), np.ones((2, 3), np.float32))]),
                  (np.full(12, 0.25, np.float32), [(0, np.array([3]), np.full((1, 3), 2.0, np.float32)),
                                                    (1, np.array([2]), np.full((1, 2), 3.0, np.float32))])]  # fmt: skip
        want = np.zeros(30, np.float32)
        want[[*range(0, 5), *range(17, 20), *range(26, 30)]] = 0.75
        want[8:11] += 1.0
        want[14:17] += 1.0 + 2.0
        want[24:26] += 3.0
        got = np.concatenate(
            [
                sum_pushes(
                    tables, [RowPush(d[dlo:dhi], r) for d, r in pushes], lambda a: a, lo, hi
                )  # every worker sends every row here; a shard adds only what it holds
                for (lo, hi), (dlo, dhi) in zip(bounds, tables.dense_bounds(bounds), strict=True)
            ]
        )
        np.testing.assert_array_equal(got, want)


def test_a_ps_held_table_through_live_rescales_matches_one_process(ray_local):
    # AdamW moves rows no batch touched (its moments, its weight decay): the shards update their whole
    # range as one process does. Adagrad through rescales: the recommendation example's test. The model
    # class is the user's, unedited (torch's Embedding, by a name bound at import): ept.tables_on_ps builds it
    kwargs = {"optimizer": "adamw"}
    job = make_job(1, 1, functools.partial(loops.tabled_bag, tables="call", **kwargs))
    table = job.program.tables.tables[0]
    assert (table.lo, table.rows, table.dim) == (0, 3001, 7)
    job.run(max_steps=3)
    for shape, steps in zip([(2, 3), (3, 2), (1, 2)], [4, 5, None], strict=True):
        run_until_applied(job, job.rescale(*shape))
        if shape == (2, 3):  # a worker holds the dense layer (24 floats, and its gradient), not the table
            held = ray.get([w.handle.held_bytes.remote() for w in job.workers])
            assert held == [2 * 24 * 4] * 3 and table.nbytes == 3001 * 7 * 4
            # the shards give rows at their step's parameters (row 1502 is cut by the 2 shards' ranges:
            # a part from each), and refuse a read at another step
            ids, step = np.array([0, 1502, 3000]), job.report().step
            rows = sum(ray.get([p.handle.read_rows.remote(0, ids, step) for p in job.ps]))
            np.testing.assert_array_equal(rows, job.parameters()[: table.hi].reshape(3001, 7)[ids])
            with pytest.raises(ray.exceptions.RayTaskError, match=f"rows of step {step - 1}'s parameters were"):
                ray.get(job.ps[1].handle.read_rows.remote(0, ids, step - 1))
        report = job.run(max_steps=steps)
    assert report.state == "finished" and report.step == 24
    assert [r.to_shape for r in report.rescales] == [(2, 3), (3, 2), (1, 2)]
    # PS traffic (the dense part, the rows read, their gradients; the evaluations' reads too) over the
    # 3 + 5 * 3 + 6 * 2 + 10 * 2 worker steps: under a quarter of the table a step (670 kB measured, 0.16
    # of it), where pulling every shard's slice and pushing a dense gradient moved the table twice
    assert sum(report.bytes_between_nodes.values()) < 50 * table.nbytes / 4
    params, want = reference(loops.tabled_bag, tables="none", **kwargs)  # the loop before it was ported
    assert relative_error(job.parameters(), params) < TOL
    # the loop's evaluation (every bag through the table, outside a step) reads the rows too
    assert [m.values["accuracy"] for m in report.metrics] == [r["metrics"]["accuracy"] for r in want]
    job.shutdown()


@pytest.mark.slow
def test_a_ps_killed_mid_epoch_with_a_table_the_job_recovers_exactly(ray_local, tmp_path):
    # the loop evaluates before its first epoch too: a worker reads the rows of the job's parameters then
    kwargs = {"optimizer": "adagrad", "evaluate_first": True}
    job = make_job(
        2, 2, functools.partial(loops.tabled_bag, **kwargs), checkpoint_dir=str(tmp_path),
        checkpoint_every_steps=5, placement_timeout_s=240,
    )  # fmt: skip
    job.run(max_steps=7)
    kill_task(job.ps[0].handle)  # the next step's forward reads rows from it
    job.run(max_steps=2)
    kill_task(job.workers[1].handle)
    report = job.run()
    assert any("restored from checkpoint at step 5" in e for e in report.events)
    assert report.state == "finished" and report.step == 24
    params, want = reference(loops.tabled_bag, **kwargs)
    assert relative_error(job.parameters(), params) < TOL
    first = report.metrics[0]
    assert first.step == 0 and first.values["loss"] == pytest.approx(want[0]["metrics"]["loss"], rel=1e-6)
    job.shutdown()


def _hang_flag(pid: int) -> Path:
    """While this file exists, the shard in process ``pid`` hangs in its reads of rows (:class:`_RowsHang`)."""
    return Path(tempfile.gettempdir()) / f"elasticps-test-rows-hang-{pid}"


class _RowsHang(PSShard):
    """A real PS shard whose reads of rows hang while its :func:`_hang_flag` exists
    (stuck in that call alone: its updates and pings answer)."""

    @ray.method(concurrency_group="rows")
    def read_rows(self, table: int, ids: np.ndarray, step: int) -> np.ndarray:
        while _hang_flag(os.getpid()).exists():
            time.sleep(0.05)
        return super().read_rows(table, ids, step)


@contextlib.contextmanager
def _rows_hang(job, monkeypatch, shards=(1,)):
    """Run ``job`` (2 PS, checkpoints every 5 steps) to step 7 on shards that can hang in their
    reads of rows, then to its end with ``shards`` hung there; yields its report and the worker's
    pid, and stops those shards and the job after."""
    ps_class = ray.remote(concurrency_groups={"rows": 1})(tasks._with_output(_RowsHang))
    monkeypatch.setitem(tasks._ACTOR_CLASSES, "ps", ps_class)
    job.run(max_steps=7)
    hung, worker = [job.ps[j] for j in shards], job.workers[0].pid
    flags = [_hang_flag(h.pid) for h in hung]
    for flag in flags:
        flag.touch()
    try:
        yield job.run(), worker
    finally:
        for flag, h in zip(flags, hung, strict=True):
            flag.unlink()
            tasks.kill(h.handle)
        job.shutdown()


@pytest.mark.parametrize(
    "case, hung, named",
    [("waits as configured", (1,), "ps-1"), ("waits longer", (1,), "ps-1"), ("two shards hung", (0, 1), "ps-0, ps-1")],
)
@pytest.mark.slow
def test_a_shard_hung_in_a_read_of_rows_is_named_by_the_worker_stopped_and_restored(
    ray_local, tmp_path, monkeypatch, case, hung, named
):
    """The worker's own wait for ps-1's rows (half the step's time) runs out before the controller's
    wait for the step and fails the worker's step naming ps-1: the job takes ps-1 for hung (stopped,
    restored as a shard hung in its update is), not the loop's code nor the worker, and goes on exactly.
    ``waits longer``: the controller's wait made longer still (it has the grace to fail on what a
    failed task lost), so that only the task's own wait can find the hung shard. ``two shards
    hung``: the worker waits once for both, not once each (the whole step's time, by which the
    controller's wait would take the worker for hung)."""
    if case == "waits longer":
        longer = classmethod(lambda cls, config: cls(4 * config.step_timeout_s, config.liveness_timeout_s))
        monkeypatch.setattr(Waits, "of", longer)
    kwargs = {"epochs": 1, "optimizer": "sgd"}
    job = make_job(
        2, 1, functools.partial(loops.tabled_bag, **kwargs), checkpoint_dir=str(tmp_path), checkpoint_every_steps=5,
        step_timeout_s=4.0, liveness_timeout_s=5.0,
    )  # fmt: skip
    with _rows_hang(job, monkeypatch, hung) as (report, worker):
        assert report.state == "finished", report.error
        events = report.events
        want = f"WaitRanOut: the rows of table 0 (of {named}) did not come within 2 s (0.5 of step_timeout_s)"
        assert any(want in e for e in events), events
        restored = f"{len(hung)} PS shard(s) died; restored from checkpoint at step 5 (lost 2 steps)"
        assert any(restored in e for e in events), events
        assert [w.pid for w in job.workers] == [worker] and report.step == 12
        params, _ = reference(loops.tabled_bag, **kwargs)
        assert relative_error(job.parameters(), params) < TOL


def _frozen_table():
    model = torch.nn.Sequential(ept.Embedding(10, 2), torch.nn.Flatten(), torch.nn.Linear(2, 1))
    model[0].weight.requires_grad_(False)
    ept.prepare(model, torch.optim.SGD(model[2].parameters(), lr=0.1))
    ept.DataLoader(torch.utils.data.TensorDataset(torch.zeros(4, 1).long()), batch_size=2)
    for _ in ept.epochs(1):
        pass


def test_what_a_ps_held_table_cannot_do_is_refused_with_what_to_use():
    with pytest.raises(ProgramError, match="does not take \\['max_norm'\\]"):
        ept.Embedding(10, 2, max_norm=1.0)
    with pytest.raises(ProgramError, match="does not take \\['sparse'\\]"):
        ept.Embedding(10, 2, sparse=True)
    with pytest.raises(ProgramError, match="use torch.nn.Embedding for a frozen table"):
        load_program(_frozen_table)
    table = ept.Embedding(10, 2, padding_idx=0)  # in one process: torch's embedding
    assert isinstance(table, torch.nn.Embedding) and table.weight.device.type == "cpu"
    assert torch.equal(table(torch.tensor([0, 3])), torch.nn.functional.embedding(torch.tensor([0, 3]), table.weight))


class InWorker:
    tables_on_ps = True  # what a job's worker session says: an elasticps table allocates nothing

    def rng_point(self):
        pass


class Tied(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.table = torch.nn.Embedding(50, 4)
        self.out = torch.nn.Linear(4, 50, bias=False)
        self.out.weight = self.table.weight  # the output layer is the table


def _tied_loop(build):
    model = build()
    ept.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    ept.DataLoader(torch.utils.data.TensorDataset(torch.zeros(4, 1).long()), batch_size=2)
    for _ in ept.epochs(1):
        pass


def test_tables_on_ps_builds_an_unedited_model_with_its_tables_on_the_ps():
    init = torch.nn.Embedding.__init__
    # in one process: the same model, the same initial values, its tables marked as the PS's
    torch.manual_seed(0)
    plain = loops.Bag(3001)
    torch.manual_seed(0)
    built = ept.tables_on_ps(loops.Bag, 3001)
    assert isinstance(built.table, ept.Embedding) and torch.equal(built.table.weight, plain.table.weight)
    assert torch.nn.Embedding.__init__ is init and type(torch.nn.Embedding(3, 2)) is torch.nn.Embedding

    class Three(torch.nn.Module):  # every name of torch's class; the 5-row table under min_rows stays
        def __init__(self, rows):
            super().__init__()
            self.a, self.b = torch.nn.Embedding(rows, 4), loops.Embedding(rows, 4)
            self.small = torch.nn.modules.sparse.Embedding(5, 4, sparse=True)

    with api.active(InWorker()):
        model = ept.tables_on_ps(Three, 10**9, min_rows=6)  # 16 GB of tables
    assert [type(m) for m in (model.a, model.b, model.small)] == [ept.Embedding, ept.Embedding, torch.nn.Embedding]
    assert model.a.weight.device.type == model.b.weight.device.type == "meta"
    assert model.small.weight.device.type == "cpu"
    with pytest.raises(ProgramError, match="min_rows=6 to leave it"):
        ept.tables_on_ps(Three, 10)
    with pytest.raises(ProgramError, match="built no torch.nn.Embedding of at least 11 rows"):
        ept.tables_on_ps(Three, 10, min_rows=11)
    assert torch.nn.Embedding.__init__ is init


def test_tables_on_ps_puts_torch_back_after_a_raising_constructor_and_leaves_other_threads_alone():
    init = torch.nn.Embedding.__init__
    others = []

    def build():
        table = torch.nn.Embedding(10, 2)
        thread = threading.Thread(target=lambda: others.append(torch.nn.Embedding(10, 2)))
        thread.start()
        thread.join()
        assert torch.nn.Embedding.__init__ is not init  # the call is on
        raise ValueError(f"the user's constructor fails after a {type(table).__name__}")

    with pytest.raises(ValueError, match="after a Embedding"):
        ept.tables_on_ps(build)
    assert torch.nn.Embedding.__init__ is init
    assert [type(t) for t in others] == [torch.nn.Embedding]


def test_a_table_the_ps_holds_with_tied_weights_is_refused_at_prepare():
    with pytest.raises(ProgramError, match="is also out.weight \\(tied weights\\)"):
        load_program(functools.partial(_tied_loop, lambda: ept.tables_on_ps(Tied)))
    with pytest.raises(ProgramError, match="is also out.weight"):  # in one process too: as a job would be
        _tied_loop(lambda: ept.tables_on_ps(Tied))
    model = Tied()  # a table each worker holds may be tied
    ept.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))


def test_a_worker_lookup_refuses_ids_one_process_refuses_before_reading_any_row():
    with api.active(InWorker()):
        model = ept.tables_on_ps(lambda: torch.nn.Sequential(torch.nn.Embedding(10, 2), torch.nn.Embedding(5, 2)))
    tables, modules = tables_of(model)
    reads = []
    RowClient(tables, modules, lambda: reads.append("params"), 60.0)  # a worker's, before its first pull
    # an id past a table's end would read the next table's rows; a float id would be truncated to a row
    for ids, error, match in [
        ([3, 10], IndexError, "index out of range in an elasticps.torch.Embedding of 10 rows"),
        ([-1], IndexError, "index out of range"),
        ([1.7], RuntimeError, "scalar types: Long, Int; but got torch.FloatTensor"),
        ([True], RuntimeError, "scalar types: Long, Int; but got torch.BoolTensor"),
    ]:
        with pytest.raises(error, match=match):
            model[0](torch.tensor(ids))
        if error is RuntimeError:  # torch's own words in one process
            with pytest.raises(error, match="scalar types: Long, Int"):
                torch.nn.Embedding(10, 2)(torch.tensor(ids))
    assert reads == []


def test_a_worker_s_table_used_before_prepare_says_so():
    with api.active(InWorker()):
        model = ept.tables_on_ps(lambda: torch.nn.Sequential(torch.nn.Embedding(10, 2), torch.nn.Linear(2, 2)))
    with pytest.raises(ProgramError, match="read before elasticps.torch.prepare"):
        model(torch.tensor([1, 2]))


def test_a_copy_of_a_worker_s_table_is_refused_and_one_process_copies_as_torch_does():
    # an EMA or AveragedModel deep-copies the model: a worker has no values of the table to copy (a copy
    # sharing the prepared table's reads would evaluate the live rows, not an average)
    def build():
        return ept.tables_on_ps(lambda: torch.nn.Sequential(torch.nn.Embedding(10, 2), torch.nn.Linear(2, 2)))

    with api.active(InWorker()):
        model = build()
    tables, modules = tables_of(model)
    RowClient(tables, modules, lambda: None, 60.0)
    with pytest.raises(ProgramError, match="a copy of a table the PS holds \\(copy.deepcopy"):
        copy.deepcopy(model)
    with pytest.raises(ProgramError, match="a copy of a table the PS holds"):
        pickle.dumps(model[0])
    model = build()  # in one process
    twin = copy.deepcopy(model)
    assert type(twin[0]) is ept.Embedding and torch.equal(twin[0].weight, model[0].weight)
    assert twin[0].weight is not model[0].weight


def test_peak_rss_reads_the_high_water_mark_of_a_commands_processes():
    from elasticps.bench.peak_rss import watch

    # a parent that holds 20 MB and a child that holds 120 MB (touched pages), each for longer than a read
    child = "import time; b = bytearray(120 << 20); time.sleep(1)"
    parent = f"import subprocess, sys, time; b = bytearray(20 << 20); subprocess.run([sys.executable, '-c', {child!r}])"
    code, rows = watch([sys.executable, "-c", parent], every_s=0.1)
    assert code == 0 and len(rows) == 2
    big, small = rows
    assert big["peak_rss_mib"] >= 120 > small["peak_rss_mib"] >= 20
