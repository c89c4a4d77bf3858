"""A user's loop inside a worker, driven in this process without Ray: the
loops that do not fit the step protocol fail at their first step with what
to change; global-norm clipping is recorded for the PS shards."""

from __future__ import annotations

import itertools
import threading

import numpy as np
import pytest
import torch

import elasticps.torch as ept
from elasticps import ProgramError, load_program
from elasticps.examples.digits import train_set
from elasticps.loop import api, rules
from elasticps.loop.local import LocalSession
from elasticps.loop.worker_session import RELEASE, StepMessage, WorkerSession
from elasticps.runtime.data import DataPosition, GlobalBatches
from elasticps.runtime.loop_worker import _install_clip_hook
from elasticps.runtime.ps import clip_coefficient, norm_part


def drive(fn, steps: int = 3) -> list[dict]:
    """Run ``fn`` as one worker of a job whose stand-in PS takes SGD steps; the
    statistics of each step, or the loop's error."""
    program = load_program(fn)
    session = WorkerSession(program, lambda numel: None)
    failure: list[BaseException] = []

    def run() -> None:
        try:
            fn()
        except BaseException as exc:
            failure.append(exc)
            session.outbox.put(exc)

    original_clip = torch.nn.utils.clip_grad_norm_
    _install_clip_hook(session)
    stats = []
    with api.active(session):
        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        params = program.initial_params()
        order = GlobalBatches(program.seed, program.num_samples, program.batch_size, program.shuffle)
        pos = DataPosition(0, 0)
        try:
            for step in range(steps):
                idx, nxt = order.take(pos, program.batch_size)
                session.inbox.put(StepMessage(step, pos.epoch, [params], [(0, len(params))], idx, None, 1.0))
                out = session.outbox.get(timeout=60)
                if isinstance(out, BaseException):
                    raise out
                stats.append(out)
                params = params - 0.01 * session.flat.grads.numpy()
                pos = nxt
        finally:
            session.inbox.put(RELEASE)
            thread.join(10)
            torch.nn.utils.clip_grad_norm_ = original_clip
            torch.nn.utils.clip_grad.clip_grad_norm_ = original_clip
    return stats


def make_loop(model_fn=lambda: torch.nn.Linear(64, 10), body=None, dataset=None):
    """A digits loop whose batch is handled by ``body(model, opt, x, y)``."""

    def loop():
        torch.manual_seed(0)
        model = model_fn()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model, opt = ept.prepare(model, opt)
        loader = ept.DataLoader(dataset or train_set(), batch_size=64)
        for _ in ept.epochs(1):
            for x, y in loader:
                body(model, opt, x, y)

    return loop


def plain_step(model, opt, x, y):
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()


def by_hand(model, opt, x, y):
    model.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    with torch.no_grad():
        for p in model.parameters():
            p.data -= 0.1 * p.grad


def test_the_stand_in_job_runs_a_fitting_loop():
    stats = drive(make_loop(body=plain_step))
    assert len(stats) == 3 and all(s["groups"][0]["lr"] == 0.1 and s["clip"] is None for s in stats)


def test_parameters_changed_by_hand_without_the_optimizer_fail_at_the_first_step():
    with pytest.raises(
        ProgramError, match=r"did not step\(\), yet the parameters changed .* or p.data changed by hand"
    ):
        drive(make_loop(body=by_hand))


def test_a_second_optimizer_fails_at_the_first_step():
    second: list[torch.optim.Optimizer] = []

    def two_optimizers(model, opt, x, y):
        if not second:
            second.append(torch.optim.SGD(model[0].parameters(), lr=0.5))
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        second[0].step()
        opt.step()

    loop = make_loop(model_fn=lambda: torch.nn.Sequential(torch.nn.Linear(64, 10)), body=two_optimizers)
    with pytest.raises(ProgramError, match="a second optimizer"):
        drive(loop)


