"""The zero-copy bridge: NumPy, the buffer protocol, __array_interface__ and DLPack, with lifetimes."""
import gc
import sys
import weakref

import numpy as np
import pytest

import fasttrain as ft


def test_from_numpy_shares_memory_and_keeps_array_alive():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    before = sys.getrefcount(a)
    t = ft.from_numpy(a)
    assert sys.getrefcount(a) == before + 1
    assert t.data_ptr() == a.ctypes.data and t.shape == (2, 3) and t.stride() == (3, 1)
    a[0, 0] = 42
    assert t[0, 0].item() == 42
    t[1, 2] = -1
    assert a[1, 2] == -1
    del t
    gc.collect()
    assert sys.getrefcount(a) == before


def test_from_numpy_outlives_the_array_name():
    t = ft.from_numpy(np.arange(5, dtype=np.int16))
    gc.collect()
    assert t.tolist() == [0, 1, 2, 3, 4]


def test_from_numpy_strided_negative_and_zero_size():
    a = np.arange(24, dtype=np.float64).reshape(4, 6)
    v = a[::-2, 1::3]
    t = ft.from_numpy(v)
    assert t.stride() == (-12, 3)
    assert t.data_ptr() == v.ctypes.data
    np.testing.assert_array_equal(t.numpy(), v)
    np.testing.assert_array_equal(t.contiguous().numpy(), v)
    e = ft.from_numpy(np.zeros((0, 3), np.int8))
    assert e.shape == (0, 3) and e.numel() == 0
    s = ft.from_numpy(np.array(3.5))
    assert s.shape == () and s.item() == 3.5
    b = ft.from_numpy(np.broadcast_to(np.arange(3), (4, 3)))
    assert b.stride() == (0, 1) and b._readonly


@pytest.mark.parametrize("dtype", ["bool", "uint8", "int8", "int16", "int32", "int64", "uint16", "uint32",
                                   "uint64", "float16", "float32", "float64", "complex64", "complex128"])
def test_numpy_round_trip_every_dtype(dtype):
    a = (np.arange(12) % 3).astype(dtype).reshape(3, 4)
    t = ft.from_numpy(a)
    assert t.dtype.name == dtype
    back = t.numpy()
    assert back.dtype == a.dtype and np.shares_memory(back, a)
    np.testing.assert_array_equal(back, a)
    np.testing.assert_array_equal(np.asarray(t), a)
    np.testing.assert_array_equal(np.array(memoryview(t)), a)
    np.testing.assert_array_equal(np.from_dlpack(t), a)
    assert np.shares_memory(np.from_dlpack(t), a)
    u = ft.from_dlpack(a)
    assert u.data_ptr() == a.ctypes.data and u.dtype is t.dtype


def test_numpy_keeps_storage_after_tensor_is_gone():
    t = ft.arange(1000, dtype=ft.int32)
    r = weakref.ref(t)
    arr = t.numpy()
    del t
    gc.collect()
    assert r() is None  # the array holds the storage, not the tensor object
    assert arr.sum() == sum(range(1000))
    arr[0] = 7  # still valid, writable memory
    assert arr[0] == 7


def test_buffer_protocol_formats_and_errors():
    for dt, fmt in [(ft.bool, "?"), (ft.uint8, "B"), (ft.int64, "q"), (ft.float16, "e"), (ft.float32, "f"),
                    (ft.float64, "d"), (ft.uint32, "I")]:
        m = memoryview(ft.zeros(2, 3, dtype=dt))
        assert m.format == fmt and m.shape == (2, 3) and m.itemsize == dt.itemsize
    m = memoryview(ft.arange(10)[::-3])
    assert m.strides == (-24,) and m.tolist() == [9, 6, 3, 0]
    with pytest.raises(BufferError, match="bfloat16"):
        memoryview(ft.zeros(2, dtype=ft.bfloat16))
    with pytest.raises(BufferError, match="contiguous"):
        np.frombuffer(ft.zeros(4, dtype=ft.uint8)[::2], dtype=np.uint8)  # asks for a simple buffer
    ro = ft.from_numpy(np.frombuffer(b"abcd", dtype=np.uint8))
    mv = memoryview(ro)
    assert mv.readonly and bytes(mv) == b"abcd"
    with pytest.raises(TypeError):
        mv[0] = 1


