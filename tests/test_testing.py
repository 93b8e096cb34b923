"""fasttrain.testing (assert_close, make_tensor, gradcheck) and the pytest plugin (fixtures, markers, header),
the plugin run on small test files by pytest's own pytester, and the example downstream project's suite."""
import importlib.metadata
import os
import re
import subprocess
import sys

import numpy as np
import pytest

import fasttrain as ft
from fasttrain import nn
from fasttrain.testing import assert_close, gradcheck, make_tensor

pytest_plugins = ["pytester"]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def report(actual, expected, **kwargs):
    with pytest.raises(AssertionError) as info:
        assert_close(actual, expected, **kwargs)
    return str(info.value)


# ---------------------------------------------------------------- assert_close

@pytest.mark.parametrize("actual, expected", [
    (ft.tensor([1.0, 2.0]), np.array([1.0, 2.0], np.float32)),
    (ft.tensor([1.0, 2.0]), [1.0, 2.0 + 1e-6]),  # a list takes the tensor's tolerances
    (np.array([100.0], np.float32), np.array([100.0001], np.float32)),  # within rtol 1.3e-6
    (ft.tensor([[1, 2], [3, 4]]), [[1, 2], [3, 4]]),
    (ft.tensor([1.0, 2.0]).bfloat16(), ft.tensor([1.01, 2.0]).bfloat16()),
    (3, 3),
    (0.1 + 0.2, 0.3),
    ([float("inf"), -float("inf")], [float("inf"), -float("inf")]),
])
def test_close_values_pass(actual, expected):
    assert_close(actual, expected)


def test_pytorch_tensors_compare_by_their_dtype_whatever_they_track():
    """A PyTorch reference output (requiring grad, bfloat16) compares by its values and dtype, as a NumPy array
    does."""
    torch = pytest.importorskip("torch")
    x = ft.tensor([1.0, 2.0])
    assert_close(x, torch.tensor([1.0, 2.0], requires_grad=True) * 1)
    assert_close(x.to(ft.bfloat16), torch.tensor([1.0, 2.0], dtype=torch.bfloat16))
    for other in (torch.tensor([1.0, 2.0], dtype=torch.float64), torch.tensor([1, 2], dtype=torch.int32)):
        with pytest.raises(AssertionError, match="The dtypes do not match: .*float32 != .*(float64|int32)"):
            assert_close(x, other)
    with pytest.raises(AssertionError, match="The dtypes do not match: .*float64 != .*float32"):
        assert_close(np.array([1.0, 2.0]), torch.tensor([1.0, 2.0]))
    assert_close(np.array([1.0, 2.0]), torch.tensor([1.0, 2.0]), check_dtype=False)
    assert_close([x, x[:1]], [torch.tensor([1.0, 2.0], requires_grad=True) * 1, torch.tensor([1.0])])
    with pytest.raises(AssertionError, match=r"item \[1\]: The dtypes do not match"):
        assert_close((x, x), (torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.0], dtype=torch.float64)))


def test_the_report_counts_and_locates_the_mismatches():
    expected = np.zeros((2, 3), np.float32)
    actual = expected.copy()
    actual[0, 1], actual[1, 2] = 0.5, -2.0
    expected[1, 2] = -4.0
    text = report(ft.from_numpy(actual), expected)
    assert text.startswith("Tensor-likes are not close!")
    assert "Mismatched elements: 2 / 6 (33.3%)" in text
    assert "Greatest absolute difference: 2 at index (1, 2) (up to 1e-05 allowed)" in text
    # the relative difference of 0.5 against an expected 0 is infinite
    assert "Greatest relative difference: inf at index (0, 1) (up to 1.3e-06 allowed)" in text


def test_the_greatest_differences_are_among_the_mismatches():
    # index 0 is within tolerance (rtol 1.3e-6 of 100) but differs more than the mismatched index 1
    text = report(ft.tensor([100.0, 0.0]), ft.tensor([100.0001, 2e-5]))
    assert "Mismatched elements: 1 / 2" in text and "Greatest absolute difference: 2e-05 at index (1,)" in text
    # integers differ exactly, beyond float64's 2**53 too
    assert "Greatest absolute difference: 1 at index (0,)" in report(ft.tensor([2 ** 62 + 1]), ft.tensor([2 ** 62]))
    assert "Greatest absolute difference: 1.84467e+19 at index (0,)" in report(np.array([2 ** 64 - 1], np.uint64),
                                                                               np.array([0], np.uint64))


