"""Seeding and random tensors, checked against an independent NumPy Philox4x32-10."""
import os
import random

import numpy as np
import pytest

import fasttrain as ft

M0, M1, W0, W1 = 0xD2511F53, 0xCD9E8D57, 0x9E3779B9, 0xBB67AE85


def philox(counters, key):
    """Philox4x32-10 of an (n, 4) uint32 array of counters, written from the SC'11 paper."""
    c = counters.astype(np.uint64)
    k0, k1 = np.uint64(key[0]), np.uint64(key[1])
    mask = np.uint64(0xFFFFFFFF)
    for _ in range(10):
        p0, p1 = c[:, 0] * np.uint64(M0), c[:, 2] * np.uint64(M1)
        c = np.stack([(p1 >> np.uint64(32)) ^ c[:, 1] ^ k0, p1 & mask,
                      (p0 >> np.uint64(32)) ^ c[:, 3] ^ k1, p0 & mask], axis=1)
        k0, k1 = (k0 + np.uint64(W0)) & mask, (k1 + np.uint64(W1)) & mask
    return c.astype(np.uint32)


def test_reference_philox_matches_random123_vectors():
    # Random123's kat_vectors for philox4x32_10
    cases = [
        ([0, 0, 0, 0], [0, 0], [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]),
        ([0xFFFFFFFF] * 4, [0xFFFFFFFF] * 2, [0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD]),
        ([0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344], [0xA4093822, 0x299F31D0],
         [0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1]),
    ]
    for ctr, key, want in cases:
        assert philox(np.array([ctr], np.uint32), key)[0].tolist() == want


def blocks(seed, first, n):
    ctr = np.zeros((n, 4), np.uint32)
    idx = np.arange(first, first + n, dtype=np.uint64)
    ctr[:, 0], ctr[:, 1] = idx & np.uint64(0xFFFFFFFF), idx >> np.uint64(32)
    return philox(ctr, [seed & 0xFFFFFFFF, seed >> 32])


@pytest.mark.parametrize("seed", [0, 1, 2 ** 40 + 7, 2 ** 64 - 1])
def test_rand_is_philox_uniform(seed):
    g = ft.Generator().manual_seed(seed)
    got = ft.rand(1001, generator=g).numpy()
    words = blocks(seed, 0, 251).reshape(-1)[:1001]
    want = (words >> 8).astype(np.float32) * np.float32(2.0 ** -24)
    np.testing.assert_array_equal(got, want)
    # the next draw continues at block 251
    got2 = ft.rand(4, generator=g).numpy()
    want2 = (blocks(seed, 251, 1).reshape(-1) >> 8).astype(np.float32) * np.float32(2.0 ** -24)
    np.testing.assert_array_equal(got2, want2)


def test_rand_float64_uses_53_bits():
    g = ft.Generator().manual_seed(5)
    got = ft.rand(6, generator=g, dtype=ft.float64).numpy()
    w = blocks(5, 0, 3).reshape(-1).astype(np.uint64)
    x = ((w[1::2] << np.uint64(32)) | w[0::2]) >> np.uint64(11)
    np.testing.assert_array_equal(got, x.astype(np.float64) * 2.0 ** -53)


def test_randn_is_box_muller_of_philox():
    g = ft.Generator().manual_seed(11)
    got = ft.randn(8, generator=g, dtype=ft.float32).numpy()
    u = (blocks(11, 0, 2).reshape(-1) >> 8).astype(np.float64) * 2.0 ** -24
    r = np.sqrt(-2 * np.log(1 - u[0::2]))
    z = np.empty(8)
    z[0::2], z[1::2] = r * np.cos(2 * np.pi * u[1::2]), r * np.sin(2 * np.pi * u[1::2])
    np.testing.assert_allclose(got, z.astype(np.float32), rtol=1e-6, atol=1e-6)


