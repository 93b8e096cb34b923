"""`import fasttrain` maps no CUDA library (cudart, cuBLAS, cuDNN): the CUDA backend loads on the first CUDA
use (ft.cuda.*, a tensor on "cuda", page-locked memory), and CPU work never causes it. Each case runs in a
fresh interpreter, which reads its own /proc/self/maps; timings are benchmarks/bench_import.py's business."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

import fasttrain as ft

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PRELUDE = """
import json
def cuda_libraries():
    names = ("libcudart", "libcublas", "libcudnn")
    return sorted({name for line in open("/proc/self/maps") for name in names if name in line})
"""


def run(body):
    """Runs PRELUDE + body in a fresh interpreter; returns the JSON it prints last."""
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    code = PRELUDE + textwrap.dedent(body)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_import_maps_no_cuda_library():
    got = run("""
        import fasttrain
        print(json.dumps(cuda_libraries()))
    """)
    assert got == []


def test_cpu_work_maps_no_cuda_library():
    got = run("""
        import numpy as np
        import fasttrain as ft
        ft.manual_seed(0)
        x = ft.randn(8, 4)
        model = ft.nn.Sequential(ft.nn.Linear(4, 3), ft.nn.ReLU())
        y = model(x)
        opt = ft.optim.SGD(model.parameters(), lr=0.1)
        loss = ft.nn.functional.cross_entropy(y, ft.tensor([0, 1, 2, 0, 1, 2, 0, 1]))
        ft.nn.functional.softmax(ft.from_numpy(np.ones((2, 3), np.float32)), dim=1)
        ft.memory_stats("cpu")
        images = np.zeros((12, 6, 6, 1), np.uint8)
        labels = np.arange(12, dtype=np.int64)
        for _ in ft.data.Loader((images, labels), batch_size=4, num_workers=1, pin_memory=False):
            pass
        print(json.dumps(cuda_libraries()))
    """)
    assert got == []


def test_first_cuda_question_loads_the_backend():
    got = run("""
        import fasttrain as ft
        before = cuda_libraries()
        available = ft.cuda.is_available()
        print(json.dumps({"before": before, "available": available, "after": cuda_libraries(),
                          "compiled": ft.cuda.is_compiled(), "reason": ft.cuda.unavailable_reason()}))
    """)
    assert got["before"] == []
    assert isinstance(got["available"], bool)
    if got["available"]:
        assert "libcudart" in got["after"] and got["reason"] == ""
    else:
        assert got["reason"]
    if got["compiled"] and "libcuda.so.1" in got["reason"]:
        # without a driver the backend is not worth mapping: the answer is known
        assert got["after"] == [] and "no CUDA driver" in got["reason"]
    elif got["compiled"]:
        assert "libcudart" in got["after"]


@pytest.mark.skipif(ft.cuda.is_available(), reason="a CUDA device is present")
def test_cuda_request_without_a_device_names_the_reason():
    got = run("""
        import fasttrain as ft
        try:
            ft.zeros(2, device="cuda")
            message = None
        except RuntimeError as e:
            message = str(e)
        print(json.dumps({"message": message, "reason": ft.cuda.unavailable_reason()}))
    """)
    assert got["message"] is not None
    assert got["reason"] and got["reason"] in got["message"]


@pytest.mark.cuda
def test_cuda_tensor_loads_the_backend():
    got = run("""
        import fasttrain as ft
        before = cuda_libraries()
        ft.zeros(2, device="cuda")
        print(json.dumps({"before": before, "after": cuda_libraries()}))
    """)
    assert got["before"] == [] and "libcudart" in got["after"]
