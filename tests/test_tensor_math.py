"""The eager tensor math (python/fasttrain/_math.py): operators, elementwise functions, reductions, selection,
joining and advanced indexing against NumPy as the independent reference (values, dtypes, shapes, keepdim,
negative dims, empty and non-contiguous inputs, bfloat16), in-place identity, error messages, and PyTorch's type
promotion written out; against PyTorch itself when it is installed (the promotion matrix, every operator over
every dtype pair, topk, sort, unique, std and var)."""
import itertools
import math
import operator
import warnings

import numpy as np
import pytest

import fasttrain as ft

F, nn = ft.nn.functional, ft.nn
rng = np.random.default_rng(0)
TOL = {"float16": 1e-3, "bfloat16": 8e-3, "float32": 2e-6, "float64": 1e-12}
REAL = ["bool", "uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16", "float32", "float64"]


def n(t):
    """The values of a tensor as NumPy (bfloat16 as float32)."""
    return np.asarray(t)


def assert_values(got, want, dtype):
    """got (a tensor) has dtype and want's values: within dtype's rounding for floats, exactly otherwise."""
    assert got.dtype is getattr(ft, dtype), (got.dtype, dtype)
    want = np.asarray(want)
    assert got.shape == want.shape
    if dtype in TOL:
        np.testing.assert_allclose(n(got), want.astype(np.float64), rtol=TOL[dtype], atol=TOL[dtype], equal_nan=True)
    else:
        np.testing.assert_array_equal(n(got), want.astype(dtype))


def sample(dtype, shape, nonzero=False, seed=0):
    """(float64 values exactly representable in dtype, the tensor holding them)."""
    r = np.random.default_rng(seed)
    v = r.integers(-5, 6, shape).astype(np.float64)
    if dtype == "bool":
        v = (v > 0).astype(np.float64)
    elif dtype.startswith("uint"):
        v = np.abs(v)
    elif dtype.startswith(("float", "bfloat")):
        v = v + np.round(r.random(shape), 2)
    if nonzero:
        v = np.where(v == 0, 1.0, v)
    t = ft.tensor(v, dtype=dtype)
    return n(t).astype(np.float64), t


# ================================================================ type promotion, written out

PROMOTE = [
    ("bool", "bool", "bool"), ("bool", "uint8", "uint8"), ("bool", "float16", "float16"), ("uint8", "int8", "int16"),
    ("uint8", "int16", "int16"), ("int8", "int64", "int64"), ("int32", "uint8", "int32"),
    ("int32", "float16", "float16"),
    ("int64", "bfloat16", "bfloat16"), ("float16", "bfloat16", "float32"), ("float16", "float32", "float32"),
    ("bfloat16", "float64", "float64"), ("float32", "float64", "float64"), ("uint16", "float32", "float32"),
    ("uint16", "uint16", "uint16"),
]


@pytest.mark.parametrize("a, b, want", PROMOTE)
def test_promote_types_written_out(a, b, want):
    assert ft.promote_types(a, b) is getattr(ft, want)
    assert ft.promote_types(getattr(ft, b), getattr(ft, a)) is getattr(ft, want)


def test_promote_types_refuses_what_pytorch_refuses():
    for a, b in [("uint16", "int32"), ("uint64", "int64"), ("uint32", "bool"), ("uint16", "uint8")]:
        with pytest.raises(TypeError, match="uint16, uint32 and uint64"):
            ft.promote_types(a, b)
    with pytest.raises(TypeError, match="storage-only"):
        ft.promote_types("complex64", "float32")


def operand(spec):
    """('int64', (3,)) -> a tensor of ones of that dtype and shape; anything else is itself."""
    return ft.ones(spec[1], dtype=spec[0]) if isinstance(spec, tuple) else spec


RESULT_TYPE = [
    (("int64", (3,)), 2.5, "float32"),            # a Python float with integers: the default dtype
    (("int64", (3,)), 2, "int64"),
    (("int32", (3,)), 2, "int32"),                # a Python int does not widen an integer tensor
    (("int8", (3,)), 1000, "int8"),
    (("float32", (3,)), 2.5, "float32"),
    (("float16", (3,)), 2.5, "float16"),
    (("bfloat16", (3,)), 2.5, "bfloat16"),
    (("float32", (3,)), ("float64", (3,)), "float64"),
    (("float32", (3,)), ("float64", ()), "float32"),  # a 0-d tensor of the same category counts as a scalar
    (("int32", (3,)), ("float64", ()), "float64"),    # ... but raises the category with its own dtype
    (("int8", (3,)), ("int64", ()), "int8"),
    (("bool", (3,)), True, "bool"),
    (("bool", (3,)), 2, "int64"),
    (("bool", (3,)), ("int8", ()), "int8"),
    (("uint8", (3,)), ("int8", (3,)), "int16"),
    (("bfloat16", (3,)), ("float32", ()), "bfloat16"),
    (("int64", ()), 2.5, "float32"),
    (("bool", ()), 2.5, "float32"),
    (("int64", ()), ("int8", (3,)), "int8"),
    (("int32", (3,)), np.float64(2.0), "float32"),    # NumPy scalars count as Python scalars
    (("int32", (3,)), np.ones(3), "float64"),         # NumPy arrays as tensors
    (("uint16", (3,)), 7, "uint16"),
]


@pytest.mark.parametrize("a, b, want", RESULT_TYPE)
def test_result_type_written_out_and_operators_follow_it(a, b, want):
    x, y = operand(a), operand(b)
    assert ft.result_type(x, y) is getattr(ft, want)
    assert ft.result_type(y, x) is getattr(ft, want)
    assert (x + y).dtype is getattr(ft, want)
    assert (y * x).dtype is getattr(ft, want)


def test_division_is_true_division_in_the_default_dtype():
    a, b = ft.tensor([7, -7]), ft.tensor([2, 2])
    assert_values(a / b, [3.5, -3.5], "float32")
    assert_values(a / 2, [3.5, -3.5], "float32")
    assert_values(ft.tensor([7.0, -7.0], dtype=ft.float64) / b, [3.5, -3.5], "float64")
    assert_values(ft.tensor([True, False]) / ft.tensor([True, True]), [1.0, 0.0], "float32")
    assert_values(ft.tensor([3], dtype=ft.int16) / ft.tensor(2.0, dtype=ft.float64), [1.5], "float64")


def test_bool_arithmetic_is_logical():
    t, f = ft.tensor([True, True, False]), ft.tensor([True, False, False])
    assert_values(t + f, [True, True, False], "bool")
    assert_values(t * f, [True, False, False], "bool")
    assert_values(t + True, [True, True, True], "bool")
    assert_values(t * 2, [2, 2, 0], "int64")
    with pytest.raises(TypeError, match="subtraction.*bool"):
        t - f
    with pytest.raises(TypeError, match="subtraction.*bool"):
        ft.tensor([1, 2]) - True
    with pytest.raises(TypeError, match="negation.*`~`"):
        -t
    assert_values(~t, [False, False, True], "bool")
    assert_values(t & f, [True, False, False], "bool")
    assert_values(t | f, [True, True, False], "bool")
    assert_values(t ^ f, [False, True, False], "bool")


def test_bfloat16_computes_in_float32_and_rounds_back():
    a = ft.tensor([1.0, 1.3, -2.7, 300.0]).bfloat16()
    b = ft.tensor([0.1, 0.7, 1e-3, 2.0]).bfloat16()
    for op in (operator.add, operator.sub, operator.mul, operator.truediv):
        got = op(a, b)
        assert got.dtype is ft.bfloat16
        want = ft.tensor(op(n(a), n(b))).bfloat16()  # the float32 result rounded once
        np.testing.assert_array_equal(n(got), n(want))
    assert_values(a * 1.3, n(ft.tensor(n(a) * np.float32(1.3)).bfloat16()), "bfloat16")
    assert (a.sum().dtype, a.mean().dtype, a.max().dtype, a.exp().dtype) == (ft.bfloat16,) * 4
    np.testing.assert_array_equal(n(a.sum()), n(ft.tensor(n(a).sum()).bfloat16()))


# ================================================================ operators against NumPy

OPS = {
    "+": (operator.add, np.add), "-": (operator.sub, np.subtract), "*": (operator.mul, np.multiply),
    "/": (operator.truediv, np.true_divide), "//": (operator.floordiv, np.floor_divide),
    "%": (operator.mod, np.remainder), "**": (operator.pow, np.power),
}


def reference(op, x, y, dtype):
    """op of float64 values in the result dtype: integers exactly (wrapping as the dtype does), floats in float64."""
    if dtype in TOL or op == "/":
        with np.errstate(all="ignore"):
            return OPS[op][1](x, y)
    xi, yi = x.astype(np.int64), y.astype(np.int64)
    return OPS[op][1](xi, yi).astype(dtype)


@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("a, b", [("float32", "float32"), ("int64", "int64"), ("int32", "float32"),
                                  ("uint8", "int8"), ("float16", "float64"), ("int16", "bool")])
def test_binary_operators_match_numpy(op, a, b):
    x, tx = sample(a, (3, 4), seed=1)
    y, ty = sample(b, (4,), nonzero=True, seed=2)  # broadcast along the first dimension
    if op == "**":
        y, ty = np.abs(y), ft.tensor(np.abs(y), dtype=b)
    if op == "-" and "bool" in (a, b):
        pytest.skip("refused: see test_bool_arithmetic_is_logical")
    for left, right, lv, rv in [(tx, ty, x, y), (3, ty, np.full_like(y, 3), y)]:  # then reflected, 3 on the left
        dtype = ft.result_type(left, right).name
        if op == "/" and dtype not in TOL:
            dtype = "float32"
        assert_values(OPS[op][0](left, right), reference(op, lv, rv, dtype), dtype)


def test_operators_on_non_contiguous_views_and_broadcasting():
    base = rng.normal(size=(6, 8)).astype(np.float32)
    t = ft.from_numpy(base)
    views = [(t.T, base.T), (t[::2, 1::3], base[::2, 1::3]), (t[::-1, ::-2], base[::-1, ::-2]),
             (t[:, :1], base[:, :1]), (t[1].expand(3, 8), np.broadcast_to(base[1], (3, 8)))]
    for (a, an), (b, bn) in itertools.product(views, views):
        try:
            want_shape = np.broadcast_shapes(an.shape, bn.shape)
        except ValueError:
            with pytest.raises(ValueError, match=rf"shapes \({an.shape[0]}, {an.shape[1]}\) and"):
                a + b
            continue
        got = a * b - b
        assert got.shape == want_shape
        np.testing.assert_allclose(n(got), an * bn - bn, rtol=1e-6)
    np.testing.assert_array_equal(base, n(t))  # the inputs stay as they were


def test_empty_tensors():
    e = ft.zeros(0, 3)
    assert (e + 1).shape == (0, 3) and (e * ft.ones(3)).shape == (0, 3)
    assert_values(e.sum(), 0.0, "float32")
    assert_values(e.sum(0), [0.0, 0.0, 0.0], "float32")
    assert e.sum(1).shape == (0,)
    assert np.isnan(e.mean().item())
    assert ft.zeros(0, dtype=ft.int32).sum().dtype is ft.int64
    assert e.max(1).values.shape == (0,) and e.argmax(1).shape == (0,)
    assert e.sort(0).values.shape == (0, 3) and e.topk(0, dim=0).values.shape == (0, 3)
    assert e.unique().shape == (0,)
    assert e.all().item() is True and e.any().item() is False
    assert ft.cat([e, e]).shape == (0, 3) and ft.stack([e, e], 1).shape == (0, 2, 3)