def test_normal_of_numbers_and_of_tensors_is_randn_scaled():
    """torch.normal's two forms: numbers and a size (d2l's torch.normal(0, 0.01, size=(n, h))) are randn's draws
    times std plus mean; tensors of means and standard deviations give one sample per element, broadcast; a
    negative std and a size with tensors (or none with numbers) are refused."""
    draws = ft.randn(2, 3, generator=ft.Generator().manual_seed(4)).numpy()
    got = ft.normal(2.0, 0.5, size=(2, 3), generator=ft.Generator().manual_seed(4))
    assert got.dtype == ft.float32 and got.shape == (2, 3)
    np.testing.assert_allclose(got.numpy(), draws * 0.5 + 2.0, rtol=1e-6)
    means, stds = ft.tensor([[0.0], [10.0]]), ft.tensor([1.0, 0.0, 2.0])
    got = ft.normal(means, stds, generator=ft.Generator().manual_seed(4))
    np.testing.assert_allclose(got.numpy(), draws * stds.numpy() + means.numpy(), rtol=1e-6)
    np.testing.assert_array_equal(ft.normal(ft.arange(3.0), 0.0).numpy(), [0.0, 1.0, 2.0])
    for bad, error, match in ((lambda: ft.normal(0, -1.0, (2,)), ValueError, "std >= 0.0, got -1"),
                              (lambda: ft.normal(ft.zeros(2), -1.0), ValueError, "std >= 0.0, got -1"),
                              (lambda: ft.normal(0.0, ft.tensor([1.0, -2.0])), ValueError, "std >= 0.0, got -2"),
                              (lambda: ft.normal(0, 1), TypeError, "give size with numbers"),
                              (lambda: ft.normal(ft.zeros(2), 1.0, (2,)), TypeError, "no size with a tensor")):
        with pytest.raises(error, match=match):
            bad()


@pytest.mark.parametrize("draw", [
    lambda g: ft.rand(300_001, generator=g),
    lambda g: ft.randn(300_001, generator=g, dtype=ft.float64),
    lambda g: ft.randint(-5, 1000, (300_001,), generator=g),
    lambda g: ft.rand(300_001, generator=g, dtype=ft.bfloat16),
    lambda g: ft.randperm(100_000, generator=g),
])
def test_same_numbers_for_any_thread_count(draw, threads):
    results = []
    for n in (1, 2):
        threads(n)
        t = draw(ft.Generator().manual_seed(123))
        results.append((t.float() if t.dtype is ft.bfloat16 else t).numpy().tobytes())
    assert results[0] == results[1]


def test_distributions():
    g = ft.Generator().manual_seed(1)
    u = ft.rand(200_000, generator=g).numpy()
    assert u.min() >= 0 and u.max() < 1 and abs(u.mean() - 0.5) < 0.005 and abs(u.var() - 1 / 12) < 0.002
    n = ft.randn(200_000, generator=g).numpy()
    assert abs(n.mean()) < 0.01 and abs(n.std() - 1) < 0.01
    r = ft.randint(3, 13, (100_000,), generator=g).numpy()
    assert r.min() == 3 and r.max() == 12 and np.all(np.bincount(r - 3) > 9000)
    p = ft.randperm(1000, generator=g).numpy()
    assert sorted(p.tolist()) == list(range(1000)) and p.tolist() != list(range(1000))
    x = ft.empty(50_000, dtype=ft.float16).uniform_(-2, 3, generator=g).numpy()
    assert x.min() >= -2 and x.max() < 3
    y = ft.zeros(10_000, dtype=ft.float64)[::2].normal_(5, 0.5, generator=g).numpy()
    assert abs(y.mean() - 5) < 0.05
    assert ft.randint(0, 2, (10,), dtype=ft.uint8).dtype is ft.uint8
    assert ft.randint(10, (3, 4)).shape == (3, 4)
    assert ft.randperm(0).numel() == 0 and ft.randperm(1).tolist() == [0]


def test_random_bad_inputs():
    with pytest.raises(ValueError):
        ft.randint(5, 5, (3,))
    with pytest.raises(ValueError, match="fit"):
        ft.randint(0, 300, (3,), dtype=ft.uint8)
    with pytest.raises(TypeError):
        ft.zeros(3, dtype=ft.int32).uniform_()
    with pytest.raises(ValueError):
        ft.zeros(3).normal_(0, -1)
    with pytest.raises(ValueError):
        ft.zeros(3).uniform_(2, 1)
    with pytest.raises(ValueError):
        ft.zeros(3).uniform_(0, float("nan"))
    with pytest.raises(ValueError):
        ft.randperm(-1)
    with pytest.raises(TypeError):
        ft.randint(1, 2, 3, 4)
    with pytest.raises(TypeError):
        ft.manual_seed(1.5)
    with pytest.raises(ValueError):
        ft.manual_seed(2 ** 64)
    g = ft.Generator().manual_seed(3)
    with pytest.raises(TypeError):
        g.set_state(b"0" * 16)
    with pytest.raises(ValueError):
        g.set_state(ft.zeros(15, dtype=ft.uint8))
    before = g.get_state().tolist()
    with pytest.raises(ValueError):
        ft.randint(3, 1, (4,), generator=g)
    assert g.get_state().tolist() == before  # a failed draw consumes nothing


def test_generator_state_and_manual_seed():
    ft.manual_seed(42)
    a = ft.rand(5)
    state = ft.get_rng_state()
    b = ft.rand(5)
    ft.set_rng_state(state)
    assert ft.rand(5).tolist() == b.tolist()
    ft.manual_seed(42)
    assert ft.rand(5).tolist() == a.tolist()
    assert ft.initial_seed() == 42
    g = ft.Generator()
    s = g.seed()
    assert g.initial_seed() == s
    assert ft.manual_seed(-1).initial_seed() == 2 ** 64 - 1


