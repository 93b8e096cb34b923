"""Tensor creation, views, indexing, copies and conversions against NumPy."""
import pickle
import weakref

import numpy as np
import pytest

import fasttrain as ft

REAL = ["bool", "uint8", "int8", "int16", "int32", "int64", "uint16", "uint32", "uint64", "float16", "float32",
        "float64"]


def test_dtypes_and_aliases():
    assert ft.float32.itemsize == 4 and ft.bfloat16.itemsize == 2 and ft.complex128.itemsize == 16
    assert ft.float is ft.float32 and ft.long is ft.int64 and ft.half is ft.float16 and ft.double is ft.float64
    assert ft.float16.is_floating_point and ft.bfloat16.is_floating_point and not ft.int32.is_floating_point
    assert repr(ft.bfloat16) == "fasttrain.bfloat16"
    assert pickle.loads(pickle.dumps(ft.int16)) is ft.int16


def test_device_parsing():
    assert ft.device("cpu") == "cpu" and str(ft.device("cuda:1")) == "cuda:1"
    assert ft.device("cuda").index == 0 and repr(ft.device("cpu")) == "device(type='cpu')"
    for bad in ["gpu", "cuda:x", "cuda:-1"]:
        with pytest.raises(ValueError):
            ft.device(bad)
    with pytest.raises(TypeError):
        ft.device(3.0)


@pytest.mark.parametrize("name", REAL + ["bfloat16"])
def test_factories(name):
    dt = getattr(ft, name)
    z, o = ft.zeros(2, 3, dtype=dt), ft.ones((2, 3), dtype=dt)
    assert z.shape == (2, 3) and z.dtype is dt and z.stride() == (3, 1)
    assert z.tolist() == [[0] * 3] * 2 and o.tolist() == [[1] * 3] * 2
    assert ft.full((4,), 7, dtype=dt).tolist() == [1 if name == "bool" else 7] * 4


def test_full_infers_dtype_like_torch():
    assert ft.full((1,), True).dtype is ft.bool
    assert ft.full((1,), 3).dtype is ft.int64
    assert ft.full((1,), 3.5).dtype is ft.float32


def test_arange():
    assert ft.arange(5).tolist() == list(range(5)) and ft.arange(5).dtype is ft.int64
    np.testing.assert_array_equal(ft.arange(1, 2, 0.1).numpy(), np.arange(1, 2, 0.1).astype(np.float32))
    assert ft.arange(10, 0, -3).tolist() == [10, 7, 4, 1]
    assert ft.arange(0, 5, dtype=ft.float64).dtype is ft.float64
    assert ft.arange(3, 3).numel() == 0
    with pytest.raises(ValueError):
        ft.arange(0, 10, 0)
    with pytest.raises(ValueError):
        ft.arange(0, float("inf"))
    for args in ((5, 0, 1), (0, 5, -1), (-1,)):  # away from end: refused, as PyTorch's (an empty range was returned)
        with pytest.raises(ValueError, match="arange: the step .* goes away from end"):
            ft.arange(*args)
    # an integer dtype from real arguments, as PyTorch: start and step truncated to integers and the count from the
    # real arguments, evenly spaced (no value repeated about zero)
    assert ft.arange(-2.5, 2, 1, dtype=ft.int64).tolist() == np.arange(-2.5, 2, 1, dtype=np.int64).tolist() == \
        [-2, -1, 0, 1, 2]
    assert ft.arange(0.5, -3.5, -1, dtype=ft.int64).tolist() == [0, -1, -2, -3]
    assert ft.arange(1.7, 6, 2, dtype=ft.int32).tolist() == [1, 3, 5]
    assert ft.arange(0, 2, 0.5, dtype=ft.int64).tolist() == [0, 0, 0, 0]  # a step truncated to 0, as PyTorch's
    assert ft.arange(ft.tensor(4)).tolist() == [0, 1, 2, 3] and ft.arange(ft.tensor(1.0), 3).tolist() == [1.0, 2.0]


