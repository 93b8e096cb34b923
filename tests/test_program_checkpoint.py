"""Checkpoints of a compiled program (ft.save, ft.load): a bitwise-exact resume, the values as written,
interchange with the safetensors package, another architecture or optimizer refused without changing anything,
corrupt or truncated files, and a resume with a data loader's position."""
import json
import os
import struct
import warnings

import numpy as np
import pytest

import fasttrain as ft
from _programref import CLASSES, batch, compile_plain, compile_resnet, make_resnet, plain_net, state_bits

nn = ft.nn


def train(program, first, count, size=8):
    return [program.train_step(*batch(size, seed=500 + k)) for k in range(first, first + count)]


RESUME_CASES = {
    "sgd_nesterov": (plain_net, compile_plain, lambda ps: ft.optim.SGD(ps, lr=0.05, momentum=0.9, nesterov=True,
                                                                      weight_decay=1e-3)),
    "adamw": (plain_net, compile_plain, lambda ps: ft.optim.AdamW(ps, lr=0.01)),
    "nadam": (plain_net, compile_plain, lambda ps: ft.optim.NAdam(ps, lr=0.01)),  # a scalar state: mu_product
    "batchnorm_sgd": (make_resnet, compile_resnet, lambda ps: ft.optim.SGD(ps, lr=0.05, momentum=0.9)),
    "dropout_sgd": (lambda seed: plain_net(seed, dropout=0.3), compile_plain,
                    lambda ps: ft.optim.SGD(ps, lr=0.05, momentum=0.9)),
}


@pytest.mark.parametrize("case", list(RESUME_CASES))
def test_checkpoint_resume_is_bitwise_exact(case, tmp_path):
    make, comp, opt = RESUME_CASES[case]
    n, m = 3, 3
    a = make(0)
    pa = comp(a, opt(a.parameters()))
    train(pa, 0, n)
    path = str(tmp_path / "run.safetensors")
    ft.save(path, pa, epoch=1)
    saved = state_bits(a)
    want_losses = train(pa, n, m)
    b = make(9)  # other initial weights: everything must come from the checkpoint
    pb = comp(b, opt(b.parameters()))
    assert state_bits(b) != saved
    meta = ft.load(path, into=pb)
    assert meta["epoch"] == 1 and pb.step_count == n
    assert state_bits(b) == saved
    assert train(pb, n, m) == want_losses
    assert state_bits(b) == state_bits(a)
    sa, sb = pa.optimizer.state_dict(), pb.optimizer.state_dict()
    assert sa["param_groups"] == sb["param_groups"] and sa["state"].keys() == sb["state"].keys()
    for i in sa["state"]:
        for key in sa["state"][i]:
            assert np.asarray(sa["state"][i][key]).tobytes() == np.asarray(sb["state"][i][key]).tobytes()


def test_an_ema_of_the_weights_resumes_from_the_checkpoint(tmp_path):
    """ft.save(..., ema=) keeps the averages as "ema.<parameter>" tensors (readable by safetensors) with the decay and
    the update count; ft.load(..., ema=) puts them back, so updates after the load go on as an uninterrupted run's.
    A checkpoint without one, or an EMA of other parameters, is refused and changes nothing."""
    def run(seed):
        model = plain_net(seed)
        program = compile_plain(model, ft.optim.AdamW(model.parameters(), lr=0.01))
        return model, program, ft.optim.EMA(model.parameters(), decay=0.9)

    path = str(tmp_path / "ema.safetensors")
    a, pa, ema_a = run(0)
    for k in range(3):
        pa.train_step(*batch(8, seed=600 + k))
        ema_a.update()
    ft.save(path, pa, ema=ema_a)
    tensors, meta = ft.load(path)
    names = [n for n, _ in a.named_parameters()]
    np.testing.assert_array_equal(tensors[f"ema.{names[0]}"], ema_a.shadow[0].numpy())
    b, pb, ema_b = run(9)
    ft.load(path, pb, ema=ema_b)
    assert ema_b.num_updates == 3 and ema_b.decay == 0.9
    for k in range(3, 5):
        for program, ema in ((pa, ema_a), (pb, ema_b)):
            program.train_step(*batch(8, seed=600 + k))
            ema.update()
    for sa, sb in zip(ema_a.shadow, ema_b.shadow):
        assert sa.numpy().tobytes() == sb.numpy().tobytes()
    bare = str(tmp_path / "bare.safetensors")
    ft.save(bare, pa)
    c, pc, ema_c = run(5)
    before = [s.numpy().copy() for s in ema_c.shadow], state_bits(c)
    with pytest.raises(KeyError, match="holds no EMA"):
        ft.load(bare, pc, ema=ema_c)
    with pytest.raises(ValueError, match=r"EMA averages \d+ parameters .*, this EMA 1 "):
        ft.load(path, pc, ema=ft.optim.EMA(list(c.parameters())[:1]))
    with pytest.raises(ValueError, match="not this model's parameters"):
        ft.save(bare, pa, ema=ema_c)
    assert all(np.array_equal(s.numpy(), w) for s, w in zip(ema_c.shadow, before[0])) and state_bits(c) == before[1]
    with pytest.warns(UserWarning, match="holds an EMA of the weights that this load does not restore"):
        ft.load(path, pc)


