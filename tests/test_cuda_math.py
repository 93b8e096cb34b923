"""The eager tensor math on CUDA tensors (csrc/ops/math.c, cuda/math.cu) against the same calls on CPU tensors (the
NumPy path): elementwise ops and comparisons bit for bit (float32 too: nvcc compiles without contraction), the
transcendental functions within 2 ulp of the dtype, float sums, means, variances within their rounding (the device
adds in double, NumPy pairwise in the float type), max/min/argmax/argmin, all/any and integer sums bit for bit;
results stay on the device; bad input raises as on the CPU."""
import numpy as np
import pytest

import fasttrain as ft
from _cudaref import mixed_devices, same_error
from _mathcases import (BINARY, BITWISE, DTYPES, FLOATS, INTS, REDUCTIONS_FLOAT, UNARY_EXACT,
                        UNARY_INEXACT, View, binary_pairs, exact_reduction_calls, layouts, place, reduction_views,
                        refused_for_bool, same, sample)
from fasttrain import _math

pytestmark = pytest.mark.cuda

# float sums: NumPy adds pairwise in the result's float type (float32 for 16-bit), the device in double
SUM_RTOL = {"float16": 2 ** -9, "bfloat16": 2 ** -7, "float32": 1e-5, "float64": 1e-12}


def check(fn, args, exact, rtol=None, **kw):
    want = fn(*place(args, "cpu"), **kw)
    got = fn(*place(args, "cuda"), **kw)
    pairs = zip(got, want) if isinstance(want, tuple) else [(got, want)]
    for g, w in pairs:
        assert g.is_cuda, "the result left the device"
        same(g, w, exact, rtol)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", BINARY)
def test_binary_ops_broadcast_over_any_strides(dtype, name):
    if dtype == "bool" and refused_for_bool(name):
        pytest.skip("refused for bool on both devices")
    fn = getattr(_math, name)
    for a, b in binary_pairs(dtype, name):
        check(fn, [a, b], exact=True)


@pytest.mark.parametrize("dtype", ["uint8", "int8", "int32", "int64", "uint64", "float32", "bfloat16", "float16"])
def test_scalars_and_cpu_0d_tensors(dtype):
    a = layouts(dtype, 3)[1]
    for s in (2, -3, 1000, 2.5, -0.1, True, np.float32(1.5), np.int8(-7)):
        if dtype == "uint64" and isinstance(s, (int, np.integer)) and s < 0:
            continue
        for name in ("add", "mul", "maximum", "lt", "eq"):
            check(getattr(_math, name), [a, s], exact=True)
            check(getattr(_math, name), [s, a], exact=True)
    # a 0-d CPU tensor goes with a CUDA tensor, as in PyTorch
    x, zero_d = ft.ones((2, 3), device="cuda").to(dtype), ft.tensor(3).to(dtype)
    same(x * zero_d, ft.ones((2, 3)).to(dtype) * zero_d, exact=True)


@pytest.mark.parametrize("dtypes", [("int8", "uint8"), ("int32", "float16"), ("bfloat16", "float16"),
                                    ("float32", "bfloat16"), ("int64", "float64"), ("bool", "int16"),
                                    ("float32", "float64"), ("uint8", "bool")])
def test_mixed_dtypes_promote_as_on_the_cpu(dtypes):
    x, y = dtypes
    a, b = layouts(x, 4, special=True)[0], layouts(y, 5, special=True)[2]
    for name in ("add", "mul", "div", "maximum", "ge"):
        check(getattr(_math, name), [a, b], exact=True)
    check(ft.add, [a, View(sample(y, (), 6), lambda t: t, "0-d")], exact=True)


@pytest.mark.parametrize("dtype", INTS + ["uint16", "uint32", "uint64"])
def test_integer_division_and_wrap_around(dtype):
    info = np.iinfo(dtype)
    vals = [info.min, info.min + 1, -7, -1, 0, 1, 7, info.max] if info.min < 0 else [0, 1, 7, 200, info.max]
    a = ft.tensor(np.array(vals, dtype=dtype).reshape(-1, 1))
    b = ft.tensor(np.array([v for v in vals if v != 0], dtype=dtype))
    for fn, kw in ((ft.floor_divide, {}), (ft.remainder, {}), (ft.div, {"rounding_mode": "trunc"}),
                   (ft.div, {"rounding_mode": "floor"}), (ft.mul, {}), (ft.sub, {}), (ft.add, {})):
        check(fn, [a, b], exact=True, **kw)


@pytest.mark.parametrize("dtype", ["int8", "int64", "uint8", "float32", "bfloat16", "float64"])
def test_pow(dtype):
    a = ft.tensor([[-3, -2, -1, 0, 1, 2, 3]]).to(dtype)
    b = ft.tensor([[0], [1], [2], [5]] + ([] if dtype == "uint8" else [[-1], [-2]])).to(dtype)
    check(ft.pow, [a, b], exact=dtype not in FLOATS)
    check(ft.pow, [a, 2], exact=dtype not in FLOATS)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", UNARY_EXACT + UNARY_INEXACT + ["bitwise_not"])
def test_unary_ops(dtype, name):
    if dtype == "bool" and refused_for_bool(name):
        pytest.skip("refused for bool on both devices")
    if name == "bitwise_not" and dtype in FLOATS:
        pytest.skip("refused for floats on both devices")
    for a in layouts(dtype, 7, special=True):
        check(getattr(_math, name), [a], exact=name not in UNARY_INEXACT)


@pytest.mark.parametrize("dtype", INTS + ["uint64", "bool"])
@pytest.mark.parametrize("name", BITWISE)
def test_bitwise_ops(dtype, name):
    for a in layouts(dtype, 1)[:3]:
        for b in layouts(dtype, 2)[2:6]:
            check(getattr(_math, name), [a, b], exact=True)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16", "int16", "uint8", "float64"])
