"""PyTorch's classic MNIST example loop, on scikit-learn's 8x8 digits, as an elastic job.

The loop of ``pytorch/examples/mnist/main.py`` (a CNN, Adadelta, StepLR, a
test pass after every epoch) as a user would bring it; the six lines marked
``# elasticps`` are all that changed (docs/user-loop.md shows the diff). The
CNN has no dropout: a mask drawn per worker is not what one process draws,
and ``sync`` mode is exact only without it (docs/user-loop.md).

Run alone: ``python -m elasticps.examples.digits_loop``; as a job:
``elasticps train elasticps.examples.digits_loop:main --workers 2``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn, optim
from torch.optim.lr_scheduler import StepLR

import elasticps.torch as ept  # elasticps
from elasticps.examples.digits import test_set, train_set


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, 1, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, 1, padding=1)
        self.fc1 = nn.Linear(32 * 4 * 4, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.view(-1, 1, 8, 8)
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        x = F.max_pool2d(x, 2)
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        return F.log_softmax(self.fc2(x), dim=1)


def train(model, train_loader, optimizer, epoch, log_interval):
    model.train()
    for batch_idx, (data, target) in enumerate(train_loader):
        optimizer.zero_grad()
        output = model(data)
        loss = F.nll_loss(output, target)
        loss.backward()
        optimizer.step()
        if log_interval and batch_idx % log_interval == 0:
            print(f"Train Epoch: {epoch} [{batch_idx}/{len(train_loader)}]\tLoss: {loss.item():.6f}")


def test(model, test_loader):
    model.eval()
    test_loss, correct = 0.0, 0
    with torch.no_grad():
        for data, target in test_loader:
            output = model(data)
            test_loss += F.nll_loss(output, target, reduction="sum").item()
            correct += output.argmax(dim=1).eq(target).sum().item()
    n = len(test_loader.dataset)
    print(f"Test set: Average loss: {test_loss / n:.4f}, Accuracy: {correct}/{n} ({100.0 * correct / n:.0f}%)")
    return test_loss / n, correct / n


def main(epochs=14, batch_size=64, lr=1.0, gamma=0.7, seed=1, optimizer="adadelta", log_interval=10):
    torch.manual_seed(seed)
    train_loader = ept.DataLoader(train_set(), batch_size=batch_size, shuffle=True)  # elasticps
    test_loader = torch.utils.data.DataLoader(test_set(), batch_size=1000)
    model = Net()
    make = {"adadelta": optim.Adadelta, "sgd": optim.SGD, "adamw": optim.AdamW}[optimizer]
    optimizer = make(model.parameters(), lr=lr)
    model, optimizer = ept.prepare(model, optimizer)  # elasticps
    scheduler = StepLR(optimizer, step_size=1, gamma=gamma)
    ept.register(scheduler=scheduler)  # elasticps
    for epoch in ept.epochs(epochs):  # elasticps
        train(model, train_loader, optimizer, epoch, log_interval)
        test_loss, accuracy = test(model, test_loader)
        ept.report(accuracy=accuracy, test_loss=test_loss)  # elasticps
        scheduler.step()
    return model


if __name__ == "__main__":
    main()
