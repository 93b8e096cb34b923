"""Feature arrays in the C loader and in ft.fit: D.from_arrays / D.Loader((X, y)) with float32, float64,
float16 and bfloat16 features of any per-sample shape (strided views too) and integer or float targets of any
per-sample shape, checked row by row against NumPy indexing in the loader's order; the order is the image
sources' (one sampler) and follows the global seed; bad arrays and image options give clear errors; ft.fit
over (X, y) arrays trains as a NumPy SGD over the same shuffled batches. Runs under ASan in make
test-stress-sanitize."""
import numpy as np
import pytest

import fasttrain as ft
from _opref import bf16_round

D = ft.data
nn = ft.nn


def order_of(n, batch_size, seed, epoch=0, drop_last=False):
    """The sample order of a shuffled Loader, read from a uint8 image source whose labels are the indices."""
    loader = D.Loader((np.zeros((n, 1, 1), np.uint8), np.arange(n)), batch_size, shuffle=True, seed=seed,
                      num_workers=0, drop_last=drop_last)
    loader.set_epoch(epoch)
    return np.concatenate([y.numpy() for _, y in loader])


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
@pytest.mark.parametrize("shape", [(5,), (2, 3, 4)])
def test_rows_in_the_shuffled_order(dtype, shape):
    rng = np.random.default_rng(1)
    X = rng.standard_normal((23, *shape)).astype(dtype)
    y = rng.integers(0, 7, 23).astype(np.int32)
    want_order = order_of(23, 4, seed=5, epoch=2)
    for workers in (0, 1, 3):
        loader = D.Loader(D.from_arrays(X, y), 4, shuffle=True, seed=5, num_workers=workers)
        assert loader.source.kind == "tensors" and tuple(loader.batch_shape) == (4, *shape)
        loader.set_epoch(2)
        xs, ys = zip(*[(a.numpy(), b.numpy()) for a, b in loader])
        assert [len(b) for b in ys] == [4] * 5 + [3]
        got_x, got_y = np.concatenate(xs), np.concatenate(ys)
        assert got_x.dtype == np.float32 and got_y.dtype == np.int64
        np.testing.assert_array_equal(got_x, X[want_order].astype(np.float32))
        np.testing.assert_array_equal(got_y, y[want_order])


def test_float_targets_strided_views_and_low_precision_batches():
    """A transposed float64 view of features, targets (N, 2) float64 through a strided view: batches are the rows,
    targets float32; dtype='bfloat16' rounds the features as NumPy's round-to-nearest-even does."""
    rng = np.random.default_rng(2)
    base = rng.standard_normal((17, 4, 3))
    X = base.transpose(0, 2, 1)  # (17, 3, 4), not contiguous
    wide = rng.standard_normal((17, 4))
    T = wide[:, ::2]  # (17, 2), strided
    loader = D.Loader((X, T), 5, num_workers=2)
    xs, ts = zip(*[(a.numpy(), b.numpy()) for a, b in loader])
    np.testing.assert_array_equal(np.concatenate(xs), X.astype(np.float32))
    np.testing.assert_array_equal(np.concatenate(ts), T.astype(np.float32))
    low = D.Loader((X, T), 5, num_workers=1, dtype="bfloat16")
    batches = [a for a, _ in low]
    assert all(a.dtype is ft.bfloat16 for a in batches)
    got = np.concatenate([a.float().numpy() for a in batches])  # widening bfloat16 is exact
    np.testing.assert_array_equal(got, bf16_round(X.astype(np.float32)))


@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.uint16])
def test_token_ids_are_batched_as_int64_rows(dtype):
    """Integer features (token ids) come in batches as int64, whatever the loader's float dtype, row for row in
    the shuffled order."""
    rng = np.random.default_rng(6)
    X, y = rng.integers(0, 1000, (23, 7)).astype(dtype), rng.integers(0, 3, 23)
    want_order = order_of(23, 4, seed=7, epoch=1)
    loader = D.Loader((X, y), 4, shuffle=True, seed=7, num_workers=2, dtype="bfloat16")
    loader.set_epoch(1)
    xs = [a for a, _ in loader]
    assert all(a.dtype is ft.int64 for a in xs)
    np.testing.assert_array_equal(np.concatenate([a.numpy() for a in xs]), X[want_order].astype(np.int64))


