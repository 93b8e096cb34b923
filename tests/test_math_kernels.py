"""The C ops behind the eager tensor math on CUDA tensors (csrc/ops/math.c), run here through their CPU reference
loops, which call the same per-element functions (csrc/kernels/math.h) as the CUDA kernels: every call of the
NumPy path on CPU tensors against the same call with the C ops switched on for the CPU (_math._KERNEL_DEVICES).
Exact math is compared bit for bit; transcendental functions within 2 ulp, float sums within their rounding."""
import numpy as np
import pytest

import fasttrain as ft
from fasttrain import _math

from _mathcases import (BINARY, BITWISE, DTYPES, FLOATS, INTS, REDUCTIONS_FLOAT, UNARY_EXACT,
                        UNARY_INEXACT, View, binary_pairs, exact_reduction_calls, layouts, place, reduction_views,
                        refused_for_bool, same, sample)


# float sums: NumPy adds pairwise in the result's float type (float32 for 16-bit), the C ops in double
SUM_RTOL = {"float16": 2 ** -9, "bfloat16": 2 ** -7, "float32": 1e-5, "float64": 1e-12}


@pytest.fixture
def both(monkeypatch):
    """call(fn, *args, **kw) -> (the NumPy path's result, the C ops' result) of fn on CPU tensors."""
    def call(fn, *args, **kw):
        want = fn(*place(args, "cpu"), **kw)
        with monkeypatch.context() as m:
            m.setattr(_math, "_KERNEL_DEVICES", ("cpu", "cuda"))
            got = fn(*place(args, "cpu"), **kw)
        return got, want
    return call


def check(both, fn, args, exact, **kw):
    got, want = both(fn, *args, **kw)
    if isinstance(want, tuple):
        for g, w in zip(got, want):
            same(g, w, exact)
    else:
        same(got, want, exact)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", BINARY)
def test_binary_ops_in_every_layout_agree_with_numpy(both, dtype, name):
    if dtype == "bool" and refused_for_bool(name):
        pytest.skip("refused for bool on both paths")
    fn = getattr(_math, name)
    for a, b in binary_pairs(dtype, name):
        check(both, fn, [a, b], exact=True)


@pytest.mark.parametrize("dtype", ["uint8", "int8", "int32", "int64", "uint64", "float32", "bfloat16", "float16"])
def test_scalars_are_cast_as_the_cpu_path_casts_them(both, dtype):
    a = layouts(dtype, 3)[1]
    for s in (2, -3, 1000, 2.5, -0.1, True, np.float32(1.5), np.int8(-7)):
        if dtype == "uint64" and isinstance(s, (int, np.integer)) and s < 0:
            continue
        for name in ("add", "mul", "maximum", "lt", "eq"):
            check(both, getattr(ft, name), [a, s], exact=True)
            check(both, getattr(ft, name), [s, a], exact=True)


@pytest.mark.parametrize("dtypes", [("int8", "uint8"), ("int32", "float16"), ("bfloat16", "float16"),
                                    ("float32", "bfloat16"), ("int64", "float64"), ("bool", "int16"),
                                    ("float32", "float64"), ("uint8", "bool")])
def test_mixed_dtypes_promote_and_round_as_the_cpu_path(both, dtypes):
    x, y = dtypes
    a, b = layouts(x, 4, special=True)[0], layouts(y, 5, special=True)[2]
    for name in ("add", "mul", "div", "maximum", "ge"):
        check(both, getattr(ft, name), [a, b], exact=True)
    # a 0-d tensor of another dtype is rounded to a 16-bit result dtype first
    check(both, ft.add, [a, View(sample(y, (), 6), lambda t: t, "0-d")], exact=True)


@pytest.mark.parametrize("dtype", INTS + ["uint16", "uint32", "uint64"])
def test_integer_division_rounds_and_wraps_as_numpy(both, dtype):
    info = np.iinfo(dtype)
    vals = [info.min, info.min + 1, -7, -1, 0, 1, 7, info.max] if info.min < 0 else [0, 1, 7, 200, info.max]
    a = ft.tensor(np.array(vals, dtype=dtype).reshape(-1, 1))
    b = ft.tensor(np.array([v for v in vals if v != 0], dtype=dtype))
    for fn, kw in ((ft.floor_divide, {}), (ft.remainder, {}), (ft.div, {"rounding_mode": "trunc"}),
                   (ft.div, {"rounding_mode": "floor"}), (ft.mul, {}), (ft.sub, {}), (ft.add, {})):
        check(both, fn, [a, b], exact=True, **kw)