def test_scalar_wraparound_and_integer_semantics():
    assert_values(ft.tensor([1, 2], dtype=ft.int8) + 1000, [-23, -22], "int8")  # 1000 wraps to -24, as in PyTorch
    assert_values(ft.tensor([1, 2], dtype=ft.uint8) - 300, [213, 214], "uint8")
    assert_values(ft.tensor([-7, 7]) // 2, [-4, 3], "int64")
    assert_values(ft.tensor([-7, 7]) % 3, [2, 1], "int64")
    assert_values(ft.tensor([-7.0, 7.0]) % -3, [-1.0, -2.0], "float32")
    assert_values(ft.tensor([-7, 7]).div(2, rounding_mode="trunc"), [-3, 3], "int64")
    assert_values(ft.tensor([-7, 7]).div(2, rounding_mode="floor"), [-4, 3], "int64")
    assert_values(ft.tensor([-7.5, 7.5]).div(2, rounding_mode="trunc"), [-3.0, 3.0], "float32")
    assert_values(ft.tensor([0, 1, -1, 2, -2]) ** ft.tensor([-1, -3, -3, -1, -2]), [0, 1, -1, 0, 0], "int64")
    assert_values(2 ** ft.tensor([3, 0]), [8, 1], "int64")
    assert_values(ft.tensor([3]) ** 2.0, [9.0], "float32")
    assert_values(ft.tensor([1, 2]).add(ft.tensor([1, 2]), alpha=2), [3, 6], "int64")
    assert_values(ft.tensor([1.0, 2.0]).sub(1, alpha=0.5), [0.5, 1.5], "float32")
    with pytest.raises(ValueError, match="negative integer powers"):
        ft.tensor([3]) ** -1
    with pytest.raises(ZeroDivisionError):
        ft.tensor([3]) // 0
    with pytest.raises(ZeroDivisionError):
        ft.tensor([3]) % ft.tensor([0])
    with pytest.raises(TypeError, match="alpha must not be a floating point"):
        ft.tensor([1]).add(1, alpha=0.5)
    with pytest.raises(ValueError, match="rounding_mode"):
        ft.tensor([1]).div(1, rounding_mode="round")
    with pytest.raises(TypeError, match="bitwise operations need bool or integer tensors, got float32"):
        ft.tensor([1.0]) & 1
    assert_values(ft.tensor([1.0, 0.0]) / 0, [np.inf, np.nan], "float32")  # no warnings, PyTorch's values


def test_comparisons_promote_as_pytorch():
    # 2.0000001 is 2 in float32, the dtype an int64 tensor meets a Python float in
    assert_values(ft.tensor([2]) == 2.0000001, [True], "bool")
    assert_values(ft.tensor([1, 5], dtype=ft.uint8) > ft.tensor([-1, 9], dtype=ft.int8), [True, False], "bool")
    x = ft.tensor([[1.0, 2.0], [3.0, 4.0]])
    assert_values(x >= ft.tensor([2.0, 3.0]), [[False, False], [True, True]], "bool")
    assert_values(np.array([2.0, 3.0]) < x, [[False, False], [True, True]], "bool")  # NumPy defers to the tensor
    assert (x == None) is False and (x != "a") is True  # noqa: E711
    y = x.clone()
    assert {x: 1, y: 2}[y] == 2  # hashed by identity, as in PyTorch: equal tensors stay apart as dict keys
    assert ft.tensor([1, 2]).eq(ft.tensor([1, 3])).tolist() == [True, False]


def test_numpy_operands_give_tensors():
    x = ft.tensor([1.0, 2.0])
    for got in (np.ones(2) + x, x + np.ones(2), np.float32(2) * x, x * np.float64(2)):
        assert isinstance(got, ft.Tensor)
    assert (np.ones(2, np.float32) + x).dtype is ft.float32 and (x + np.ones(2)).dtype is ft.float64
    assert (np.float64(2) * x).dtype is ft.float32
    assert sum([x, x, x]).tolist() == [3.0, 6.0]  # 0 + x: the reflected add


# ================================================================ in place

@pytest.mark.parametrize("op, method, value, want", [
    ("+=", "add_", 2, [3, 4, 5]), ("-=", "sub_", 1, [0, 1, 2]), ("*=", "mul_", 3, [3, 6, 9]),
    ("//=", None, 2, [0, 1, 1]), ("%=", None, 2, [1, 0, 1]), ("**=", "pow_", 2, [1, 4, 9]),
])
def test_in_place_keeps_identity_and_storage(op, method, value, want):
    for use_method in ([False, True] if method else [False]):
        base = np.array([1, 2, 3], np.int64)
        t = ft.from_numpy(base)
        before, ptr = t, t.data_ptr()
        if use_method:
            assert getattr(t, method)(value) is t
        else:
            scope = {"t": t}
            exec(f"t {op} {value}", scope)
            t = scope["t"]
        assert t is before and t.data_ptr() == ptr
        np.testing.assert_array_equal(base, want)  # the array shares the tensor's memory


def test_in_place_on_a_strided_view_writes_only_its_elements():
    base = np.zeros((4, 6), np.float32)
    t = ft.from_numpy(base)
    v = t[1::2, ::3]
    v += ft.tensor([1.0, 2.0])
    v.mul_(2).clamp_(max=3.0)
    want = np.zeros((4, 6), np.float32)
    want[1::2, ::3] = np.minimum(np.array([1.0, 2.0]) * 2, 3.0)
    np.testing.assert_array_equal(base, want)
    x = ft.tensor([1.0, 4.0, 9.0])
    x.sqrt_().neg_().abs_().exp_().log_()
    np.testing.assert_allclose(n(x), [1.0, 2.0, 3.0], rtol=1e-6)
    h = ft.tensor([1.5, 2.5]).half()
    h += ft.tensor([1.0, 1.0], dtype=ft.float64)  # a float64 result may be stored in float16
    assert h.dtype is ft.float16 and h.tolist() == [2.5, 3.5]


def test_in_place_refuses_what_cannot_be_stored():
    i = ft.tensor([1, 2])
    for call in (lambda: i.add_(0.5), lambda: i.div_(2), lambda: i.clamp_(min=0.5), lambda: i.exp_()):
        with pytest.raises(TypeError, match="result type float32 can't be cast to the desired output type int64"):
            call()
    with pytest.raises(TypeError, match="result type float32 can't be cast"):
        i /= 2
    b = ft.tensor([True, False])
    with pytest.raises(TypeError, match="result type int64 can't be cast to the desired output type bool"):
        b += 1
    with pytest.raises(ValueError, match=r"output with shape \(3,\) doesn't match the broadcast shape \(2, 3\)"):
        ft.zeros(3).add_(ft.zeros(2, 3))
    ro = ft.from_numpy(np.frombuffer(b"\x01\x02", np.uint8))
    with pytest.raises(ValueError, match="read-only"):
        ro += 1
    assert i.tolist() == [1, 2] and b.tolist() == [True, False]


# ================================================================ elementwise functions

@pytest.mark.parametrize("name, ref", [("exp", np.exp), ("log", np.log), ("sqrt", np.sqrt), ("tanh", np.tanh),
                                       ("sigmoid", lambda x: 1 / (1 + np.exp(-x))), ("abs", np.abs),
                                       ("neg", np.negative), ("relu", lambda x: np.maximum(x, 0))])
@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16", "int32"])
def test_unary_functions_match_numpy(name, ref, dtype):
    x, t = sample(dtype, (5, 4), seed=3)
    x, t = x.T, t.T  # transposed input
    floating = name not in ("abs", "neg", "relu")
    want_dtype = "float32" if floating and dtype not in TOL else dtype
    with np.errstate(all="ignore"):
        assert_values(getattr(t, name)(), ref(x), want_dtype)
        assert_values(getattr(ft, name)(t), ref(x), want_dtype)
    if name in ("abs", "neg", "relu"):
        with pytest.raises(TypeError, match="bool"):
            getattr(ft.tensor([True]), name)()


def test_sigmoid_is_exact_in_the_tails():
    x = np.array([-80.0, -20.0, 0.0, 20.0, 100.0])
    np.testing.assert_allclose(n(ft.tensor(x).sigmoid()), 1 / (1 + np.exp(-x)), rtol=1e-6)


def test_clamp():
    x, t = sample("float32", (3, 4), seed=4)
    assert_values(t.clamp(-1, 2), np.clip(x, -1, 2), "float32")
    assert_values(ft.clamp(t, min=0.5), np.maximum(x, 0.5), "float32")
    assert_values(t.clip(max=0), np.minimum(x, 0), "float32")
    lo = ft.tensor([[0.0], [1.0], [-9.0]])
    assert_values(t.clamp(lo, 2.0), np.minimum(np.maximum(x, [[0.0], [1.0], [-9.0]]), 2.0), "float32")
    assert_values(ft.tensor([1, 2]).clamp(min=0.5), [1.0, 2.0], "float32")  # promoted with the bound
    assert_values(ft.tensor([1, 2], dtype=ft.uint8).clamp(-1), [1, 2], "uint8")  # a bound below the range: no-op
    assert_values(ft.tensor([1, 200], dtype=ft.uint8).clamp(max=1000), [1, 200], "uint8")
    assert_values(ft.tensor([1.0, 5.0]).clamp(3, 2), [2.0, 2.0], "float32")  # min > max gives max, as PyTorch
    assert np.isnan(ft.tensor([np.nan]).clamp(0, 1).item())
    with pytest.raises(ValueError, match="at least one of 'min' or 'max'"):
        t.clamp()


def test_where_maximum_minimum():
    c = ft.tensor([[True, False, True], [False, False, True]])
    x, t = sample("int32", (2, 3), seed=5)
    assert_values(ft.where(c, t, 2.5), np.where(n(c), x, 2.5), "float32")
    assert_values(ft.where(c, t, ft.tensor([7, 8, 9])), np.where(n(c), x, [7, 8, 9]), "int64")
    assert_values(t.where(c, 0), np.where(n(c), x, 0), "int32")
    rows, cols = ft.where(c)
    assert rows.tolist() == [0, 0, 1] and cols.tolist() == [0, 2, 2] and rows.dtype is ft.int64
    with pytest.raises(TypeError, match="where: expected condition to be a bool tensor, got a tensor with dtype int64"):
        ft.where(ft.tensor([1, 0]), 1.0, 2.0)
    with pytest.raises(ValueError, match=r"where: shapes \(2, 3\) and \(2, 3\) and \(2,\)"):
        ft.where(c, t, ft.zeros(2))
    a, b = ft.tensor([1.0, np.nan, 3.0]), ft.tensor([2.0, 0.0, 1.0])
    assert_values(ft.maximum(a, b), [2.0, np.nan, 3.0], "float32")
    assert_values(ft.minimum(a, b), [1.0, np.nan, 1.0], "float32")
    assert_values(a.max(b), [2.0, np.nan, 3.0], "float32")
    assert_values(ft.maximum(ft.tensor([1, 2]), ft.tensor(2.5)), [2.5, 2.5], "float32")


def test_matmul():
    for sa, sb in [((3, 4), (4, 5)), ((4,), (4, 5)), ((3, 4), (4,)), ((4,), (4,)), ((2, 3, 4), (4, 5)),
                   ((2, 1, 3, 4), (5, 4, 2))]:
        a, b = rng.normal(size=sa).astype(np.float32), rng.normal(size=sb).astype(np.float32)
        want = np.matmul(a.astype(np.float64), b.astype(np.float64))
        np.testing.assert_allclose(n(ft.tensor(a) @ ft.tensor(b)), want, rtol=1e-5, atol=1e-5)
        assert (ft.tensor(a) @ ft.tensor(b)).shape == want.shape
    a = rng.normal(size=(5, 3))
    np.testing.assert_allclose(n(ft.tensor(a).T @ ft.tensor(a)[:, ::-1]), a.T @ a[:, ::-1], rtol=1e-12)
    assert (ft.tensor([[1, 2]]) @ ft.tensor([[3], [4]])).tolist() == [[11]]
    assert (ft.ones(2, 3).bfloat16() @ ft.ones(3, 1).bfloat16()).dtype is ft.bfloat16
    with pytest.raises(ValueError, match=r"matmul: shapes \(2, 3\) and \(2, 3\) cannot be multiplied"):
        ft.ones(2, 3) @ ft.ones(2, 3)
    with pytest.raises(TypeError, match="same dtype, got float32 and float64"):
        ft.ones(2, 3) @ ft.ones(3, 2, dtype=ft.float64)
    with pytest.raises(ValueError, match="at least 1-d"):
        ft.tensor(2.0) @ ft.ones(3)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float64", "float16"])
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_softmax_and_log_softmax(dtype, dim):
    x = rng.normal(0, 3, (4, 6))
    t = ft.tensor(x, dtype=dtype)
    x = n(t).astype(np.float64)
    e = np.exp(x - x.max(dim, keepdims=True))
    want = e / e.sum(dim, keepdims=True)
    assert_values(t.softmax(dim), want, dtype)
    assert_values(ft.log_softmax(t, dim), np.log(want), dtype)
    e = np.exp(x.T - x.T.max(dim, keepdims=True))
    assert_values(t.T.softmax(dim), e / e.sum(dim, keepdims=True), dtype)  # a transposed input


def test_softmax_errors():
    with pytest.raises(TypeError, match="int64"):
        ft.tensor([1, 2]).softmax(0)
    with pytest.raises(IndexError, match="dim 2 is out of range"):
        ft.ones(2, 3, dtype=ft.float64).softmax(2)
    assert_values(ft.tensor([1, 2]).softmax(0, dtype=ft.float64), np.exp([1, 2]) / np.exp([1, 2]).sum(), "float64")
    # F.softmax / F.log_softmax on eager tensors take what the methods take
    x = np.array([[1.0, 2.0, 4.0]])
    assert_values(ft.nn.functional.softmax(ft.tensor(x), 1), np.exp(x) / np.exp(x).sum(), "float64")
    assert_values(ft.nn.functional.log_softmax(ft.tensor(x), -1), np.log(np.exp(x) / np.exp(x).sum()), "float64")
    with pytest.raises(TypeError, match="int64"):
        ft.nn.functional.softmax(ft.tensor([1, 2]), 0)


# ================================================================ reductions

DIMS = [None, 0, 1, -1, -3, (0, 2), (-1, 0), (0, 1, 2), ()]


@pytest.mark.parametrize("dim", DIMS)
@pytest.mark.parametrize("keepdim", [False, True])
def test_reductions_match_numpy(dim, keepdim):
    x, t = sample("float32", (3, 4, 5), seed=6)
    x, t = x.transpose(2, 0, 1), t.permute(2, 0, 1)  # non-contiguous (5, 3, 4)
    axis = None if dim == () else dim
    kw = dict(dim=dim, keepdim=keepdim)
    assert_values(t.sum(**kw), x.sum(axis, keepdims=keepdim), "float32")
    assert_values(ft.mean(t, **kw), x.mean(axis, keepdims=keepdim), "float32")
    count = x.size if axis is None else np.prod([x.shape[d] for d in np.atleast_1d(axis)])
    if count > 1:
        assert_values(t.var(**kw), x.var(axis, ddof=1, keepdims=keepdim), "float32")
        assert_values(ft.std(t, **kw, correction=0), x.std(axis, ddof=0, keepdims=keepdim), "float32")
    if dim == ():  # torch.all and torch.any reduce no dimension there, unlike sum and mean
        assert_values(t.all(**kw), x != 0, "bool")
        assert_values((t > 4).any(**kw), x > 4, "bool")
    else:
        assert_values(t.all(**kw), np.all(x, axis, keepdims=keepdim), "bool")
        assert_values((t > 4).any(**kw), np.any(x > 4, axis, keepdims=keepdim), "bool")
    i, ti = sample("int16", (3, 4, 5), seed=7)
    s = ti.sum(**kw)
    assert_values(s, i.astype(np.int64).sum(axis, keepdims=keepdim), "int64")
    assert_values((ti > 0).sum(**kw), (i > 0).sum(axis, keepdims=keepdim), "int64")


@pytest.mark.parametrize("dim", [0, 1, -1, -2])
@pytest.mark.parametrize("keepdim", [False, True])
@pytest.mark.parametrize("dtype", ["float32", "int64", "bfloat16", "uint8"])
def test_max_min_argmax_argmin_match_numpy(dim, keepdim, dtype):
    x, t = sample(dtype, (6, 5), seed=8)  # small integers: many ties, the first one wins
    x, t = x[::-1], t[::-1]
    for name, val, arg in (("max", np.max, np.argmax), ("min", np.min, np.argmin)):
        got = getattr(t, name)(dim, keepdim)
        assert isinstance(got, tuple) and got._fields == ("values", "indices")
        values, indices = got
        assert_values(values, val(x, dim, keepdims=keepdim), dtype)
        assert_values(indices, arg(x, dim, keepdims=keepdim), "int64")
        assert_values(getattr(t, "arg" + name)(dim, keepdim), arg(x, dim, keepdims=keepdim), "int64")
        assert_values(getattr(ft, name)(t), val(x), dtype)
        assert_values(getattr(ft, "arg" + name)(t), arg(x), "int64")
    assert t.argmax(keepdim=True).shape == (1, 1)


def test_reductions_of_nan_and_zero_d():
    x = ft.tensor([[1.0, np.nan, 3.0], [4.0, 5.0, 6.0]])
    assert np.isnan(x.max().item()) and np.isnan(x.min().item())
    assert x.argmax().item() == 1 and x.max(1).indices.tolist() == [1, 2]
    z = ft.tensor(3.5)
    assert z.sum().item() == 3.5 and z.sum(0).item() == 3.5 and z.sum(-1).shape == ()
    assert tuple(z.max(0)) == (z.max(0).values, z.max(0).indices) and z.max(0).indices.item() == 0
    assert z.argmax().item() == 0
    with pytest.raises(IndexError, match=r"expected in \[-1, 0\]"):
        z.sum(1)


def test_reduction_dtypes_and_errors():
    assert ft.tensor([1, 2], dtype=ft.uint8).sum().dtype is ft.int64
    assert ft.tensor([True, True]).sum().item() == 2
    assert ft.tensor([1, 2]).sum(dtype=ft.float32).dtype is ft.float32
    assert ft.tensor([1.5, 2.5]).sum(dtype=ft.int32).item() == 3
    assert ft.tensor([1, 2]).mean(dtype=ft.float64).item() == 1.5
    assert ft.tensor([1, 2], dtype=ft.uint8).all().dtype is ft.uint8  # PyTorch keeps uint8 for old masks
    with pytest.raises(TypeError, match=r"mean\(\): could not infer output dtype. Input dtype must be either a "
                                        "floating point or complex dtype. Got: int64"):
        ft.tensor([1, 2]).mean()
    with pytest.raises(TypeError, match="std and var only support floating point"):
        ft.tensor([1, 2]).std()
    with pytest.raises(IndexError, match=r"sum: dim 2 is out of range for a 2-d tensor \(expected in \[-2, 1\]\)"):
        ft.ones(2, 3).sum(2)
    with pytest.raises(IndexError, match="argmax: dim -3 is out of range"):
        ft.ones(2, 3).argmax(-3)
    with pytest.raises(ValueError, match="dim 0 appears multiple times"):
        ft.ones(2, 3).sum((0, -2))
    with pytest.raises(ValueError, match=r"max\(\): Expected reduction dim to be specified for input.numel\(\) == 0"):
        ft.zeros(0).max()
    with pytest.raises(IndexError, match=r"argmin\(\): Expected reduction dim to be specified"):
        ft.zeros(0).argmin()
    with pytest.raises(IndexError, match=r"max\(\): Expected reduction dim 0 to have non-zero size"):
        ft.zeros(0, 3).max(0)
    with pytest.raises(TypeError, match="give correction or unbiased"):
        ft.ones(3).var(unbiased=True, correction=1)


def test_var_corrections():
    x = np.array([1.0, 2.0, 4.0, 7.0])
    t = ft.tensor(x, dtype=ft.float64)
    assert t.var().item() == pytest.approx(x.var(ddof=1))
    assert t.var(unbiased=False).item() == pytest.approx(x.var())
    assert t.var(False).item() == pytest.approx(x.var())  # the legacy var(unbiased)
    assert t.std(correction=2).item() == pytest.approx(x.std(ddof=2))
    assert np.isnan(ft.tensor([1.0]).std().item())  # N - 1 = 0 degrees of freedom
    assert ft.tensor([1.0, 3.0]).var(correction=3).item() == np.inf


# ================================================================ sorting and selection

def test_sort_is_stable_and_places_nan_as_pytorch():
    x = np.array([[3.0, 1.0, np.nan, 3.0, 1.0, 2.0], [0.0, 0.0, -1.0, 5.0, np.nan, 0.0]], np.float32)
    t = ft.tensor(x)
    values, indices = t.sort()
    np.testing.assert_array_equal(n(indices), np.argsort(x, -1, kind="stable"))
    np.testing.assert_array_equal(n(values), np.sort(x, -1))
    values, indices = t.sort(descending=True)
    assert indices.tolist() == [[2, 0, 3, 5, 1, 4], [4, 3, 0, 1, 5, 2]]
    assert n(values)[0, 0] != n(values)[0, 0] and values.tolist()[0][1:] == [3.0, 3.0, 2.0, 1.0, 1.0]
    assert t.argsort(dim=0, descending=True).tolist() == [[0, 0, 0, 1, 1, 0], [1, 1, 1, 0, 0, 1]]
    assert ft.tensor(5.0).sort().values.item() == 5.0 and ft.tensor(5.0).sort().indices.shape == ()


@pytest.mark.parametrize("dim", [0, 1, -1])
@pytest.mark.parametrize("largest", [True, False])
def test_topk_matches_a_stable_numpy_sort(dim, largest):
    x, t = sample("int32", (6, 7), seed=9)
    x, t = x[:, ::-1], t[:, ::-1]
    order = np.argsort(-x if largest else x, dim, kind="stable")
    for k in range(x.shape[dim] + 1):
        values, indices = t.topk(k, dim, largest)
        want = np.take(order, np.arange(k), axis=dim)
        assert_values(indices, want, "int64")
        assert_values(values, np.take_along_axis(x, want, dim), "int32")
    with pytest.raises(IndexError, match=r"topk: k \(8\) is out of range for dimension 1 of size 7"):
        ft.ones(6, 7).topk(8)


def test_unique():
    x = np.array([[3, 1, 2], [1, 3, 3]])
    t = ft.tensor(x)
    assert t.unique().tolist() == [1, 2, 3]
    values, inverse, counts = ft.unique(t, return_inverse=True, return_counts=True)
    assert inverse.shape == (2, 3) and (n(values)[n(inverse)] == x).all() and counts.tolist() == [2, 1, 3]
    values, counts = t.unique(return_counts=True)
    assert counts.dtype is ft.int64
    rows, inverse = ft.tensor([[1, 2], [0, 5], [1, 2]]).unique(dim=0, return_inverse=True)
    assert rows.tolist() == [[0, 5], [1, 2]] and inverse.tolist() == [1, 0, 1]
    assert ft.tensor([1.5, 0.5, 1.5]).bfloat16().unique().dtype is ft.bfloat16
    nan = ft.tensor([np.nan, 1.0, np.nan]).unique()
    assert nan.shape == (3,)  # NaNs stay apart, as in PyTorch


# ================================================================ joining

def test_cat_and_stack():
    a, b = rng.normal(size=(2, 3)).astype(np.float32), rng.normal(size=(2, 5)).astype(np.float32)
    np.testing.assert_array_equal(n(ft.cat([ft.tensor(a), ft.tensor(b)], 1)), np.concatenate([a, b], 1))
    np.testing.assert_array_equal(n(ft.cat([ft.tensor(a).T, ft.tensor(a).T], -2)), np.concatenate([a.T, a.T], 0))
    mixed = ft.cat([ft.tensor([[1, 2]]), ft.tensor([[0.5, 1.5]], dtype=ft.float64)])
    assert mixed.dtype is ft.float64 and mixed.tolist() == [[1.0, 2.0], [0.5, 1.5]]
    ints = ft.cat((ft.tensor([1, 2], dtype=ft.int8), ft.tensor([3], dtype=ft.uint8)))
    assert ints.dtype is ft.int16 and ints.tolist() == [1, 2, 3]
    assert ft.cat([ft.ones(2, 2), ft.ones(0)]).shape == (2, 2)  # PyTorch's legacy empty tensors are skipped
    assert ft.cat([ft.ones(1, 2).bfloat16(), ft.ones(1, 2).bfloat16()]).dtype is ft.bfloat16
    assert F.cat is ft.cat
    s = ft.stack([ft.tensor(a), ft.tensor(a) * 2], dim=-1)
    np.testing.assert_array_equal(n(s), np.stack([a, a * 2], -1))
    assert ft.stack([ft.tensor(1), ft.tensor(2)]).tolist() == [1, 2]
    with pytest.raises(ValueError, match=r"cat: sizes of tensors must match except in dimension 1, but got shapes "
                                         r"\(2, 3\) and \(3, 3\) \(at position 1\)"):
        ft.cat([ft.zeros(2, 3), ft.zeros(3, 3)], 1)
    with pytest.raises(ValueError, match="zero-dimensional tensor"):
        ft.cat([ft.tensor(1.0)])
    with pytest.raises(ValueError, match="non-empty"):
        ft.cat([])
    with pytest.raises(IndexError, match="cat: dim 2 is out of range"):
        ft.cat([ft.zeros(2, 3)], 2)
    with pytest.raises(ValueError, match=r"stack expects each tensor to be equal size, but got \(2, 2\) at entry 0 and "
                                         r"\(2, 3\) at entry 1"):
        ft.stack([ft.zeros(2, 2), ft.zeros(2, 3)])
    with pytest.raises(TypeError, match="got list at position 0"):
        ft.cat([[1.0]])


# ================================================================ indexing

def test_mask_and_integer_array_indexing_copy():
    x = np.arange(24, dtype=np.float32).reshape(4, 6)
    t = ft.from_numpy(x)
    for index in [(x > 7,), ([2, 0, 2],), (slice(None), [5, 0]), ([1, 3], [0, 5]), (np.array([True, False, True,
                                                                                             False]), slice(1, 3)),
                  (Ellipsis, np.array([-1, 1])), (slice(None, None, -1), [0])]:
        tindex = tuple(ft.tensor(i) if isinstance(i, np.ndarray) else i for i in index)
        got = t[tindex if len(tindex) > 1 else tindex[0]]
        np.testing.assert_array_equal(n(got), x[index if len(index) > 1 else index[0]])
        got.fill_(-1)  # a copy: the source is untouched
        np.testing.assert_array_equal(n(t), np.arange(24).reshape(4, 6))
    assert t[ft.tensor([1, 0, 0, 1], dtype=ft.uint8)].shape == (2, 6)  # uint8 tensors are masks, as in PyTorch
    assert t[ft.tensor(2)].tolist() == x[2].tolist()  # a 0-d integer tensor is an integer index
    assert t.T[ft.tensor([0, 2])].shape == (2, 4)
    b = t.bfloat16()
    assert b[b > 20].dtype is ft.bfloat16 and b[b > 20].tolist() == [21.0, 22.0, 23.0]
    with pytest.raises(IndexError, match="the shape of the mask \\[2\\] at index 0 does not match the shape \\[4\\]"):
        t[ft.tensor([True, False])]
    with pytest.raises(IndexError, match="out of bounds"):
        t[[4]]
    with pytest.raises(IndexError, match="integer or bool tensors, got float32"):
        t[ft.tensor([0.0])]


def test_setitem_with_masks_and_arrays():
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    t = ft.from_numpy(x)
    t[t > 8] = 0
    t[[0, 2], 1] = ft.tensor([-1.0, -2.0])
    t[:, ft.tensor([True, False, False, True])] = ft.tensor([[7.0], [8.0], [9.0]])
    want = np.arange(12, dtype=np.float32).reshape(3, 4)
    want[want > 8] = 0
    want[[0, 2], 1] = [-1, -2]
    want[:, [True, False, False, True]] = [[7], [8], [9]]
    np.testing.assert_array_equal(x, want)  # written into the tensor's (and the array's) memory
    b = ft.tensor([1.0, 2.0, 3.0]).bfloat16()
    ptr = b.data_ptr()
    b[b > 1.5] = 0.5
    assert b.tolist() == [1.0, 0.5, 0.5] and b.data_ptr() == ptr
    ro = ft.from_numpy(np.frombuffer(b"\x01\x02", np.uint8))
    with pytest.raises(ValueError, match="read-only"):
        ro[ro > 1] = 0


# ================================================================ Python protocols, detach, no_grad

def test_python_protocols():
    with pytest.raises(ValueError, match="Boolean value of Tensor with more than one value is ambiguous"):
        bool(ft.ones(2))
    with pytest.raises(ValueError, match="Boolean value of Tensor with no values is ambiguous"):
        bool(ft.ones(0))
    assert bool(ft.tensor([3])) and not ft.tensor(0.0)
    # a 0-d tensor formats as its number, as PyTorch's (f"{loss}" in a log line); others as their repr
    assert f"{ft.tensor(1.23456):.2f}" == "1.23" and f"{ft.tensor(7)}" == "7" and f"{ft.tensor([7])}" == "tensor([7])"
    assert ft.tensor(1.0).transpose(0, -1).tolist() == 1.0 and ft.tensor(1.0).movedim(0, -1).tolist() == 1.0
    x = ft.tensor([1.0, -2.0])
    assert (+x) is x and abs(x).tolist() == [1.0, 2.0] and (-x).tolist() == [-1.0, 2.0]
    for other in ("a", None, 1j, object()):
        with pytest.raises(TypeError):
            x + other
    with pytest.raises(TypeError, match="expected a tensor, an array or a real number"):
        ft.add(x, "a")


def test_detach_data_and_no_grad():
    x = ft.tensor([1.0, 2.0])
    x.requires_grad = True
    d = x.detach()
    assert d is not x and d.data_ptr() == x.data_ptr() and not d.requires_grad
    d.fill_(5)
    assert x.tolist() == [5.0, 5.0]
    assert x.data.data_ptr() == x.data_ptr()
    ptr = x.data_ptr()
    x.data = ft.tensor([3.0, 4.0])
    assert x.tolist() == [3.0, 4.0] and x.data_ptr() == ptr
    with pytest.raises(ValueError, match="shape"):
        x.data = ft.zeros(3)
    with ft.no_grad():
        y = x * 2

    @ft.no_grad()
    def called(v):
        return v + 1

    @ft.no_grad
    def bare(v):
        return v + 2
    assert y.tolist() == [6.0, 8.0] and called(1) == 2 and bare(1) == 3
    for phase in ("train", "val"):  # a transfer-learning loop's phases
        with ft.set_grad_enabled(phase == "train"), ft.enable_grad():
            assert (x * 2).tolist() == [6.0, 8.0]

    @ft.inference_mode
    def inferred(v):
        return v * 3
    with ft.inference_mode(), ft.inference_mode(False):
        assert inferred(2) == 6


def test_pytorch_habits_of_everyday_code():
    """The quickstart's (pred.argmax(1) == y).type(ft.float), len(loader.dataset), ft.randn(..., requires_grad=True),
    Module.double()."""
    right = (ft.tensor([[0.1, 0.9], [0.8, 0.2]]).argmax(1) == ft.tensor([1, 1])).type(ft.float)
    assert right.dtype == ft.float32 and right.tolist() == [1.0, 0.0] and right.type() == "fasttrain.float32"
    loader = ft.data.Loader((np.zeros((10, 3), np.float32), np.zeros(10, np.int64)), batch_size=4)
    assert len(loader.dataset) == 10 and len(loader) == 3
    assert ft.randn(2, 3, requires_grad=True).requires_grad and not ft.rand(2).requires_grad
    layer = ft.nn.Linear(2, 3).double()
    assert layer.weight.dtype == ft.float64 and layer.bias.dtype == ft.float64
    device = ft.accelerator.current_accelerator().type if ft.accelerator.is_available() else "cpu"
    assert device == ("cuda" if ft.cuda.is_available() else "cpu")
    for name, why in (("autograd", "gradients of gradients"), ("polar", "complex tensors are storage-only")):
        with pytest.raises(AttributeError, match=f"module 'fasttrain' has no attribute '{name}': {why}"):
            getattr(ft, name)


def test_traced_values_take_tensor_operands():
    from fasttrain.nn.graph import Input, Symbolic
    s = Input((4, 3))
    w = ft.ones(4, 3)
    assert w.__add__(s) is NotImplemented and w.__matmul__(s) is NotImplemented
    for got in (w + s, w * s, s - w, w - s, ft.cat([s, s], 1), ft.cat([s, w], 1), ft.cat([w, s], 1)):
        assert isinstance(got, Symbolic)
    m = ft.ones(3, 2)
    assert isinstance(s @ m, Symbolic)


def test_cuda_tensors_compute_on_the_host_and_come_back(ft_device):
    x = ft.tensor([[1.0, -2.0], [3.0, 4.0]], device=ft_device)
    for got in (x + 1, x.sum(0), x.max(1).values, x.softmax(1), x[x > 0], ft.cat([x, x]), x @ x, x.sort().indices):
        assert got.device == x.device
    np.testing.assert_allclose(n((x * 2).cpu()), [[2.0, -4.0], [6.0, 8.0]])
    ptr = x.data_ptr()
    x += 1
    x[x > 4] = 0
    assert x.data_ptr() == ptr and x.cpu().tolist() == [[2.0, -1.0], [4.0, 0.0]]
    if ft_device == "cuda":
        with pytest.raises(RuntimeError, match="cpu.*cuda:0|cuda:0.*cpu"):
            x + ft.ones(2, 2)
        assert (x + ft.tensor(1.0)).device == x.device  # a 0-d CPU tensor goes with any device


# ================================================================ against PyTorch

def torch_dtype(torch, name):
    return getattr(torch, name)


def test_promotion_matrix_matches_torch():
    torch = pytest.importorskip("torch")
    names = REAL + ["uint16", "uint32", "uint64"]
    for a, b in itertools.product(names, names):
        try:
            want = str(torch.promote_types(torch_dtype(torch, a), torch_dtype(torch, b))).split(".")[1]
        except RuntimeError:
            with pytest.raises(TypeError):
                ft.promote_types(a, b)
            continue
        assert ft.promote_types(a, b).name == want, (a, b)
    for a, b in itertools.product(names, names):
        for sa, sb in [((2,), ()), ((), (2,)), ((), ()), ((2,), (2,))]:
            ta, tb = torch.ones(sa, dtype=torch_dtype(torch, a)), torch.ones(sb, dtype=torch_dtype(torch, b))
            try:
                want = str(torch.result_type(ta, tb)).split(".")[1]
            except RuntimeError:
                want = None
            if want is None:
                with pytest.raises(TypeError):
                    ft.result_type(ft.ones(sa, dtype=a), ft.ones(sb, dtype=b))
            else:
                assert ft.result_type(ft.ones(sa, dtype=a), ft.ones(sb, dtype=b)).name == want, (a, sa, b, sb)
        for s in (True, 2, 2.5, -1):
            for sa in ((2,), ()):
                want = str(torch.result_type(torch.ones(sa, dtype=torch_dtype(torch, a)), s)).split(".")[1]
                assert ft.result_type(ft.ones(sa, dtype=a), s).name == want, (a, sa, s)


TORCH_OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv,
             "//": operator.floordiv, "%": operator.mod, "**": operator.pow, "&": operator.and_, "==": operator.eq,
             "<": operator.lt}