def test_fit_on_token_ids_is_the_steps_over_the_loaders_batches():
    """ft.fit(program, (ids, labels)) of a token model (int64 input) trains as train_step over the loader's
    batches in its shuffled order does, bitwise."""
    rng = np.random.default_rng(8)
    X, y = rng.integers(0, 50, (40, 6)), rng.integers(0, 2, 40)

    def run(fit):
        ft.manual_seed(9)
        model = nn.Sequential(nn.Embedding(50, 8), nn.Flatten(), nn.Linear(48, 2))
        program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss(), batch_size=8,
                                input_shape=(6,), input_dtype=ft.int64)
        if fit:
            ft.fit(program, (X, y), epochs=2, batch_size=8, progress=False)
        else:
            for epoch in range(2):
                order = order_of(40, 8, seed=9, epoch=epoch)
                for i in range(0, 40, 8):
                    program.train_step(X[order[i:i + 8]], y[order[i:i + 8]])
        return [p.numpy().tobytes() for p in model.parameters()]
    assert run(True) == run(False)


def test_tensors_and_bfloat16_features():
    """CPU fasttrain tensors are read without a copy, bfloat16 ones included (widened exactly to float32)."""
    rng = np.random.default_rng(3)
    X = ft.from_numpy(rng.standard_normal((9, 6)).astype(np.float32)).bfloat16()
    y = ft.from_numpy(rng.standard_normal(9).astype(np.float32))
    got = np.concatenate([a.numpy() for a, _ in D.Loader((X, y), 4, num_workers=1)])
    np.testing.assert_array_equal(got, X.float().numpy())


def test_other_libraries_tensors_are_read_through_dlpack():
    """PyTorch's tensors, bfloat16 ones too (which NumPy cannot hold), are read through DLPack."""
    torch = pytest.importorskip("torch")
    X = torch.randn(9, 6, generator=torch.Generator().manual_seed(3)).bfloat16()
    y = torch.arange(9)
    batches = list(D.Loader((X, y), 4, num_workers=1))
    np.testing.assert_array_equal(np.concatenate([a.numpy() for a, _ in batches]), X.float().numpy())
    assert np.concatenate([b.numpy() for _, b in batches]).tolist() == list(range(9))


def test_order_follows_the_global_seed():
    X = np.arange(40, dtype=np.float32).reshape(20, 2)
    y = np.arange(20)
    ft.manual_seed(11)
    first = np.concatenate([b.numpy() for _, b in D.Loader((X, y), 6, shuffle=True, num_workers=1)])
    np.testing.assert_array_equal(first, order_of(20, 6, seed=11))
    ft.manual_seed(12)
    other = np.concatenate([b.numpy() for _, b in D.Loader((X, y), 6, shuffle=True, num_workers=1)])
    assert sorted(other) == list(range(20)) and list(other) != list(first)