def test_sequences_and_mappings_compare_item_by_item():
    """As torch.testing: each tensor of a list, tuple or dict at its own dtype's tolerances; None equals None."""
    assert_close([ft.tensor([100.0])], [ft.tensor([100.0001])])  # float32's rtol, not float64's
    assert_close((ft.ones(2).bfloat16(), ft.ones(3)), (ft.full((2,), 1.004).bfloat16(), ft.ones(3)))
    assert_close([ft.ones(2), None, [ft.zeros(1)]], [ft.ones(2), None, [ft.zeros(1)]])
    assert_close(None, None)
    state = {"w": ft.ones(2, 2), "b": ft.zeros(2)}
    assert_close(state, {k: v.clone() for k, v in state.items()})
    assert re.search(r"The failure occurred for item \['b'\]: Tensor-likes are not close!",
                     report(state, {"w": ft.ones(2, 2), "b": ft.ones(2)}))
    assert "The failure occurred for item [1]" in report([ft.ones(1), ft.ones(1)], [ft.ones(1), ft.zeros(1)])
    assert "lengths 1 != 2" in report([ft.ones(2)], [ft.ones(2), ft.ones(1)])
    assert "keys do not match" in report(state, {"w": ft.ones(2, 2)})
    assert "None mismatch" in report(None, ft.ones(1))
    assert "None mismatch" in report([ft.ones(1), None], [ft.ones(1), ft.ones(1)])


def test_given_tolerances_replace_the_defaults_and_show_in_the_report():
    assert_close([1.0, 2.0], [1.05, 2.0], rtol=0.1, atol=0.0)
    text = report([1.0, 2.0], [1.5, 2.0], rtol=0.1, atol=0.01)
    assert "(up to 0.01 allowed)" in text and "(up to 0.1 allowed)" in text
    assert "Greatest relative difference: 0.333333 at index (0,)" in text
    with pytest.raises(ValueError, match="both rtol and atol"):
        assert_close(1.0, 1.0, rtol=0.1)


def test_float_tolerances_follow_the_dtype():
    # 1e-4 apart at 1.0: within float16's rtol 1e-3, not within float32's 1.3e-6 and atol 1e-5
    assert_close(np.array([1.0], np.float16), np.array([1.0001], np.float16))
    assert "1.3e-06 allowed" in report(np.array([1.0], np.float32), np.array([1.0001], np.float32))
    # 5e-8 apart: within float64's 1e-7, 1e-6 apart is not
    assert_close(np.array([1.0]), np.array([1.0 + 5e-8]))
    assert "1e-07 allowed" in report(np.array([1.0]), np.array([1.000001]))


def test_integers_compare_exactly():
    text = report(ft.tensor([1, 2, 3]), ft.tensor([1, 2, 4]))
    assert text.startswith("Tensor-likes are not equal!")
    assert "Greatest absolute difference: 1 at index (2,) (up to 0 allowed)" in text
    big = 2 ** 53
    report(np.array([big], np.int64), np.array([big + 1], np.int64))  # beyond float64's integers
    report(ft.tensor([True, False]), ft.tensor([True, True]))
    assert report(3, 4).startswith("Scalars are not equal!")


def test_shapes_must_match():
    assert report(ft.zeros(2, 3), np.zeros((3, 2), np.float32)) == "The shapes do not match: (2, 3) != (3, 2)."
    assert "shapes" in report(ft.zeros(1), 0.0)


def test_dtypes_must_match_unless_told_otherwise():
    text = report(ft.zeros(2), np.zeros(2))
    assert text == "The dtypes do not match: fasttrain.float32 != fasttrain.float64."
    assert "dtypes" in report(ft.zeros(2, dtype=ft.int64), ft.zeros(2, dtype=ft.int32))
    assert_close(ft.zeros(2), np.zeros(2), check_dtype=False)
    # the looser dtype's tolerances: 1e-3 apart passes as bfloat16 against float32
    assert_close(ft.tensor([1.0]).bfloat16(), [1.001], check_dtype=False)
    report(ft.tensor([1.0]), np.array([1.001]), check_dtype=False)