def test_checkpoint_round_trip_values(tmp_path):
    """Parameters (PyTorch key names), optimizer state and metadata as written."""
    model = plain_net(1)
    program = compile_plain(model, ft.optim.SGD(model.parameters(), lr=0.05, momentum=0.9))
    train(program, 0, 2)
    path = str(tmp_path / "c.safetensors")
    ft.save(path, program, epoch=4, step=7, metadata={"note": "hello"})
    tensors, meta = ft.load(path)
    sd = model.state_dict()
    for k, v in sd.items():
        assert tensors[k].dtype == v.dtype and tensors[k].shape == v.shape and tensors[k].tobytes() == v.tobytes()
    state = program.optimizer.state_dict()["state"]
    for i, entry in state.items():
        assert tensors[f"optimizer.state.{i}.momentum_buffer"].tobytes() == entry["momentum_buffer"].tobytes()
    assert meta["epoch"] == 4 and meta["step"] == 7 and meta["note"] == "hello"
    assert json.loads(meta["optimizer.param_groups"])[0]["lr"] == 0.05
    assert not [f for f in os.listdir(tmp_path) if f != "c.safetensors"]  # no temporary file left behind
    assert ft.load(path, weights_only=True)[1] == meta  # PyTorch's call
    ft.checkpoint.save_file(str(tmp_path / "bare.safetensors"), tensors)  # its tensors rewritten without metadata
    with pytest.warns(UserWarning, match="holds optimizer state tensors but not the metadata"):
        ft.load(str(tmp_path / "bare.safetensors"), program)
    with pytest.raises(TypeError, match=r"a \(tensors, metadata\) tuple, what ft.load\(path\) returns without a "
                                        r"model: pass ft.load\(path\)\[0\]"):
        model.load_state_dict(ft.load(path))
    with pytest.raises(IsADirectoryError, match=f"save: {tmp_path} is a directory: give a file's path in it"):
        ft.save(str(tmp_path), program)
    for obj, hint in ((model.state_dict(), r"a state_dict: give the model itself"), (path, "the path comes first")):
        with pytest.raises(TypeError, match=rf"ft.save expects a Module or a compiled Program, got \w+ \({hint}"):
            ft.save(path, obj)


@pytest.mark.parametrize("make", [plain_net, make_resnet], ids=["plain", "batchnorm"])
def test_checkpoint_opens_with_safetensors_numpy(make, tmp_path):
    st = pytest.importorskip("safetensors.numpy", reason="the safetensors package is not installed")
    model = make(2)
    comp = compile_resnet if make is make_resnet else compile_plain
    program = comp(model, ft.optim.AdamW(model.parameters(), lr=0.01))
    train(program, 0, 1)
    path = str(tmp_path / "c.safetensors")
    ft.save(path, program)
    tensors = st.load_file(path)
    for k, v in model.state_dict().items():
        assert k in tensors
        assert tensors[k].dtype == v.dtype and tensors[k].tobytes() == v.tobytes()
    for k, v in program.optimizer.state_dict()["state"][0].items():
        assert tensors[f"optimizer.state.0.{k}"].tobytes() == np.asarray(v).tobytes()