def test_bad_arrays_and_image_options(tmp_path):
    X, y = np.zeros((8, 3), np.float32), np.zeros(8, np.int64)
    with pytest.raises(ValueError, match="transforms apply to images"):
        D.Loader((X, y), 4, transforms=[D.RandomHorizontalFlip()])
    with pytest.raises(ValueError, match="channels_last apply to images"):
        D.Loader((X, y), 4, channels_last=True)
    with pytest.raises(TypeError, match=r"float32, bfloat16 or float16 \(integer ones int64\), not uint8"):
        D.Loader((X, y), 4, dtype="uint8")
    with pytest.raises(TypeError, match="floating-point features or integer ones \\(token ids\\), got bool"):
        D.from_arrays(X.astype(bool), y)
    with pytest.raises(ValueError, match="integer features are read as int64"):
        D.from_arrays(np.full((8, 3), 2 ** 63, np.uint64), y)
    with pytest.raises(ValueError, match=r"\(N, 1\)"):
        D.from_arrays(np.zeros(8, np.float32), y)
    with pytest.raises(ValueError, match=r"targets must have shape \(8, \.\.\.\)"):
        D.from_arrays(X, y[:7])
    with pytest.raises(TypeError, match="complex64"):
        D.from_arrays(X, y.astype(np.complex64))
    with pytest.raises(ValueError, match="holds no images"):
        D.write_records(tmp_path / "features.rec", (X, y))
    assert list(tmp_path.iterdir()) == []
    # uint8 arrays are images, read channels last: torchvision's layout and uint8 features say what to give
    with pytest.raises(ValueError, match=r"got \(8, 1, 28, 28\), which looks \(N, C, H, W\): give "
                                         r"x.transpose\(0, 2, 3, 1\)"):
        D.Loader((np.zeros((8, 1, 28, 28), np.uint8), y), 4)
    with pytest.raises(ValueError, match="uint8 arrays are images.* got 2 dimensions \(uint8 features or byte "
                                         "tokens: give them as float32 or int64\)"):
        D.Loader((np.zeros((8, 3), np.uint8), y), 4)
    if ft.cuda.is_available():
        with pytest.raises(ValueError, match="host memory"):
            D.from_arrays(ft.from_numpy(X).cuda(), y)


# ---------------------------------------------------------------- ft.fit over arrays

def numpy_sgd(X, y, w, b, lr, orders, batch_size):
    """Linear regression y ~ X w + b by SGD on the mean squared error, in float64, over the given epoch orders."""
    for order in orders:
        for i in range(0, len(order), batch_size):
            idx = order[i:i + batch_size]
            err = X[idx] @ w + b - y[idx]
            gw, gb = 2 * X[idx].T @ err / len(idx), 2 * err.mean()
            w, b = w - lr * gw, b - lr * gb
    return w, b


def test_fit_on_arrays_is_sgd_over_shuffled_batches():
    """ft.fit(program, (X, y), batch_size=...) with float64 features and (N,) float targets for an (N, 1) output:
    the same weights as NumPy SGD over the loader's shuffled order (the global seed's), epoch after epoch; a
    second fit on the same arrays goes on with the next epoch's order."""
    rng = np.random.default_rng(4)
    X = rng.standard_normal((50, 3))
    y = X @ np.array([1.5, -2.0, 0.5]) + 0.25 + 0.1 * rng.standard_normal(50)
    ft.manual_seed(21)
    model = nn.Linear(3, 1)
    w0, b0 = model.weight.numpy()[0].astype(np.float64), float(model.bias.numpy()[0])
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.05), nn.MSELoss(), batch_size=16,
                            input_shape=(3,))
    history = ft.fit(program, (X, y), epochs=2, batch_size=8, progress=False)
    ft.fit(program, (X, y), epochs=1, batch_size=8, progress=False)
    assert len(history["train_loss"]) == 2 and history["train_accuracy"] == [None, None]
    assert history["train_loss"][1] < history["train_loss"][0]
    orders = [order_of(50, 8, seed=21, epoch=e) for e in range(3)]
    w, b = numpy_sgd(X, y, w0, b0, 0.05, orders, 8)
    np.testing.assert_allclose(model.weight.numpy()[0], w, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(model.bias.numpy()[0], b, rtol=1e-4, atol=1e-5)
    loss, acc = ft.evaluate(program, (X, y))
    assert acc is None and loss == pytest.approx(np.mean((X @ w + b - y) ** 2), rel=1e-4)


def test_fit_arguments():
    X, y = np.zeros((8, 3), np.float32), np.zeros(8, np.float32)
    model = nn.Linear(3, 1)
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), nn.MSELoss(), batch_size=4, input_shape=(3,))
    loader = D.Loader((X, y), 4)
    with pytest.raises(ValueError, match="batch_size applies to"):
        ft.fit(program, loader, batch_size=4, progress=False)
    with pytest.raises(TypeError, match="tuple of 3"):
        ft.fit(program, (X, y, y), progress=False)
    with pytest.raises(ValueError, match="every_n_steps"):
        ft.fit(program, (X, y), step_callbacks=[print], every_n_steps=0, progress=False)