def test_nans_are_equal_only_with_equal_nan():
    nan = float("nan")
    text = report(ft.tensor([nan, 1.0, 2.0]), [nan, 1.0, 2.5])
    assert "Mismatched elements: 2 / 3" in text
    assert "Mismatched NaNs: 1, the first at index (0,)" in text
    assert "Greatest absolute difference: 0.5 at index (2,)" in text  # the NaN hides no number
    assert_close(ft.tensor([nan, 1.0]), [nan, 1.0], equal_nan=True)
    assert "Mismatched NaNs: 1" in report(ft.tensor([nan, 1.0]), [1.0, 1.0], equal_nan=True)
    text = report(ft.tensor([1.0, nan, 3.0]), [1.0, 2.0, nan])  # only NaNs differ: theirs, not a matching element's
    assert "Greatest absolute difference: nan at index (1,)" in text
    assert "Greatest relative difference: nan at index (1,)" in text


def test_msg_replaces_or_rewrites_the_report():
    assert report(1.0, 2.0, msg="the loss moved") == "the loss moved"
    text = report(1.0, 2.0, msg=lambda r: "step 3: " + r)
    assert text.startswith("step 3: Scalars are not close!")


def test_values_that_cannot_be_compared_are_refused():
    with pytest.raises(TypeError, match="assert_close"):
        assert_close([[1.0], [1.0, 2.0]], [[1.0], [1.0, 2.0]])


# ---------------------------------------------------------------- make_tensor

@pytest.mark.parametrize("dtype, low, high", [
    (ft.float32, -9, 9), (ft.float64, -9, 9), (ft.bfloat16, -9, 9), (ft.float16, -9, 9),
    (ft.int64, -9, 9), (ft.int8, -9, 9), (ft.uint8, 0, 9), (ft.bool, 0, 1)])
def test_make_tensor_draws_the_default_range_of_each_dtype(dtype, low, high):
    t = make_tensor(50, 40, dtype=dtype, seed=0)
    assert t.shape == (50, 40) and t.dtype is dtype
    v = np.asarray(t).astype(np.float64)
    assert v.min() >= low and v.max() <= high
    assert v.min() < low + 1 and v.max() > high - 1  # it spans the range
    if not dtype.is_floating_point:
        assert np.array_equal(np.unique(v), np.arange(low, high + 1))


def test_make_tensor_takes_a_range_and_either_form_of_shape():
    t = make_tensor((3, 4), low=2, high=2.5, seed=1)
    assert t.shape == (3, 4) and 2 <= np.asarray(t).min() and np.asarray(t).max() <= 2.5
    assert set(np.asarray(make_tensor(100, dtype=ft.int32, low=5, high=7, seed=1)).tolist()) == {5, 6}  # [5, 7)
    assert set(np.asarray(make_tensor(100, dtype=ft.int64, low=0, high=3, seed=1)).tolist()) == {0, 1, 2}
    assert set(np.asarray(make_tensor(100, dtype=ft.int64, low=2.5, high=4.5, seed=1)).tolist()) == {3, 4}
    with pytest.raises(ValueError, match="low"):
        make_tensor(3, low=1, high=0)
    with pytest.raises(ValueError, match="must be numbers"):
        make_tensor(3, low=float("nan"))
    for dtype in (ft.float16, ft.bfloat16, ft.float32):  # bounds beyond the dtype's range clamped to it: finite
        assert np.isfinite(np.asarray(make_tensor(64, dtype=dtype, low=-1e39, high=1e39, seed=2).float())).all()
    with pytest.raises(ValueError, match="range"):
        make_tensor(3, dtype=ft.uint8, low=-1, high=3)
    with pytest.raises(ValueError, match=r"\[4, 4\) is not a range of .* \(high is excluded"):
        make_tensor(3, dtype=ft.int64, low=4, high=4)
    with pytest.raises(TypeError, match="complex64"):
        make_tensor(3, dtype=ft.complex64)