@pytest.mark.parametrize("dtype", ["int8", "int32", "int64", "uint8"])
def test_integer_division_by_zero_raises_on_both_paths(both, dtype, monkeypatch):
    a, b = ft.tensor([4, 5, 6]).to(dtype), ft.tensor([1, 0, 2]).to(dtype)
    for fn in (ft.floor_divide, ft.remainder, lambda x, y: ft.div(x, y, rounding_mode="trunc")):
        # 256 wraps to 0 in the 8-bit types
        for args in ((a, b), (a, 0)) + (((a, 256),) if dtype in ("int8", "uint8") else ()):
            with pytest.raises(ZeroDivisionError, match="integer division or modulo by zero"):
                fn(*args)
            with monkeypatch.context() as m:
                m.setattr(_math, "_KERNEL_DEVICES", ("cpu",))
                with pytest.raises(ZeroDivisionError, match="integer division or modulo by zero"):
                    fn(*args)


@pytest.mark.parametrize("dtype", ["int8", "int32", "int64", "uint8", "float32", "bfloat16", "float64"])
def test_pow_as_the_cpu_path(both, dtype):
    a = ft.tensor([[-3, -2, -1, 0, 1, 2, 3]]).to(dtype)
    b = ft.tensor([[0], [1], [2], [5], [-1], [-2]] if dtype not in ("uint8",) else [[0], [1], [2], [5]]).to(dtype)
    check(both, ft.pow, [a, b], exact=dtype not in FLOATS)
    check(both, ft.pow, [a, 2], exact=dtype not in FLOATS)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", UNARY_EXACT + UNARY_INEXACT + ["bitwise_not"])
def test_unary_ops_agree_with_numpy(both, dtype, name):
    if dtype == "bool" and refused_for_bool(name):
        pytest.skip("refused for bool on both paths")
    if name == "bitwise_not" and dtype in FLOATS:
        pytest.skip("refused for floats on both paths")
    exact = name in UNARY_EXACT + ["bitwise_not"]
    for a in layouts(dtype, 7, special=True):
        check(both, getattr(_math, name), [a], exact=exact)


@pytest.mark.parametrize("dtype", INTS + ["uint64"])
@pytest.mark.parametrize("name", BITWISE)
def test_bitwise_ops(both, dtype, name):
    for a in layouts(dtype, 1)[:3]:
        for b in layouts(dtype, 2)[2:6]:
            check(both, getattr(_math, name), [a, b], exact=True)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int16", "uint8", "float64"])
def test_where_and_clamp(both, dtype):
    cond = View(sample("bool", (4, 1), 9), lambda t: t, "cond")
    for a in layouts(dtype, 1, special=True)[:4]:
        for b in layouts(dtype, 2)[3:6]:
            check(both, ft.where, [cond, a, b], exact=True)
        check(both, ft.where, [cond, a, 2], exact=True)
        check(both, ft.clamp, [a, -1, 2], exact=True)
        check(both, ft.clamp, [a], exact=True, min=0)
        check(both, ft.clamp, [a], exact=True, max=1)
        check(both, ft.clamp, [a, layouts(dtype, 3)[3], 50], exact=True)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "bool"])
def test_operands_longer_than_the_loops_runs_and_blocks(both, dtype):
    """The typed float loop works in runs of 256 values and blocks of 16384 elements: rows that end inside a run,
    runs that cross a block, strided and broadcast operands over 3 * 7 * 1001 elements, NaN and infinities."""
    base = sample(dtype, (3, 1001, 7), 21, special=True)
    views = [View(base, lambda t: t.permute(0, 2, 1), "permuted"),
             View(sample(dtype, (3, 7, 2001), 22, special=True), lambda t: t[:, :, ::2], "strided"),
             View(sample(dtype, (7, 1), 23), lambda t: t, "column (7, 1)"),
             View(sample(dtype, (1001,), 24), lambda t: t, "row (1001,)")]
    cond = View(sample("bool", (3, 7, 1001), 25), lambda t: t, "cond")
    names = ("eq", "ne") if dtype == "bool" else ("add", "sub", "mul", "div", "maximum", "minimum", "lt", "ge")
    for a in views[:2]:
        for b in views:
            for name in names:
                check(both, getattr(_math, name), [a, b], exact=True)
            check(both, ft.where, [cond, a, b], exact=True)
        check(both, ft.where, [cond, 0.5 if dtype != "bool" else True, a], exact=True)
        if dtype == "bool":
            check(both, ft.logical_not, [a], exact=True)
        else:
            check(both, ft.clamp, [a, views[2], 0.75], exact=True)
            for name in ("neg", "abs", "relu"):
                check(both, getattr(ft, name), [a], exact=True)


@pytest.mark.parametrize("dtype", DTYPES)
def test_exact_reductions_over_any_dims(both, dtype):
    for v in reduction_views(dtype):
        for name, kw in exact_reduction_calls():
            fn = getattr(_math, name)
            check(both, fn, [v], exact=True, **kw)
        if dtype != "bool":
            for dim in (None, 1, (0, 2), -1):
                got, want = both(ft.sum, v, dim=dim)
                same(got, want, exact=dtype not in FLOATS, rtol=SUM_RTOL.get(dtype))


