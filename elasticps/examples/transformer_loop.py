"""A transformer training loop as a user brings it: AdamW, linear warm-up then
cosine decay (``LambdaLR``, stepped every batch), global-norm clipping and
bfloat16 autocast on CPU; the six lines marked ``# elasticps`` are all that
changed (docs/user-loop.md shows the diff).

The model and data are :mod:`elasticps.examples.transformer`'s (a 2-layer
encoder on generated sequences; no dropout, LayerNorm per sample).
``bf16=True`` runs the forward pass under ``torch.autocast("cpu", torch.bfloat16)``
where this torch supports it: each worker's gradient of its share is then
rounded to bfloat16 before the shards sum the shares, so the job equals the
one-process run to bfloat16's precision, not float32's (docs/user-loop.md).

Run alone: ``python -m elasticps.examples.transformer_loop``; as a job:
``elasticps train elasticps.examples.transformer_loop:main --ps 2 --workers 2``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch.optim.lr_scheduler import LambdaLR

import elasticps.torch as ept  # elasticps
from elasticps.examples.transformer import Classifier, Sequences


def warmup_cosine(step: int, warmup: int, total: int) -> float:
    """The learning rate's factor at ``step``: linear warm-up, then cosine to 0."""
    if step < warmup:
        return (step + 1) / warmup
    return 0.5 * (1.0 + math.cos(math.pi * min(1.0, (step - warmup) / max(1, total - warmup))))


def bf16_autocast_works() -> bool:
    """Whether this torch runs a CPU forward and backward pass under bfloat16 autocast."""
    try:
        layer = torch.nn.Linear(4, 4)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = layer(torch.ones(2, 4))
        out.float().sum().backward()
        return out.dtype == torch.bfloat16
    except (RuntimeError, TypeError):
        return False


def evaluate(model, data):
    model.eval()
    with torch.no_grad():
        batch, target = data[:]
        correct = (model(**batch).argmax(1) == target).float().mean().item()
    model.train()
    return correct


def main(epochs=3, batch_size=64, samples=2048, lr=3e-3, warmup=10, max_norm=1.0, bf16=True, seed=0, width=64):
    torch.manual_seed(seed)
    autocast = bf16 and bf16_autocast_works()
    train_set, test_set = Sequences(samples, seed=1000 + seed), Sequences(512, seed=2000 + seed)
    loader = ept.DataLoader(train_set, batch_size=batch_size, shuffle=True)  # elasticps
    model = Classifier(width, layers=2, heads=4)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    model, optimizer = ept.prepare(model, optimizer)  # elasticps
    total = epochs * len(loader)
    scheduler = LambdaLR(optimizer, lambda step: warmup_cosine(step, warmup, total))
    ept.register(scheduler=scheduler)  # elasticps
    for epoch in ept.epochs(epochs):  # elasticps
        for step, (batch, target) in enumerate(loader):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                loss = F.cross_entropy(model(**batch), target)
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
            optimizer.step()
            scheduler.step()
            if step % 10 == 0:
                print(f"epoch {epoch} step {step}: loss {loss.item():.4f} lr {scheduler.get_last_lr()[0]:.2e}")
        accuracy = evaluate(model, test_set)
        print(f"epoch {epoch}: test accuracy {accuracy:.3f}")
        ept.report(accuracy=accuracy, loss=loss.item())  # elasticps
    return model


if __name__ == "__main__":
    main()
