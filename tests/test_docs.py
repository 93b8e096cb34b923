"""The code in README.md's taste and docs/models.md runs as written (on random data instead of the epochs)."""
import os
import re

import numpy as np

import fasttrain as ft

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def blocks(path):
    with open(os.path.join(ROOT, path)) as f:
        return re.findall(r"```python\n(.*?)```", f.read(), re.S)


def test_models_md_examples_compile_and_train():
    first, several, targets, loss_block = blocks("docs/models.md")[:4]
    scope = {}
    exec(first, scope)
    program, x = scope["program"], np.random.default_rng(0).standard_normal((128, 1, 28, 28)).astype(np.float32)
    y = np.arange(128) % 10
    assert np.isfinite(program.train_step(x, y))
    assert scope["model"].state_dict().keys() >= {"blocks.1.conv.weight", "blocks.1.bn.running_var"}

    rng = np.random.default_rng(1)
    lengths = rng.integers(5, 128, 96)
    mask = (np.arange(128) < lengths[:, None]).astype(np.int64)
    tokens = dict(ids=rng.integers(1, 1000, (96, 128)) * mask, mask=mask, y=rng.integers(0, 2, 96))
    exec(several, {**scope, **tokens})

    class Detector(ft.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.cls, self.box = ft.nn.Conv2d(3, 4, 3), ft.nn.Linear(4, 5), ft.nn.Linear(4, 4)

        def forward(self, x):
            f = ft.nn.functional.adaptive_avg_pool2d(self.conv(x).relu(), 1).flatten(1)
            return self.cls(f), self.box(f)

    detector = Detector()
    boxes = dict(model=detector, opt=ft.optim.Adam(detector.parameters()), F=ft.nn.functional,
                 x=rng.standard_normal((64, 3, 32, 32)).astype(np.float32), labels=rng.integers(0, 5, 64),
                 boxes=rng.random((64, 4)).astype(np.float32))
    exec(targets, {**scope, **boxes})

    class TwoHeads(ft.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = ft.nn.Linear(4, 3), ft.nn.Linear(4, 2)

        def forward(self, x):
            return self.a(x), self.b(x)

    exec(loss_block, scope)
    model = TwoHeads()
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), scope["loss"], batch_size=8, input_shape=(4,))
    assert np.isfinite(program.train_step(np.ones((8, 4), np.float32), np.arange(8) % 3))


def test_readme_taste_network_compiles_as_the_layers_it_names():
    """The README's Net traces to the graph of its layers in order, its ReLUs fused, and trains."""
    taste = blocks("README.md")[0]
    scope = {}
    exec(taste[:taste.index("ft.seed_everything")], scope)
    model = scope["Net"]()
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), ft.nn.CrossEntropyLoss(), batch_size=16,
                            input_shape=(1, 28, 28))
    kinds = [line.split()[1] for line in program.summary().splitlines() if line[:3].strip().isdigit()]
    assert kinds == ["input", "Conv2d", "BatchNorm2d", "MaxPool2d", "Conv2d", "BatchNorm2d", "AdaptiveMaxPool2d",
                     "Reshape", "Linear", "Target", "CrossEntropyLoss"]
    x = np.random.default_rng(0).standard_normal((16, 1, 28, 28)).astype(np.float32)
    assert np.isfinite(program.train_step(x, np.arange(16) % 10))