@pytest.mark.parametrize("dtype", FLOATS)
def test_float_reductions_within_their_rounding(both, dtype):
    base = sample(dtype, (6, 7, 9), 13)
    rtol = SUM_RTOL[dtype]
    for v in (View(base, lambda t: t, "contiguous"), View(base, lambda t: t.permute(2, 0, 1), "permuted")):
        for name in REDUCTIONS_FLOAT:
            for dim in (None, 0, -1, (0, 2)):
                for keepdim in (False, True):
                    got, want = both(getattr(ft, name), v, dim=dim, keepdim=keepdim)
                    same(got, want, exact=False, rtol=rtol)
    got, want = both(ft.var, View(base, lambda t: t, "c"), dim=1, correction=0)
    same(got, want, exact=False, rtol=rtol)
    got, want = both(ft.sum, View(sample("int32", (5, 6), 1), lambda t: t, "c"), dim=0, dtype=ft.float32)
    same(got, want, exact=False, rtol=1e-6)


def test_edge_shapes(both):
    empty = View(sample("float32", (0, 3), 1), lambda t: t, "empty")
    zero_d = View(sample("int32", (), 2), lambda t: t, "0-d")
    for fn, kw in ((ft.sum, {}), (ft.sum, {"dim": 0}), (ft.mean, {"dim": 0}), (ft.all, {}), (ft.any, {"dim": 1}),
                   (ft.max, {"dim": 1}), (ft.argmin, {"dim": 1, "keepdim": True}), (ft.var, {"dim": 0})):
        check(both, fn, [empty], exact=True, **kw)
    check(both, ft.add, [empty, View(sample("float32", (3,), 3), lambda t: t, "row")], exact=True)
    for fn, kw in ((ft.sum, {}), (ft.max, {}), (ft.argmax, {}), (ft.max, {"dim": 0}), (ft.sum, {"dim": 0}),
                   (ft.sum, {"dim": -1, "keepdim": True}), (ft.neg, {}), (ft.argmin, {"dim": 0, "keepdim": True})):
        check(both, fn, [zero_d], exact=True, **kw)


def test_errors_are_the_cpu_paths(both, monkeypatch):
    monkeypatch.setattr(_math, "_KERNEL_DEVICES", ("cpu",))
    x = ft.ones((2, 3))
    with pytest.raises(ValueError, match="cannot be broadcast"):
        x + ft.ones((4,))
    with pytest.raises(IndexError, match="non-zero size"):
        ft.max(ft.ones((2, 0)), dim=1)
    with pytest.raises(TypeError, match="mean"):
        ft.mean(ft.ones(3, dtype=ft.int32))
    with pytest.raises(IndexError, match="out of range"):
        ft.sum(x, dim=2)


def test_the_c_ops_refuse_bad_arguments():
    x = ft.ones((2, 3))
    with pytest.raises(ValueError, match="unknown elementwise op"):
        ft._C.math_pointwise("nope", [x, x], ft.float32._code, (2, 3))
    with pytest.raises(TypeError, match="not supported for int32"):
        ft._C.math_pointwise("exp", [ft.ones(3, dtype=ft.int32)], ft.int32._code, (3,))
    with pytest.raises(ValueError, match="takes 2 operands"):
        ft._C.math_pointwise("add", [x], ft.float32._code, (2, 3))
    with pytest.raises(TypeError, match="needs a tensor operand"):
        ft._C.math_pointwise("add", [1, 2], ft.float32._code, ())
    with pytest.raises(ValueError, match=r"add: other \(2, 3\) does not broadcast to out \(3, 3\)"):
        ft._C.math_pointwise("add", [ft.ones((3, 1)), x], ft.float32._code, (3, 3))
    with pytest.raises(ValueError, match="no reduction of inp"):
        ft._C.math_reduce("sum", x, (3, 1), ft.float32._code, ft.float32._code)
    with pytest.raises(TypeError, match="float64"):
        ft._C.math_reduce("var", x, (1, 1), ft.float32._code, ft.float32._code)
    with pytest.raises(IndexError, match="no elements"):
        ft._C.math_reduce("max", ft.ones((2, 0)), (2, 1), ft.float32._code, ft.float32._code)
    with pytest.raises(ValueError, match="only max and min"):
        ft._C.math_reduce("sum", x, (1, 1), ft.float32._code, ft.float32._code, indices=True)
    with pytest.raises(TypeError, match="complex"):
        ft._C.math_pointwise("add", [x, x], ft.complex64._code, (2, 3))
