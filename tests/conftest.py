import pytest

import fasttrain as ft

# fasttrain's plugin (fixtures, the cuda and slow markers, the header line): named here because the tests also
# run from a source checkout, where no entry point registers it; an installed fasttrain has registered it under
# this same name, and pytest then skips it here.
pytest_plugins = ["fasttrain.pytest_plugin"]


@pytest.fixture
def threads():
    """Sets the thread count inside a test and restores it afterwards."""
    before = ft.get_num_threads()
    yield ft.set_num_threads
    ft.set_num_threads(before)