def test_checkpoint_keeps_scalar_shapes(tmp_path):
    st = pytest.importorskip("safetensors.numpy", reason="the safetensors package is not installed")
    model = make_resnet(2)
    program = compile_resnet(model, ft.optim.AdamW(model.parameters(), lr=0.01))
    train(program, 0, 1)
    path = str(tmp_path / "c.safetensors")
    ft.save(path, program)
    tensors = st.load_file(path)
    assert tensors["batch_norm2d.num_batches_tracked"].shape == ()
    assert tensors["optimizer.state.0.step"].shape == ()


def other_net(seed=0):
    """plain_net with a 5x5 first conv and 7 classes: 0.weight and 6.weight/6.bias differ."""
    ft.manual_seed(seed)
    return nn.Sequential(nn.Conv2d(3, 6, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(6, 8, 3, padding=1),
                         nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 7))


def trained(make, seed):
    """make(seed) compiled with SGD (momentum) and trained for one step: (model, program)."""
    model = make(seed)
    program = compile_plain(model, ft.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    train(program, 0, 1)
    return model, program


def test_checkpoint_of_another_architecture_is_refused(tmp_path):
    _, psrc = trained(other_net, 0)
    path = str(tmp_path / "other.safetensors")
    ft.save(path, psrc)
    model, program = trained(plain_net, 1)
    before, opt_before = state_bits(model), program.optimizer.state_dict()
    with pytest.raises(ValueError) as info:
        ft.load(path, into=program)
    msg = str(info.value)
    assert "0.weight" in msg and "(6, 3, 5, 5)" in msg and "(6, 3, 3, 3)" in msg
    assert "7.weight" not in msg  # the first mismatch only
    assert state_bits(model) == before
    opt_after = program.optimizer.state_dict()
    assert all(opt_after["state"][i]["momentum_buffer"].tobytes() == opt_before["state"][i]["momentum_buffer"].tobytes()
               for i in opt_before["state"])
    # a checkpoint that lacks one of the model's tensors
    ft.save(path, nn.Sequential(nn.Conv2d(3, 6, 3, padding=1)))
    with pytest.raises((KeyError, ValueError), match="3.weight"):
        ft.load(path, into=program)
    assert state_bits(model) == before


def test_strict_load_refuses_tensors_the_model_lacks_and_strict_false_loads_the_shared_ones(tmp_path):
    """As load_state_dict(strict=): a backbone's checkpoint into a model with a new head, and back."""
    ft.manual_seed(0)
    backbone = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Conv2d(4, 5, 3))
    path = str(tmp_path / "backbone.safetensors")
    ft.save(path, backbone)
    smaller = nn.Sequential(nn.Conv2d(3, 4, 3))
    before = state_bits(smaller)
    with pytest.raises(KeyError, match=r"2 tensor\(s\) the model does not, first '2.bias'; strict=False"):
        ft.load(path, smaller)
    assert state_bits(smaller) == before
    ft.load(path, smaller, strict=False)
    assert smaller[0].weight.numpy().tobytes() == backbone[0].weight.numpy().tobytes()
    bigger = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Conv2d(4, 5, 3), nn.Flatten(), nn.Linear(5, 2))
    head = bigger[4].weight.numpy().copy()
    with pytest.raises(KeyError, match="no tensor '4.weight' that the model needs"):
        ft.load(path, bigger)
    ft.load(path, bigger, strict=False)
    assert bigger[2].weight.numpy().tobytes() == backbone[2].weight.numpy().tobytes()
    np.testing.assert_array_equal(bigger[4].weight.numpy(), head)
    with pytest.raises(TypeError, match="strict must be a bool"):
        ft.load(path, bigger, strict="no")


