"""fasttrain's pytest plugin: the fixtures ft_seed, ft_deterministic and ft_device, the markers cuda and slow,
and a report header line (docs/testing.md).

Installed fasttrain registers it through the pytest11 entry point, under its module's name, so that a conftest
naming it in pytest_plugins (as a source checkout's tests do) finds it already registered instead of
registering it twice. Elsewhere: pytest -p fasttrain.pytest_plugin."""
import hashlib

import numpy as np
import pytest

import fasttrain as ft


def pytest_configure(config):
    config.addinivalue_line("markers", "cuda: needs a CUDA device (skipped without one)")
    config.addinivalue_line("markers", "slow: long-running (deselect with -m 'not slow')")


def pytest_report_header(config):
    isa = " ".join(ft.backends.cpu_capability()) or "no AVX2"
    cuda = "available" if ft.cuda.is_available() else "not available (" + ft.cuda.unavailable_reason() + ")"
    return f"fasttrain {ft.__version__}: CPU {isa}, {ft.get_num_threads()} threads, CUDA {cuda}"


def pytest_collection_modifyitems(config, items):
    marked = [item for item in items if item.get_closest_marker("cuda")]
    if not marked or ft.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="no CUDA device: " + ft.cuda.unavailable_reason())
    for item in marked:
        item.add_marker(skip)


def pytest_generate_tests(metafunc):
    if "ft_device" in metafunc.fixturenames:
        devices = ["cpu"] + ([pytest.param("cuda", marks=pytest.mark.cuda)] if ft.cuda.is_available() else [])
        metafunc.parametrize("ft_device", devices, indirect=True)


@pytest.fixture
def ft_device(request):
    """The device a test runs on: "cpu", and "cuda" too where a CUDA device is available."""
    return request.param


@pytest.fixture
def ft_seed(request):
    """Seeds fasttrain's generator and NumPy's global one from the test's file name and its name in the file (the
    same seed every run of the same test, wherever pytest starts; another for each test) and yields the seed, which
    a failure's report shows; both generators get their state back afterwards."""
    name = f"{request.node.path.name}::{request.node.nodeid.split('::', 1)[-1]}"
    seed = int.from_bytes(hashlib.sha256(name.encode()).digest()[:4], "little")
    request.node.add_report_section("call", "ft_seed", f"ft_seed {seed} (from {name})")
    ft_state, np_state = ft.get_rng_state(), np.random.get_state()
    ft.manual_seed(seed)
    np.random.seed(seed)
    yield seed
    ft.set_rng_state(ft_state)
    np.random.set_state(np_state)


@pytest.fixture
def ft_deterministic():
    """ft.use_deterministic_algorithms(True) for the test, the previous setting afterwards."""
    before = ft.are_deterministic_algorithms_enabled()
    ft.use_deterministic_algorithms(True)
    yield
    ft.use_deterministic_algorithms(before)
