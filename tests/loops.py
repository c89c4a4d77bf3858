"""User loops for the tests that submit them by name (``tests.loops:NAME``)."""

from __future__ import annotations

import os
import time

import torch
from torch.nn import Embedding

from elasticps.examples import digits_loop


def gated_digits(gate: str, **kwargs):
    """The digits loop, each batch after the first epoch held 0.1 s until the file
    ``gate`` exists: a test opens it once the job did what it waits for (a
    rescale), so the job cannot end first on a fast machine. The arithmetic is
    the digits loop's."""
    train = digits_loop.train

    def held(model, loader, optimizer, epoch, log_interval):
        class Held:
            def __iter__(self):
                for batch in loader:
                    if epoch >= 1 and not os.path.exists(gate):
                        time.sleep(0.1)
                    yield batch

            def __len__(self):
                return len(loader)

        return train(model, Held(), optimizer, epoch, log_interval)

    digits_loop.train = held
    try:
        return digits_loop.main(**kwargs)
    finally:
        digits_loop.train = train


def scheduled_mlp(
    epochs: int = 2,
    batch_size: int = 64,
    lr: float = 0.05,
    seed: int = 0,
    max_batch_size: int | None = None,
    lr_scaling: str = "sqrt",
):
    """A small loop whose learning rate moves every step (linear warm-up, then a
    per-step decay, LambdaLR): registered state that a restart or a restored PS
    must bring back exactly. ``max_batch_size``: its global batch is adaptive."""
    import torch

    import elasticps.torch as ept
    from elasticps.examples.digits import test_set, train_set

    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.Tanh(), torch.nn.Linear(32, 10))
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    model, opt = ept.prepare(model, opt)
    per_step = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 10) * 0.99**s)
    loader = ept.DataLoader(
        train_set(), batch_size=batch_size, shuffle=True, max_batch_size=max_batch_size, lr_scaling=lr_scaling
    )
    x_test, y_test = test_set().tensors
    ept.register(per_step=per_step)
    for _ in ept.epochs(epochs):
        for x, y in loader:
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            per_step.step()
        with torch.no_grad():
            accuracy = (model(x_test).argmax(1) == y_test).float().mean().item()
        ept.report(accuracy=accuracy, lr=opt.param_groups[0]["lr"])
    return model


class Bag(torch.nn.Module):
    """A mean-pooled bag of tokens plus a per-bag id, into a linear layer. Its table
    is torch's ``Embedding`` by the name bound when this module was imported."""

    def __init__(self, vocab: int, table: type = Embedding):
        super().__init__()
        self.table = table(vocab, 7, padding_idx=0)
        self.out = torch.nn.Linear(7, 3)

    def forward(self, x):
        return self.out(self.table(x).mean(1) + self.table(x[:, 0]))


def tabled_bag(
    epochs: int = 2,
    batch_size: int = 64,
    samples: int = 768,
    vocab: int = 3001,
    optimizer: str = "adamw",
    tables: str = "module",
    evaluate_first: bool = False,
):
    """Bags of token ids (0 pads) through a PS-held table read twice per batch
    (the tokens and a per-bag id), mean-pooled into a linear layer, with
    global-norm clipping: a dense layer beside the table, a row that a shard
    boundary cuts (vocab * 7 elements over 2-3 shards), a padding row.
    ``tables``: the PS holds the table as ``ept.Embedding`` in the class
    (``module``) or through ``ept.tables_on_ps(Bag, vocab)`` (``call``);
    ``none``: the plain loop, torch's table. ``evaluate_first``: the loss of the
    untrained model is reported before the first epoch."""
    import elasticps.torch as ept

    torch.manual_seed(0)
    build = {
        "module": lambda: Bag(vocab, ept.Embedding),
        "call": lambda: ept.tables_on_ps(Bag, vocab),
        "none": lambda: Bag(vocab),
    }[tables]
    model = build().to("cpu")  # as a script that picks its device does
    cls = {"adamw": torch.optim.AdamW, "sgd": torch.optim.SGD, "adagrad": torch.optim.Adagrad}[optimizer]
    opt = cls(model.parameters(), lr=0.01)
    model, opt = ept.prepare(model, opt)
    # the data are drawn after the model, from torch's global generator
    tokens = (torch.rand(samples, 6) ** 2 * vocab).long().clamp(max=vocab - 1)
    tokens[:, 4:] *= (torch.rand(samples, 1) < 0.5).long()  # some bags padded with 0
    labels = (tokens % 3 == 0).sum(1).clamp(max=2)
    loader = ept.DataLoader(torch.utils.data.TensorDataset(tokens, labels), batch_size=batch_size, shuffle=True)
    if evaluate_first:
        with torch.no_grad():
            ept.report(loss=torch.nn.functional.cross_entropy(model(tokens), labels).item())
    for _ in ept.epochs(epochs):
        for x, y in loader:
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
            opt.step()
        with torch.no_grad():
            accuracy = (model(tokens).argmax(1) == labels).float().mean().item()
        ept.report(accuracy=accuracy)
    return model


def breaks_out_at(step: int, epochs: int = 1):
    """A loop that leaves its epoch's DataLoader at ``step`` (a rule of
    ``elasticps.torch`` broken after the job's first steps)."""
    import torch

    import elasticps.torch as ept
    from elasticps.examples.digits import train_set

    model = torch.nn.Linear(64, 10)
    model, opt = ept.prepare(model, torch.optim.SGD(model.parameters(), lr=0.05))
    loader = ept.DataLoader(train_set(), batch_size=64, shuffle=True)
    for _ in ept.epochs(epochs):
        for x, y in loader:
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            if ept.step() == step:
                break


def dies_at(step: int, epochs: int = 1):
    """A loop whose process ends itself at ``step`` every time it gets there (a
    crash in native code, running out of memory on that batch)."""
    import torch

    import elasticps.torch as ept
    from elasticps.examples.digits import train_set

    model = torch.nn.Linear(64, 10)
    model, opt = ept.prepare(model, torch.optim.SGD(model.parameters(), lr=0.05))
    loader = ept.DataLoader(train_set(), batch_size=64, shuffle=True)
    for _ in ept.epochs(epochs):
        for x, y in loader:
            if ept.step() == step:
                os._exit(1)
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