@pytest.mark.parametrize("dtype,low,high", [("int64", -2 ** 63, 2 ** 63), ("uint64", 0, 2 ** 64),
                                            ("uint64", 2 ** 64 - 3, 2 ** 64), ("int64", 2 ** 63 - 3, 2 ** 63),
                                            ("uint64", 5, 2 ** 64)])
def test_make_tensor_draws_ranges_beyond_int64(dtype, low, high):
    t = make_tensor(4000, dtype=getattr(ft, dtype), low=low, high=high, seed=3)
    v = [int(x) for x in t.tolist()]
    assert t.dtype is getattr(ft, dtype) and min(v) >= low and max(v) < high
    if high - low < 10:
        assert set(v) == set(range(low, high))
    else:  # both halves of the range
        mid = low + (high - low) // 2
        assert 0.45 < sum(x > mid for x in v) / len(v) < 0.55
    assert t.tolist() == make_tensor(4000, dtype=getattr(ft, dtype), low=low, high=high, seed=3).tolist()


def test_make_tensor_repeats_for_a_seed():
    a, b = make_tensor(2, 3, seed=7), make_tensor(2, 3, seed=7)
    assert np.array_equal(np.asarray(a), np.asarray(b))
    assert not np.array_equal(np.asarray(a), np.asarray(make_tensor(2, 3, seed=8)))
    # without a seed the values follow fasttrain's generator, which the seed left as it was
    ft.manual_seed(3)
    c = make_tensor(2, 3)
    ft.manual_seed(3)
    make_tensor(2, 3, seed=7)
    assert np.array_equal(np.asarray(c), np.asarray(make_tensor(2, 3)))


# ---------------------------------------------------------------- gradcheck

def conv_net():
    ft.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 3, 3, padding=1), nn.Tanh(), nn.Flatten(), nn.Linear(3 * 4 * 4, 4))


def conv_batch():
    rng = np.random.default_rng(0)
    return rng.standard_normal((4, 1, 4, 4)).astype(np.float32), rng.integers(0, 4, 4)


def test_gradcheck_passes_a_model_and_leaves_its_parameters_as_they_were():
    model = conv_net()
    before = {k: v.copy() for k, v in model.state_dict().items()}
    assert gradcheck(model, *conv_batch()) is True
    for k, v in model.state_dict().items():
        assert np.array_equal(v, before[k]), k
    assert all(p.grad is None for p in model.parameters())


def test_gradcheck_holds_the_dropout_masks_of_the_gradients_step():
    """A model with dropout: every loss of the differences uses the masks the gradient was computed with (a fresh
    mask per loss would make them meaningless); an eps that cannot move the parameters is refused."""
    ft.manual_seed(1)
    model = nn.Sequential(nn.Linear(3, 8), nn.Dropout(0.5), nn.Linear(8, 2))
    x, y = make_tensor(6, 3, low=-1, high=1, seed=2), np.array([0, 1, 1, 0, 1, 0])
    assert gradcheck(model, x, y)
    for eps in (0.0, 1e-12):
        with pytest.raises(ValueError, match="eps must be positive|does not move .* give a larger eps"):
            gradcheck(model, x, y, eps=eps)


def test_gradcheck_picks_the_loss_from_the_targets_or_takes_one():
    ft.manual_seed(1)
    model = nn.Sequential(nn.Linear(3, 5), nn.GELU(), nn.Linear(5, 2))
    x, t = make_tensor(6, 3, low=-1, high=1, seed=2), make_tensor(6, 2, low=-1, high=1, seed=3)
    assert gradcheck(model, x, t)  # float targets: mean squared error
    assert gradcheck(model, x, t, nn.L1Loss())
    assert gradcheck(model, x, np.array([0, 1, 1, 0, 1, 0]))  # class indices: cross-entropy