def test_tensor_from_nested_lists_infers_like_torch():
    assert ft.tensor([[1, 2], [3, 4]]).dtype is ft.int64
    assert ft.tensor([1, 2.5]).dtype is ft.float32
    assert ft.tensor([True, False]).dtype is ft.bool
    assert ft.tensor([True, 2]).dtype is ft.int64
    assert ft.tensor([np.float64(1.0), 2.0]).dtype is ft.float64
    assert ft.tensor([np.int32(1), np.int32(2)]).dtype is ft.int32
    assert ft.tensor([np.float16(1.0)]).dtype is ft.float16
    assert ft.tensor(3).shape == () and ft.tensor(3).item() == 3
    assert ft.tensor([]).shape == (0,) and ft.tensor([]).dtype is ft.float32
    assert ft.tensor([[], []]).shape == (2, 0)
    assert ft.tensor(((1, 2), (3, 4))).tolist() == [[1, 2], [3, 4]]
    assert ft.tensor([1, 2], dtype=ft.float16).tolist() == [1.0, 2.0]
    assert ft.tensor([2 ** 64 - 1], dtype=ft.uint64).item() == 2 ** 64 - 1


def test_tensor_from_data_bad_input():
    with pytest.raises(ValueError, match="ragged"):
        ft.tensor([[1, 2], [3]])
    with pytest.raises(ValueError, match="ragged"):
        ft.tensor([[1, 2], 3])
    with pytest.raises(ValueError, match="ragged"):
        ft.tensor([1, [2]])
    a = [1]
    a.append(a)
    with pytest.raises(ValueError):
        ft.tensor(a)
    b = []
    b.append(b)
    with pytest.raises(ValueError, match="deeper"):
        ft.tensor(b)
    with pytest.raises(TypeError):
        ft.tensor(["a", "b"])
    with pytest.raises(TypeError):
        ft.tensor([None])
    with pytest.raises(TypeError):
        ft.tensor([1 + 2j])
    with pytest.raises(OverflowError):
        ft.tensor([2 ** 64])
    with pytest.raises(OverflowError):
        ft.tensor([2 ** 63])  # does not fit the inferred int64
    with pytest.raises(OverflowError):
        ft.tensor([-(2 ** 63) - 1])


def test_shape_errors():
    with pytest.raises(ValueError):
        ft.empty(-1)
    with pytest.raises(OverflowError):
        ft.empty(2 ** 40, 2 ** 40)
    with pytest.raises(MemoryError):
        ft.empty(2 ** 50)
    with pytest.raises(ValueError):
        ft.empty([1] * 17)
    with pytest.raises(TypeError):
        ft.empty(2.5)
    assert ft.empty(2 ** 40, 2 ** 40, 0).numel() == 0  # a zero dimension makes any shape legal


INDICES = [
    (1,), (-1,), (slice(None),), (slice(1, None, 2),), (slice(None, None, -1),), (slice(None, None, -2), 1),
    (Ellipsis, 0), (None, 1), (0, None, slice(2)), (slice(5, 1, -1), Ellipsis, slice(None, None, -3)),
    (slice(10, 20),), (Ellipsis,), (1, 2, 3), (slice(None), None, -1),
]


@pytest.mark.parametrize("index", INDICES)
def test_getitem_matches_numpy(index):
    a = np.arange(4 * 5 * 6, dtype=np.float32).reshape(4, 5, 6)
    t = ft.from_numpy(a)
    want = a[index]
    got = t[index]
    assert got.shape == want.shape
    np.testing.assert_array_equal(got.numpy(), want)
    if want.ndim:
        assert tuple(s * 4 for s in got.stride()) == want.strides  # a view, same layout as NumPy


def test_getitem_errors():
    t = ft.zeros(3, 4)
    with pytest.raises(IndexError):
        t[3]
    with pytest.raises(IndexError):
        t[0, 0, 0]
    with pytest.raises(IndexError):
        t[..., ...]
    with pytest.raises(IndexError, match="valid indices, got float"):
        t[1.0]
    with pytest.raises(IndexError, match="integer or bool tensors"):
        t[ft.tensor([0.0])]


def test_setitem():
    a = np.zeros((4, 5), np.float32)
    t = ft.from_numpy(a)
    t[1] = 3
    t[:, ::-2] = ft.tensor([1.0, 2.0, 3.0])
    t[2, 1:3] = np.array([7, 8])
    want = np.zeros((4, 5), np.float32)
    want[1] = 3
    want[:, ::-2] = [1.0, 2.0, 3.0]
    want[2, 1:3] = [7, 8]
    np.testing.assert_array_equal(a, want)  # written through the shared memory
    with pytest.raises(ValueError):
        t[0] = ft.ones(3)


