"""Issue 11, the training side: exports that outlive model.compile(), checkpoint validation, resuming through
ft.fit, schedules in the C epoch, tensor comparisons, output shapes and the thread-count promise."""
import gc

import numpy as np
import pytest

import fasttrain as ft

nn = ft.nn
CLASSES = 3


def small_net(seed=0):
    ft.manual_seed(seed)
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, CLASSES))


def compile_small(model, opt=None, **kw):
    opt = opt or ft.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    return model.compile(opt, nn.CrossEntropyLoss(), batch_size=4, input_shape=(1, 6, 6), **kw)


# ---------------------------------------------------------------- 2. exports taken before compile()

@pytest.mark.parametrize("export", ["asarray", "memoryview", "array_interface"])
def test_export_taken_before_compile_keeps_its_memory(export):
    """compile() rebinds each parameter object to the flat buffer and releases the old storage; an array taken
    before must keep that storage alive: it still reads the values it was taken with, and writing to it touches
    no other tensor."""
    model = small_net()
    w = model[3].weight
    before = w.numpy().copy()
    if export == "asarray":
        arr = np.asarray(w)
    elif export == "memoryview":
        arr = np.asarray(memoryview(w))
    else:
        class Holder:
            __array_interface__ = w.__array_interface__
        arr = np.asarray(Holder())
    assert arr.ctypes.data == w.data_ptr()
    program = compile_small(model)
    assert w.data_ptr() != arr.ctypes.data
    gc.collect()
    # memory released by the rebind gets reused by the next allocations: fill some to catch a dangling pointer
    junk = [ft.full((before.size,), 7.0) for _ in range(8)]
    np.testing.assert_array_equal(arr, before)
    others = {k: v.numpy().copy() for k, v in model.named_parameters()}
    arr[...] = -1.0
    assert all(np.array_equal(v.numpy(), others[k]) for k, v in model.named_parameters())
    assert all(np.all(j.numpy() == 7.0) for j in junk)
    assert program is not None


# ---------------------------------------------------------------- 11. small ones

def test_dlpack_device_not_a_tuple_is_a_type_error():
    class Bad:
        def __init__(self, device):
            self.device = device

        def __dlpack__(self, **kw):
            return np.ones(3).__dlpack__()

        def __dlpack_device__(self):
            return self.device

    for device in ([1, 0], 1, None, (1,), ("cpu", 0)):
        with pytest.raises(TypeError, match="__dlpack_device__"):
            ft.from_dlpack(Bad(device))