def test_seed_everything():
    ft.seed_everything(7)
    r1, n1, f1 = random.random(), np.random.rand(), ft.rand(3).tolist()
    assert os.environ["PYTHONHASHSEED"] == "7"
    ft.seed_everything(7)
    assert (random.random(), np.random.rand(), ft.rand(3).tolist()) == (r1, n1, f1)


def test_deterministic_flag():
    assert ft.are_deterministic_algorithms_enabled() is False
    ft.use_deterministic_algorithms(True)
    try:
        assert ft.are_deterministic_algorithms_enabled() is True
    finally:
        ft.use_deterministic_algorithms(False)


def test_multinomial_with_replacement_is_the_uniforms_through_the_cdf():
    """Each draw is the category whose cumulative share holds the generator's float64 uniform (an independent
    NumPy inverse CDF of the same draws); frequencies follow the weights and a zero weight is never drawn."""
    w = np.array([[1.0, 2.0, 3.0, 4.0, 0.0], [0.0, 0.0, 5.0, 0.0, 1.0]])
    g = ft.Generator().manual_seed(2)
    got = ft.multinomial(ft.tensor(w, dtype=ft.float32), 20_000, replacement=True, generator=g).numpy()
    u = ft.rand(2, 20_000, generator=ft.Generator().manual_seed(2), dtype=ft.float64).numpy()
    cdf = np.cumsum(w, 1) / w.sum(1, keepdims=True)
    want = np.stack([(row[:, None] >= c[None, :]).sum(1) for row, c in zip(u, cdf)])
    np.testing.assert_array_equal(got, want)
    assert got.dtype == np.int64 and got.shape == (2, 20_000)
    freq = np.stack([np.bincount(r, minlength=5) for r in got]) / 20_000
    np.testing.assert_allclose(freq, w / w.sum(1, keepdims=True), atol=0.01)
    assert ft.multinomial(ft.tensor([0.0, 1.0]), 3, replacement=True).tolist() == [1, 1, 1]


def test_multinomial_without_replacement_draws_one_after_another():
    """Without replacement: distinct categories of positive weight, and ordered pairs as often as drawing one
    category, then another from the rest (w_a / W * w_b / (W - w_a)); ft.manual_seed repeats the samples."""
    w = np.array([1.0, 2.0, 3.0, 0.0])
    ft.manual_seed(3)
    rows = ft.multinomial(ft.tensor(np.tile(w, (30_000, 1))), 2).numpy()
    assert rows.shape == (30_000, 2) and (rows[:, 0] != rows[:, 1]).all() and (rows != 3).all()
    W = w.sum()
    for a in range(3):
        for b in range(3):
            if a != b:
                want = w[a] / W * w[b] / (W - w[a])
                assert abs(np.mean((rows[:, 0] == a) & (rows[:, 1] == b)) - want) < 0.01
    ft.manual_seed(3)
    again = ft.multinomial(ft.tensor(np.tile(w, (30_000, 1))), 2).numpy()
    np.testing.assert_array_equal(again, rows)
    assert sorted(ft.multinomial(ft.tensor(w), 3).tolist()) == [0, 1, 2]
    assert ft.multinomial(ft.zeros(0, 4), 2, replacement=True).shape == (0, 2)  # no rows, no draws


@pytest.mark.parametrize("call, error, match", [
    (lambda: ft.multinomial(ft.tensor([1.0, -1.0]), 1), ValueError, "finite and non-negative"),
    (lambda: ft.multinomial(ft.tensor([1.0, float("nan")]), 1), ValueError, "finite and non-negative"),
    (lambda: ft.multinomial(ft.tensor([[1.0, 1.0], [0.0, 0.0]]), 1), ValueError, "positive total weight"),
    (lambda: ft.multinomial(ft.tensor([1.0, 0.0, 1.0]), 3), ValueError, "cannot draw 3 samples without replacement"),
    (lambda: ft.multinomial(ft.tensor([1.0, 1.0]), 0), ValueError, "num_samples must be positive"),
    (lambda: ft.multinomial(ft.ones(2, 2, 2), 1), TypeError, "1-d or 2-d floating-point"),
    (lambda: ft.multinomial(ft.tensor([1, 2]), 1), TypeError, "1-d or 2-d floating-point"),
    (lambda: ft.multinomial(ft.tensor([1.0, 2.0]), 2.5), TypeError, "num_samples must be an int, got float"),
])
def test_multinomial_bad_input(call, error, match):
    with pytest.raises(error, match=match):
        call()