def test_masked_and_index_assignment_from_a_view_of_itself_reads_the_values_first():
    """t[mask] = t[:3] writes the values t held before, as a copy of them would (NumPy's masked write into the memory
    it reads gave [0, 0, 2, 0, 4, 2])."""
    for index in (np.array([0, 1, 0, 1, 0, 1], bool), [1, 3, 5]):
        t = ft.tensor(np.arange(6, dtype=np.float32))
        t[ft.tensor(index) if isinstance(index, np.ndarray) else index] = t[:3]
        assert t.tolist() == [0, 0, 2, 1, 4, 2]


def test_view_and_reshape():
    a = np.arange(24, dtype=np.int32).reshape(2, 3, 4)
    t = ft.from_numpy(a)
    np.testing.assert_array_equal(t.view(6, 4).numpy(), a.reshape(6, 4))
    np.testing.assert_array_equal(t.view(-1).numpy(), a.reshape(-1))
    p = t.permute(2, 0, 1)
    np.testing.assert_array_equal(p.numpy(), a.transpose(2, 0, 1))
    with pytest.raises(ValueError, match="reshape"):
        p.view(-1)
    r = p.reshape(-1)
    np.testing.assert_array_equal(r.numpy(), a.transpose(2, 0, 1).reshape(-1))
    assert t.reshape(4, 6).data_ptr() == t.data_ptr()  # no copy when a view works
    np.testing.assert_array_equal(t.transpose(0, 2).numpy(), a.swapaxes(0, 2))
    np.testing.assert_array_equal(t[0].t().numpy(), a[0].T)
    np.testing.assert_array_equal(t.flatten(1).numpy(), a.reshape(2, 12))
    np.testing.assert_array_equal(t.unsqueeze(1).squeeze().numpy(), a)
    with pytest.raises(ValueError):
        t.view(5, -1)
    with pytest.raises(ValueError):
        t.view(-1, -1)
    with pytest.raises(ValueError):
        t.permute(0, 0, 1)
    with pytest.raises(ValueError):
        t.t()
    # a split of a non-contiguous dimension can still be a view
    s = ft.from_numpy(np.arange(12.0).reshape(3, 4))[:, ::2]
    np.testing.assert_array_equal(s.view(3, 2, 1).numpy(), np.arange(12.0).reshape(3, 4)[:, ::2].reshape(3, 2, 1))


def test_casts_and_clones_keep_the_memory_layout():
    # as PyTorch's preserve_format: x.bfloat16() of a channels-last x stays channels-last (convolutions then run
    # channels-last); contiguous() and pin_memory() are C-contiguous
    a = np.arange(2 * 3 * 4 * 5, dtype=np.float32).reshape(2, 3, 4, 5)
    cl = ft.from_numpy(np.ascontiguousarray(a.transpose(0, 2, 3, 1))).permute(0, 3, 1, 2)
    for copy in (cl.bfloat16(), cl.to(ft.float64), cl.clone(), cl.to(ft.bfloat16).float()):
        assert copy.stride() == (60, 1, 15, 3)
        np.testing.assert_array_equal(copy.float().numpy(), a)
    tr = ft.from_numpy(a[0, 0]).t()
    assert tr.double().stride() == (1, 5) and tr.clone().stride() == (1, 5)
    for dense in (cl.contiguous(), cl.pin_memory(), tr.contiguous(), ft.tensor(cl)):
        assert dense.is_contiguous()
        np.testing.assert_array_equal(dense.numpy(), cl.numpy() if dense.ndim == 4 else a[0, 0].T)


def test_contiguous_clone_copy():
    a = np.arange(20, dtype=np.float64).reshape(4, 5)
    t = ft.from_numpy(a).t()
    assert not t.is_contiguous()
    c = t.contiguous()
    assert c.is_contiguous() and c.data_ptr() != t.data_ptr()
    np.testing.assert_array_equal(c.numpy(), a.T)
    assert c.contiguous() is c
    k = ft.from_numpy(a).clone()
    k[0, 0] = 100
    assert a[0, 0] == 0  # a clone owns its memory