def test_strict_false_into_a_program_of_other_names_loads_weights_alone(tmp_path):
    """A trained program's checkpoint into a program whose head has another name (and the same shape): the
    optimizer's state, saved by parameter position, would give the new head the old head's moments; it is not
    restored, nor the step count or the dropout stream, and the load says so."""
    def net(head):
        ft.manual_seed(36)
        m = nn.Sequential()
        m.add_module("body", nn.Linear(4, 8))
        m.add_module(head, nn.Linear(8, 3))
        return m, m.compile(ft.optim.AdamW(m.parameters(), lr=0.01), nn.CrossEntropyLoss(), batch_size=2,
                            input_shape=(4,))
    old, trained_program = net("head")
    x, y = np.ones((2, 4), np.float32), np.array([0, 2])
    for _ in range(3):
        trained_program.train_step(x, y)
    path = str(tmp_path / "old.safetensors")
    ft.save(path, trained_program)
    new, program = net("cls")
    fresh = new.cls.weight.numpy().copy()
    with pytest.warns(UserWarning, match="the optimizer's state, of other parameters, is not restored"):
        ft.load(path, program, strict=False)
    assert new.body.weight.numpy().tobytes() == old.body.weight.numpy().tobytes()
    np.testing.assert_array_equal(new.cls.weight.numpy(), fresh)
    assert program.optimizer.state_dict()["state"] == {} and program.step_count == 0


@pytest.mark.parametrize("strict", [True, False])
def test_a_model_with_tied_weights_resumes_from_its_checkpoint(strict, tmp_path):
    """A checkpoint names a tied weight under each of its names, as state_dict does: loading it into the same
    model, strict or not, is a resume (optimizer state, step count, the next step), not a partial load."""
    def gpt():
        ft.manual_seed(37)
        m = nn.Sequential(nn.Embedding(11, 6), nn.Linear(6, 11, bias=False))
        m[1].weight = m[0].weight
        return m, m.compile(ft.optim.AdamW(m.parameters(), lr=0.01), lambda out, y: nn.functional.cross_entropy(
            out.transpose(1, 2), y), batch_size=2, input_shape=(3,), input_dtype=ft.int64, target_shape=(3,))
    model, program = gpt()
    ids = np.array([[1, 2, 3], [4, 5, 6]])
    program.train_step(ids, ids)
    path = str(tmp_path / "tied.safetensors")
    ft.save(path, program)
    again, again_program = gpt()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ft.load(path, again_program, strict=strict)
    assert again_program.step_count == 1 and again_program.optimizer.state_dict()["state"] != {}
    saved = model[0].weight.numpy().tobytes()
    assert again[0].weight.numpy().tobytes() == saved
    assert again_program.train_step(ids, ids) == program.train_step(ids, ids)
    assert again[0].weight.numpy().tobytes() == model[0].weight.numpy().tobytes()
    bare = nn.Sequential(nn.Embedding(11, 6), nn.Linear(6, 11, bias=False))
    bare[1].weight = bare[0].weight
    ft.load(path, bare, strict=strict)
    assert bare[1].weight is bare[0].weight and bare[1].weight.numpy().tobytes() == saved


def test_a_programs_checkpoint_loads_strictly_into_its_bare_model(tmp_path):
    """The optimizer's state tensors in the file are not tensors the model lacks."""
    model, program = trained(plain_net, 0)
    path = str(tmp_path / "run.safetensors")
    ft.save(path, program)
    bare = plain_net(1)
    ft.load(path, bare)
    assert state_bits(bare) == state_bits(model)


@pytest.mark.parametrize("mismatch", ["groups", "class"])
def test_failed_optimizer_load_changes_nothing(mismatch, tmp_path):
    src = plain_net(0)
    psrc = compile_plain(src, ft.optim.AdamW(src.parameters(), lr=0.01))
    train(psrc, 0, 1)
    path = str(tmp_path / "c.safetensors")
    ft.save(path, psrc)
    model = plain_net(1)
    params = list(model.parameters())
    if mismatch == "groups":
        opt = ft.optim.AdamW([{"params": params[:2]}, {"params": params[2:], "weight_decay": 0.0}], lr=0.01)
    else:
        opt = ft.optim.SGD(params, lr=0.1, momentum=0.9)
    program = compile_plain(model, opt)
    train(program, 0, 1)
    before = state_bits(model)
    with pytest.raises((ValueError, KeyError, TypeError)):  # the class mismatch gives KeyError('momentum') today
        ft.load(path, into=program)
    assert state_bits(model) == before


