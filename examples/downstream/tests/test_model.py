"""tinyreg's tests, with fasttrain's fixtures (ft_seed, ft_deterministic, ft_device) and fasttrain.testing."""
import numpy as np
import pytest

import fasttrain as ft
from fasttrain.testing import assert_close, gradcheck, make_tensor

from tinyreg import Regressor, fit


def problem(n=32, features=3):
    """Inputs and targets of a smooth function (drawn from the generator ft_seed seeded)."""
    x = make_tensor(n, features, low=-1, high=1)
    y = np.sin(np.asarray(x).sum(1, keepdims=True)).astype(np.float32)
    return x, y


def test_gradients_match_finite_differences(ft_seed):
    x, y = problem(8)
    assert gradcheck(Regressor(3), x, y)


def test_forward_matches_numpy(ft_device):
    model = Regressor(3).to(ft_device)
    x = make_tensor(4, 3, seed=0, device=ft_device)
    w = {k: v.astype(np.float64) for k, v in model.state_dict().items()}
    h = np.tanh(np.asarray(x) @ w["hidden.weight"].T + w["hidden.bias"])
    assert_close(model(x), (h @ w["out.weight"].T + w["out.bias"]).astype(np.float32), rtol=1e-5, atol=1e-6)


def test_training_lowers_the_loss(ft_seed):
    x, y = problem()
    losses = fit(Regressor(3), x, y)
    assert losses[-1] < 0.5 * losses[0]


def test_a_seed_gives_the_same_model(ft_deterministic):
    results = []
    for _ in range(2):
        ft.manual_seed(0)
        model = Regressor(3)
        x, y = problem()
        fit(model, x, y, steps=5)
        results.append(model.state_dict())
    for name, value in results[0].items():
        assert_close(results[1][name], value, rtol=0, atol=0, msg=f"{name} differs between two runs")


@pytest.mark.slow
def test_long_training_fits_closely(ft_seed):
    x, y = problem()
    assert fit(Regressor(3, hidden=32), x, y, steps=500)[-1] < 1e-2