@pytest.mark.parametrize("src", REAL)
@pytest.mark.parametrize("dst", REAL)
def test_casts_match_numpy(src, dst):
    values = np.array([0, 1, 2, 3, 7, 100, 127, 255], dtype=np.float64)
    if src in ("int8", "int16", "int32", "int64", "float16", "float32", "float64"):
        values = np.concatenate([values, -values[1:5]])
    if src.startswith("float"):
        values = np.concatenate([values, [0.5, 1.5, 2.5, 3.75, -0.25]])
    a = values.astype(src)
    # only values representable in dst (casts of out-of-range values are implementation-defined in NumPy)
    if dst not in ("bool",) and not dst.startswith("float"):
        info = np.iinfo(dst)
        a = a[(a.astype(np.float64) >= info.min) & (a.astype(np.float64) <= info.max)]
    want = a.astype(dst)
    got = ft.from_numpy(a).to(getattr(ft, dst)).numpy()
    np.testing.assert_array_equal(got, want)


def test_float_to_int_saturates():
    t = ft.tensor([1e30, -1e30, float("nan"), float("inf")], dtype=ft.float64)
    assert t.to(ft.int64).tolist() == [2 ** 63 - 1, -(2 ** 63), 0, 2 ** 63 - 1]
    assert t.to(ft.uint64).tolist() == [2 ** 64 - 1, 0, 0, 2 ** 64 - 1]
    values = np.array([3e9, -3e9, np.inf, -np.inf, np.nan, 300.7, -1.5, 255.9, -128.9, 127.2, 65535.5, 0.0])
    for dst in ("uint8", "int8", "int16", "uint16", "int32", "uint32"):
        info = np.iinfo(dst)
        want = np.trunc(np.clip(np.nan_to_num(values, nan=0.0), info.min, info.max)).astype(dst)
        for src in ("float64", "float32"):
            t = ft.from_numpy(values.astype(src))
            np.testing.assert_array_equal(t.to(getattr(ft, dst)).numpy(), want, err_msg=f"{src} -> {dst}")
            # assignment converts as the cast does, through a basic index, or an advanced one of an array (a tensor
            # of another dtype is refused there, as PyTorch's index_put_ refuses it)
            basic, advanced = ft.zeros(len(values), dtype=getattr(ft, dst)), ft.zeros(len(values), dtype=getattr(ft, dst))
            basic[:] = t
            advanced[list(range(len(values)))] = values.astype(src)
            np.testing.assert_array_equal(basic.numpy(), want)
            np.testing.assert_array_equal(advanced.numpy(), want)
            with pytest.raises(TypeError, match=f"got {dst} for the destination and {src} for the source"):
                advanced[list(range(len(values)))] = t


# (dtype, number, stored value or None where PyTorch refuses it: "value cannot be converted ... without overflow")
CHECKED_NUMBERS = [("uint8", 300, None), ("uint8", -1, 255), ("uint8", -255, 1), ("uint8", -256, None),
                   ("int8", -129, None), ("int8", 1.5, 1), ("int32", 3.7e9, None), ("int32", float("nan"), None),
                   ("int32", 2147483647.5, 2147483647), ("uint8", 255.9, 255), ("uint8", -0.5, None),
                   ("uint64", -1, None), ("uint64", 2 ** 64 - 1, 2 ** 64 - 1), ("int64", 2 ** 63, None),
                   ("bool", 5, True), ("float16", 1e6, float("inf"))]


@pytest.mark.parametrize("dtype,number,stored", CHECKED_NUMBERS)
def test_numbers_convert_as_pytorch_checks_them(dtype, number, stored):
    """ft.tensor, fill_ and assignment through basic and advanced indices take a Python number as torch.tensor and
    fill_ do: a fraction goes, a negative integer wraps into uint8..uint32, anything else out of range raises; a
    float beyond a float dtype's range is inf, but fill_ and advanced-index assignment (PyTorch's checked fill)
    refuse it."""
    dt = getattr(ft, dtype)
    makers = [lambda: ft.tensor([number], dtype=dt), lambda: ft.zeros(1, dtype=dt).fill_(number)]
    for index in (0, [0], slice(None)):
        def assign(index=index):
            t = ft.zeros(1, dtype=dt)
            t[index] = number
            return t
        makers.append(assign)
    checked = makers[1], makers[3]
    for make in makers:
        if stored is None or (stored == float("inf") and make in checked):
            with pytest.raises(OverflowError, match=f"cannot be converted to type {dtype} without overflow"):
                make()
        else:
            assert make().tolist() == [stored]


