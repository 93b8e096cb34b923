import fasttrain as ft
from fasttrain import nn
from fasttrain.nn import functional as F


class Regressor(nn.Module):
    """features -> hidden (tanh) -> one value."""

    def __init__(self, features, hidden=16):
        super().__init__()
        self.hidden = nn.Linear(features, hidden)
        self.out = nn.Linear(hidden, 1)

    def forward(self, x):
        return self.out(F.tanh(self.hidden(x)))


def fit(model, x, y, steps=50, lr=0.05):
    """Full-batch SGD with momentum on the mean squared error; returns the loss of every step."""
    program = model.compile(ft.optim.SGD(model.parameters(), lr=lr, momentum=0.9), nn.MSELoss(),
                            batch_size=len(x), input_shape=tuple(x.shape[1:]))
    return [program.train_step(x, y) for _ in range(steps)]