def test_an_optimizer_made_after_prepare_and_stepped_instead_is_named():
    def loop():
        model = torch.nn.Linear(64, 10)
        model, _ = ept.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)  # not the prepared one: a port's usual slip
        loader = ept.DataLoader(train_set(), batch_size=64)
        for _ in ept.epochs(1):
            for x, y in loader:
                plain_step(model, opt, x, y)

    with pytest.raises(ProgramError, match=r"did not step\(\), yet the parameters changed \(.* made after prepare"):
        drive(loop)


def test_an_lr_scheduler_made_before_prepare_still_watches_the_step_and_torch_says_nothing(recwarn):
    def loop():
        model = torch.nn.Linear(64, 10)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        schedule = torch.optim.lr_scheduler.StepLR(opt, 1, 0.5)  # before prepare(), as a port may have it
        model, opt = ept.prepare(model, opt)
        loader = ept.DataLoader(train_set(), batch_size=64)
        for _ in ept.epochs(1):
            for x, y in loader:
                plain_step(model, opt, x, y)
                schedule.step()

    stats = drive(loop)
    assert [s["groups"][0]["lr"] for s in stats] == [0.1, 0.05, 0.025]  # the scheduler moves the prepared lr
    assert not [w for w in recwarn if "overridden after learning rate scheduler" in str(w.message)]


def test_batchnorm_in_training_mode_fails_at_the_first_step():
    def model_fn():
        return torch.nn.Sequential(torch.nn.Linear(64, 10), torch.nn.BatchNorm1d(10))

    with pytest.raises(ProgramError, match="BatchNorm in training mode.*GroupNorm"):
        drive(make_loop(model_fn=model_fn, body=plain_step))


def test_an_iterable_style_dataset_is_refused_when_the_loop_is_described():
    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            yield from zip(torch.zeros(8, 64), torch.zeros(8, dtype=torch.long), strict=True)

    with pytest.raises(ProgramError, match="map-style dataset"):
        load_program(make_loop(body=plain_step, dataset=Stream()))


def test_clipping_part_of_the_model_is_refused_and_clipping_all_of_it_is_recorded():
    def clip(params_of):
        def body(model, opt, x, y):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            torch.nn.utils.clip_grad_norm_(params_of(model), 0.5)
            opt.step()

        return body

    model_fn = lambda: torch.nn.Sequential(torch.nn.Linear(64, 16), torch.nn.Linear(16, 10))  # noqa: E731
    stats = drive(make_loop(model_fn=model_fn, body=clip(lambda m: m.parameters())))
    assert [s["clip"] for s in stats] == [(0.5, 2.0)] * 3
    with pytest.raises(ProgramError, match="part of the prepared model's parameters"):
        drive(make_loop(model_fn=model_fn, body=clip(lambda m: m[1].parameters())))


def test_the_global_clip_coefficient_is_torchs_for_the_whole_gradient():
    from elasticps.runtime.ps import clip_coefficient

    g = np.array([3.0, 4.0, 12.0], dtype=np.float32)  # norm 13
    shards = [g[:2], g[2:]]
    norms = [{"sq": float(np.dot(s, s)), "max": float(np.abs(s).max())} for s in shards]
    t = torch.tensor(g, requires_grad=True)
    t.grad = torch.tensor(g)
    torch.nn.utils.clip_grad_norm_([t], 6.5)
    assert np.allclose(g * clip_coefficient((6.5, 2.0), norms), t.grad.numpy(), rtol=1e-6)  # 6.5/13 = 0.5
    assert clip_coefficient((20.0, 2.0), norms) == 1.0
    assert clip_coefficient((6.0, float("inf")), norms) == pytest.approx(0.5, rel=1e-6)  # 6/12


@pytest.mark.parametrize("norm_type", [2.0, float("inf")])
def test_the_shards_norm_parts_give_torchs_clipping_of_the_whole_gradient(norm_type):
    grad = torch.randn(1001, generator=torch.Generator().manual_seed(3)) * 0.1
    grad[17] = -5.0  # the largest magnitude is negative: the inf-norm must see it
    parts = [norm_part(grad[lo:hi].numpy(), norm_type) for lo, hi in ((0, 400), (400, 400), (400, 1001))]
    param = torch.nn.Parameter(torch.zeros(1001))
    param.grad = grad.clone()
    torch.nn.utils.clip_grad.clip_grad_norm_([param], 0.5, norm_type)  # clip_grad (the hook may wrap nn.utils')
    coefficient = clip_coefficient((0.5, norm_type), parts)
    assert coefficient < 1.0
    torch.testing.assert_close(grad * coefficient, param.grad, rtol=1e-6, atol=0)