def test_the_checked_numbers_are_pytorchs():
    torch = pytest.importorskip("torch")
    for dtype, number, stored in CHECKED_NUMBERS:
        if dtype == "uint64" or number == 2 ** 63:  # refused by torch's Python binding, with its own errors
            continue
        try:
            want = torch.tensor([number], dtype=getattr(torch, dtype)).tolist()
        except RuntimeError:
            want = None
        assert want == (None if stored is None else [stored]), (dtype, number)


def test_half_and_bfloat16_rounding():
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.standard_normal(10000) * 1000, rng.standard_normal(1000) * 1e-6,
                        [65504, 65519.99, 65520, 1e10, -1e10, 2 ** -25, 2 ** -24 * 1.5]])
    with np.errstate(over="ignore"):  # NumPy warns where values become inf
        want16, x32 = x.astype(np.float16), x.astype(np.float32)
        want16_from32 = x32.astype(np.float16)
    np.testing.assert_array_equal(ft.from_numpy(x).to(ft.float16).numpy(), want16)
    np.testing.assert_array_equal(ft.from_numpy(x32).to(ft.float16).numpy(), want16_from32)
    # bfloat16: round to nearest even on the top 16 bits of float32
    bits = x32.view(np.uint32)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint32) << 16
    want = rounded.view(np.float32)
    np.testing.assert_array_equal(ft.from_numpy(x32).to(ft.bfloat16).to(ft.float32).numpy(), want)
    assert np.isnan(ft.tensor([float("nan")]).to(ft.bfloat16).float().item())


def test_copy_broadcast_dtype_and_overlap():
    t = ft.zeros(3, 4, dtype=ft.int32)
    t.copy_(ft.tensor([1.9, 2.1, -3.5, 4.0]))
    assert t.tolist() == [[1, 2, -3, 4]] * 3
    t.copy_(np.arange(3).reshape(3, 1))
    assert t.tolist() == [[0] * 4, [1] * 4, [2] * 4]
    a = np.arange(10, dtype=np.int64)
    x = ft.from_numpy(a)
    x[1:].copy_(x[:-1])  # overlapping: reads all of the source first, like NumPy
    np.testing.assert_array_equal(a, [0, 0, 1, 2, 3, 4, 5, 6, 7, 8])
    x.copy_(x[::-1])  # a reversed view of the same memory
    np.testing.assert_array_equal(a, [8, 7, 6, 5, 4, 3, 2, 1, 0, 0])
    with pytest.raises(ValueError, match="broadcast"):
        t.copy_(ft.zeros(5))


def test_complex_is_storage_only():
    a = np.array([1 + 2j, 3 - 4j], dtype=np.complex64)
    t = ft.from_numpy(a)
    assert t.dtype is ft.complex64 and t.clone().tolist() == [1 + 2j, 3 - 4j]
    assert t[1].item() == 3 - 4j
    with pytest.raises(TypeError, match="storage-only"):
        t.to(ft.float32)
    with pytest.raises(TypeError):
        ft.zeros(2).copy_(t)
    # no math: it would compute on the real parts alone
    for name, math in [("sum", lambda: t.sum()), ("mean", lambda: t.mean()), ("exp", lambda: t.exp()),
                       ("gt", lambda: t > 1), ("add", lambda: t + t), ("clamp", lambda: t.clamp(0, 1)),
                       ("max", lambda: t.max(0)), ("argmax", lambda: t.argmax()), ("sort", lambda: t.sort()),
                       ("unique", lambda: t.unique()), ("matmul", lambda: t @ t), ("eq", lambda: t == t)]:
        with pytest.raises(TypeError, match=f"{name}: complex tensors are storage-only"):
            math()
    assert ft.cat([t, t]).tolist() == [1 + 2j, 3 - 4j] * 2 and ft.stack([t, t]).shape == (2, 2)  # copies