def same_as_torch(torch, want, got, what):
    """got (fasttrain) equals want (torch): dtype, shape and values (within the dtype's rounding), or both raised."""
    if isinstance(want, Exception) or isinstance(got, Exception):
        assert isinstance(want, Exception) and isinstance(got, Exception), (what, want, got)
        return
    name = str(want.dtype).split(".")[1]
    assert got.dtype.name == name and got.shape == tuple(want.shape), (what, got.dtype, name)
    w = want.float().numpy() if want.dtype == torch.bfloat16 else want.numpy()
    if name in TOL:
        np.testing.assert_allclose(n(got), w, rtol=TOL[name], atol=TOL[name], equal_nan=True, err_msg=what)
    else:
        np.testing.assert_array_equal(n(got), w, err_msg=what)


def outcome(fn):
    """fn's result, or the exception it raised (whether both sides refuse is compared); torch's warnings (zero
    degrees of freedom) are not failures."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return fn()
    except Exception as e:  # noqa: BLE001
        return e


def test_every_operator_over_every_dtype_pair_matches_torch():
    torch = pytest.importorskip("torch")

    def pair(dtype, shape, seed, nonzero=False):
        x, t = sample(dtype, shape, nonzero, seed)
        return torch.tensor(x).to(torch_dtype(torch, dtype)), t

    for a, b in itertools.product(REAL, REAL):
        for sa, sb in [((3,), (3,)), ((2, 3), ()), ((), (3,))]:
            ta, fa = pair(a, sa, 1)
            tb, fb = pair(b, sb, 2, nonzero=True)
            for sym, op in TORCH_OPS.items():
                if sym == "**" and b != "bool":
                    tb, fb = tb.abs(), ft.tensor(n(fb), dtype=b).abs()
                same_as_torch(torch, outcome(lambda: op(ta, tb)), outcome(lambda: op(fa, fb)), f"{a}{sa} {sym} {b}{sb}")
        for s in (True, 3, -2, 2.5):
            ta, fa = pair(a, (3,), 3)
            for sym, op in TORCH_OPS.items():
                if not (a == "bool" and sym == "**"):  # torch special-cases bool ** True
                    same_as_torch(torch, outcome(lambda: op(ta, s)), outcome(lambda: op(fa, s)), f"{a} {sym} {s}")
                same_as_torch(torch, outcome(lambda: op(s, ta)), outcome(lambda: op(s, fa)), f"{s} {sym} {a}")


def test_reductions_and_functions_match_torch():
    torch = pytest.importorskip("torch")
    for dtype in REAL:
        for shape in [(3, 4), (), (0, 3)]:
            x, f = sample(dtype, shape, seed=4)
            t = torch.tensor(x).to(torch_dtype(torch, dtype))
            calls = [("sum", {}), ("sum", dict(dim=-1, keepdim=True)), ("mean", {}), ("mean", dict(dim=0)),
                     ("std", {}), ("var", dict(dim=0)), ("all", {}), ("any", dict(dim=0)), ("max", {}), ("min", {}),
                     ("abs", {}), ("exp", {}), ("log", {}), ("sqrt", {}), ("sigmoid", {}), ("tanh", {})]
            if shape:
                calls += [("argmax", dict(dim=-1, keepdim=True)), ("argmin", {})]
            for name, kw in calls:
                if dtype == "bool" and name.startswith("arg"):
                    continue  # torch refuses; fasttrain answers as NumPy
                same_as_torch(torch, outcome(lambda: getattr(t, name)(**kw)), outcome(lambda: getattr(f, name)(**kw)),
                              f"{dtype}{shape}.{name}({kw})")
            if shape:
                for name in ("max", "min"):
                    w, g = outcome(lambda: getattr(t, name)(-1)), outcome(lambda: getattr(f, name)(-1))
                    for i in range(2):
                        same_as_torch(torch, w if isinstance(w, Exception) else w[i],
                                      g if isinstance(g, Exception) else g[i], f"{dtype}{shape}.{name}(-1)")
            same_as_torch(torch, outcome(lambda: t.clamp(min=0.5)), outcome(lambda: f.clamp(min=0.5)), "clamp")


def test_topk_sort_unique_std_var_match_torch():
    torch = pytest.importorskip("torch")
    x = rng.integers(0, 5, (4, 7)).astype(np.float32)
    x[0, 2] = x[1, 3] = np.nan
    t, f = torch.tensor(x), ft.tensor(x)
    for desc, dim in itertools.product([False, True], [0, 1, -1]):
        want, got = t.sort(dim=dim, descending=desc, stable=True), f.sort(dim, desc)
        np.testing.assert_array_equal(n(got.values), want.values.numpy())
        np.testing.assert_array_equal(n(got.indices), want.indices.numpy())
    for k, largest, dim in itertools.product([1, 3, 4], [True, False], [0, -1]):
        want, got = t.topk(k, dim, largest), f.topk(k, dim, largest)
        np.testing.assert_array_equal(n(got.values), want.values.numpy())  # ties may pick other indices in torch
        np.testing.assert_array_equal(np.take_along_axis(x, n(got.indices), dim), n(got.values))
    y = rng.integers(0, 4, (5, 3))
    for dim in [None, 0, 1]:
        want = torch.tensor(y).unique(return_inverse=True, return_counts=True, dim=dim)
        got = ft.tensor(y).unique(return_inverse=True, return_counts=True, dim=dim)
        for w, g in zip(want, got):
            np.testing.assert_array_equal(n(g), w.numpy())
    z = rng.normal(size=(3, 4, 5)).astype(np.float32)
    for kw in [{}, dict(dim=1), dict(dim=(0, 2), keepdim=True), dict(correction=0), dict(dim=2, correction=2),
               dict(unbiased=False)]:
        for name in ("std", "var"):
            want, got = getattr(torch.tensor(z), name)(**kw), getattr(ft.tensor(z), name)(**kw)
            np.testing.assert_allclose(n(got), want.numpy(), rtol=2e-6)


def test_matmul_takes_numpy_arrays_on_either_side():
    a, b = np.arange(6, dtype=np.float32).reshape(2, 3), np.arange(12, dtype=np.float32).reshape(3, 4)
    for got in (ft.tensor(a) @ b, a @ ft.tensor(b), ft.matmul(a, ft.tensor(b))):
        assert isinstance(got, ft.Tensor)
        np.testing.assert_array_equal(n(got), a @ b)
    with pytest.raises(TypeError, match="same dtype"):
        ft.tensor(a) @ b.astype(np.float64)


def test_squeeze_of_several_dims_all_and_any_of_no_dims_and_where_of_any_dtype():
    """As torch 2.x: squeeze((1, 2)); all/any with dim=() give each element's truth (sum(dim=()) reduces all);
    where(t) alone is nonzero for any dtype."""
    z = ft.zeros(2, 1, 1, 3)
    assert z.squeeze((1, 2)).shape == (2, 3) and z.squeeze([1, -1]).shape == (2, 1, 3)
    assert z.squeeze((0, 1)).shape == (2, 1, 3)  # a size other than 1 stays, as with one dim
    x = ft.tensor([[0.0, 1.5], [np.nan, 0.0]])
    for fn in (ft.all, ft.any):
        got = fn(x, dim=())
        assert got.dtype is ft.bool and n(got).tolist() == [[False, True], [True, False]]
    assert ft.any(ft.tensor([3, 0], dtype=ft.uint8), dim=[]).dtype is ft.uint8
    assert ft.sum(ft.ones(2, 2), dim=()).shape == ()
    rows, cols = ft.where(x)
    assert n(rows).tolist() == [0, 1] and n(cols).tolist() == [1, 0]
    assert n(ft.where(ft.tensor([0, 2, 0, 3]))[0]).tolist() == [1, 3]
    with pytest.raises(TypeError, match="expected condition to be a bool tensor"):
        ft.where(ft.tensor([0, 2]), 1, 2)


def test_clear_errors_for_a_bad_dim():
    with pytest.raises(TypeError, match="sum: dim must be an int or a sequence of ints, got float"):
        ft.zeros(2).sum(1.0)
    with pytest.raises(IndexError, match=r"stack: dim 3 is out of range for stacking 2-d tensors \(expected in "
                                         r"\[-3, 2\]\)"):
        ft.stack([ft.zeros(2, 2)] * 2, dim=3)
    assert ft.stack([ft.zeros(2, 3)] * 4, dim=-1).shape == (2, 3, 4)


@pytest.mark.parametrize("diagonal", [0, 1, -1, 5])
def test_tril_and_triu_match_numpy(diagonal):
    a = np.random.default_rng(3).standard_normal((2, 3, 4)).astype(np.float32)
    np.testing.assert_array_equal(ft.tril(ft.tensor(a), diagonal).numpy(), np.tril(a, diagonal))
    np.testing.assert_array_equal(ft.tensor(a).triu(diagonal).numpy(), np.triu(a, diagonal))
    assert ft.tril(ft.ones(3, 3, dtype=ft.int64)).dtype is ft.int64
    with pytest.raises(ValueError, match="tril: input must have at least 2 dimensions"):
        ft.tril(ft.ones(3))
    with pytest.raises(TypeError, match="triu: diagonal must be an int"):
        ft.triu(ft.ones(3, 3), 1.0)


def test_masked_fill_matches_numpy_and_keeps_the_dtype():
    a = np.arange(12, dtype=np.int64).reshape(3, 4)
    mask = np.array([True, False, False, True])
    np.testing.assert_array_equal(ft.tensor(a).masked_fill(ft.tensor(mask), -1).numpy(), np.where(mask, -1, a))
    f = ft.zeros(2, 4)
    assert f.masked_fill_(ft.tensor(mask), float("-inf")) is f
    np.testing.assert_array_equal(f.numpy(), np.where(mask, -np.inf, 0)[None].repeat(2, 0))
    with pytest.raises(TypeError, match="mask must be a bool tensor, got int64"):
        ft.masked_fill(ft.ones(4), ft.ones(4, dtype=ft.int64), 0)
    with pytest.raises(ValueError, match=r"masked_fill: a mask of shape \(2, 4\) does not broadcast"):
        ft.masked_fill(ft.ones(4), ft.tensor(np.ones((2, 4), bool)), 0)


def test_clamp_min_max_square_logsumexp_expand_as_type_as():
    a = np.array([[1.0, 2.0, 3.0], [-np.inf, -np.inf, -np.inf], [1000.0, 0.0, -5.0]], np.float32)
    t = ft.tensor(a)
    np.testing.assert_allclose(ft.logsumexp(t, 1).numpy(), np.logaddexp.reduce(a, axis=1), rtol=1e-6)
    assert t.logsumexp(1, keepdim=True).shape == (3, 1)
    np.testing.assert_array_equal(t.clamp_min(0.5).numpy(), np.maximum(a, 0.5))
    np.testing.assert_array_equal(ft.clamp_max(t, 0.5).numpy(), np.minimum(a, 0.5))
    np.testing.assert_array_equal(ft.square(t).numpy(), a * a)
    assert ft.ones(3).expand_as(t).shape == (3, 3)
    assert ft.ones(3).type_as(ft.zeros(1, dtype=ft.int64)).dtype is ft.int64


@pytest.mark.parametrize("dim", [(), 0, -1, (0, 2), (2, 0, 1)])
@pytest.mark.parametrize("keepdim", [False, True])
def test_amax_amin_norm_match_numpy(dim, keepdim, ft_device):
    a = np.random.default_rng(31).standard_normal((3, 4, 5)).astype(np.float32)
    a[0, 1, 2] = 0.0
    t = ft.tensor(a, device=ft_device)
    axes = None if dim == () else dim
    for got, want in ((t.amax(dim, keepdim), a.max(axes, keepdims=keepdim)),
                      (ft.amin(t, dim, keepdim), a.min(axes, keepdims=keepdim))):
        assert got.device == t.device
        np.testing.assert_array_equal(n(got.cpu()), want)
    x = a.astype(np.float64)
    for p, want in (("fro", np.sqrt((x * x).sum(axes, keepdims=keepdim))), (1, np.abs(x).sum(axes, keepdims=keepdim)),
                    (np.inf, np.abs(x).max(axes, keepdims=keepdim)), (-np.inf, np.abs(x).min(axes, keepdims=keepdim)),
                    (0, (x != 0).sum(axes, keepdims=keepdim)),
                    (3.5, (np.abs(x) ** 3.5).sum(axes, keepdims=keepdim) ** (1 / 3.5))):
        got = t.norm(p, None if dim == () else dim, keepdim)
        assert got.dtype is ft.float32 and got.device == t.device
        np.testing.assert_allclose(n(got.cpu()), want, rtol=1e-6, err_msg=f"p={p}")


def test_amax_norm_gather_nan_and_errors():
    t = ft.tensor([[1.0, np.nan, 3.0], [4.0, 5.0, 6.0]])
    assert np.isnan(t.amax(1)[0].item()) and t.amax(1)[1].item() == 6.0 and np.isnan(ft.amin(t).item())
    with pytest.raises(IndexError, match=r"amax\(\): Expected reduction dim 1 to have non-zero size"):
        ft.zeros(2, 0).amax(1)
    with pytest.raises(TypeError, match="norm\\(\\): input dtype should be floating point, got int64"):
        ft.ones(3, dtype=ft.int64).norm()
    with pytest.raises(ValueError, match="norm: p must be a number or 'fro', got 'nuc'"):
        ft.ones(3).norm("nuc")
    x = ft.tensor([[1.0, 2.0], [3.0, 4.0]])
    with pytest.raises(IndexError, match="gather: index 2 is out of bounds for dimension 1 with size 2"):
        x.gather(1, ft.tensor([[0], [2]]))
    with pytest.raises(IndexError, match="gather: index -1 is out of bounds"):
        x.gather(1, ft.tensor([[-1], [0]]))
    with pytest.raises(TypeError, match="Expected dtype int64 for index, got float32"):
        x.gather(1, ft.ones(2, 1))
    with pytest.raises(ValueError, match="gather: index has 1 dimensions and input 2"):
        x.gather(1, ft.tensor([0, 1]))
    with pytest.raises(ValueError, match=r"gather: index \(3, 1\) is larger than input \(2, 2\) outside dimension 1"):
        x.gather(1, ft.zeros(3, 1, dtype=ft.int64))


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_gather_matches_numpy(dim, ft_device):
    rng = np.random.default_rng(32)
    a = rng.standard_normal((4, 5, 3)).astype(np.float32)
    shape = [3, 4, 2]
    shape[dim] = 6  # longer than input along dim, shorter elsewhere: a prefix of the other dimensions is read
    idx = rng.integers(0, a.shape[dim], shape)
    got = ft.gather(ft.tensor(a, device=ft_device), dim, ft.tensor(idx, device=ft_device))
    want = np.take_along_axis(a[tuple(slice(0, m) if k != dim % 3 else slice(None) for k, m in enumerate(shape))],
                              idx, dim)
    assert got.device.type == ft_device
    np.testing.assert_array_equal(n(got.cpu()), want)


def test_amax_norm_gather_cosine_similarity_match_torch():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(33)
    a, b = rng.standard_normal((2, 4, 6)).astype(np.float32)
    b[1] = 0.0  # zero vectors: the norm's eps bound
    idx = rng.integers(0, 4, (4, 6))
    T = torch.nn.functional
    pairs = [(torch.amax(torch.tensor(a), (0, 1)), ft.amax(ft.tensor(a), (0, 1))),
             (torch.tensor(a).norm(dim=1), ft.tensor(a).norm(dim=1)),
             (torch.linalg.vector_norm(torch.tensor(a), 3.0), ft.norm(ft.tensor(a), 3.0)),
             (torch.tensor(a).gather(0, torch.tensor(idx)), ft.tensor(a).gather(0, ft.tensor(idx))),
             (T.cosine_similarity(torch.tensor(a), torch.tensor(b)), F.cosine_similarity(ft.tensor(a), ft.tensor(b))),
             (T.pairwise_distance(torch.tensor(a), torch.tensor(b)), F.pairwise_distance(ft.tensor(a), ft.tensor(b))),
             (T.triplet_margin_loss(*(torch.tensor(v) for v in (a, b, a[::-1].copy())), swap=True),
              F.triplet_margin_loss(*(ft.tensor(v) for v in (a, b, a[::-1].copy())), swap=True))]
    for want, got in pairs:
        np.testing.assert_allclose(n(got), want.numpy(), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("equation, shapes", [("ij,jk->ik", [(3, 4), (4, 5)]), ("bij,bjk", [(2, 3, 4), (2, 4, 5)]),
                                              ("i,i->", [(4,), (4,)]), ("ij->ji", [(3, 4)]),
                                              ("i j , j -> i", [(3, 4), (4,)]), ("ii->i", [(3, 3)])])
def test_einsum_matches_numpy(equation, shapes, ft_device):
    arrays = [np.random.default_rng(34).standard_normal(s).astype(np.float32) for s in shapes]
    got = ft.einsum(equation, *(ft.tensor(a, device=ft_device) for a in arrays))
    assert got.device.type == ft_device and got.dtype is ft.float32
    np.testing.assert_allclose(n(got.cpu()), np.einsum(equation.replace(" ", ""), *arrays), rtol=1e-5, atol=1e-6)
    assert ft.einsum(equation, [ft.tensor(a) for a in arrays]).shape == got.shape  # the operands as one list


def test_einsum_errors_and_torch():
    with pytest.raises(TypeError, match="einsum: expected operands of one dtype, got float32, int64"):
        ft.einsum("i,i->", ft.ones(3), ft.ones(3, dtype=ft.int64))
    with pytest.raises(ValueError, match=r"einsum: .*\(equation 'ij,jk->ik', shapes \(3, 4\), \(5, 2\)\)"):
        ft.einsum("ij,jk->ik", ft.ones(3, 4), ft.ones(5, 2))
    with pytest.raises(TypeError, match="einsum: expected a sequence of tensors, got list at position 0"):
        ft.einsum("i->", [[1.0]])
    torch = pytest.importorskip("torch")
    a, b = rng.standard_normal((2, 3, 4)).astype(np.float32), rng.standard_normal((2, 4, 5)).astype(np.float32)
    np.testing.assert_allclose(n(ft.einsum("bij,bjk->bki", ft.tensor(a), ft.tensor(b))),
                               torch.einsum("bij,bjk->bki", torch.tensor(a), torch.tensor(b)).numpy(), rtol=1e-5,
                               atol=1e-6)


def test_views_taken_apart_and_copies_rearranged_match_numpy(ft_device):
    a = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    t = ft.tensor(a, device=ft_device)
    for got, want in [(t.select(1, 2), a[:, 2]), (t.narrow(2, -3, 2), a[:, :, 1:3]), (ft.select(t, -1, 0), a[..., 0])]:
        np.testing.assert_array_equal(n(got.cpu()), want)
    assert [n(u.cpu()).tolist() for u in ft.unbind(t, 1)] == [a[:, i].tolist() for i in range(3)]
    assert [u.shape for u in t.chunk(3, 2)] == [(2, 3, 2), (2, 3, 2)]  # ceil(4 / 3) each: two, as torch
    assert [u.shape for u in ft.chunk(t, 4, 1)] == [(2, 1, 4)] * 3
    assert [u.shape for u in ft.split(t, 3, 2)] == [(2, 3, 3), (2, 3, 1)]
    assert [u.shape for u in t.split([1, 2], 1)] == [(2, 1, 4), (2, 2, 4)]
    t.unbind(1)[0].zero_()  # views: written through
    assert n(t.cpu())[:, 0].sum() == 0
    a[:, 0] = 0
    np.testing.assert_array_equal(n(t.repeat(2, 1, 1, 2).cpu()), np.tile(a, (2, 1, 1, 2)))
    np.testing.assert_array_equal(n(ft.flip(t, (0, 2)).cpu()), np.flip(a, (0, 2)))
    np.testing.assert_array_equal(n(t.flip(0, 2).cpu()), np.flip(a, (0, 2)))  # PyTorch's method takes *dims
    np.testing.assert_array_equal(n(t.roll(1, 2).cpu()), np.roll(a, 1, 2))
    np.testing.assert_array_equal(n(ft.roll(t, (1, -1), (0, 1)).cpu()), np.roll(a, (1, -1), (0, 1)))
    np.testing.assert_array_equal(n(ft.roll(t, (1, 2), (1, 1)).cpu()), np.roll(a, 3, 1))  # a dim twice: both shifts
    np.testing.assert_array_equal(n(t.cumsum(-1).cpu()), np.cumsum(a, -1))
    assert ft.tensor([True, True]).cumsum(0).dtype is ft.int64
    # float32 running sums carried in float64, as PyTorch's CPU kernel (in float32 they stop growing at 2**24)
    ones = ft.ones(2 ** 24 + 10)
    assert ones.cumsum(0)[-1].item() == 2 ** 24 + 10 and ones.sum().item() == 2 ** 24 + 10
    r = np.random.default_rng(3).random(10 ** 5).astype(np.float32)
    np.testing.assert_array_equal(ft.tensor(r).cumsum(0).numpy(), np.cumsum(r, dtype=np.float64).astype(np.float32))
    np.testing.assert_array_equal(ft.tensor(r[:50] + 0.5).cumprod(0).numpy(),
                                  np.cumprod(r[:50] + 0.5, dtype=np.float64).astype(np.float32))
    with pytest.raises(ValueError, match=r"split: sizes \[1, 1\] do not add up to dimension 1 of size 3"):
        t.split([1, 1], 1)
    with pytest.raises(IndexError, match="narrow: start 3 and length 2 exceed dimension 2 of size 4"):
        t.narrow(2, 3, 2)
    with pytest.raises(ValueError, match="repeat: the number of sizes"):
        t.repeat(2)


def test_rounding_signs_and_tests_match_numpy():
    a = np.array([-2.5, -1.5, -0.5, 0.0, 0.5, 1.5, 2.5, np.nan, np.inf, -np.inf], np.float32)
    t = ft.tensor(a)
    for name in ("floor", "ceil", "round", "trunc", "sign", "isnan", "isinf", "isfinite", "log1p", "expm1"):
        with np.errstate(all="ignore"):
            want = np.nan_to_num(np.sign(a), nan=0.0) if name == "sign" else getattr(np, name)(a)
        got = getattr(ft, name)(t)
        np.testing.assert_allclose(n(got).astype(np.float64), want.astype(np.float64), rtol=1e-6, err_msg=name)
    assert ft.floor(ft.tensor([3, -2])).tolist() == [3, -2] and ft.floor(ft.tensor([3])).dtype is ft.int64
    assert ft.round(ft.tensor([0.5, 1.5, 2.5])).tolist() == [0.0, 2.0, 2.0]  # half to even, as torch
    with pytest.raises(TypeError, match="floor: not supported for bool tensors"):
        ft.floor(ft.tensor([True]))
    torch = pytest.importorskip("torch")
    for name in ("floor", "ceil", "round", "trunc", "sign", "isnan", "isfinite", "log1p", "expm1"):
        np.testing.assert_allclose(n(getattr(ft, name)(t)).astype(np.float64),
                                   getattr(torch, name)(torch.tensor(a)).numpy().astype(np.float64), rtol=1e-6,
                                   err_msg=name)
    b = np.arange(12.0).reshape(3, 4)
    for ours, theirs in [(ft.tensor(b).chunk(3, 1), torch.tensor(b).chunk(3, 1)),
                         (ft.tensor(b).split(3, 1), torch.tensor(b).split(3, 1))]:
        assert [tuple(x.shape) for x in ours] == [tuple(x.shape) for x in theirs]


def test_pad_keeps_the_dtype_as_numpy():
    """F.pad of int64 ids, bool masks and bfloat16 values keeps their dtype (it padded in float32: 2**40 + 1 came
    back as 2**40), NumPy's np.pad being the reference."""
    for a in (np.array([[2 ** 40 + 1, 7]]), np.array([[True, False]]), np.array([[1.5, -2.25]], np.float32)):
        got = F.pad(ft.tensor(a), (1, 2), value=1)
        assert got.dtype.name == a.dtype.name
        np.testing.assert_array_equal(n(got), np.pad(a, ((0, 0), (1, 2)), constant_values=1))
    got = F.pad(ft.tensor([[1.5, -2.25]]).bfloat16(), (0, 1), value=3)
    assert got.dtype is ft.bfloat16 and got.float().tolist() == [[1.5, -2.25, 3.0]]