def test_gradcheck_takes_a_tuple_of_targets_and_names_what_it_cannot_take():
    """A model of two heads and a loss of two targets (class labels and values), compiled here for the tuple; a
    list of differently shaped inputs (which NumPy refused as inhomogeneous), a 0-d input, and several targets
    without their loss are refused by name."""
    class Heads(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(3, 4), nn.Linear(3, 2)

        def forward(self, x):
            return self.a(x), self.b(x)

    def loss(out, y):
        return nn.functional.cross_entropy(out[0], y[0]) + nn.functional.mse_loss(out[1], y[1])

    ft.manual_seed(4)
    x = make_tensor(6, 3, low=-1, high=1, seed=5)
    y = (np.array([0, 1, 3, 2, 1, 0]), make_tensor(6, 2, low=-1, high=1, seed=6).numpy())
    assert gradcheck(Heads(), x, y, loss)
    with pytest.raises(ValueError, match="give the loss that reads the tuple of targets"):
        gradcheck(Heads(), x, y)
    with pytest.raises(TypeError, match="inputs and targets are arrays, or tuples of arrays for several"):
        gradcheck(Heads(), [np.ones((6, 3)), np.ones((6, 2))], y, loss)
    with pytest.raises(ValueError, match="batches, with the batch dimension first"):
        gradcheck(Heads(), np.float32(1.0), y, loss)


def test_gradcheck_takes_a_compiled_program_with_its_own_options():
    model = conv_net()
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), batch_size=4, input_shape=(1, 4, 4),
                            memory_format="contiguous")
    x, y = conv_batch()
    program.train_step(x, y)  # gradients already there are not mistaken for the batch's
    assert gradcheck(program, x, y)
    with pytest.raises(ValueError, match="own loss"):
        gradcheck(program, x, y, nn.MSELoss())
    with pytest.raises(TypeError, match="Module"):
        gradcheck(lambda x: x, x, y)


def test_gradcheck_names_the_parameter_and_element_a_wrong_backward_gets_wrong(monkeypatch):
    """A backward that gets one element of one gradient wrong (here: off by 0.05), its loss still right."""
    backward = ft.nn.Program.backward

    def broken(self, x, y):
        loss = backward(self, x, y)
        dict(self.model.named_parameters())["3.bias"].grad.numpy()[2] += 0.05  # .numpy() shares the memory
        return loss

    monkeypatch.setattr(ft.nn.Program, "backward", broken)
    with pytest.raises(AssertionError, match=r"gradient of 3\.bias at index \(2,\)"):
        gradcheck(conv_net(), *conv_batch())


def test_gradcheck_skips_frozen_parameters():
    model = conv_net()
    model[0].weight.requires_grad_(False)
    assert gradcheck(model, *conv_batch())


# ---------------------------------------------------------------- the pytest plugin

PLUGIN = ["-p", "fasttrain.pytest_plugin"]  # as an installed fasttrain's entry point would register it


def seeds(result):
    return dict(re.findall(r"SEED (\w+) (\d+ \S+ \S+)", result.stdout.str()))


def test_ft_seed_follows_the_test_wherever_pytest_starts(pytester, monkeypatch):
    """The seed comes from the file's name and the test's name in it: the same every run, from the project's root
    or from the tests' directory (a node id relative to pytest's rootdir gave CI another seed than a local run);
    a failure's report shows it."""
    pytester.mkpydir("tests")
    (pytester.path / "tests" / "test_seeds.py").write_text("""
import numpy as np
import fasttrain as ft

def test_a(ft_seed):
    print("SEED a", ft_seed, ft.rand(1).item(), np.random.rand())

def test_b(ft_seed):
    print("SEED b", ft_seed, ft.rand(1).item(), np.random.rand())
    assert False
""")
    first, second = (pytester.runpytest(*PLUGIN, "-s", "tests") for _ in range(2))
    first.assert_outcomes(passed=1, failed=1)
    assert seeds(first) == seeds(second) and len(seeds(first)) == 2  # the same seeds and draws every run
    assert seeds(first)["a"].split()[0] != seeds(first)["b"].split()[0]
    b = seeds(first)["b"].split()[0]
    first.stdout.fnmatch_lines([f"*ft_seed {b} (from test_seeds.py::test_b)*"])
    inside = pytester.path / "tests"
    monkeypatch.chdir(inside)
    assert seeds(pytester.runpytest_inprocess(*PLUGIN, "-s", "--rootdir", str(inside), "test_seeds.py")) == \
        seeds(first)