def test_array_interface_and_array_protocol():
    t = ft.arange(12, dtype=ft.float32).reshape(3, 4)[:, 1:3]
    ai = t.__array_interface__
    assert ai["typestr"] == "<f4" and ai["shape"] == (3, 2) and ai["strides"] == (16, 4)
    assert ai["data"].ctypes.data + ai["offset"] == t.data_ptr() and ai["data"].flags.writeable
    a = np.asarray(t)
    assert a.ctypes.data == t.data_ptr() and a.tolist() == t.tolist()
    assert np.array(t, dtype=np.float64).dtype == np.float64
    assert np.array(t, copy=True).ctypes.data != t.data_ptr()
    bf = ft.ones(3, dtype=ft.bfloat16)
    assert np.asarray(bf).dtype == np.float32  # converted, since NumPy has no bfloat16
    with pytest.raises(ValueError):
        np.array(bf, copy=False)
    with pytest.raises(AttributeError):
        bf.__array_interface__


def test_readonly_arrays_stay_readonly():
    a = np.arange(4.0)
    a.flags.writeable = False
    t = ft.from_numpy(a)
    assert t._readonly
    for write in (lambda: t.fill_(1), lambda: t.copy_(ft.zeros(4, dtype=ft.float64)), lambda: t.__setitem__(0, 5),
                  lambda: t.uniform_()):
        with pytest.raises(ValueError, match="read-only"):
            write()
    assert not t.numpy().flags.writeable
    c = t.clone()
    c.fill_(1)  # a clone is writable
    assert a.tolist() == [0, 1, 2, 3]
    cap = t.__dlpack__(max_version=(1, 0))
    with pytest.raises(BufferError, match="read-only"):
        t.__dlpack__()  # a legacy capsule cannot say read-only
    assert ft.from_dlpack(cap)._readonly


@pytest.mark.parametrize("make,err", [
    (lambda: np.array(["a"]), TypeError),
    (lambda: np.array([b"a"]), TypeError),
    (lambda: np.array([object()]), TypeError),
    (lambda: np.array(["2020-01-01"], dtype="datetime64[D]"), TypeError),
    (lambda: np.zeros(2, dtype=np.longdouble), TypeError),
    (lambda: np.zeros(2, dtype=">f4"), ValueError),
    (lambda: np.zeros(4, dtype=np.uint8)[1:].view(np.int16) if False else
        np.ndarray((2,), dtype=np.int16, buffer=np.zeros(5, np.uint8), offset=0, strides=(3,)), ValueError),
    (lambda: np.zeros(2, dtype=[("a", "i4")]), TypeError),
    (lambda: np.zeros([1] * 17), ValueError),
    (lambda: [1, 2], TypeError),
])
def test_from_numpy_rejects_with_clear_errors(make, err):
    a = make()
    before = sys.getrefcount(a)
    with pytest.raises(err):
        ft.from_numpy(a)
    assert sys.getrefcount(a) == before  # a failed conversion takes no reference


def test_as_tensor_copies_only_when_needed():
    a = np.arange(4, dtype=np.float32)
    t = ft.as_tensor(a)
    assert t.data_ptr() == a.ctypes.data
    assert ft.as_tensor(t) is t
    assert ft.as_tensor(t, dtype=ft.float32) is t
    c = ft.as_tensor(a, dtype=ft.float64)
    assert c.dtype is ft.float64 and c.data_ptr() != a.ctypes.data
    assert ft.as_tensor([1, 2]).dtype is ft.int64
    assert ft.as_tensor(np.float64(2.0)).dtype is ft.float64
    m = ft.as_tensor(memoryview(a))
    assert m.data_ptr() == a.ctypes.data
    import array
    arr = array.array("i", [1, 2, 3])
    assert ft.as_tensor(arr).tolist() == [1, 2, 3]
    with pytest.raises(TypeError):
        ft.as_tensor(object())
    assert ft.tensor(a).data_ptr() != a.ctypes.data  # ft.tensor always copies


def test_dlpack_versioned_and_legacy_capsules():
    t = ft.arange(6, dtype=ft.float32).reshape(2, 3)
    cap = t.__dlpack__(max_version=(1, 1))
    assert "dltensor_versioned" in repr(cap)
    u = ft.from_dlpack(cap)
    assert u.data_ptr() == t.data_ptr() and u.tolist() == t.tolist()
    assert "used_dltensor_versioned" in repr(cap)
    with pytest.raises(ValueError, match="consumed"):
        ft.from_dlpack(cap)
    legacy = t.__dlpack__()
    assert '"dltensor"' in repr(legacy)
    v = ft.from_dlpack(legacy)
    assert v.data_ptr() == t.data_ptr()
    assert t.__dlpack_device__() == (1, 0)


