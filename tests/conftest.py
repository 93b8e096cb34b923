import pytest

import fasttrain as ft


@pytest.fixture
def threads():
    """Sets the thread count inside a test and restores it afterwards."""
    before = ft.get_num_threads()
    yield ft.set_num_threads
    ft.set_num_threads(before)


def pytest_collection_modifyitems(config, items):
    if ft.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="no CUDA device: " + ft.cuda.unavailable_reason())
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)