def _with_header(raw, edit):
    """The checkpoint raw with its safetensors header rewritten by edit(header dict)."""
    (n,) = struct.unpack("<Q", raw[:8])
    h = json.loads(raw[8:8 + n])
    edit(h)
    j = json.dumps(h).encode()
    j += b" " * (-len(j) % 8)
    return struct.pack("<Q", len(j)) + j + raw[8 + n:]


def _corruptions(raw):
    """(label, bytes) of damaged versions of a valid checkpoint."""
    (n,) = struct.unpack("<Q", raw[:8])
    out = [(f"truncated to {k} bytes", raw[:k]) for k in (0, 3, 8, 16, 8 + n // 2, 8 + n, 8 + n + 10, len(raw) - 1)]
    out.append(("header length beyond the file", struct.pack("<Q", len(raw)) + raw[8:]))
    out.append(("header length 2**63", struct.pack("<Q", 1 << 63) + raw[8:]))
    out.append(("garbage", bytes(range(256)) * 4))
    out.append(("header not JSON", raw[:8] + b"\xff" * n + raw[8 + n:]))
    out.append(("header a JSON list", raw[:8] + b"[1, 2]".ljust(n) + raw[8 + n:]))
    header = json.loads(raw[8:8 + n])

    def crafted(label, edit):
        out.append((label, _with_header(raw, edit)))

    crafted("a tensor beyond the data", lambda h: h["0.weight"].__setitem__(
        "data_offsets", [h["0.weight"]["data_offsets"][0], len(raw)]))
    crafted("negative offset", lambda h: h["0.weight"].__setitem__("data_offsets", [-4, 644]))
    crafted("overlapping tensors", lambda h: h["0.bias"].__setitem__("data_offsets", [0, 24]))
    crafted("unknown dtype", lambda h: h["0.weight"].__setitem__("dtype", "F99"))
    crafted("wrong dtype size", lambda h: h["0.weight"].__setitem__("dtype", "F16"))
    crafted("entry not a dict", lambda h: h.__setitem__("0.weight", [1, 2]))
    crafted("negative dimension", lambda h: h["0.weight"].__setitem__("shape", [-6, 3, 3, 3]))
    assert "0.weight" in header
    return out


def _crafted_bad_types(raw):
    out = []

    def crafted(label, edit):
        out.append((label, _with_header(raw, edit)))

    crafted("a string offset", lambda h: h["0.weight"].__setitem__("data_offsets", [0, "x"]))
    crafted("a dtype that is a list", lambda h: h["0.weight"].__setitem__("dtype", ["F32"]))
    crafted("a dimension of 10**30", lambda h: h["0.weight"].__setitem__("shape", [10 ** 30]))
    crafted("a shape of true", lambda h: h["0.bias"].__setitem__("shape", [True] * len(h["0.bias"]["shape"])))
    crafted("70 dimensions", lambda h: h["0.bias"].__setitem__("shape", h["0.bias"]["shape"] + [1] * 69))
    crafted("metadata not a dict", lambda h: h.__setitem__("__metadata__", [1]))
    return out


def _checkpoint(tmp_path):
    _, program = trained(plain_net, 0)
    path = str(tmp_path / "good.safetensors")
    ft.save(path, program)
    with open(path, "rb") as f:
        return f.read()


def test_corrupt_or_truncated_checkpoint_raises_value_error(tmp_path):
    raw = _checkpoint(tmp_path)
    model = plain_net(1)
    program = compile_plain(model, ft.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    train(program, 0, 1)
    before = state_bits(model)
    bad = str(tmp_path / "bad.safetensors")
    for label, data in _corruptions(raw):
        with open(bad, "wb") as f:
            f.write(data)
        with pytest.raises(ValueError):
            ft.load(bad, into=program)
            pytest.fail(f"{label}: loaded")
        with pytest.raises(ValueError):
            ft.load(bad)
        assert state_bits(model) == before, label
    # random damage to the header bytes: an exception (never a crash), and the model unchanged
    (n,) = struct.unpack("<Q", raw[:8])
    rng = np.random.default_rng(0)
    for _ in range(40):
        data = bytearray(raw)
        for pos in rng.integers(8, 8 + n, 3):
            data[pos] = int(rng.integers(0, 256))
        with open(bad, "wb") as f:
            f.write(bytes(data))
        try:
            ft.load(bad, into=program)
        except (ValueError, KeyError):
            assert state_bits(model) == before
        else:  # harmless damage (in padding, or a value that still fits): the checkpoint's weights were loaded
            before = state_bits(model)


def test_corrupt_header_types_raise_value_error(tmp_path):
    raw = _checkpoint(tmp_path)
    bad = str(tmp_path / "bad.safetensors")
    failures = []
    for label, data in _crafted_bad_types(raw):
        with open(bad, "wb") as f:
            f.write(data)
        try:
            ft.load(bad)
        except ValueError:
            continue
        except Exception as e:  # noqa: BLE001 - which exception is the point
            failures.append(f"{label}: {type(e).__name__}: {e}")
        else:
            failures.append(f"{label}: loaded")
    assert not failures, failures


def test_resume_with_loader_position(tmp_path):
    """ft.save/ft.load with a data loader in the middle of an epoch: the resumed run sees the same batches."""
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (40, 8, 8), dtype=np.uint8)
    labels = rng.integers(0, CLASSES, 40)

    def loader():
        return ft.data.Loader(ft.data.from_arrays(images, labels), 8, shuffle=True, seed=3, num_workers=1,
                              transforms=[ft.data.RandomHorizontalFlip(), ft.data.Normalize(0.5, 0.25)])

    def net(seed):
        ft.manual_seed(seed)
        return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(256, CLASSES))

    def comp(m):
        return m.compile(ft.optim.SGD(m.parameters(), lr=0.05, momentum=0.9), batch_size=8, input_shape=(1, 8, 8))

    a, la = net(0), loader()
    pa = comp(a)
    it = iter(la)
    for _ in range(2):
        pa.train_step(*next(it))
    path = str(tmp_path / "c.safetensors")
    ft.save(path, pa, loader=la)
    want = [pa.train_step(x, y) for x, y in it]  # the 3 batches left in the epoch
    want += [pa.train_step(x, y) for x, y in la]  # and the next epoch
    b, lb = net(1), loader()
    pb = comp(b)
    ft.load(path, into=pb, loader=lb)
    got = [pb.train_step(x, y) for x, y in lb]
    got += [pb.train_step(x, y) for x, y in lb]
    assert got == want
    assert state_bits(a) == state_bits(b)
    # A program fitted on a Loader and saved without it would resume at that Loader's first epoch: said.
    ft.fit(pb, lb, 1, progress=False)
    with pytest.warns(UserWarning, match="last trained by ft.fit on a Loader whose position this checkpoint does "
                                         "not keep.*pass loader= to ft.save and ft.load"):
        ft.save(path, pb)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ft.save(path, pb, loader=lb)


class _Halves(nn.Module):
    """A forward of two inputs: the two halves of the features."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.head = nn.Linear(2, 8), nn.Linear(4, 8), nn.Linear(8, 3)

    def forward(self, a, b):
        return self.head(ft.nn.functional.relu(self.a(a) + self.b(b)))


def test_a_loader_without_a_position_is_refused_before_anything_is_written(tmp_path):
    """loader= of a loader that keeps no position (a DataLoader of a Python dataset, torch's) is a TypeError that
    says to leave it out, and no file is written."""
    model = plain_net(0)
    program = compile_plain(model, ft.optim.SGD(model.parameters(), lr=0.1))
    batches = ft.utils.data.DataLoader(ft.utils.data.TensorDataset(*batch(8)), batch_size=4)
    path = tmp_path / "run.safetensors"
    with pytest.raises(TypeError, match="a DataLoader has none, so leave it out"):
        ft.save(str(path), program, loader=batches)
    assert not path.exists()


@pytest.mark.parametrize("inputs", [1, 2])
@pytest.mark.parametrize("stop", [None, 3])
def test_a_run_fitted_on_arrays_resumes_from_its_checkpoint(stop, inputs, tmp_path):
    """ft.fit(program, (X, y)) (or ((X1, X2), y) for a forward of two inputs) makes a Loader of the arrays;
    ft.save(program) keeps its position and ft.load gives it to the next fit on arrays: saved after an epoch (or a
    step callback's stop mid-epoch), loaded into a fresh program, the run ends as an uninterrupted fit(2)."""
    rng = np.random.default_rng(5)
    X, Y = rng.standard_normal((48, 6)).astype(np.float32), rng.integers(0, 3, 48)
    if inputs == 2:
        X = (X[:, :2].copy(), X[:, 2:].copy())

    def fresh():
        ft.manual_seed(11)
        model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3)) if inputs == 1 else _Halves()
        return model, model.compile(ft.optim.AdamW(model.parameters(), lr=0.01), batch_size=8,
                                    input_shape=(6,) if inputs == 1 else ((2,), (4,)))

    whole, program = fresh()
    ft.fit(program, (X, Y), 2, progress=False)
    first, program = fresh()
    callbacks = [lambda step, m: step == stop] if stop else []
    ft.fit(program, (X, Y), 1, step_callbacks=callbacks, progress=False)
    path = str(tmp_path / "arrays.safetensors")
    ft.save(path, program)
    resumed, program = fresh()
    ft.load(path, program)
    ft.fit(program, (X, Y), 2 if stop else 1, progress=False)  # the stopped epoch's rest, then the second
    assert program.step_count == 12 and state_bits(resumed) == state_bits(whole)


def test_fits_on_fresh_arrays_go_on_with_the_epochs_orders():
    """fit on a new copy of the arrays in every call (augmented afresh, Keras-style): each call shuffles in the next
    epoch's order, as fit on the same arrays does, not the first epoch's again."""
    rng = np.random.default_rng(6)
    X, Y = rng.standard_normal((48, 6)).astype(np.float32), rng.integers(0, 3, 48)
    runs = []
    for fresh in (False, True):
        ft.manual_seed(11)
        model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
        program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), batch_size=8, input_shape=(6,))
        history = [ft.fit(program, (X.copy() if fresh else X, Y), 1, progress=False)["epoch"] for _ in range(3)]
        runs.append((history, state_bits(model)))
    assert runs[0] == runs[1] and runs[0][0] == [[1], [2], [3]]


