"""Mutation fuzzing of DLPack import (ft.from_dlpack): DLManagedTensor structs built with ctypes, with random
and hostile fields (ranks, negative and huge sizes, strides whose offsets overflow, unknown dtypes and devices,
giant byte offsets). Every capsule must be refused with a Python exception or imported; an imported tensor's
producer is told once (its deleter) when the tensor goes; and a tensor whose elements lie in the producer's
buffer reads what NumPy reads there."""
import ctypes
import gc

import numpy as np
import pytest

import fasttrain as ft


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32), ("dtype", DLDataType),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.POINTER(ctypes.c_int64)),
                ("byte_offset", ctypes.c_uint64)]


DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", DELETER)]


_new_capsule = ctypes.pythonapi.PyCapsule_New
_new_capsule.restype = ctypes.py_object
_new_capsule.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]

REFUSALS = (TypeError, ValueError, BufferError, OverflowError, RuntimeError, IndexError)
BUFFER = 4096


class Producer:
    """One DLManagedTensor over `buf`, kept alive with its arrays, counting its deleter's calls."""

    def __init__(self, buf, ndim, shape, strides, code, bits, lanes, device_type=1, byte_offset=0):
        self.deleted = 0
        self.buf = buf
        n = max(ndim, 0)
        self.shape = (ctypes.c_int64 * max(n, 1))(*[int(s) for s in shape[:n]])
        self.strides = None if strides is None else (ctypes.c_int64 * max(n, 1))(*[int(s) for s in strides[:n]])
        self.deleter = DELETER(self._delete)
        self.managed = DLManagedTensor()
        t = self.managed.dl_tensor
        t.data = ctypes.addressof(buf)
        t.device = DLDevice(device_type, 0)
        t.ndim = ndim
        t.dtype = DLDataType(code, bits, lanes)
        t.shape = self.shape
        t.strides = self.strides if strides is not None else None
        t.byte_offset = byte_offset
        self.managed.deleter = self.deleter

    def _delete(self, _):
        self.deleted += 1

    def capsule(self):
        return _new_capsule(ctypes.addressof(self.managed), b"dltensor", None)


def hostile(rng):
    """Fields drawn to hit the edges of every check."""
    ndim = int(rng.choice([-3, -1, 0, 1, 1, 2, 2, 3, 4, 8, 16, 17, 32, 1000]))
    sizes = [-(2 ** 63), -5, -1, 0, 1, 2, 3, 7, 2 ** 31, 2 ** 62, 2 ** 63 - 1]
    shape = [int(rng.choice(sizes)) if rng.random() < 0.15 else int(rng.integers(0, 5)) for _ in range(max(ndim, 0))]
    strides = None if rng.random() < 0.3 else [
        int(rng.choice([-(2 ** 63), -(2 ** 62), 2 ** 40, 2 ** 62, 2 ** 63 - 1])) if rng.random() < 0.2
        else int(rng.integers(-4, 6)) for _ in range(max(ndim, 0))]
    if rng.random() < 0.8:  # a dtype fasttrain has, so that the sizes and strides are what is tested
        code, bits, lanes = [(2, 32, 1), (2, 64, 1), (0, 8, 1), (0, 64, 1), (1, 8, 1), (4, 16, 1), (6, 8, 1)][
            int(rng.integers(0, 7))]
    else:
        code, bits, lanes = (int(rng.choice([0, 1, 2, 3, 4, 5, 6, 7, 255])), int(rng.choice([0, 1, 4, 8, 128, 255])),
                             int(rng.choice([0, 1, 2, 65535])))
    device = 1 if rng.random() < 0.8 else int(rng.choice([2, 3, 7, 13, 99, -1]))
    offset = int(rng.choice([0, 0, 0, 4, 2 ** 62, 2 ** 64 - 8]))
    return ndim, shape, strides, code, bits, lanes, device, offset


@pytest.mark.parametrize("seed", range(4))
def test_hostile_capsules_are_refused_or_imported_and_released_once(seed):
    rng = np.random.default_rng(seed)
    buf = (ctypes.c_uint8 * BUFFER)()
    for _ in range(500):
        fields = hostile(rng)
        p = Producer(buf, *fields)
        try:
            t = ft.from_dlpack(p.capsule())
        except REFUSALS:
            assert p.deleted == 0  # refused: the capsule (and its producer) keep the memory
            continue
        # imported: the fields were sane (sizes >= 0, every element's byte offset an int64), nothing was read
        # (they may point anywhere), and the producer hears once when the tensor goes
        ndim, shape, strides, _, _, _, _, offset = fields
        assert 0 <= ndim <= 32 and list(t.shape) == shape[:ndim] and min(shape[:ndim], default=0) >= 0
        size = t.dtype.itemsize
        if ndim and min(shape[:ndim]) > 0:
            st = strides[:ndim] if strides is not None else list(np.cumprod([1] + shape[:0:-1])[::-1])
            span = [sum(min(0, s * (n - 1)) for s, n in zip(st, shape)), sum(max(0, s * (n - 1))
                                                                             for s, n in zip(st, shape))]
            assert -(2 ** 63) <= span[0] * size and (span[1] + 1) * size <= 2 ** 63 - 1, (shape, st)
        assert p.deleted == 0
        del t
        gc.collect()
        assert p.deleted == 1


def in_bounds(rng):
    """A float32 or int16 tensor whose every element lies in the buffer: random shape, strides of any sign
    (zero too), and the byte offset that puts the lowest element at the buffer's start."""
    dtype = np.dtype(rng.choice([np.float32, np.int16, np.uint8, np.float64]))
    ndim = int(rng.integers(0, 5))
    shape = [int(rng.integers(0, 5)) for _ in range(ndim)]
    strides = [int(rng.integers(-9, 10)) for _ in range(ndim)]
    lo = sum(s * (n - 1) for s, n in zip(strides, shape) if s < 0 and n > 0)
    hi = sum(s * (n - 1) for s, n in zip(strides, shape) if s > 0 and n > 0)
    offset = -lo * dtype.itemsize
    if offset + (hi + 1) * dtype.itemsize > BUFFER:
        return None
    return dtype, shape, strides, offset


def test_in_bounds_capsules_read_what_numpy_reads():
    rng = np.random.default_rng(7)
    buf = (ctypes.c_uint8 * BUFFER)()
    raw = np.frombuffer(buf, np.uint8)
    raw[:] = rng.integers(0, 256, BUFFER, dtype=np.uint8)
    codes = {"f": 2, "i": 0, "u": 1}
    checked = 0
    for _ in range(400):
        case = in_bounds(rng)
        if case is None:
            continue
        dtype, shape, strides, offset = case
        p = Producer(buf, len(shape), shape, strides, codes[dtype.kind], dtype.itemsize * 8, 1, byte_offset=offset)
        t = ft.from_dlpack(p.capsule())
        want = np.lib.stride_tricks.as_strided(raw[offset:].view(dtype) if dtype.itemsize == 1 else
                                               np.frombuffer(buf, dtype, (BUFFER - offset) // dtype.itemsize,
                                                             offset), shape, [s * dtype.itemsize for s in strides])
        got = np.asarray(t)
        assert got.shape == tuple(shape)
        np.testing.assert_array_equal(got, want)
        del t, got
        gc.collect()
        assert p.deleted == 1
        checked += 1
    assert checked > 200