def test_torchs_dataloader_options_that_a_job_has_no_use_for_are_refused_with_why():
    for option, why in [
        ({"num_workers": 2}, "has no num_workers: a worker reads its share of each batch in its own process"),
        ({"pin_memory": True}, "has no pin_memory: batches are not pinned"),
        ({"sampler": [3, 1, 2]}, "has no sampler: the job orders and splits the data between its workers itself"),
    ]:
        with pytest.raises(ProgramError, match=why):
            ept.DataLoader(train_set(), batch_size=64, **option)
    with pytest.raises(TypeError, match="unexpected keyword argument 'bogus'"):
        ept.DataLoader(train_set(), batch_size=64, bogus=1)
    defaults = {"num_workers": 0, "pin_memory": False, "sampler": None, "persistent_workers": False}
    assert ept.DataLoader(train_set(), batch_size=64, **defaults).batch_size == 64  # asks for nothing it lacks


def _wrapped_rule(how: str):
    """A loop that breaks a rule (report() of a string) and raises its own error over the ProgramError."""

    def loop():
        try:
            ept.report(accuracy="high")
        except ProgramError as exc:
            if how == "from":
                raise RuntimeError("my loop failed") from exc
            raise RuntimeError("my loop failed while handling it")  # noqa: B904

    return loop


@pytest.mark.parametrize("how", ["from", "while handling"])
def test_a_rule_broken_under_the_loops_own_error_is_still_a_rule_broken(how, monkeypatch):
    from elasticps.runtime.loop_worker import LoopWorker, TrainingFunctionError

    for owner, name in [(torch.Tensor, "backward"), (torch.nn.utils, "clip_grad_norm_")]:
        monkeypatch.setattr(owner, name, getattr(owner, name))  # the worker's hooks undone at the end
    monkeypatch.setattr(torch.nn.utils.clip_grad, "clip_grad_norm_", torch.nn.utils.clip_grad.clip_grad_norm_)
    monkeypatch.setattr(api, "_session", api._session)
    threads = torch.get_num_threads()
    program = load_program(make_loop(body=plain_step))
    program.fn = _wrapped_rule(how)
    worker = LoopWorker(program, shared_memory=False)
    try:
        with pytest.raises(TrainingFunctionError, match="report.. takes numbers") as failed:
            worker.ready()
        assert failed.value.rule_broken and worker.rule_broken  # not restarted: it would break it again
    finally:
        worker.close()
        torch.set_num_threads(threads)


def test_the_error_chain_is_followed_once_per_error_and_bounded():
    from elasticps.errors import MAX_CHAIN, error_chain

    a, b = RuntimeError("a"), RuntimeError("b")
    a.__context__, b.__context__ = b, a  # a cycle
    assert error_chain(a) == [a, b]
    errors = [RuntimeError(str(i)) for i in range(3 * MAX_CHAIN)]
    for outer, inner in itertools.pairwise(errors):
        outer.__cause__ = inner
    assert len(error_chain(errors[0])) == MAX_CHAIN


def run_alone(loop) -> None:
    """``loop`` as ``python train.py`` runs it: one process, no job."""
    with api.active(LocalSession()):
        loop()


def bn_model():
    return torch.nn.Sequential(torch.nn.Linear(64, 10), torch.nn.BatchNorm1d(10))


def step_twice(model, opt, x, y):
    plain_step(model, opt, x, y)
    opt.step()


def closure_step(model, opt, x, y):
    opt.step(lambda: torch.nn.functional.cross_entropy(model(x), y))