class TwoLayers(nn.Module):
    """The same parameter names declared in either order: their positions in parameters() differ."""

    def __init__(self, swapped):
        super().__init__()
        if swapped:
            self.fc2, self.fc1 = nn.Linear(4, 4), nn.Linear(4, 4)
        else:
            self.fc1, self.fc2 = nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, x):
        return self.fc2(self.fc1(x).relu())


def test_optimizer_state_follows_the_parameter_names(tmp_path):
    """A checkpoint of a model whose layers are declared in another order (fc2 before fc1) gives each layer its own
    AdamW moments: the resumed step is bitwise the uninterrupted one. By position (a state_dict's way) fc1 took
    fc2's moments without a word."""
    x, y = (np.random.default_rng(s).standard_normal((8, 4)).astype(np.float32) for s in (60, 61))

    def make(swapped):
        ft.manual_seed(62)
        model = TwoLayers(swapped)
        return model, model.compile(ft.optim.AdamW(model.parameters(), lr=0.05), nn.MSELoss(), batch_size=8,
                                    input_shape=(4,))

    (a, pa), (b, pb) = make(False), make(True)
    assert [n for n, _ in a.named_parameters()] != [n for n, _ in b.named_parameters()]
    b.load_state_dict(a.state_dict())
    for k in range(3):
        pa.train_step(x * (k + 1), y)
    ft.save(tmp_path / "a.safetensors", pa)
    ft.load(tmp_path / "a.safetensors", pb)
    pa.train_step(x, y)
    pb.train_step(x, y)
    want, got = a.state_dict(), b.state_dict()
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)


