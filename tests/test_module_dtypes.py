"""Module.half(), .bfloat16() and .float(), as PyTorch's: every floating-point parameter and buffer converted in
place (the same tensor objects), integer buffers kept, gradients converted, the values rounded as NumPy rounds
(float16) or to nearest even (bfloat16), and equal to torch's conversion when torch imports; a bfloat16 model runs
eagerly; compile refuses a model that is not float32 and says how to train in bfloat16."""
import numpy as np
import pytest

import fasttrain as ft
from _opref import bf16_round

nn = ft.nn


def net():
    ft.manual_seed(1)
    return nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 4 * 4, 3))


def _half(a):
    return a.astype(np.float16).astype(np.float32)


@pytest.mark.parametrize("convert, dtype, rounded", [
    ("half", ft.float16, _half),
    ("bfloat16", ft.bfloat16, bf16_round),
    (lambda m: m.to(ft.bfloat16), ft.bfloat16, bf16_round),
    (lambda m: m.to(dtype=ft.float16, non_blocking=True), ft.float16, _half),
    (lambda m: m.to("cpu", ft.bfloat16), ft.bfloat16, bf16_round),
    (lambda m: m.to(ft.zeros(1, dtype=ft.float16)), ft.float16, _half),
])
def test_conversion_in_place_and_back(convert, dtype, rounded):
    model = net()
    model[1].running_mean.copy_(np.linspace(-1, 1, 4, dtype=np.float32) / 3)
    before = model.state_dict()
    objects = dict(model.named_parameters()) | dict(model.named_buffers())
    model.weight_grad = model[4].weight.grad = ft.zeros(3, 64) + 1 / 3
    assert (getattr(model, convert)() if isinstance(convert, str) else convert(model)) is model
    for name, t in list(model.named_parameters()) + list(model.named_buffers()):
        assert t is objects[name]
        if name.endswith("num_batches_tracked"):
            assert t.dtype is ft.int64
            continue
        assert t.dtype is dtype, name
        np.testing.assert_array_equal(t.float().numpy(), rounded(before[name]), err_msg=name)
    assert model[4].weight.grad.dtype is dtype
    np.testing.assert_array_equal(model[4].weight.grad.float().numpy(), rounded(np.full((3, 64), 1 / 3)))
    model.float()
    for name, t in model.state_dict().items():
        assert t.dtype == before[name].dtype
        if t.dtype == np.float32:
            np.testing.assert_array_equal(t, rounded(before[name]))


def test_bfloat16_model_runs_eagerly():
    model = nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 4 * 4, 3))
    x = ft.randn(2, 1, 6, 6)
    model.bfloat16()
    widened = {k: v.float().numpy() for k, v in model.named_parameters()}  # the bf16 values, exactly
    out = model(x.bfloat16())
    assert out.dtype is ft.bfloat16 and out.shape == (2, 3)
    ref = nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 4 * 4, 3))
    ref.load_state_dict(widened)
    want = ref(ft.from_numpy(bf16_round(x.numpy()))).numpy()
    np.testing.assert_allclose(out.float().numpy(), want, rtol=2e-2, atol=2e-2)


def test_compile_refuses_a_low_precision_model():
    model = nn.Linear(4, 3)
    opt = ft.optim.SGD(model.parameters(), lr=0.1)  # built on the float32 model: the objects stay the same
    model.bfloat16()
    with pytest.raises(TypeError, match=r"parameter 'weight' is bfloat16.*model.float\(\).*precision='bf16-mixed'"):
        model.compile(opt, batch_size=4, input_shape=(4,))
    program = model.float().compile(opt, batch_size=4, input_shape=(4,))
    assert program.predict(np.zeros(4, np.float32)).shape == (3,)


@pytest.mark.parametrize("convert", ["half", "bfloat16"])
def test_matches_torch(convert):
    torch = pytest.importorskip("torch")
    model = net()
    tm = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU(), torch.nn.Flatten(),
                             torch.nn.Linear(4 * 4 * 4, 3))
    tm.load_state_dict({k: torch.from_numpy(v) for k, v in model.state_dict().items()})
    getattr(model, convert)()
    getattr(tm, convert)()
    for name, t in tm.state_dict().items():
        mine = dict(list(model.named_parameters()) + list(model.named_buffers()))[name]
        assert mine.dtype.name == str(t.dtype).removeprefix("torch."), name
        np.testing.assert_array_equal(mine.float().numpy() if mine.dtype.is_floating_point else mine.numpy(),
                                      t.float().numpy() if t.is_floating_point() else t.numpy())


def test_to_refuses_what_it_cannot_do_and_changes_nothing():
    model = net()
    before = model.state_dict()
    with pytest.raises(TypeError, match="only accepts floating point dtypes"):
        model.to(ft.int64)
    with pytest.raises((TypeError, ValueError)):
        model.to("tpu", ft.float16)
    with pytest.raises(TypeError, match="got 3 arguments"):
        model.to("cpu", ft.float16, ft.float16)
    assert all(t.dtype == before[k].dtype and np.array_equal(t, before[k]) for k, t in model.state_dict().items())
