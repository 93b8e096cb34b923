"""Threads, memory statistics and the CUDA entry points on a machine without a GPU."""
import numpy as np
import pytest

import fasttrain as ft


def test_threads(threads):
    threads(1)
    assert ft.get_num_threads() == 1
    threads(2)
    assert ft.get_num_threads() == 2
    with pytest.raises(ValueError):
        ft.set_num_threads(0)
    with pytest.raises(TypeError):
        ft.set_num_threads(1.5)
    with pytest.raises(OverflowError):
        ft.set_num_threads(2 ** 40)


_WEIGHT_GRADIENT = """
import sys, numpy as np, fasttrain as ft
ft.set_num_threads(int(sys.argv[1]))
rng = np.random.default_rng(0)
x, dy = (ft.tensor(rng.standard_normal(s).astype(np.float32)) for s in ((64, 16, 12, 12), (64, 16, 12, 12)))
w = ft.tensor(rng.standard_normal((16, 16, 3, 3)).astype(np.float32))
def dw():
    return ft.ops.conv2d_backward(False, None, False, dy, x, w, 1, 1)[1].numpy().tobytes().hex()
"""


def test_a_new_thread_count_reaches_shapes_already_run():
    """oneDNN plans a primitive's split for the thread count it is created under: after set_num_threads, a shape
    run before runs as in a process that started with the new count (here: a weight gradient, whose sum over
    the batch is split by thread)."""
    import subprocess
    import sys
    fresh = {n: subprocess.run([sys.executable, "-c", _WEIGHT_GRADIENT + "print(dw())", str(n)], check=True,
                               capture_output=True, text=True).stdout.strip() for n in (1, 2)}
    assert fresh[1] != fresh[2]  # else the check below could not tell
    switched = subprocess.run([sys.executable, "-c", _WEIGHT_GRADIENT + "dw(); ft.set_num_threads(1); print(dw())",
                               "2"], check=True, capture_output=True, text=True).stdout.strip()
    assert switched == fresh[1]


def test_memory_stats_track_and_cache_large_blocks():
    ft.empty_cache()
    base = ft.memory_stats("cpu")
    t = ft.empty(1 << 20)  # 4 MiB: cached on free
    s = ft.memory_stats("cpu")
    assert s["allocated_bytes"] - base["allocated_bytes"] >= 4 << 20
    assert s["peak_bytes"] >= s["allocated_bytes"]
    ptr = t.data_ptr()
    assert ptr % 64 == 0
    del t
    after = ft.memory_stats("cpu")
    assert after["allocated_bytes"] == base["allocated_bytes"]
    assert after["reserved_bytes"] >= base["reserved_bytes"] + (4 << 20)  # kept for reuse
    assert ft.empty(1 << 20).data_ptr() == ptr  # the same block comes back
    ft.empty_cache()
    assert ft.memory_stats("cpu")["reserved_bytes"] == ft.memory_stats("cpu")["allocated_bytes"]
    ft.reset_peak_memory_stats("cpu")
    s = ft.memory_stats("cpu")
    assert s["peak_bytes"] == s["allocated_bytes"]
    assert set(ft.memory_stats()) >= {"cpu", "cpu_pinned"}


def test_small_blocks_are_aligned():
    for n in (1, 3, 17, 1000):
        assert ft.empty(n, dtype=ft.uint8).data_ptr() % 64 == 0


def test_cuda_absent_is_clean():
    assert isinstance(ft.cuda.is_compiled(), bool)
    if ft.cuda.is_available():
        pytest.skip("a CUDA device is present")
    assert ft.cuda.device_count() == 0
    assert ft.cuda.unavailable_reason()
    with pytest.raises(RuntimeError, match="CUDA is not available"):
        ft.zeros(2, device="cuda")
    with pytest.raises(RuntimeError):
        ft.cuda.synchronize()
    with pytest.raises(RuntimeError):
        ft.cuda.get_device_name(0)
    with pytest.raises(RuntimeError):
        ft.cuda.get_device_capability(0)
    assert ft.cuda.is_bf16_supported() is False
    with pytest.raises(ValueError, match="expected a cuda device, got cpu"):
        ft.cuda.get_device_capability("cpu")
    assert ft.cuda.current_device() == 0 and ft.device("cuda").index == 0
    with pytest.raises(ValueError, match=r"set_device: cuda:0 is not a usable device here \(0 usable: .+\)"):
        ft.cuda.set_device(0)


def test_allow_tf32_is_off_by_default_and_switchable():
    assert ft.backends.allow_tf32 is False
    try:
        ft.backends.allow_tf32 = 1
        assert ft.backends.allow_tf32 is True
    finally:
        ft.backends.allow_tf32 = False
    assert ft.backends.allow_tf32 is False


def test_module_to_moves_in_place_and_refuses_cleanly():
    model = ft.nn.Sequential(ft.nn.Conv2d(1, 4, 3), ft.nn.BatchNorm2d(4), ft.nn.Flatten(), ft.nn.Linear(64, 3))
    before = {k: v.copy() for k, v in model.state_dict().items()}
    params = list(model.parameters())
    assert model.to("cpu") is model and model.cpu() is model
    assert list(model.parameters()) == params
    with pytest.raises(ValueError):
        model.to("tpu")
    if not ft.cuda.is_available():  # refused before anything moves: the model is as it was
        with pytest.raises(RuntimeError, match="CUDA is not available"):
            model.cuda()
        assert all(not t.is_cuda for t in list(model.parameters()) + list(model.buffers()))
    for k, v in model.state_dict().items():
        np.testing.assert_array_equal(v, before[k])


@pytest.mark.cuda
def test_cuda_round_trip():
    a = ft.arange(1 << 20, dtype=ft.float32).reshape(1024, 1024)
    g = a.to("cuda")
    assert g.is_cuda and g.device == ft.device("cuda:0")
    back = g.t().contiguous().to(ft.float16).cpu()
    assert back.tolist() == a.t().to(ft.float16).tolist()
    p = a.pin_memory()
    h = p.to("cuda", non_blocking=True)
    ft.cuda.synchronize()
    assert h.cpu().tolist() == a.tolist()
    r = ft.from_dlpack(g.__dlpack__(max_version=(1, 0), stream=1))
    assert r.data_ptr() == g.data_ptr()
    stats = ft.memory_stats("cuda:0")
    assert stats["allocated_bytes"] >= a.nbytes