def test_a_failed_load_changes_nothing(tmp_path):
    """A load failing at its last tensor (read-only memory; a complex value of the right shape) puts back the
    tensors it had written: ft.load and load_state_dict change nothing on failure."""
    ft.manual_seed(63)
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    model[1].bias = nn.Parameter(ft.from_numpy(np.frombuffer(bytes(8), np.float32)))  # read-only memory
    before = model.state_dict()
    ft.save(tmp_path / "other.safetensors", nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2)))
    with pytest.raises(ValueError, match="read-only"):
        ft.load(tmp_path / "other.safetensors", model)
    for name, value in model.state_dict().items():
        np.testing.assert_array_equal(value, before[name], err_msg=name)
    model[1].bias = nn.Parameter(ft.zeros(2))
    before = model.state_dict()
    with pytest.raises(TypeError, match="complex"):
        model.load_state_dict({**{k: np.full_like(v, 7) for k, v in before.items()},
                               "1.bias": np.zeros(2, np.complex64)})
    for name, value in model.state_dict().items():
        np.testing.assert_array_equal(value, before[name], err_msg=name)


def test_a_bfloat16_model_saves_and_loads(tmp_path):
    """model.bfloat16() (whose state_dict NumPy cannot hold) saves its tensors as bfloat16 and loads them back
    exactly, into a bfloat16 model or widened into a float32 one."""
    ft.manual_seed(64)
    model = nn.Sequential(nn.Linear(3, 2), nn.BatchNorm1d(2)).bfloat16()
    ft.save(tmp_path / "b.safetensors", model)
    raw = (tmp_path / "b.safetensors").read_bytes()
    header = json.loads(raw[8:8 + struct.unpack("<Q", raw[:8])[0]])
    assert header["0.weight"]["dtype"] == "BF16" and header["1.num_batches_tracked"]["dtype"] == "I64"
    again = nn.Sequential(nn.Linear(3, 2), nn.BatchNorm1d(2)).bfloat16()
    wide = nn.Sequential(nn.Linear(3, 2), nn.BatchNorm1d(2))
    for into in (again, wide):
        ft.load(tmp_path / "b.safetensors", into)
        for (name, t), (_, want) in zip(into._state().items(), model._state().items()):
            np.testing.assert_array_equal(t.float().numpy(), want.float().numpy(), err_msg=name)