@pytest.mark.parametrize(
    ("model_fn", "body"),
    [
        (bn_model, plain_step),
        (lambda: torch.nn.Linear(64, 10), step_twice),
        (lambda: torch.nn.Linear(64, 10), by_hand),
        (lambda: torch.nn.Linear(64, 10), closure_step),
    ],
    ids=["batchnorm in training mode", "step twice", "parameters by hand", "step(closure)"],
)
def test_a_loop_run_alone_is_told_what_a_job_would_tell_it(model_fn, body):
    loop = make_loop(model_fn=model_fn, body=body)
    with pytest.raises(ProgramError) as in_a_job:
        drive(loop)
    with pytest.raises(ProgramError) as alone:
        run_alone(loop)
    assert str(alone.value) == str(in_a_job.value)


def test_a_second_optimizer_is_named_alone_as_in_a_job():
    def loop():
        model = torch.nn.Linear(64, 10)
        model, _ = ept.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)  # not the prepared one
        loader = ept.DataLoader(train_set(), batch_size=64)
        for _ in ept.epochs(1):
            for x, y in loader:
                plain_step(model, opt, x, y)

    with pytest.raises(ProgramError) as in_a_job:
        drive(loop)
    with pytest.raises(ProgramError) as alone:
        run_alone(loop)
    assert str(alone.value) == str(in_a_job.value) and "made after prepare" in str(alone.value)


def test_an_epoch_left_before_its_end_is_refused_alone():
    def loop():
        model = torch.nn.Linear(64, 10)
        model, opt = ept.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
        loader = ept.DataLoader(train_set(), batch_size=64)
        for _ in ept.epochs(2):
            for x, y in loader:
                plain_step(model, opt, x, y)
                break

    with pytest.raises(ProgramError, match="the loop over the DataLoader ended before epoch 0 did"):
        run_alone(loop)


def test_checking_the_rules_alone_changes_nothing_the_loop_computes(recwarn):
    """The same loop with and without prepare(), a scheduler made before and one after it: the same parameters."""

    def loop(prepared: bool) -> torch.Tensor:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(64, 16), torch.nn.ReLU(), torch.nn.Linear(16, 10))
        opt = torch.optim.Adam(model.parameters(), lr=0.01)
        before = torch.optim.lr_scheduler.StepLR(opt, 3, 0.5)
        if prepared:
            model, opt = ept.prepare(model, opt)
        after = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0 / (1 + step))
        loader = ept.DataLoader(train_set(), batch_size=128, shuffle=True)
        for _ in ept.epochs(2):
            for x, y in loader:
                plain_step(model, opt, x, y)
                before.step()
                after.step()
        return torch.cat([p.detach().reshape(-1) for p in model.parameters()])

    with api.active(LocalSession()):
        plain, checked = loop(False), loop(True)
    assert torch.equal(plain, checked)
    assert not [w for w in recwarn if "lr_scheduler" in str(w.message)]


def _loss_step(loss_of):
    def body(model, opt, x, y):
        opt.zero_grad()
        loss_of(model, x, y).backward()
        opt.step()

    return body


F = torch.nn.functional
SUMMED = {
    "cross_entropy sum": lambda m, x, y: F.cross_entropy(m(x), y, reduction="sum"),
    "none then sum": lambda m, x, y: F.cross_entropy(m(x), y, reduction="none").sum(),
    "mse sum": lambda m, x, y: F.mse_loss(m(x), F.one_hot(y, 10).float(), reduction="sum"),
    "sum under bf16 autocast": lambda m, x, y: F.cross_entropy(m(x).bfloat16(), y, reduction="sum").float(),
    "a mean plus a sum": lambda m, x, y: F.cross_entropy(m(x), y) + F.nll_loss(m(x).log_softmax(1), y, reduction="sum"),
}
MEANS = {
    "the default mean": lambda m, x, y: F.cross_entropy(m(x), y),
    "a sum divided by the batch": lambda m, x, y: F.cross_entropy(m(x), y, reduction="sum") / len(x),
    "a mean plus an L2 penalty's sum": lambda m, x, y: (
        F.cross_entropy(m(x), y) + 1e-4 * sum(p.pow(2).sum() for p in m.parameters())
    ),
}


