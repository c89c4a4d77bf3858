"""Bring your own loop: a few calls make an ordinary PyTorch loop an elastic PS job.

.. code-block:: python

    import elasticps.torch as ept

    def main():
        torch.manual_seed(0)
        model = Net()
        opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
        model, opt = ept.prepare(model, opt)                           # the PS holds parameters and optimizer state
        loader = ept.DataLoader(train_set, batch_size=256, shuffle=True)  # the GLOBAL batch, split among workers
        for epoch in ept.epochs(30):                                   # starts where the job is
            for x, y in loader:
                loss = F.cross_entropy(model(x), y)                    # a MEAN over the batch
                opt.zero_grad()
                loss.backward()
                opt.step()                                             # the step boundary
            ept.report(accuracy=evaluate(model))

Run alone (``python -c 'import mypkg.train as t; t.main()'``) it is plain
single-process training; ``elasticps train mypkg.train:main`` or a manager job
(``program: mypkg.train:main``) runs it in every worker of an elastic job.
A model's large embedding tables can stay on the PS, and a worker reads and
pushes only the rows its batch uses: build the model as
``ept.tables_on_ps(Net, *args)`` for ``Net(*args)`` (every ``nn.Embedding``
it builds), or write ``ept.Embedding`` for ``nn.Embedding`` in its class.
See docs/user-loop.md.
"""

from elasticps.loop.api import DataLoader, epochs, prepare, register, report, step
from elasticps.loop.embedding import Embedding
from elasticps.loop.tables_on_ps import tables_on_ps

__all__ = ["DataLoader", "Embedding", "epochs", "prepare", "register", "report", "step", "tables_on_ps"]
