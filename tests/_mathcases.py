"""Cases for the C ops behind the eager tensor math (csrc/ops/math.c), shared by tests/test_math_kernels.py (their
CPU reference loops against the NumPy path) and tests/test_cuda_math.py (the CUDA kernels against the CPU).

A case is a call of an ft function on arguments built from contiguous CPU tensors: `place(args, device)` moves
each tensor to the device first and only then takes its view (a transpose, a strided slice, an expansion), so the
device kernels see the same strides as the CPU. `same(got, want, exact)` compares a result with the CPU's: bit for
bit where the math is exact, else within a tolerance of the result's dtype."""
import numpy as np

import fasttrain as ft

DTYPES = ["bool", "uint8", "int8", "int16", "int32", "int64", "uint16", "uint32", "uint64", "float16", "bfloat16",
          "float32", "float64"]
FLOATS = ["float16", "bfloat16", "float32", "float64"]
INTS = ["uint8", "int8", "int16", "int32", "int64"]
# the relative error of the transcendental functions (libm, NumPy's SIMD loops, CUDA's) in each dtype: 2 ulp
ULP2 = {"float16": 2 ** -9, "bfloat16": 2 ** -6, "float32": 2 ** -22, "float64": 2 ** -51}


def sample(dtype, shape, seed=0, special=False):
    """A CPU tensor of dtype with values that exercise signs and wrap-around (special: also inf, -inf and NaN)."""
    rng = np.random.default_rng(seed)
    n = int(np.prod(shape))
    if dtype == "bool":
        a = rng.random(n) < 0.5
    elif dtype in FLOATS:
        a = (rng.standard_normal(n) * 3).astype(np.float32)
        if special and n >= 4:
            a[:3] = [np.inf, -np.inf, np.nan]
    else:
        info = np.iinfo(dtype)
        lo, hi = max(int(info.min), -100), min(int(info.max), 100)
        a = rng.integers(lo, hi + 1, n)
    t = ft.from_numpy(np.asarray(a).reshape(shape))
    return t.to(dtype)


class View:
    """base (a CPU tensor) moved to a device, then fn of it (a view)."""

    def __init__(self, base, fn, label):
        self.base, self.fn, self.label = base, fn, label

    def __repr__(self):
        return self.label


def place(args, device):
    return [a.fn(a.base.to(device)) if isinstance(a, View) else a.to(device) if isinstance(a, ft.Tensor) else a
            for a in args]


def layouts(dtype, seed=0, special=False):
    """Operands of shape (4, 5) in several layouts, and ones that broadcast against it."""
    return [
        View(sample(dtype, (4, 5), seed, special), lambda t: t, "contiguous"),
        View(sample(dtype, (5, 4), seed, special), lambda t: t.t(), "transposed"),
        View(sample(dtype, (8, 11), seed, special), lambda t: t[::2, 1::2][:, :5], "strided slice"),
        View(sample(dtype, (5,), seed, special), lambda t: t, "row (5,)"),
        View(sample(dtype, (4, 1), seed, special), lambda t: t, "column (4, 1)"),
        View(sample(dtype, (), seed, special), lambda t: t, "0-d"),
        View(sample(dtype, (1, 5), seed, special), lambda t: t.expand(4, 5), "expanded"),
    ]


def bits(t):
    """A result as a NumPy array compared bit for bit (bfloat16 through its float32 widening, which is exact)."""
    a = t.cpu()
    return np.asarray(a.to("float32") if a.dtype == ft.bfloat16 else a)


def same(got, want, exact, rtol=None):
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    assert got.shape == want.shape, (got.shape, want.shape)
    g, w = bits(got), bits(want)
    if exact or not want.dtype.is_floating_point:
        if g.dtype.kind == "f":
            same_nan = np.isnan(g) == np.isnan(w)
            assert same_nan.all() and np.array_equal(g[~np.isnan(g)], w[~np.isnan(w)]), (g, w)
            # signed zeros too
            assert np.array_equal(np.signbit(g[~np.isnan(g)]), np.signbit(w[~np.isnan(w)])), (g, w)
        else:
            assert np.array_equal(g, w), (g, w)
        return
    g, w = g.astype(np.float64), w.astype(np.float64)
    scale = np.max(np.abs(w[np.isfinite(w)]), initial=1.0)
    rtol = ULP2[want.dtype.name] if rtol is None else rtol
    np.testing.assert_allclose(g, w, rtol=rtol, atol=rtol * scale * 1e-3, equal_nan=True)


BINARY = ["add", "sub", "mul", "div", "floor_divide", "remainder", "maximum", "minimum", "eq", "ne", "lt", "le",
          "gt", "ge"]
BITWISE = ["bitwise_and", "bitwise_or", "bitwise_xor"]
UNARY_EXACT = ["neg", "abs", "relu", "sqrt", "rsqrt"]
UNARY_INEXACT = ["exp", "log", "tanh", "sigmoid"]
REDUCTIONS_EXACT = ["max", "min", "argmax", "argmin", "all", "any"]


def binary_pairs(dtype, name):
    """Operand pairs for binary op `name` in dtype: every layout with each of the first four, both ways round
    (integer divisors without zeros, which both paths refuse)."""
    for a in layouts(dtype, 1, special=True):
        for b in layouts(dtype, 2, special=True)[:4]:
            if dtype not in FLOATS and name in ("floor_divide", "remainder"):
                b = View(b.base, lambda t, f=b.fn: f(t) + (f(t) == 0).to(t.dtype), f"{b} without zeros")
            yield a, b
            yield b, a


def reduction_views(dtype):
    """A (3, 4, 5) tensor of dtype as stored, transposed, and a stride-2 slice."""
    base = sample(dtype, (3, 4, 5), 11, special=True)
    return [View(base, lambda t: t, "contiguous"), View(base, lambda t: t.transpose(0, 2), "transposed"),
            View(sample(dtype, (3, 8, 5), 12), lambda t: t[:, ::2], "strided")]


def exact_reduction_calls():
    """(name, keyword arguments) of each exact reduction: over all dims, one, several or none, with keepdim."""
    for name in REDUCTIONS_EXACT:
        if name in ("all", "any"):
            calls = [dict(dim=d, keepdim=k) for d in (None, 0, -1, (0, 2), ()) for k in (False, True)]
        else:
            calls = [{}] + [dict(dim=d, keepdim=k) for d in (0, 1, -1) for k in (False, True)]
        for kw in calls:
            yield name, kw
REDUCTIONS_FLOAT = ["sum", "mean", "var", "std"]


def refused_for_bool(name):
    return name in ("sub", "floor_divide", "remainder", "neg", "abs", "relu", "pow")