def test_functions_written_with_other_ops_refuse_bad_input():
    x = ft.ones(2, 3, 4, 4)
    with pytest.raises(ValueError, match="triplet_margin_loss: margin must be greater than 0, got 0"):
        F.triplet_margin_loss(ft.ones(2, 3), ft.ones(2, 3), ft.ones(2, 3), margin=0)
    with pytest.raises(ValueError, match="glu: dimension -1 of size 3 is not even"):
        F.glu(ft.ones(2, 3))
    with pytest.raises(ValueError, match=r"rms_norm: normalized_shape \(5,\) is not the trailing shape"):
        F.rms_norm(x, 5)
    with pytest.raises(ValueError, match="pixel_shuffle: 3 channels are not divisible by upscale_factor"):
        F.pixel_shuffle(x, 2)
    with pytest.raises(ValueError, match="pixel_unshuffle: 4 x 4 is not divisible by downscale_factor 3"):
        F.pixel_unshuffle(x, 3)
    with pytest.raises(ValueError, match=r"pad: \(1, 1, 1\) does not pad pairs"):
        F.pad(x, (1, 1, 1))
    with pytest.raises(NotImplementedError, match="mode='edge' is not supported"):
        F.pad(x, (1, 1), mode="edge")
    with pytest.raises(ValueError, match=r"mode='reflect' cannot pad dimension 3 of size 4 by \(1, 4\): it pads by "
                                         r"at most 3 \(the size less one\)"):
        F.pad(x, (1, 4), mode="reflect")
    with pytest.raises(ValueError, match=r"mode='circular' cannot pad dimension 2 of size 4 by \(0, 5\)"):
        F.pad(x, (0, 0, 0, 5), mode="circular")
    with pytest.raises(ValueError, match=r"mode='replicate' cannot pad .* \(-1, 1\): only mode='constant' crops"):
        F.pad(x, (-1, 1), mode="replicate")
    with pytest.raises(ValueError, match="value=0.5 is only used by mode='constant'"):
        F.pad(x, (1, 1), mode="reflect", value=0.5)
    with pytest.raises(ValueError, match="padding_mode must be one of"):
        nn.Conv2d(3, 3, 3, padding_mode="mirror")
    with pytest.raises(ValueError, match="ConvTranspose2d: only padding_mode='zeros'"):
        nn.ConvTranspose2d(3, 3, 3, padding_mode="reflect")
    with pytest.raises(ValueError, match=r"ReflectionPad2d: padding takes 4 values, got \(1, 1\)"):
        nn.ReflectionPad2d((1, 1))


