import pytest
import torch

from elasticps import ProgramError, TrainingProgram, load_program
from elasticps.examples import digits
from elasticps.manager.describe import describe_program
from elasticps.runtime import JobConfig, JobController


def _prog(**kw):
    base = dict(
        name="t",
        model=lambda: torch.nn.Linear(2, 1),
        dataset=[(0, 0)],
        loss=torch.nn.functional.mse_loss,
        lr=0.1,
        batch_size=4,
        epochs=1,
    )
    base.update(kw)
    return TrainingProgram(**base)


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"optimizer": "lamb"}, "optimizer 'lamb' is not supported"),
        ({"batch_size": 0}, "batch_size must be >= 1"),
        ({"epochs": 0}, "epochs must be >= 1"),
        ({"lr": 0.0}, "lr must be > 0"),
        ({"metric": lambda o, t: 0.0}, "metric and eval_dataset must be given together"),
        ({"loss": 3}, "loss must be callable"),
    ],
)
def test_bad_programs_are_refused_with_the_field_named(kw, message):
    with pytest.raises(ProgramError, match=message):
        _prog(**kw)


def test_a_max_batch_size_over_the_dataset_is_refused_at_submit_and_at_start():
    # 1347 training samples: a global batch of 2048 would train on 1347 with the lr scaled for 2048
    message = r"max_batch_size 2048 is more than the dataset's 1347 samples"
    with pytest.raises(ProgramError, match=message):
        describe_program("elasticps.examples.digits:program", {"max_batch_size": 2048})
    with pytest.raises(ProgramError, match=message):
        JobController(digits.program(max_batch_size=2048), JobConfig(), 1, 1).start()
    assert describe_program("elasticps.examples.digits:program", {"max_batch_size": 1347})["max_batch_size"] == 1347


def test_bad_optimizer_kwargs_name_the_optimizer():
    p = _prog(optimizer="adam", optimizer_kwargs={"momentum": 0.9})
    with pytest.raises(ProgramError, match="bad optimizer_kwargs for adam"):
        p.make_optimizer([torch.nn.Parameter(torch.zeros(2))])


def test_model_factory_must_return_a_module():
    with pytest.raises(ProgramError, match="not a torch.nn.Module"):
        _prog(model=lambda: 3).build_model()


def test_build_model_is_reproducible():
    p = digits.program()
    a = torch.cat([x.flatten() for x in p.build_model().parameters()])
    b = torch.cat([x.flatten() for x in p.build_model().parameters()])
    assert torch.equal(a, b)
    other = torch.cat([x.flatten() for x in digits.program(seed=1).build_model().parameters()])
    assert not torch.equal(a, other)


def test_load_program_from_a_module_path():
    p = load_program("elasticps.examples.digits:program")
    assert p.name == "digits-mlp"
    assert len(p.build_dataset()) + len(p.build_eval_dataset()) == 1797


@pytest.mark.parametrize(
    ("ref", "message"),
    [
        ("no_colon", "must look like 'package.module:attr'"),
        ("no.such.module:x", "cannot import module 'no.such.module'"),
        ("elasticps.examples.digits:nope", "has no attribute 'nope'"),
        ("elasticps.examples.digits:_split", "names a private part"),  # a callable, refused before it is called
        ("elasticps._lazy:attr", "names a private part"),
        ("elasticps.examples.digits:TensorDataset", "is a type, not a TrainingProgram or a function"),
        ("os:system", "is a builtin_function_or_method, not a TrainingProgram or a function"),
        ("elasticps.examples.digits:mlp", "is a Sequential, not a TrainingProgram"),  # checked before any use
    ],
)
def test_load_program_errors(ref, message):
    with pytest.raises(ProgramError, match=message):
        load_program(ref)


def test_load_program_passes_arguments_to_a_factory():
    p = load_program("elasticps.examples.digits:cnn_program", {"epochs": 7, "seed": 3})
    assert (p.name, p.epochs, p.seed) == ("digits-cnn", 7, 3)
    with pytest.raises(ProgramError, match="cannot call .* with arguments"):
        load_program("elasticps.examples.digits:cnn_program", {"epoch": 7})
    with pytest.raises(ProgramError, match="is not a factory"):
        load_program(digits.program(), {"epochs": 7})


def test_a_type_error_inside_a_factory_is_its_own_not_a_wrong_argument():
    def factory(epochs: int):
        return digits.program(epochs="7" + epochs)  # the factory's own bug: str + int

    with pytest.raises(ProgramError, match=r"raised TypeError: can only concatenate str"):
        load_program(factory, {"epochs": 7})
    with pytest.raises(
        ProgramError, match=r"cannot call .* with arguments \{'epoch': 7\}: missing a required argument: 'epochs'"
    ):
        load_program(factory, {"epoch": 7})


def test_an_argument_of_the_wrong_type_is_named_before_the_factory_runs():
    ran = []

    def factory(epochs: int, lr: float = 0.1, cut: int | None = None, name: str = "x", shuffle: bool = True, **kw):
        ran.append(epochs)
        return digits.program(epochs=epochs)

    for args, said in [
        ({"epochs": "abc"}, "argument epochs='abc': .* takes epochs as int, got str"),
        ({"epochs": True}, "argument epochs=True: .* takes epochs as int, got bool"),  # YAML's `true`, not 1
        ({"epochs": 2.5}, "takes epochs as int, got float"),
        ({"epochs": 2, "cut": "all"}, r"argument cut='all': .* takes cut as int \| None, got str"),
        ({"epochs": 2, "shuffle": "no"}, "takes shuffle as bool, got str"),
        ({"epochs": 2, "lr": "fast"}, "takes lr as float, got str"),
        ({"epochs": 2, "shuffle": 2}, "takes shuffle as bool, got int"),
    ]:
        with pytest.raises(ProgramError, match=said):
            load_program(factory, args)
    assert ran == []  # refused before the factory ran
    assert load_program(factory, {"epochs": 2, "lr": 1, "cut": None, "other": "free"}).epochs == 2  # int for float
    # what YAML makes of what was meant: a string of 2014 or on, a float of 1e-3 (a string to YAML 1.1), 1 for true
    assert load_program(factory, {"epochs": 3, "name": 2014, "lr": "1e-3", "shuffle": 1}).epochs == 3
    assert load_program(factory, {"epochs": 4, "name": True, "shuffle": 0}).epochs == 4
    assert ran == [2, 3, 4]


def test_a_module_that_raises_while_imported_is_a_program_error_naming_it(tmp_path, monkeypatch):
    (tmp_path / "raises_on_import.py").write_text("raise RuntimeError('no config file')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ProgramError, match="importing module 'raises_on_import' raised RuntimeError: no config file"):
        load_program("raises_on_import:program")


def test_a_description_imports_the_programs_own_modules_afresh_and_nothing_else(tmp_path, monkeypatch):
    import sys

    import numpy

    from elasticps.manager.describe import forget_own_modules

    (tmp_path / "users_own.py").write_text("VERSION = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import users_own  # noqa: F401

    forget_own_modules("users_own:program")
    assert "users_own" not in sys.modules  # read from its file again at the next import
    for installed in ("elasticps.examples.digits:program", "numpy.linalg:norm"):
        forget_own_modules(installed)
    assert "elasticps.examples.digits" in sys.modules and sys.modules["numpy"] is numpy