def test_fill_and_item():
    t = ft.empty(2, 2, dtype=ft.float16).fill_(1.5)
    assert t.tolist() == [[1.5, 1.5], [1.5, 1.5]]
    assert isinstance(t[0, 0].item(), float)
    assert ft.tensor([True]).item() is True
    assert ft.tensor([2 ** 64 - 1], dtype=ft.uint64)[0].item() == 2 ** 64 - 1
    assert ft.zeros(3, dtype=ft.int8).fill_(ft.tensor(5)).tolist() == [5, 5, 5]
    with pytest.raises(ValueError, match="3 elements"):
        ft.zeros(3).item()
    with pytest.raises(TypeError):
        ft.zeros(3).fill_("x")
    with pytest.raises(TypeError):
        ft.zeros(3).fill_(1 + 1j)
    assert float(ft.tensor([2.5])) == 2.5 and int(ft.tensor(7)) == 7 and bool(ft.tensor(0)) is False
    assert [1, 2, 3][ft.tensor(1)] == 2
    with pytest.raises(TypeError):
        [1, 2][ft.tensor(1.0)]


def test_to_conversions():
    t = ft.tensor([1.25, 2.5])
    assert t.to(ft.float32) is t and t.to("cpu") is t
    assert t.to(ft.float64).dtype is ft.float64 and t.to("float16").dtype is ft.float16
    assert t.to(np.int32).tolist() == [1, 2]
    assert t.to("cpu", ft.int64).tolist() == [1, 2]
    assert t.to(t.to(ft.int16)).dtype is ft.int16
    assert t.to(ft.float32, copy=True) is not t
    assert t.double().dtype is ft.float64 and t.long().dtype is ft.int64 and t.half().dtype is ft.float16
    assert t.bfloat16().dtype is ft.bfloat16 and t.int().dtype is ft.int32 and t.bool().dtype is ft.bool
    with pytest.raises(RuntimeError, match="CUDA is not available"):
        t.to("cuda")
    with pytest.raises(TypeError):
        t.to("float128")


def test_repr_like_numpy():
    assert repr(ft.tensor([[1.0, 2.0], [3.0, 4.5]])) == "tensor([[1. , 2. ],\n        [3. , 4.5]])"
    assert repr(ft.tensor([1, 2])) == "tensor([1, 2])"
    assert repr(ft.tensor([1, 2], dtype=ft.int8)) == "tensor([1, 2], dtype=fasttrain.int8)"
    assert repr(ft.zeros(2, dtype=ft.bfloat16)) == "tensor([0., 0.], dtype=fasttrain.bfloat16)"
    assert "..." in repr(ft.zeros(10000))


def test_tolist_len_iter():
    t = ft.tensor([[1, 2], [3, 4]])
    assert len(t) == 2 and [row.tolist() for row in t] == [[1, 2], [3, 4]]
    with pytest.raises(TypeError):
        len(ft.tensor(1))
    assert ft.tensor(5).tolist() == 5


def test_the_tensor_class_is_pytorchs_legacy_constructor():
    """ft.Tensor(2, 3) is uninitialised float32 memory (nn.Parameter(ft.Tensor(out, in)) before an init, as older
    PyTorch code makes parameters), ft.Tensor(data) float32 values; nn.Parameter still wraps."""
    assert ft.Tensor(2, 3).shape == (2, 3) and ft.Tensor(2, 3).dtype == ft.float32 and ft.Tensor().shape == (0,)
    t = ft.Tensor(np.arange(3))
    assert t.dtype == ft.float32 and t.tolist() == [0.0, 1.0, 2.0] and ft.Tensor((2, 3)).tolist() == [2.0, 3.0]
    p = ft.nn.Parameter(ft.Tensor(4, 3))
    assert type(p) is ft.nn.Parameter and p.shape == (4, 3) and p.requires_grad
    with pytest.raises(TypeError, match="expected sizes or one sequence of values"):
        ft.Tensor(2, "a")
    with pytest.raises(TypeError, match="unexpected keyword arguments"):
        ft.Tensor(2, dtype=ft.int64)
    with pytest.raises(TypeError, match="data must be a sequence or sizes, got float"):
        ft.Tensor(2.5)
    with pytest.raises(AttributeError, match=r"legacy typed tensor classes .* ft.tensor\(data, dtype=ft.int64\)"):
        ft.LongTensor([1, 2])