class TiedLM(nn.Module):
    """An embedding and a head sharing one weight, declared in either order: the weight's first name differs."""

    def __init__(self, head_first):
        super().__init__()
        if head_first:
            self.head, self.emb = nn.Linear(4, 6, bias=False), nn.Embedding(6, 4)
        else:
            self.emb, self.head = nn.Embedding(6, 4), nn.Linear(4, 6, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, ids):
        return self.head(self.emb(ids).mean(1))


def test_optimizer_state_of_a_tied_weight_named_otherwise_loads_by_position(tmp_path):
    """When the names differ as sets (a tied weight first named 'head.weight' here, 'emb.weight' there), the state
    loads by position, as a state_dict does, instead of being refused."""
    ids, y = np.random.default_rng(65).integers(0, 6, (4, 3)), np.array([0, 1, 2, 3])

    def make(head_first):
        ft.manual_seed(66)
        model = TiedLM(head_first)
        return model, model.compile(ft.optim.AdamW(model.parameters(), lr=0.05), batch_size=4, input_shape=(3,),
                                    input_dtype=ft.int64)

    (a, pa), (b, pb) = make(False), make(True)
    pa.train_step(ids, y)
    ft.save(tmp_path / "tied.safetensors", pa)
    ft.load(tmp_path / "tied.safetensors", pb)
    pa.train_step(ids, y)
    pb.train_step(ids, y)
    np.testing.assert_array_equal(b.emb.weight.numpy(), a.emb.weight.numpy())