@pytest.mark.parametrize("loss", list(SUMMED), ids=list(SUMMED))
def test_a_loss_summed_over_the_batch_fails_at_the_first_step_in_a_job_and_alone(loss):
    original = torch.autograd.backward
    loop = make_loop(body=_loss_step(SUMMED[loss]))
    with pytest.raises(ProgramError, match="sum over the batch") as in_a_job:
        drive(loop)
    with pytest.raises(ProgramError) as alone:
        run_alone(loop)
    assert str(alone.value) == str(in_a_job.value) and "reduction='mean'" in str(alone.value)
    assert torch.autograd.backward is original  # the watch let go of torch's backward


@pytest.mark.parametrize("loss", list(MEANS), ids=list(MEANS))
def test_a_mean_loss_or_a_sum_divided_by_the_batch_trains(loss):
    original = torch.autograd.backward
    stats = drive(make_loop(body=_loss_step(MEANS[loss])), steps=5)
    assert len(stats) == 5
    run_alone(make_loop(body=_loss_step(MEANS[loss])))
    assert torch.autograd.backward is original


@pytest.mark.parametrize(
    "call", ["loss.backward()", "torch.autograd.backward(loss)", "torch.autograd.backward([loss])"]
)
def test_every_steps_loss_is_noted_for_the_reports_however_backward_is_called(call):
    seen = []

    def body(model, opt, x, y):
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        seen.append(loss.item())
        if call == "loss.backward()":
            loss.backward()
        else:
            torch.autograd.backward(loss if call == "torch.autograd.backward(loss)" else [loss])
        opt.step()

    steps = rules.CHECKED_STEPS + 2  # past the steps whose loss is checked
    stats = drive(make_loop(body=body), steps=steps)
    batch = load_program(make_loop(body=body)).batch_size
    assert [s["loss_sum"] / batch for s in stats] == pytest.approx(seen, rel=1e-6)
    assert len(seen) == steps


def test_a_summed_loss_after_the_watched_steps_or_outside_a_loop_is_not_judged():
    original = torch.autograd.backward
    F.cross_entropy(torch.randn(4, 3, requires_grad=True), torch.tensor([0, 1, 2, 0]), reduction="sum").backward()
    watch, other = rules.LossWatch(), rules.LossWatch()
    watch.start()
    watch.start()  # started again, and a second watch: torch's backward is wrapped once
    other.start()
    other.stop()
    try:
        for _ in range(rules.CHECKED_STEPS):
            F.cross_entropy(torch.randn(4, 3, requires_grad=True), torch.tensor([0, 1, 2, 0])).backward()
        assert torch.autograd.backward is original  # its checks done, the watch let go by itself
        F.cross_entropy(torch.randn(4, 3, requires_grad=True), torch.tensor([0, 1, 2, 0]), reduction="sum").backward()
    finally:
        watch.stop()
    assert torch.autograd.backward is original


def test_a_broken_rule_is_told_in_one_line_at_the_users_line_and_an_own_error_without_our_frames():
    from elasticps.errors import loop_error_text

    with pytest.raises(ProgramError) as broken:
        run_alone(make_loop(body=_loss_step(SUMMED["cross_entropy sum"])))
    text = loop_error_text(broken.value)
    assert "\n" not in text and text.startswith("ProgramError: the loss is a sum over the batch (cross_entropy")
    assert text.endswith(", in body: loss_of(model, x, y).backward())")  # the user's line, not torch's nor ours
    assert "(at tests/test_user_loop_rules.py:" in text  # relative to the folder the loop runs in

    class Broken(torch.utils.data.Dataset):  # the user's own error, raised under elasticps's DataLoader
        def __len__(self):
            return 8

        def __getitem__(self, i):
            return {}["missing"]

    with pytest.raises(KeyError) as own:
        run_alone(make_loop(body=plain_step, dataset=Broken()))
    trace = loop_error_text(own.value)
    assert trace.startswith("Traceback") and trace.rstrip().endswith("KeyError: 'missing'")
    assert 'in __getitem__\n    return {}["missing"]' in trace and "elasticps/loop" not in trace
    assert "elasticps/loop" in "".join(__import__("traceback").format_exception(own.value))  # there were some