def test_dlpack_unconsumed_capsule_frees_its_tensor():
    t = ft.arange(10)
    r = weakref.ref(t)
    before = ft.memory_stats("cpu")["allocated_bytes"]
    for _ in range(100):
        t.__dlpack__(max_version=(1, 0))
        t.__dlpack__()
    del t
    gc.collect()
    assert r() is None
    assert ft.memory_stats("cpu")["allocated_bytes"] <= before


def test_dlpack_copy_and_device_arguments():
    t = ft.arange(4)
    c = ft.from_dlpack(t.__dlpack__(max_version=(1, 0), copy=True))
    assert c.data_ptr() != t.data_ptr() and c.tolist() == t.tolist()
    same = ft.from_dlpack(t.__dlpack__(max_version=(1, 0), copy=False, dl_device=(1, 0)))
    assert same.data_ptr() == t.data_ptr()
    with pytest.raises(BufferError):
        t.__dlpack__(max_version=(1, 0), dl_device=(2, 0))
    with pytest.raises(ValueError, match="stream"):
        t.__dlpack__(stream=1)
    with pytest.raises(TypeError):
        t.__dlpack__(max_version=1)
    with pytest.raises(TypeError):
        t.__dlpack__(None)  # keyword-only
    arr = np.from_dlpack(t, copy=True)
    assert arr.ctypes.data != t.data_ptr()


def test_dlpack_bfloat16_round_trip_and_numpy_view():
    b = ft.tensor([1.5, -2.0], dtype=ft.bfloat16)
    r = ft.from_dlpack(b)
    assert r.dtype is ft.bfloat16 and r.data_ptr() == b.data_ptr() and r.tolist() == [1.5, -2.0]
    with pytest.raises(Exception):
        np.from_dlpack(b)  # NumPy has no bfloat16; it refuses cleanly


def test_from_dlpack_bad_inputs():
    with pytest.raises(TypeError, match="__dlpack__"):
        ft.from_dlpack([1, 2])
    import ctypes as c
    capsule_new = c.pythonapi.PyCapsule_New
    capsule_new.restype = c.py_object
    capsule_new.argtypes = [c.c_void_p, c.c_char_p, c.c_void_p]
    buf = c.create_string_buffer(8)
    with pytest.raises(TypeError, match="not a DLPack capsule"):
        ft.from_dlpack(capsule_new(c.addressof(buf), b"something_else", None))


def test_dlpack_with_negative_strides_shares_memory():
    a = np.arange(10.0)[::-1]
    t = ft.from_dlpack(a)
    assert t.stride() == (-1,) and t.tolist() == a.tolist()
    back = np.from_dlpack(t)
    assert np.shares_memory(back, a) and back.tolist() == a.tolist()


def test_no_leak_over_many_conversions():
    a = np.ones(256, dtype=np.float32)
    base_refs = sys.getrefcount(a)
    ft.empty_cache()
    before = ft.memory_stats("cpu")["allocated_bytes"]
    for _ in range(100_000):
        t = ft.from_numpy(a)
        t.numpy()
        ft.from_dlpack(t)
        np.from_dlpack(t)
        memoryview(t)
    del t
    gc.collect()
    assert sys.getrefcount(a) == base_refs
    assert ft.memory_stats("cpu")["allocated_bytes"] == before


def test_torch_interop():
    torch = pytest.importorskip("torch")
    t = ft.arange(6, dtype=ft.float32).reshape(2, 3)
    tt = torch.from_dlpack(t)
    assert tt.data_ptr() == t.data_ptr() and tt.tolist() == t.tolist()
    back = ft.from_dlpack(torch.arange(4, dtype=torch.bfloat16))
    assert back.dtype is ft.bfloat16 and back.tolist() == [0, 1, 2, 3]
    src = torch.arange(4, dtype=torch.bfloat16)
    copy = ft.tensor(src)  # a copy of another library's tensor, bfloat16 too (NumPy has no bfloat16)
    copy.fill_(7)
    assert copy.dtype is ft.bfloat16 and src.tolist() == [0, 1, 2, 3]
    for data in ([1, 2.5], [True, 2], [[1, 2], [3, 4]], [np.float64(1), 2.0], [np.int32(1), 2], 3.0):
        assert ft.tensor(data).dtype.name == str(torch.tensor(data).dtype).split(".")[1]