def test_as_strided_bounds():
    t = ft.zeros(10)
    assert t.as_strided((3,), (3,), 1).shape == (3,)
    with pytest.raises(ValueError, match="outside"):
        t.as_strided((4,), (3,), 1)
    with pytest.raises(ValueError):
        t.as_strided((2,), (-1,), 0)
    with pytest.raises(ValueError):
        t.as_strided((2,), (1,), -1)
    with pytest.raises(ValueError):
        t.as_strided((2, 2), (1,))
    with pytest.raises(ValueError):
        t.as_strided((3,), (2 ** 62,), 0)


def test_weakref_and_pickle():
    t = ft.arange(6).reshape(2, 3)
    r = weakref.ref(t)
    assert r() is t
    u = pickle.loads(pickle.dumps(t))
    assert u.tolist() == t.tolist() and u.dtype is t.dtype
    b = pickle.loads(pickle.dumps(ft.tensor([1.5], dtype=ft.bfloat16)))
    assert b.dtype is ft.bfloat16 and b.tolist() == [1.5]
    del t
    assert r() is None


def test_pin_memory():
    t = ft.arange(1 << 16, dtype=ft.float32)
    assert not t.is_pinned()
    try:
        p = t.pin_memory()
    except MemoryError as e:  # RLIMIT_MEMLOCK too small: a clear error, not a crash
        assert "page-lock" in str(e)
        return
    assert p.is_pinned() and p.pin_memory() is p
    np.testing.assert_array_equal(p.numpy(), t.numpy())
    assert ft.empty(8, pin_memory=True).is_pinned()


def test_copies_into_views_whose_elements_share_memory_are_refused():
    """As PyTorch: copy_ (and in-place arithmetic, and assigning a tensor) into an expanded view would leave one
    of several values at each shared address; filling with one number is defined and allowed."""
    for view in (lambda: ft.zeros(1).expand(3), lambda: ft.zeros(2, 1).expand(2, 4),
                 lambda: ft.zeros(4).as_strided((3,), (0,), 0)):
        t = view()
        for op, write in (("copy_", lambda t: t.copy_(ft.ones(t.shape))), ("add_", lambda t: t.add_(1)),
                          ("mul_", lambda t: t.mul_(2.0)),
                          ("copy_", lambda t: t.__setitem__(slice(None), ft.ones(t.shape)))):
            with pytest.raises(ValueError, match=f"^{op}: the destination has elements that share memory"):
                write(t)
            assert (t.numpy() == 0).all()  # nothing written
        t.fill_(7)
        assert (t.numpy() == 7).all()
    ok = ft.zeros(3, 4)[:, ::2]  # strided, no sharing
    ok.copy_(ft.ones(3, 2))
    assert ok.numpy().sum() == 6


def test_randn_like_and_rand_like_follow_the_generator_and_the_input():
    x = ft.zeros(3, 500, dtype=ft.float64)
    ft.manual_seed(3)
    a = ft.randn_like(x)
    ft.manual_seed(3)
    assert a.shape == (3, 500) and a.dtype is ft.float64 and np.array_equal(a.numpy(), ft.randn_like(x).numpy())
    assert abs(a.numpy().std() - 1) < 0.1
    u = ft.rand_like(x, dtype=ft.float32)
    assert u.dtype is ft.float32 and 0 <= u.numpy().min() and u.numpy().max() < 1
    with pytest.raises(TypeError, match="randn_like: expected a tensor, got list"):
        ft.randn_like([1.0])
    with pytest.raises(TypeError, match="floating"):
        ft.randn_like(ft.zeros(2, dtype=ft.int64))


def test_backward_of_an_eager_tensor_names_the_compiled_way():
    w = ft.ones(3).requires_grad_()
    assert w.requires_grad
    with pytest.raises(RuntimeError, match=r"eager fasttrain tensors record no graph.*program.backward\(x, y\) "
                                           r"fills each parameter's .grad"):
        (w * 2).sum().backward()