def test_ft_seed_and_ft_deterministic_put_back_what_they_change(pytester):
    pytester.makepyfile("""
        import numpy as np
        import fasttrain as ft

        ft.manual_seed(5)
        np.random.seed(5)
        DRAWS = ft.rand(2).tolist(), np.random.rand(2).tolist()
        ft.manual_seed(5)
        np.random.seed(5)

        def test_seeded(ft_seed, ft_deterministic):
            assert ft.are_deterministic_algorithms_enabled()
            ft.rand(3), np.random.rand(3)

        def test_after():
            assert not ft.are_deterministic_algorithms_enabled()
            assert (ft.rand(2).tolist(), np.random.rand(2).tolist()) == DRAWS
    """)
    pytester.runpytest(*PLUGIN).assert_outcomes(passed=2)


def test_ft_device_and_the_markers(pytester):
    pytester.makepyfile("""
        import pytest

        def test_device(ft_device):
            assert ft_device in ("cpu", "cuda")

        @pytest.mark.cuda
        def test_gpu():
            pass

        @pytest.mark.slow
        def test_long():
            pass
    """)
    gpu = ft.cuda.is_available()
    result = pytester.runpytest(*PLUGIN, "-v", "-rs", "--strict-markers")
    result.assert_outcomes(passed=2 + 2 * gpu, skipped=0 if gpu else 1)
    result.stdout.fnmatch_lines(["*test_device?cpu? PASSED*"] + (["*test_device?cuda? PASSED*"] if gpu else
                                                                 ["*test_gpu SKIPPED (no CUDA device*"]))
    pytester.runpytest(*PLUGIN, "-m", "not slow").assert_outcomes(passed=1 + 2 * gpu, skipped=0 if gpu else 1)


def test_the_header_names_version_isa_threads_and_cuda(pytester):
    pytester.makepyfile("def test_nothing(): pass")
    result = pytester.runpytest(*PLUGIN)
    threads = ft.get_num_threads()
    result.stdout.fnmatch_lines([f"fasttrain {ft.__version__}: CPU *, {threads} threads, CUDA *"])
    header = next(line for line in result.stdout.lines if line.startswith("fasttrain "))
    assert ("avx512_bf16" in header) == ("avx512_bf16" in ft.backends.cpu_capability())
    assert ("CUDA available" in header) == ft.cuda.is_available()


def test_installed_and_named_in_a_conftest_it_registers_once(pytester):
    """An installed fasttrain registers the plugin through setup.py's pytest11 entry point; a conftest that
    also names it (as tests/conftest.py does) must not register it a second time."""
    entry = re.search(r'"pytest11": \["([^"]+)"\]', open(os.path.join(ROOT, "setup.py")).read()).group(1)
    info = pytester.mkdir("site").joinpath("fasttrain_plugin_check-0.dist-info")
    info.mkdir()
    info.joinpath("METADATA").write_text("Metadata-Version: 2.1\nName: fasttrain-plugin-check\nVersion: 0\n")
    info.joinpath("entry_points.txt").write_text(f"[pytest11]\n{entry}\n")
    pytester.syspathinsert(info.parent)
    pytester.makepyfile("def test_seeded(ft_seed): pass")
    pytester.runpytest().assert_outcomes(passed=1)  # the entry point alone
    pytester.makeconftest('pytest_plugins = ["fasttrain.pytest_plugin"]')
    pytester.runpytest().assert_outcomes(passed=1)


def test_the_downstream_example_passes_its_tests():
    """examples/downstream: a project of its own, tested with the plugin's fixtures and fasttrain.testing."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [os.path.join(ROOT, "python"),
                                                                    os.environ.get("PYTHONPATH")])))
    installed = any(ep.value == "fasttrain.pytest_plugin" for ep in importlib.metadata.entry_points(group="pytest11"))
    args = [] if installed else PLUGIN
    run = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args,
                          "examples/downstream/tests"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    assert re.search(r"\b5 passed\b", run.stdout), run.stdout


@pytest.mark.cuda
def test_check_device_fails_tensors_on_two_devices_as_torch():
    cpu = ft.ones(3)
    with pytest.raises(AssertionError, match="The values are on different devices: cpu and cuda:0"):
        assert_close(cpu, cpu.to("cuda"))
    assert_close(cpu, cpu.to("cuda"), check_device=False)
