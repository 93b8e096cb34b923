"""program.memory_plan() and summary()'s memory lines against the CPU allocator's own count."""
import gc

import numpy as np
import pytest

import fasttrain as ft
from fasttrain import nn

HUGE_PAGE = 2 << 20  # blocks of 1 MiB and more are granted in whole 2 MiB pages


def net():
    return nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                         nn.Flatten(), nn.Linear(32, 10))


@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])
def test_plan_matches_what_the_allocator_holds(precision):
    if precision == "bf16-mixed" and not ft.backends.cpu_has_bf16():
        pytest.skip("this CPU has no AVX512-BF16: bf16-mixed runs as 32-true")
    x, y = ft.randn(256, 1, 28, 28), ft.tensor(np.random.default_rng(0).integers(0, 10, 256))
    model = net()
    opt = ft.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    gc.collect()
    before = ft.memory_stats("cpu")["allocated_bytes"]
    program = model.compile(opt, nn.CrossEntropyLoss(), batch_size=256, input_shape=(1, 28, 28),
                            precision=precision)
    program.train_step(x, y)  # the optimizer's state is allocated by its first step
    held = ft.memory_stats("cpu")["allocated_bytes"] - before
    plan = program.memory_plan()
    # the model's parameters existed before compile (which moved them into the flat buffer)
    expected = plan["total"] - plan["parameters"]
    big = [plan[k] for k in ("activations", "evaluation", "parameters", "gradients", "optimizer_state",
                             "weights_copy")]
    assert 0 <= held - expected <= HUGE_PAGE * len(big) + (1 << 20), (held, plan)
    assert plan["total"] == sum(big)
    assert (plan["weights_copy"] > 0) == (precision == "bf16-mixed")
    nodes = plan["nodes"]
    assert len(nodes) == len(program.entries) and nodes[0]["node"] == "input"
    # each node's output and gradient bytes follow its shape and dtype; the arena reuses memory
    for e, n, dtype in zip(program.entries, nodes, program._c.node_dtypes()):
        size = 256 * int(np.prod(e.shape)) * getattr(ft, dtype).itemsize
        assert n["output"] in (0, size) and n["gradient"] in (0, size), (e, n)
    assert sum(n["output"] + n["saved"] + n["gradient"] for n in nodes) >= plan["activations"]
    assert "total" in program.summary().splitlines()[-1]