def test_where_clamp_and_in_place_ops(dtype):
    cond = View(sample("bool", (4, 1), 9), lambda t: t, "cond")
    for a in layouts(dtype, 1, special=True)[:4]:
        for b in layouts(dtype, 2)[3:6]:
            check(ft.where, [cond, a, b], exact=True)
        check(ft.where, [cond, a, 2], exact=True)
        check(ft.clamp, [a, -1, 2], exact=True)
        check(ft.clamp, [a], exact=True, min=0)
        check(ft.clamp, [a], exact=True, max=1)
    x = sample(dtype, (3, 4), 5)
    gx = x.to("cuda")
    gx[:, 1:].add_(2)
    x[:, 1:].add_(2)
    same(gx, x, exact=True)


@pytest.mark.parametrize("dtype", DTYPES)
def test_exact_reductions_over_any_dims_with_keepdim(dtype):
    for v in reduction_views(dtype):
        for name, kw in exact_reduction_calls():
            fn = getattr(ft, name)
            check(fn, [v], exact=True, **kw)
        if dtype != "bool":
            for dim in (None, 1, (0, 2), -1):
                check(ft.sum, [v], exact=dtype not in FLOATS, rtol=SUM_RTOL.get(dtype), dim=dim)


def test_ties_and_nan_pick_the_first_position():
    x = ft.tensor([[1.0, 3.0, 3.0, float("nan"), float("nan")], [2.0, 2.0, -1.0, -1.0, 0.0]])
    for fn in (ft.argmax, ft.argmin):
        check(fn, [x], exact=True, dim=1)
    check(ft.max, [x], exact=True, dim=1)
    big = ft.zeros(100_000)  # many partials of one block, all tied
    assert ft.argmax(big.to("cuda")).item() == 0
    big[77_777] = 1
    assert ft.argmax(big.to("cuda")).item() == 77_777


@pytest.mark.parametrize("dtype", FLOATS)
def test_float_reductions_within_their_rounding_and_repeatable(dtype):
    base = sample(dtype, (6, 7, 9), 13)
    for v in (View(base, lambda t: t, "contiguous"), View(base, lambda t: t.permute(2, 0, 1), "permuted")):
        for name in REDUCTIONS_FLOAT:
            for dim in (None, 0, -1, (0, 2)):
                for keepdim in (False, True):
                    check(getattr(ft, name), [v], exact=False, rtol=SUM_RTOL[dtype], dim=dim, keepdim=keepdim)
    check(ft.var, [View(base, lambda t: t, "c")], exact=False, rtol=SUM_RTOL[dtype], dim=1, correction=0)
    check(ft.sum, [View(sample("int32", (5, 6), 1), lambda t: t, "c")], exact=False, rtol=1e-6, dim=0,
          dtype=ft.float32)
    big = sample(dtype, (1_000_003,), 3).to("cuda")
    first = ft.sum(big)
    assert all(bool(ft.sum(big) == first) for _ in range(3)), "a float sum changed between runs"


def test_empty_and_0d_tensors():
    empty = View(sample("float32", (0, 3), 1), lambda t: t, "empty")
    zero_d = View(sample("int32", (), 2), lambda t: t, "0-d")
    for fn, kw in ((ft.sum, {}), (ft.sum, {"dim": 0}), (ft.mean, {"dim": 0}), (ft.all, {}), (ft.any, {"dim": 1}),
                   (ft.max, {"dim": 1}), (ft.argmin, {"dim": 1, "keepdim": True}), (ft.var, {"dim": 0})):
        check(fn, [empty], exact=True, **kw)
    check(ft.add, [empty, View(sample("float32", (3,), 3), lambda t: t, "row")], exact=True)
    for fn, kw in ((ft.sum, {}), (ft.max, {}), (ft.argmax, {}), (ft.max, {"dim": 0}), (ft.sum, {"dim": 0}),
                   (ft.sum, {"dim": -1, "keepdim": True}), (ft.neg, {}), (ft.argmin, {"dim": 0, "keepdim": True})):
        check(fn, [zero_d], exact=True, **kw)


def test_bad_input_raises_as_on_the_cpu():
    cpu, gpu = ft.ones((2, 3)), ft.ones((2, 3), device="cuda")
    mixed_devices(lambda: gpu + ft.ones((2, 3)))
    mixed_devices(lambda: ft.where(ft.ones((2, 3), device="cuda") > 0, gpu, cpu))
    same_error(lambda: cpu + ft.ones(4), lambda: gpu + ft.ones(4, device="cuda"), ValueError)
    ints = ft.tensor([4, 5, 6], dtype=ft.int32)
    zeros = ft.tensor([1, 0, 2], dtype=ft.int32)
    for fn in (ft.floor_divide, ft.remainder, lambda a, b: ft.div(a, b, rounding_mode="trunc")):
        same_error(lambda: fn(ints, zeros), lambda: fn(ints.to("cuda"), zeros.to("cuda")), ZeroDivisionError)
        same_error(lambda: fn(ints, 0), lambda: fn(ints.to("cuda"), 0), ZeroDivisionError)
    same_error(lambda: ft.max(ft.ones((2, 0)), dim=1), lambda: ft.max(ft.ones((2, 0), device="cuda"), dim=1),
               IndexError)
    same_error(lambda: ft.mean(ints), lambda: ft.mean(ints.to("cuda")), TypeError)
    same_error(lambda: ft.sum(cpu, dim=2), lambda: ft.sum(gpu, dim=2), IndexError)
    same_error(lambda: -ft.ones(2, dtype=ft.bool), lambda: -ft.ones(2, dtype=ft.bool, device="cuda"), TypeError)