@pytest.mark.parametrize("mode,numpy_mode", [("reflect", "reflect"), ("replicate", "edge"), ("circular", "wrap")])
def test_pad_modes_match_numpy(mode, numpy_mode):
    x = np.random.default_rng(3).standard_normal((2, 3, 5, 6)).astype(np.float32)
    for pad in [(1, 2), (2, 1, 3, 0), (0, 0, 4, 1), (5, 5), (1, 1, 1, 1)]:
        widths = [(0, 0)] * (4 - len(pad) // 2) + [tuple(pad[k:k + 2]) for k in range(len(pad) - 2, -1, -2)]
        np.testing.assert_array_equal(n(F.pad(ft.tensor(x), pad, mode)), np.pad(x, widths, mode=numpy_mode))
    layers = {"reflect": nn.ReflectionPad2d, "replicate": nn.ReplicationPad2d, "circular": nn.CircularPad2d}
    np.testing.assert_array_equal(n(layers[mode]((1, 2, 0, 3))(ft.tensor(x))),
                                  np.pad(x, [(0, 0), (0, 0), (0, 3), (1, 2)], mode=numpy_mode))


def test_alpha_scales_in_the_promoted_dtype():
    """add/sub(input, other, alpha): alpha * other computed in the dtype of input and other promoted, as PyTorch (it
    wrapped in other's narrow integer dtype, or overflowed float16)."""
    f32 = ft.tensor([0.5])
    assert ft.add(f32, ft.tensor([200], dtype=ft.uint8), alpha=2).tolist() == [400.5]
    assert ft.sub(ft.tensor([0.0]), ft.tensor([100], dtype=ft.int8), alpha=3).tolist() == [-300.0]
    assert ft.add(ft.tensor([0.0]), ft.tensor([30000], dtype=ft.float16), alpha=4).tolist() == [120000.0]
    got = ft.tensor([1], dtype=ft.int32).add(ft.tensor([100], dtype=ft.int8), alpha=2)
    assert got.tolist() == [201] and got.dtype == ft.int32
    assert ft.add(ft.tensor(5, dtype=ft.int32), 2, alpha=3).dtype == ft.int32
    assert ft.sub(ft.tensor(1.0, dtype=ft.bfloat16), 2.5, alpha=2).dtype == ft.bfloat16
    x = ft.tensor([0.5])
    x.add_(ft.tensor([200], dtype=ft.uint8), alpha=2)
    assert x.tolist() == [400.5]
    with pytest.raises(TypeError, match="subtraction, the `-` operator, with a bool tensor is not supported"):
        ft.sub(ft.tensor([1], dtype=ft.uint8), ft.tensor([True]), alpha=2)
    with pytest.raises(TypeError, match="alpha must not be a floating point number"):
        ft.add(ft.tensor([1]), ft.tensor([1]), alpha=0.5)


def test_integers_mixed_with_array_indices_index_first_as_pytorch():
    """x[0, :, [0, 1]]: the integer selects first (PyTorch), rather than joining the arrays (NumPy moves their
    dimension first when a slice separates them); assignment writes through the same view."""
    x = ft.arange(24).reshape(2, 3, 4)
    assert x[0, :, [0, 1]].tolist() == [[0, 1], [4, 5], [8, 9]]
    assert x[0, ..., [1]].tolist() == [[1], [5], [9]]
    assert x[:, 0, [0, 1]].tolist() == [[0, 1], [12, 13]]
    assert x[ft.tensor(1), :, ft.tensor([3])].tolist() == [[15], [19], [23]]
    assert x[1, [0, 2], [1, 3]].tolist() == [13, 23]
    x[0, :, [0, 1]] = ft.full((3, 2), -1)
    assert x[0].tolist() == [[-1, -1, 2, 3], [-1, -1, 6, 7], [-1, -1, 10, 11]] and x[1, 0, 0].item() == 12
    y = ft.zeros(3)
    y[0] = ft.tensor([7.0])  # a one-element value into one element, as PyTorch takes it
    assert y.tolist() == [7.0, 0.0, 0.0]
    torch = pytest.importorskip("torch")
    a = np.arange(60).reshape(3, 4, 5)
    for index in [(1, slice(None), [0, 2]), (slice(None), 2, [1, 1, 0]), (0, [1, 2], slice(1, 3)),
                  (Ellipsis, 1, [0, 3]), (2, None, [True, False, True, False]), ([0, 2], 1, slice(None), None)]:
        want = torch.from_numpy(a)[index].numpy()
        got = n(ft.tensor(a)[index])
        assert got.shape == want.shape and np.array_equal(got, want), index


def test_empty_reductions_chunks_and_divisions_and_bool_math_as_pytorch():
    np.testing.assert_array_equal(n(ft.zeros(0, 3).logsumexp(0)), np.full(3, -np.inf, np.float32))
    assert [tuple(c.shape) for c in ft.zeros(3, 0).chunk(2, 1)] == [(3, 0), (3, 0)]
    assert (ft.zeros(3, 0, dtype=ft.int32) // ft.zeros(3, 1, dtype=ft.int32)).shape == (3, 0)
    b = ft.tensor([True, False])
    assert b.square().dtype == ft.int64 and b.square().tolist() == [1, 0]
    assert b.sign().dtype == ft.bool and b.sign().tolist() == [True, False]


A = np.random.default_rng(50).standard_normal((3, 4)).astype(np.float32)
I = np.array([[3, 0, 2, 2], [1, 1, 0, 3], [2, 3, 1, 0]])
EVERYDAY = {  # name: (the call on a library L, given (a, i) as L's tensors), PyTorch's names throughout
    "prod": lambda L, a, i: (a.prod(1), L.prod(i), i.prod(0, keepdim=True)),
    "cumprod": lambda L, a, i: (a.cumprod(0), L.cumprod(i, 1)),
    "nansum/nanmean": lambda L, a, i: (L.nansum(L.where(a > 0, a, a * float("nan")), 1),
                                       L.nanmean(L.where(a > 0, a, a * float("nan")), 0)),
    "count_nonzero": lambda L, a, i: (L.count_nonzero(i), L.count_nonzero(i, 0)),
    "median": lambda L, a, i: (L.median(a), *a.median(1), *i.median(0, keepdim=True)),
    "quantile": lambda L, a, i: (L.quantile(a, 0.3), L.quantile(a, L.tensor([0.1, 0.9]), dim=1, keepdim=True),
                                 L.quantile(a, 0.5, 0, interpolation="lower")),
    "unary": lambda L, a, i: tuple(getattr(L, f)(a) for f in ("log2", "exp2", "sin", "cos", "tan", "atan", "sinh",
                                                              "cosh", "reciprocal")) + (L.log10(i), L.asin(a / 3)),
    "binary": lambda L, a, i: (L.atan2(a, a.flip(0)), L.hypot(a, 2 * a), L.logaddexp(a, -a), L.fmod(i, 2),
                               L.fmod(a, 0.7), L.fmod(-i, 3), L.fmax(a, L.where(a > 0, a * float("nan"), a)),
                               L.fmin(a, L.zeros(4))),
    "logical": lambda L, a, i: (L.logical_and(a > 0, i), L.logical_or(a, i), L.logical_xor(a > 0, a > 1),
                                L.logical_not(i)),
    "var_mean/std_mean": lambda L, a, i: (*L.var_mean(a, 1), *L.std_mean(a, 0, keepdim=True),
                                          *L.var_mean(a, correction=0)),
    "lerp/isclose": lambda L, a, i: (L.lerp(a, 2 * a, 0.25), L.lerp(a, -a, 0.7), L.lerp(a, a.flip(0), a.abs()),
                                     L.lerp(a.bfloat16(), a.flip(0).bfloat16(), 0.5),
                                     L.lerp(a, L.full_like(a, -float("inf")), 0.5), L.lerp(a, a * 3, 1.0),
                                     L.isclose(a, a + 1e-6), L.isclose(a, a + 0.1)),
    "creation": lambda L, a, i: (L.linspace(-1, 2, 7), L.eye(3), L.eye(2, 4, dtype=L.int64)),
    "products": lambda L, a, i: (L.outer(a[0], a[1]), L.dot(a[0], a[1]), L.mv(a, a[0]), L.mm(a, a.T),
                                 L.bmm(a.reshape(3, 2, 2), a.reshape(3, 2, 2))),
    "diagonals": lambda L, a, i: (a.diagonal(), a.diagonal(1), a.diagonal(-1), L.diag(a, 1), L.diag(a[0]),
                                  L.diag(a[0], -1), L.trace(a), L.trace(i)),
    "selection": lambda L, a, i: (L.nonzero(i), L.index_select(a, 1, L.tensor([3, 0, 0])),
                                  L.masked_select(a, a > 0), L.masked_select(a, L.tensor([True, False, True, True]))),
    "scatter": lambda L, a, i: (L.scatter(L.zeros(4, 4), 0, i, a), L.scatter_add(L.zeros(4, 4), 0, i, a),
                                L.zeros(3, 5).scatter(1, i[:, :2], 7.0) if L is not ft else
                                ft.zeros(3, 5).scatter(1, i[:, :2], value=7.0)),
    "counts": lambda L, a, i: (L.bincount(i.reshape(-1)), L.bincount(i.reshape(-1), a.reshape(-1), minlength=6),
                               L.diff(a), L.diff(i, n=2, dim=0), L.diff(a > 0)),
    "search": lambda L, a, i: (L.isin(i, L.tensor([0, 3])), L.searchsorted(L.tensor([0.0, 0.5, 1.0]), a),
                               L.bucketize(a, L.tensor([-1.0, 0.0, 1.0]), right=True)),
    "shapes": lambda L, a, i: (a.mT, a.reshape(3, 2, 2).movedim(0, 2), a.reshape(3, 2, 2).swapaxes(0, 1),
                               a.view_as(a.T), a.ravel(), a.tile(2), a.tile((2, 1, 1)), a.broadcast_to((2, 3, 4)),
                               L.repeat_interleave(i, 2), i.repeat_interleave(L.tensor([1, 0, 2]), dim=0),
                               *L.meshgrid(L.tensor([1, 2, 3]), L.tensor([4, 5]), indexing="xy")),
}


def _values(results):
    return [(np.asarray(r.float() if r.dtype.is_floating_point else r), str(r.dtype).split(".")[-1])
            for r in (results if isinstance(results, tuple) else (results,))]


@pytest.mark.parametrize("name", EVERYDAY)
def test_everyday_functions_match_pytorch(name):
    torch = pytest.importorskip("torch")
    ours = _values(EVERYDAY[name](ft, ft.tensor(A), ft.tensor(I)))
    theirs = _values(EVERYDAY[name](torch, torch.tensor(A), torch.tensor(I)))
    assert len(ours) == len(theirs)
    for k, ((got, got_dtype), (want, want_dtype)) in enumerate(zip(ours, theirs)):
        assert got_dtype == want_dtype and got.shape == want.shape, (k, got_dtype, want_dtype, got.shape, want.shape)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, equal_nan=True, err_msg=f"{name} result {k}")


def test_everyday_functions_match_numpy():
    a, i = ft.tensor(A), ft.tensor(I)
    assert a.prod(1).tolist() == pytest.approx(np.prod(A, 1).tolist(), rel=1e-6) and ft.prod(i).dtype == ft.int64
    assert ft.median(ft.tensor([3.0, 1.0, 4.0, 2.0])).item() == 2.0  # the lower middle value, not 2.5
    assert ft.median(ft.tensor([1.0, float("nan"), 0.0])).item() != ft.median(ft.tensor([1.0, 0.0])).item()
    np.testing.assert_allclose(n(ft.quantile(a, 0.3, dim=1)), np.quantile(A, 0.3, axis=1), rtol=1e-6)
    # PyTorch's module-level spellings of the shape methods, and the integer conversions
    np.testing.assert_array_equal(n(ft.reshape(a, (4, -1))), A.reshape(4, -1))
    np.testing.assert_array_equal(n(ft.transpose(a, 0, 1)), A.T)
    np.testing.assert_array_equal(n(ft.permute(a, (1, 0))), A.T)
    np.testing.assert_array_equal(n(ft.t(a)), A.T)
    assert ft.squeeze(ft.zeros(1, 2, 1)).shape == (2,) and ft.squeeze(ft.zeros(1, 2, 1), 0).shape == (2, 1)
    assert ft.unsqueeze(a, 1).shape == (A.shape[0], 1, A.shape[1]) and ft.numel(a) == A.size
    np.testing.assert_array_equal(n(ft.take(a, ft.tensor([[0, 5], [A.size - 1, 2]]))),
                                  np.take(A, [[0, 5], [A.size - 1, 2]]))
    np.testing.assert_array_equal(n(ft.argwhere(i)), np.argwhere(I))
    assert i.short().dtype is ft.int16 and i.byte().dtype is ft.uint8 and i.char().dtype is ft.int8
    with pytest.raises(ValueError, match="quantile: the values to take quantiles of are empty"):
        ft.zeros(0).quantile(0.5)
    with pytest.raises(ValueError, match="quantile: the values to take quantiles of are empty"):
        ft.zeros(3, 0).quantile(0.5, dim=1)
    np.testing.assert_allclose(n(ft.fmod(ft.tensor([-7, 7]), 3)), np.fmod([-7, 7], 3))
    assert ft.allclose(a, a + 1e-7) and not ft.allclose(a, a + 1e-3) and ft.equal(i, i.clone())
    assert not ft.equal(i, i[:2]) and ft.linspace(0, 1, 5).tolist() == [0.0, 0.25, 0.5, 0.75, 1.0]
    d = a.diagonal(1)  # a view, as PyTorch's
    d.fill_(0)
    assert a[0, 1].item() == 0 and a[2, 3].item() == 0
    np.testing.assert_array_equal(n(ft.nonzero(i)), np.argwhere(I))
    np.testing.assert_array_equal(n(ft.index_select(i, 0, ft.tensor([2, 0]))), I[[2, 0]])
    out = n(ft.scatter_add(ft.zeros(4, 4, dtype=ft.int64), 0, i, ft.ones(3, 4, dtype=ft.int64)))
    np.testing.assert_array_equal(out.sum(0), [3, 3, 3, 3])  # repeated places add up
    np.testing.assert_array_equal(n(ft.bincount(i.reshape(-1))), np.bincount(I.reshape(-1)))
    np.testing.assert_array_equal(n(ft.searchsorted(ft.tensor([1, 3, 5]), ft.tensor([3, 4]), right=True)), [2, 2])
    assert a.reshape(3, 2, 2).movedim(0, -1).shape == (2, 2, 3) and a.mT.shape == (4, 3)
    with pytest.raises(IndexError, match="index_select: index out of range for dimension 1 of size 4"):
        ft.index_select(a, 1, ft.tensor([4]))
    with pytest.raises(IndexError, match="scatter: index out of range"):
        ft.scatter(ft.zeros(2, 2), 0, ft.tensor([[2, 0]]), 1.0)
    with pytest.raises(ValueError, match="bincount: input must be non-negative"):
        ft.bincount(ft.tensor([-1, 2]))
    with pytest.raises(ValueError, match=r"mm: expected 2-d and 2-d tensors, got 1-d and 2-d"):
        ft.mm(a[0], a)


def test_scatter_diff_and_index_select_edges_as_pytorch():
    labels = ft.tensor([0, 2, 1, 2, 0, 1, 2])  # an index longer than the input along dim: class counts
    assert ft.scatter_add(ft.zeros(3), 0, labels, ft.ones(7)).tolist() == [2.0, 2.0, 3.0]
    with pytest.raises(ValueError, match=r"larger than input \(2, 3\) outside dimension 0"):
        ft.scatter(ft.zeros(2, 3), 0, ft.zeros(2, 4, dtype=ft.int64), 1.0)
    bits = ft.tensor([True, False, True, True, False, False, True])
    assert ft.diff(bits, n=2).tolist() == [False, True, True, True, True]  # xor applied twice
    with pytest.raises(IndexError, match="index_select: index out of range"):
        ft.index_select(ft.zeros(2, 3), 1, ft.tensor([-1]))


def test_numpys_names_for_dimensions_as_pytorch_takes_them():
    """axis for dim and keepdims for keepdim, in functions, methods and traced code, as PyTorch accepts them."""
    a = rng.standard_normal((3, 4)).astype(np.float32)
    t = ft.tensor(a)
    np.testing.assert_allclose(n(t.sum(axis=1)), a.sum(axis=1), rtol=1e-6)
    np.testing.assert_allclose(n(ft.mean(t, axis=0, keepdims=True)), a.mean(axis=0, keepdims=True), rtol=1e-6)
    assert n(t.argmax(axis=1)).tolist() == a.argmax(axis=1).tolist()
    np.testing.assert_array_equal(n(t.max(axis=0, keepdims=True).values), a.max(axis=0, keepdims=True))
    np.testing.assert_allclose(n(t.cumsum(axis=0)), a.cumsum(axis=0), rtol=1e-6)
    assert t.unsqueeze(axis=0).shape == (1, 3, 4) and ft.cat([t, t], axis=0).shape == (6, 4)
    with pytest.raises(TypeError, match="sum.. got both dim and its alias axis"):
        t.sum(dim=0, axis=1)

    class Centered(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 3)

        def forward(self, x):
            h = self.fc(x)
            return h - h.mean(axis=-1, keepdims=True)

    ft.manual_seed(0)
    m = Centered()
    p = m.compile(ft.optim.SGD(m.parameters(), lr=0.1), batch_size=3, input_shape=(4,))
    out = p.predict(a).numpy()
    np.testing.assert_allclose(out.sum(axis=1), 0, atol=1e-6)


@pytest.mark.parametrize("dtype", ["uint8", "int16", "int32", "int64"])
def test_shifts_as_numpy_and_pytorch(dtype):
    """<< and >> (and in place) of integers as NumPy's shifts, which PyTorch's equal: past the width 0, or -1 for a
    negative value shifted right; floats and bools refused."""
    info = np.iinfo(dtype)
    a = rng.integers(info.min, info.max, (5, 4), dtype=dtype, endpoint=True)
    s = rng.integers(0, info.bits + 3, (1, 4)).astype(dtype)
    t, u = ft.tensor(a), ft.tensor(s)
    assert_values(t << u, np.left_shift(a, s), dtype)
    assert_values(t >> u, np.right_shift(a, s), dtype)
    assert_values(t >> 1, np.right_shift(a, 1), dtype)
    assert_values(3 << u, np.left_shift(np.asarray(3, dtype), s), dtype)
    t <<= 1
    np.testing.assert_array_equal(n(t), np.left_shift(a, 1))
    with pytest.raises(TypeError, match="bitwise_left_shift: shifts need integer tensors, got float32"):
        ft.tensor([1.5]) << 1
    with pytest.raises(TypeError, match="shifts need integer tensors, got bool"):
        ft.tensor([True]) >> ft.tensor([False])


def test_numpy_force_copies_only_what_it_must():
    t = ft.tensor(np.arange(6, dtype=np.float32))
    a = t.numpy(force=True)
    a[0] = 7  # a CPU tensor's memory, shared as without force
    assert t[0].item() == 7


def test_stacking_aliases_nan_to_num_and_unflatten_as_numpy():
    """hstack/vstack (1-d and 0-d tensors as NumPy's), concat/concatenate (cat), nan_to_num with the dtype's
    finite extremes (bfloat16's own), unflatten, round(decimals=) and index_add against NumPy."""
    a, b = np.arange(3, dtype=np.float32), np.arange(3, 6, dtype=np.float32)
    m = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(np.asarray(ft.hstack([ft.tensor(a), ft.tensor(b)])), np.hstack([a, b]))
    np.testing.assert_array_equal(np.asarray(ft.hstack([ft.tensor(m), ft.tensor(m)])), np.hstack([m, m]))
    np.testing.assert_array_equal(np.asarray(ft.vstack([ft.tensor(a), ft.tensor(m)])), np.vstack([a, m]))
    np.testing.assert_array_equal(np.asarray(ft.hstack([ft.tensor(1.0), ft.tensor(a)])), np.hstack([1.0, a]))
    assert ft.concat is ft.cat and ft.concatenate is ft.cat
    x = np.array([np.nan, np.inf, -np.inf, 1.5], np.float32)
    np.testing.assert_array_equal(np.asarray(ft.nan_to_num(ft.tensor(x))), np.nan_to_num(x))
    np.testing.assert_array_equal(np.asarray(ft.tensor(x).nan_to_num(nan=2.0, posinf=9.0)),
                                  np.nan_to_num(x, nan=2.0, posinf=9.0))
    low = np.asarray(ft.tensor(x).to(ft.bfloat16).nan_to_num().float())
    assert np.isfinite(low).all() and low[1] == 3.3895313892515355e38 and low[2] == -low[1]
    np.testing.assert_array_equal(np.asarray(ft.tensor([1, 2]).nan_to_num()), [1, 2])
    t = ft.tensor(np.arange(24, dtype=np.float32).reshape(2, 12))
    np.testing.assert_array_equal(np.asarray(t.unflatten(1, (3, -1))), np.arange(24).reshape(2, 3, 4))
    r = np.array([1.2345, -2.5, 125.0, 0.125], np.float32)
    for decimals in (0, 2, -1):
        np.testing.assert_array_equal(np.asarray(ft.tensor(r).round(decimals=decimals)), np.round(r, decimals))
    with pytest.raises(TypeError, match="decimals takes floating-point tensors"):
        ft.round(ft.tensor([1, 2]), decimals=1)
    x = ft.tensor(np.arange(12, dtype=np.float32).reshape(3, 4))
    x.index_add_(1, ft.tensor([1, 3, 1]), ft.ones(3, 3), alpha=2)  # repeated entries add up
    np.testing.assert_array_equal(np.asarray(x), np.arange(12).reshape(3, 4) + [[0, 4, 0, 2]] * 3)
    with pytest.raises(ValueError, match=r"source must have shape \(3, 2\)"):
        x.index_add(1, ft.tensor([0, 1]), ft.ones(3, 3))
    with pytest.raises(IndexError, match="out of range"):
        x.index_add(0, ft.tensor([3]), ft.ones(1, 4))
    np.testing.assert_array_equal(np.asarray(t.unflatten(-1, (2, 6))), np.arange(24).reshape(2, 2, 6))


def test_masks_fills_zero_d_selections_and_ravel_as_pytorch():
    """An empty bool mask indexed a dimension of any size (NumPy's rule; PyTorch refuses it), masked_fill wrapped
    a number its dtype cannot hold (int8 1000 gave -24; fill_ and t[i] = v refuse it), index_select of a 0-d
    tensor gave (1,), and ravel of a strided view returned a view sharing its memory (torch.ravel is contiguous)."""
    t = ft.arange(6).reshape(3, 2)
    with pytest.raises(IndexError, match=r"the shape of the mask \[0\] at index 0 does not match the shape \[3\]"):
        t[ft.zeros(0, dtype=ft.bool)]
    with pytest.raises(IndexError, match=r"mask \[2\] at index 1 does not match the shape \[3\]"):
        t.reshape(2, 3)[..., ft.tensor([True, False])] = 7
    np.testing.assert_array_equal(t[..., ft.tensor([True, False])].numpy(), [[0], [2], [4]])
    mask = ft.tensor([True, False])
    for dtype, value in ((ft.int8, 1000), (ft.int64, float("nan")), (ft.int32, 1e10)):
        with pytest.raises(OverflowError, match="without overflow"):
            ft.tensor([5, 6], dtype=dtype).masked_fill(mask, value)
    assert ft.tensor([5, 6]).masked_fill(mask, 2.7).tolist() == [2, 6]
    assert ft.tensor([5, 6], dtype=ft.uint8).masked_fill(mask, -1).tolist() == [255, 6]  # as PyTorch
    assert ft.tensor(5).index_select(0, ft.tensor([0])).shape == ()
    with pytest.raises(IndexError, match="a 0-d tensor takes an index of one value, got 2"):
        ft.tensor(5).index_select(0, ft.tensor([0, 0]))
    base = ft.arange(24.0).reshape(3, 8)
    flat = base[:, ::2].ravel()
    flat[0] = -1.0
    assert flat.is_contiguous() and base[0, 0].item() == 0.0
    assert base.ravel().data_ptr() == base.data_ptr()  # a contiguous tensor's is a view


def test_finfo_iinfo_erf_addmm_and_sizes_by_name_as_pytorch():
    """Names ported code reaches for (Hugging Face's masks use finfo(dtype).min, GPT-2's Conv1D addmm, BEiT's
    zeros(size=...)), against NumPy and math; ft.stack's result is contiguous, so that .view(-1) works (it was laid
    out with the new dimension innermost)."""
    assert ft.finfo(ft.float32).min == float(np.finfo(np.float32).min) and ft.finfo().eps == 2.0 ** -23
    b = ft.finfo(ft.bfloat16)
    assert (b.bits, b.eps, b.max, b.tiny) == (16, 2.0 ** -7, float.fromhex("0x1.fep127"), 2.0 ** -126)
    assert ft.tensor([b.max]).to(ft.bfloat16).item() == b.max  # the largest finite bfloat16
    assert (ft.iinfo(ft.int8).min, ft.iinfo(ft.uint8).max, ft.iinfo(ft.int64).max) == (-128, 255, 2 ** 63 - 1)
    for bad, call in (("int64", lambda: ft.finfo(ft.int64)), ("float32", lambda: ft.iinfo(ft.float32))):
        with pytest.raises(TypeError, match=bad):
            call()
    x = np.array([-3.0, -0.5, 0.0, 0.25, 2.0], np.float32)
    np.testing.assert_allclose(ft.erf(ft.tensor(x)).numpy(), [math.erf(v) for v in x], rtol=1e-6)
    np.testing.assert_allclose(ft.erfc(ft.tensor(x)).numpy(), [math.erfc(v) for v in x], rtol=1e-6)
    r = np.random.default_rng(74)
    bias, m1, m2 = r.standard_normal(3), r.standard_normal((2, 4)), r.standard_normal((4, 3))
    got = ft.addmm(ft.tensor(bias), ft.tensor(m1), ft.tensor(m2), beta=0.5, alpha=2.0)
    np.testing.assert_allclose(got.numpy(), 0.5 * bias + 2.0 * m1 @ m2, rtol=1e-5)
    nan = ft.full((2, 3), float("nan"))
    np.testing.assert_allclose(ft.addmm(nan, ft.tensor(m1), ft.tensor(m2), beta=0).numpy(), m1 @ m2, rtol=1e-5)
    b1, b2 = r.standard_normal((2, 3, 4)), r.standard_normal((2, 4, 5))
    np.testing.assert_allclose(ft.baddbmm(ft.ones(2, 3, 5), ft.tensor(b1), ft.tensor(b2)).numpy(), 1 + b1 @ b2,
                               rtol=1e-5)
    assert ft.zeros(size=(2, 3)).shape == ft.empty(size=[2, 3]).shape == (2, 3) and ft.ones(size=4).shape == (4,)
    with pytest.raises(TypeError, match="positionally or as size=, not both"):
        ft.zeros(2, size=(3,))
    s = ft.stack([ft.arange(4.0), ft.arange(4.0) + 4])
    assert s.is_contiguous() and s.view(-1).tolist() == list(range(8))


def test_triangle_indices_are_pytorchs_documented_examples():
    assert ft.tril_indices(3, 3).tolist() == [[0, 1, 1, 2, 2, 2], [0, 0, 1, 0, 1, 2]]
    assert ft.tril_indices(4, 3, -1).tolist() == [[1, 2, 2, 3, 3, 3], [0, 0, 1, 0, 1, 2]]
    assert ft.tril_indices(4, 3, 1).tolist() == [[0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3], [0, 1, 0, 1, 2, 0, 1, 2, 0, 1, 2]]
    assert ft.triu_indices(3, 3).tolist() == [[0, 0, 0, 1, 1, 2], [0, 1, 2, 1, 2, 2]]
    assert ft.triu_indices(4, 3, -1).tolist() == [[0, 0, 0, 1, 1, 1, 2, 2, 3], [0, 1, 2, 0, 1, 2, 1, 2, 2]]
    assert ft.triu_indices(4, 3, 1).tolist() == [[0, 0, 1], [1, 2, 2]]
    assert ft.tril_indices(0, 3).shape == (2, 0) and ft.tril_indices(2, 2).dtype == ft.int64
    with pytest.raises(ValueError, match="row and col must be non-negative"):
        ft.triu_indices(-1, 3)


def test_arange_movedim_and_bernoulli_spellings_as_pytorch():
    """ft.arange(end=n) (ultralytics' make_anchors), ft.movedim / ft.moveaxis as functions, ft.bernoulli of
    probabilities and bernoulli_ of a tensor of them, a 0-d tensor's unfold, and F.upsample (old PSPNet and FPN
    code's name of interpolate)."""
    assert ft.arange(end=3).tolist() == [0, 1, 2] and ft.arange(0.0, 2).dtype == ft.float32
    with pytest.raises(TypeError, match="missing 1 required argument: 'end'"):
        ft.arange()
    a = np.arange(24.0).reshape(2, 3, 4)
    for fn in (ft.movedim, ft.moveaxis):
        np.testing.assert_array_equal(fn(ft.tensor(a), (0, 1), (2, 0)).numpy(), np.moveaxis(a, (0, 1), (2, 0)))
    ft.manual_seed(3)
    p = ft.tensor(np.repeat(np.float32([0.0, 0.25, 1.0]), 4000))
    drawn = ft.bernoulli(p).numpy().reshape(3, -1)
    assert drawn.dtype == np.float32 and not drawn[0].any() and drawn[2].all() and abs(drawn[1].mean() - 0.25) < 0.03
    assert ft.empty(3).bernoulli_(ft.tensor([1.0, 0.0, 1.0])).tolist() == [1.0, 0.0, 1.0]
    with pytest.raises(ValueError, match=r"p must be in \[0, 1\]"):
        ft.empty(2).bernoulli_(ft.tensor([0.5, 2.0]))
    assert ft.tensor(3.0).unfold(0, 1, 1).tolist() == [3.0]
    x = ft.tensor(a[:, :, None].astype(np.float32))
    with pytest.warns(UserWarning, match="upsample is deprecated"):
        up = ft.nn.functional.upsample(x, scale_factor=2)
    np.testing.assert_array_equal(up.numpy(), ft.nn.functional.interpolate(x, scale_factor=2).numpy())


# ================================================================ differences a fuzzer found against PyTorch

def test_einsum_sums_one_integer_operand_into_int64():
    """One bool or integer operand summed over an index sums in int64, as torch.sum (it wrapped around in int8);
    without a sum, or with two operands, the dtype stays."""
    for eq, x, want in (("i->", ft.tensor([100, 100, 100], dtype=ft.int8), 300),
                        ("ii->", ft.tensor([[100, 0], [0, 100]], dtype=ft.int8), 200),
                        ("ii", ft.tensor([[30000, 0], [0, 30000]], dtype=ft.int16), 60000),
                        ("i->", ft.tensor([True, True]), 2)):
        r = ft.einsum(eq, x)
        assert r.dtype == ft.int64 and r.item() == want, eq
    r = ft.einsum("ij->j", ft.full((2, 3), 200, dtype=ft.uint8))
    assert r.dtype == ft.int64 and r.tolist() == [400] * 3
    assert ft.einsum("ii->i", ft.tensor([[1, 2], [3, 4]], dtype=ft.int8)).dtype == ft.int8
    assert ft.einsum("ij->ji", ft.ones(2, 3, dtype=ft.int32)).dtype == ft.int32
    assert ft.einsum("i,i->", ft.tensor([1, 2], dtype=ft.int8), ft.tensor([3, 4], dtype=ft.int8)).dtype == ft.int8
    assert ft.einsum("i->", ft.tensor([1.0, 2.0], dtype=ft.float16)).dtype == ft.float16


def test_a_list_of_sequences_indexes_as_a_tuple_of_indices():
    """PyTorch reads a list holding a sequence, tensor, slice, None or ... as a tuple (a[[[0], [1]]] is a[[0], [1]]);
    a list of numbers stays one index array."""
    a = ft.arange(24).reshape(2, 3, 4)
    assert a[[[0], [1]]].tolist() == [[4, 5, 6, 7]]
    view = a[[1, slice(1, 3)]]  # basic, a view
    assert view.tolist() == a[1, 1:3].tolist() and view.data_ptr() == a[1, 1].data_ptr()
    assert a[[0, None]].shape == (1, 3, 4) and a[[1, ...]].tolist() == a[1].tolist()
    assert a[[ft.tensor(1), 1]].tolist() == [16, 17, 18, 19] and a[[np.array([1]), 1]].shape == (1, 4)
    assert a[[(0, 1), 1]].tolist() == [[4, 5, 6, 7], [16, 17, 18, 19]]
    assert a[[1, 0]].shape == (2, 3, 4) and a[[1, 0]][0].tolist() == a[1].tolist()  # numbers: one array
    b = ft.zeros(3, 3, dtype=ft.int64)
    b[[[0], [1]]] = 7
    b[[2, slice(0, 2)]] = 5
    assert b.tolist() == [[0, 7, 0], [0, 0, 0], [5, 5, 0]]


def test_16_bit_rounded_division_rounds_each_step_to_the_dtype():
    """div(rounding_mode='trunc'/'floor') and // of float16 and bfloat16 as PyTorch's CPU kernels: the quotient
    rounded to the dtype before trunc (6 / bf16(0.1) is 59.94, 60 in bfloat16), floor by divmod's steps each
    rounded (values from torch 2.15)."""
    x, y = ft.tensor([6.0, 7.0, -9.0], dtype=ft.bfloat16), ft.full((3,), 0.1, dtype=ft.bfloat16)
    assert ft.div(x, y, rounding_mode="trunc").tolist() == [60.0, 70.0, -90.0]
    assert ft.div(x, y, rounding_mode="floor").tolist() == [59.0, 69.0, -91.0]
    assert (x // y).tolist() == [59.0, 69.0, -91.0] and (x // y).dtype == ft.bfloat16
    h = ft.tensor([-80.25, -76.75, 41.875, 0.0], dtype=ft.float16)
    d = ft.tensor([-3.2109375, 0.030242919921875, 0.0, 0.0], dtype=ft.float16)
    got = ft.div(h, d, rounding_mode="trunc").tolist()
    assert got[:2] == [25.0, -2538.0] and got[2] == float("inf") and math.isnan(got[3])
    assert ft.div(h, d, rounding_mode="floor").tolist()[:3] == [24.0, -2540.0, float("inf")]


def test_masked_fill_takes_a_number_or_a_0_d_tensor():
    a = ft.tensor([[1], [2]])
    with pytest.raises(ValueError, match=r"only a 0-dimensional value tensor .* got one with 1 dimension"):
        a.masked_fill(a > 1, ft.arange(3))
    with pytest.raises(ValueError, match="0-dimensional value tensor"):
        a.masked_fill_(a > 1, ft.tensor([5]))
    assert a.masked_fill(a > 1, ft.tensor(5)).tolist() == [[1], [5]]
    assert a.masked_fill(a > 1, ft.tensor(2.7)).tolist() == [[1], [2]]  # its number, converted as fill_'s


def test_roll_takes_one_shift_per_dim():
    a = ft.arange(6).reshape(2, 3)
    for shifts, dims in (((1,), (0, 1)), ((1, 2), 1), ((1, 1), (0,)), ((1, 2), None)):
        with pytest.raises(ValueError, match="shifts and dimensions must align"):
            a.roll(shifts, dims)
    with pytest.raises(ValueError, match="`shifts` required"):
        a.roll((), ())
    assert a.roll(1).tolist() == a.roll([1]).tolist() == a.roll(1, []).tolist() == [[5, 0, 1], [2, 3, 4]]
    assert a.roll((1,), 0).tolist() == [[3, 4, 5], [0, 1, 2]] and a.roll((1, 1), (0, 0)).tolist() == a.tolist()


def test_lerp_takes_floating_tensors_of_one_dtype():
    """As torch.lerp: input floating, end of its dtype, a weight tensor of dimensions too (a 0-d weight of any
    dtype); it gave garbage for a 0-d int16 start and a uint8 end."""
    f = ft.tensor([1.0, 2.0])
    with pytest.raises(TypeError, match="expected a floating point tensor, got int16"):
        ft.lerp(ft.tensor(9, dtype=ft.int16), ft.tensor([43, 5, 3], dtype=ft.uint8), 0.5)
    for start, end, weight, name in ((f.half(), f, 0.5, "end"), (f.bfloat16(), f.half(), 0.5, "end"),
                                     (f, f.double(), 0.5, "end"), (f, ft.tensor(3.0, dtype=ft.float64), 0.5, "end"),
                                     (f.half(), f.half(), ft.tensor([0.5, 0.5]), "weight")):
        with pytest.raises(TypeError, match=f"expected dtype {start.dtype.name} for `{name}` but got dtype"):
            ft.lerp(start, end, weight)
    with pytest.raises(TypeError, match="for `end`"):
        f.clone().lerp_(f.double(), 0.5)
    assert ft.lerp(f, f * 3, ft.tensor(0.25, dtype=ft.float64)).tolist() == [1.5, 3.0]
    half = ft.lerp(f.half(), f.half() * 3, ft.tensor(1))
    assert half.dtype == ft.float16 and half.tolist() == [3.0, 6.0]


def test_zero_d_and_empty_edges_as_pytorch():
    """topk(0) of a 0-d tensor is itself, median's index of a NaN its first one, a 0-d bound beside a number bound a
    number (clamp keeps float16), an empty tensor contiguous, quantile and scatter_ of 0-d tensors (IndexError)."""
    r = ft.tensor(5.0).topk(0)
    assert r.values.shape == () and r.values.item() == 5.0 and r.indices.item() == 0
    assert ft.tensor([5.0]).topk(0).values.shape == (0,)
    nan = float("nan")
    assert ft.tensor([3.0, nan, 1.0, nan]).median(0).indices.item() == 1
    m = ft.tensor([[nan, 1.0, nan], [2.0, nan, nan], [3.0, 1.0, 2.0]]).median(1)
    assert m.indices.tolist() == [0, 1, 2] and m.values.tolist()[2] == 2.0
    assert ft.clamp(ft.tensor(3.0, dtype=ft.float16), min=ft.tensor(0.5), max=1).dtype == ft.float16
    assert ft.clamp(ft.tensor([3, 0]), min=ft.tensor(0.5, dtype=ft.float16), max=1).dtype == ft.float32
    assert ft.clamp(ft.tensor(3.0, dtype=ft.float16), min=ft.tensor(0.5), max=ft.tensor(1.0)).dtype == ft.float32
    assert ft.zeros(2, 0, 3).transpose(0, 2).is_contiguous() and ft.zeros(2, 0, 3)[:, :, ::2].is_contiguous()
    assert not ft.zeros(3, 1)[::2].is_contiguous()
    x = ft.tensor(-6.1)
    assert x.quantile(0.5, dim=-1).item() == x.item() and x.quantile(0.5, dim=0, keepdim=True).shape == ()
    assert x.quantile(ft.tensor([0.5, 0.25]), dim=0).tolist() == [x.item()] * 2
    with pytest.raises(IndexError, match="dim 1 is out of range"):
        x.quantile(0.5, dim=1)
    assert ft.tensor(5).scatter_(0, ft.tensor(0), 7).tolist() == 7
    assert ft.tensor(5).scatter_add(0, ft.tensor([0]), ft.tensor(3)).tolist() == 8
    assert ft.tensor([5, 6]).scatter(0, ft.tensor(1), 7).tolist() == [5, 7]
    with pytest.raises(IndexError, match="index out of range for dimension 0 of size 1"):
        ft.tensor(5).scatter(0, ft.tensor(1), 7)


def test_numbers_a_dtype_cannot_hold_are_refused_as_pytorch():
    """where's and pow's numbers in an integer result dtype, clamp's bounds, fill_, full, masked_fill and an
    advanced-index assignment's number: OverflowError naming the value and dtype, where PyTorch refuses them; what
    PyTorch takes stays (a negative int wrapping into uint8, a 16-bit where's inf, a float32 tensor's exponent)."""
    c, i8, u8, h = ft.tensor([True, False]), ft.tensor([1, 5], dtype=ft.int8), ft.tensor([1, 5], dtype=ft.uint8), \
        ft.tensor([1.0, 5.0], dtype=ft.float16)
    refused = [(lambda: ft.where(c, i8, 200), "value 200 .* int8"), (lambda: ft.where(c, 200, i8), "int8"),
               (lambda: ft.where(c, u8, -256), "uint8"), (lambda: ft.where(c, h.float(), 1e39), "float32"),
               (lambda: i8 ** 255, "value 255 .* int8"), (lambda: u8 ** 256, "uint8"),
               (lambda: h ** 70000, "float16"), (lambda: i8.clone().pow_(300), "int8"),
               (lambda: u8.clamp(max=-1), "max value -1 is outside the representable range of uint8"),
               (lambda: i8.clamp(min=128), "min value 128 .* int8"), (lambda: i8.clamp_max(-200), "int8"),
               (lambda: h.clamp(max=1e6), "value 1000000.0 .* float16"),
               (lambda: h.clamp(min=-65504.5), "float16"),
               (lambda: h.float().clamp(max=1e39), "float32"),
               (lambda: ft.zeros(2, dtype=ft.float16).fill_(1e6), "value 1000000.0 .* float16"),
               (lambda: ft.zeros(2, dtype=ft.float16).fill_(65519), "float16"),
               (lambda: ft.zeros(2, dtype=ft.bfloat16).fill_(1e39), "bfloat16"),
               (lambda: ft.zeros(0, dtype=ft.float32).fill_(-1e39), "float32"),
               (lambda: h.masked_fill(c, 1e6), "float16"), (lambda: h.masked_fill(~c & c, 1e6), "float16"),
               (lambda: i8.masked_fill(c, ft.tensor(200)), "value 200 .* int8"),
               (lambda: ft.full((2,), 1e6, dtype=ft.float16), "float16"),
               (lambda: h.new_full((2,), -1e6), "float16"), (lambda: ft.full_like(h, 1e6), "float16"),
               (lambda: h.clone().__setitem__(ft.tensor([0]), 1e6), "float16"),
               (lambda: h.clone().__setitem__(c, 1e6), "float16")]
    for fn, match in refused:
        with pytest.raises(OverflowError, match=match):
            fn()
    assert ft.where(c, u8, -1).tolist() == [1, 255] and ft.where(c, i8, 127).tolist() == [1, 127]
    assert ft.where(c, h, 1e6).tolist() == [1.0, float("inf")]
    assert ft.where(c, i8, ft.tensor(200)).tolist() == [1, -56]  # a 0-d tensor casts
    assert (i8 ** 127).tolist() == [1, (pow(5, 127, 256) + 128) % 256 - 128]  # wraps, as PyTorch's
    with np.errstate(over="ignore"):  # (NumPy warns as it casts 1e39 to float32)
        assert (h.float() ** 1e39).tolist() == [1.0, float("inf")]
    assert (h ** float("inf")).tolist() == [1.0, float("inf")] and (200 ** i8).tolist() == [-56, 0]
    assert u8.clamp(min=-1).tolist() == [1, 5] and i8.clamp(-200, 200).tolist() == [1, 5]
    assert h.clamp(min=-float("inf"), max=65504).tolist() == [1.0, 5.0]
    assert ft.zeros(1, dtype=ft.float16).fill_(float("inf")).tolist() == [float("inf")]
    assert ft.zeros(1, dtype=ft.float16).fill_(ft.tensor(1e6)).tolist() == [float("inf")]  # a tensor casts
    assert ft.zeros(1, dtype=ft.uint8).fill_(-255).tolist() == [1]
    t = ft.zeros(2, dtype=ft.float16)
    t[0] = 1e6  # basic-index assignment converts as PyTorch's: inf
    assert t.tolist() == [float("inf"), 0.0]


def test_sources_of_another_dtype_are_refused_as_pytorch():
    """index_add, scatter and scatter_add (and their in-place forms) take a source of input's dtype, and assignment
    through an advanced index a tensor of its dtype (but one value by a mask, as PyTorch's masked_fill_ path);
    basic-index assignment, numbers and arrays convert."""
    refused = [lambda: ft.zeros(3, dtype=ft.int32).index_add(0, ft.tensor([0, 0]), ft.ones(2)),
               lambda: ft.zeros(3).index_add_(0, ft.tensor([0, 0]), ft.ones(2, dtype=ft.float64)),
               lambda: ft.zeros(2, 3).scatter(1, ft.tensor([[0, 1]]), ft.ones(1, 2, dtype=ft.float64)),
               lambda: ft.zeros(2, 3).scatter_(1, ft.tensor([[0, 1]]), ft.tensor(2)),
               lambda: ft.zeros(3, dtype=ft.uint8).scatter_add(0, ft.tensor([0, 0]), ft.full((2,), 200)),
               lambda: ft.zeros(3, dtype=ft.uint8).scatter_add_(0, ft.tensor([0, 0]), ft.full((2,), 200))]
    for fn in refused:
        with pytest.raises(TypeError, match="expected s.* of input's dtype"):
            fn()
    for index, value in ((ft.tensor([0, 1]), ft.tensor([1.7, 2.5])), (ft.tensor([0, 1]), ft.tensor(5)),
                         ([0, 1], ft.tensor([1.0, 2.0])), (ft.tensor([True, False, True]), ft.tensor([1.0, 2.0])),
                         (ft.tensor(True), ft.tensor(1.5))):
        with pytest.raises(TypeError, match="got int32 for the destination and"):
            ft.zeros(3, dtype=ft.int32)[index] = value
    with pytest.raises(TypeError, match="got int32 for the destination and float32"):
        ft.zeros(2, 3, dtype=ft.int32)[0, ft.tensor([0, 1])] = ft.tensor([1.0, 2.0])
    t = ft.zeros(3, dtype=ft.int32)
    t[ft.tensor([True, False, True])] = ft.tensor(1.5)
    t[1:] = ft.tensor([3.7, 4.2])
    t[ft.tensor([0])] = 9.9
    assert t.tolist() == [9, 3, 4]
    t[[0, 1]] = np.array([5.5, 6.5])
    t[ft.tensor([2])] = ft.tensor([8], dtype=ft.int32)
    assert t.tolist() == [5, 6, 8]
    assert ft.zeros(3, dtype=ft.uint8).scatter_add(0, ft.tensor([0, 0]), ft.full((2,), 200, dtype=ft.uint8)) \
        .tolist() == [144, 0, 0]


def test_the_fuzzer_cases_match_torch():
    """The cases above, and random 16-bit divisions, against PyTorch itself: values, dtypes and shapes, or both
    refusing."""
    torch = pytest.importorskip("torch")
    nan = float("nan")
    cases = [
        lambda L: L.einsum("i->", L.tensor([100, 100, 100], dtype=L.int8)),
        lambda L: L.einsum("...i->...", L.full((2, 3), 30000, dtype=L.int16)),
        lambda L: L.arange(24).reshape(2, 3, 4)[[[0], [1]]],
        lambda L: L.arange(24).reshape(2, 3, 4)[[0, slice(1, 3)]],
        lambda L: L.masked_fill(L.tensor([[1], [2]]), L.tensor([[False], [True]]), L.arange(3)),
        lambda L: L.arange(6).reshape(2, 3).roll(1, (0, 1)),
        lambda L: L.lerp(L.tensor([1.0], dtype=L.bfloat16), L.tensor([2.0], dtype=L.float16), 0.5),
        lambda L: L.lerp(L.tensor([1, 2]), L.tensor([3, 4]), 0.5),
        lambda L: L.tensor(5.0).topk(0).values,
        lambda L: L.tensor([3.0, nan, 1.0, nan]).median(0).indices,
        lambda L: L.clamp(L.tensor(3.0, dtype=L.float16), min=L.tensor(0.5), max=1),
        lambda L: L.tensor(-6.1).quantile(0.5, dim=-1),
        lambda L: L.tensor(5).scatter_(0, L.tensor(0), 7),
        lambda L: L.where(L.tensor([True, False]), L.tensor([1], dtype=L.int8), 200),
        lambda L: L.tensor([1, 5], dtype=L.uint8).clamp(max=-1),
        lambda L: L.full((2,), 1e6, dtype=L.float16),
        lambda L: L.zeros(3, dtype=L.int32).index_add(0, L.tensor([0, 0]), L.ones(2)),
        lambda L: L.zeros(2, 3).scatter(1, L.tensor([[0, 1]]), L.ones(1, 2, dtype=L.float64)),
    ]
    for k, case in enumerate(cases):
        same_as_torch(torch, outcome(lambda: case(torch)), outcome(lambda: case(ft)), f"case {k}")
    assert ft.zeros(2, 0, 3).transpose(0, 2).is_contiguous() == torch.zeros(2, 0, 3).transpose(0, 2).is_contiguous()
    r = np.random.default_rng(1)
    a, b = r.uniform(-100, 100, 4000), r.uniform(-2, 2, 4000) ** 3
    for dtype in ("bfloat16", "float16"):
        ta, tb = (torch.tensor(v).to(getattr(torch, dtype)) for v in (a, b))
        fa, fb = (ft.tensor(v.float().numpy()).to(dtype) for v in (ta, tb))
        for mode in ("trunc", "floor"):
            want = torch.div(ta, tb, rounding_mode=mode).float().numpy()
            np.testing.assert_array_equal(n(ft.div(fa, fb, rounding_mode=mode).float()), want, err_msg=mode)
