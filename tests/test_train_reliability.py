"""Issue 11, the training side: exports that outlive model.compile(), checkpoint validation, resuming through
ft.fit, schedules in the C epoch, tensor comparisons, output shapes and the thread-count promise."""
import gc
import warnings

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


# ---------------------------------------------------------------- checkpoints (7, 8, 11, 17, 22)

def _saved(tmp_path, **kw):
    model = small_net()
    program = compile_small(model, ft.optim.AdamW(model.parameters(), lr=1e-3))
    x, y = np.ones((4, 1, 6, 6), np.float32), np.arange(4) % CLASSES
    program.train_step(x, y)
    path = str(tmp_path / "c.safetensors")
    ft.save(path, program, **kw)
    return path, program


def _rewrite(path, edit_header=None, header_len_delta=0):
    import json
    import struct
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header, body = raw[8:8 + n], raw[8 + n:]
    if edit_header is not None:
        h = json.loads(header)
        edit_header(h)
        header = json.dumps(h).encode()
        header += b" " * (-len(header) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header) + header_len_delta) + header + body)


def test_header_length_one_byte_short_is_refused(tmp_path):
    path, _ = _saved(tmp_path)
    _rewrite(path, header_len_delta=-1)  # still valid JSON: the header ends in padding
    with pytest.raises(ValueError, match="data"):
        ft.load(path)


def test_a_gap_between_tensors_is_refused(tmp_path):
    path, _ = _saved(tmp_path)

    def shrink(h):
        name = next(k for k in h if k != "__metadata__" and h[k]["shape"] == [CLASSES])
        h[name]["shape"] = [CLASSES - 1]
        h[name]["data_offsets"][1] -= 4
    _rewrite(path, shrink)
    with pytest.raises(ValueError, match="belong to no tensor"):
        ft.load(path)


@pytest.mark.parametrize("change", ["delete", "rename"])
def test_lost_optimizer_state_tensor_is_refused(tmp_path, change):
    path, program = _saved(tmp_path)

    def edit(h):
        # moving the last tensor keeps the data contiguous; its bytes go to the tensor before it
        names = sorted((k for k in h if k != "__metadata__"), key=lambda k: h[k]["data_offsets"])
        assert names[-1].startswith("optimizer.state.")
        if change == "rename":
            h[names[-1].replace("optimizer.state.", "optimizer.state.9")] = h.pop(names[-1])
        else:
            h[names[-2]]["shape"] = [(h[names[-1]]["data_offsets"][1] - h[names[-2]]["data_offsets"][0]) // 4]
            h[names[-2]]["data_offsets"][1] = h.pop(names[-1])["data_offsets"][1]
    _rewrite(path, edit)
    model = small_net(5)
    other = compile_small(model, ft.optim.AdamW(model.parameters(), lr=1e-3))
    with pytest.raises(ValueError, match="optimizer"):
        ft.load(path, other)


def test_deeply_nested_header_is_a_value_error(tmp_path):
    import struct
    path = str(tmp_path / "deep.safetensors")
    header = b"[" * 100000 + b"]" * 100000
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header)
    with pytest.raises(ValueError, match="corrupt safetensors header"):
        ft.load(path)


def test_stale_temporaries_of_the_target_are_cleaned(tmp_path):
    import fcntl
    import os
    target = tmp_path / "c.safetensors"
    stale = tmp_path / ".tmp-c.safetensors-dead1.safetensors"
    stale.write_bytes(b"half a checkpoint")
    live = tmp_path / ".tmp-c.safetensors-live1.safetensors"  # a save in progress elsewhere holds its lock
    live.write_bytes(b"being written")
    other = tmp_path / ".tmp-d.safetensors-dead2.safetensors"  # another target's: not ours to judge
    other.write_bytes(b"x")
    fd = os.open(live, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        ft.save(str(target), small_net())
    finally:
        os.close(fd)
    assert not stale.exists() and live.exists() and other.exists() and target.exists()
    assert sorted(os.listdir(tmp_path)) == sorted([target.name, live.name, other.name])


def _state_bits(model):
    return {k: np.ascontiguousarray(v).tobytes() for k, v in model.state_dict().items()}


def _groups(edit):
    import json
    return lambda text: json.dumps([edit(g) or g for g in json.loads(text)])


@pytest.mark.parametrize("key,value,match", [
    ("rng", '[0, "x"]', "rng"), ("rng", "[1]", "rng"), ("program.step", '"x"', "program.step"),
    ("program.dropout", "[1, -2]", "program.dropout"), ("loader", '{"epoch": "a", "batch": 0}', "loader"),
    ("loader", '{"epoch": 18446744073709551621, "batch": 0}', "loader"),
    ("scheduler", '{"unrelated": 1}', "scheduler"),
    ("optimizer.param_groups", _groups(lambda g: g.pop("weight_decay")), "group 0 of the state_dict has no "
                                                                        "'weight_decay'"),
    ("optimizer.param_groups", _groups(lambda g: g.__setitem__("nesterov", "yes")), "nesterov must be a bool")])
def test_load_checks_all_metadata_before_changing_anything(tmp_path, key, value, match):
    """Tampered metadata (tampered by hand or a bug) is a ValueError or TypeError naming it, before anything
    changes (a missing hyperparameter was a KeyError, an infinite step or a huge epoch an OverflowError, "yes" a
    flag that is set)."""
    images = np.zeros((8, 6, 6), np.uint8)
    loader = ft.data.Loader(ft.data.from_arrays(images, np.zeros(8, np.int64)), 4, num_workers=1)
    model = small_net()
    program = compile_small(model)
    sched = ft.optim.lr_scheduler.StepLR(program.optimizer, 2)
    path = str(tmp_path / "c.safetensors")
    ft.save(path, program, scheduler=sched, loader=loader)
    _rewrite(path, lambda h: h["__metadata__"].__setitem__(key, value(h["__metadata__"][key]) if callable(value)
                                                            else value))
    fresh = small_net(3)
    target = compile_small(fresh)
    target_sched = ft.optim.lr_scheduler.StepLR(target.optimizer, 2)
    before = _state_bits(fresh)
    ft.manual_seed(77)
    rng_before = ft.random.default_generator.get_state().numpy().tobytes()
    sched_before = target_sched.state_dict()
    with pytest.raises((ValueError, TypeError), match=match):
        ft.load(path, target, scheduler=target_sched, loader=loader, restore_rng=True)
    assert _state_bits(fresh) == before
    assert ft.random.default_generator.get_state().numpy().tobytes() == rng_before
    assert target_sched.state_dict() == sched_before and target.step_count == 0


def test_loading_weights_keeps_the_global_rng(tmp_path):
    path, program = _saved(tmp_path)
    fresh = small_net(1)
    ft.seed_everything(123)
    want = ft.rand(4).numpy().copy()
    ft.seed_everything(123)
    ft.load(path, fresh)  # weights only: for inference or fine-tuning
    assert np.array_equal(ft.rand(4).numpy(), want)
    ft.manual_seed(5)
    ft.load(path, fresh, restore_rng=True)
    assert ft.random.default_generator.initial_seed() == 0  # the seed small_net() set before the save


def test_metadata_types_round_trip(tmp_path):
    path, program = _saved(tmp_path, epoch=3, step=17, metadata={"note": "hi", "best": 0.5, "tags": ["a", 1],
                                                                 "digits": "42"})
    _, meta = ft.load(path)
    assert meta["epoch"] == 3 and meta["step"] == 17 and meta["best"] == 0.5 and meta["tags"] == ["a", 1]
    assert meta["note"] == "hi" and meta["digits"] == "42"
    assert ft.load(path, small_net())["epoch"] == 3
    with pytest.raises(TypeError, match="when"):
        ft.save(path, program, metadata={"when": object()})
    with pytest.raises(ValueError, match="epoch given both as an argument and in metadata"):
        ft.save(path, program, epoch=5, metadata={"epoch": 3})
    ft.save(path, program, epoch=np.int64(4), metadata={"acc": np.float32(0.5), "ok": np.bool_(True)})
    _, meta = ft.load(path)  # NumPy scalars (an epoch counter, an accuracy) as the numbers they are
    assert meta["epoch"] == 4 and meta["acc"] == 0.5 and meta["ok"] is True


@pytest.mark.parametrize("key", ["scheduler", "loader", "rng", "format", "program.step", "optimizer.param_groups",
                                 "optimizer.anything", "fasttrain.json_keys"])
def test_metadata_keys_that_load_reads_are_refused(tmp_path, key):
    """A user's 'scheduler' or 'loader' (a name, say) saved with no scheduler or loader given was read back by
    ft.load as their state: it refused its own file. Every key ft.load reads is refused by ft.save."""
    path, program = _saved(tmp_path)
    with pytest.raises(ValueError, match=f"metadata key '{key}' is one fasttrain uses itself"):
        ft.save(path, program, metadata={key: "cosine"})


# ---------------------------------------------------------------- ft.fit: epochs, resume, schedules (12, 13, 22)

def _images(n=24, seed=0):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (n, 6, 6), dtype=np.uint8), rng.integers(0, CLASSES, n)


def _loader(n=24):
    images, labels = _images(n)
    return ft.data.Loader(ft.data.from_arrays(images, labels), 4, shuffle=True, seed=3, num_workers=1,
                          transforms=[ft.data.RandomHorizontalFlip(), ft.data.Normalize(0.5, 0.25)])


def _run(make_opt, sched=None):
    model = small_net()
    program = compile_small(model, make_opt(model.parameters()))
    return model, program, (sched(program.optimizer) if sched else None)


def test_fit_twice_equals_fit_two_epochs_and_resume_equals_both(tmp_path):
    def opt(ps):
        return ft.optim.SGD(ps, lr=0.05, momentum=0.9)

    def sched(o):
        return ft.optim.lr_scheduler.StepLR(o, 5, gamma=0.5)

    a, pa, sa = _run(opt, sched)
    la = _loader()
    history = ft.fit(pa, la, 2, scheduler=sa, progress=False)
    assert history["epoch"] == [1, 2]
    b, pb, sb = _run(opt, sched)
    lb = _loader()
    seen = []
    ft.fit(pb, lb, 1, scheduler=sb, progress=False, callbacks=[lambda e, m: seen.append((e, m["epoch"]))])
    path = str(tmp_path / "c.safetensors")
    ft.save(path, pb, scheduler=sb, loader=lb)
    ft.fit(pb, lb, 1, scheduler=sb, progress=False, callbacks=[lambda e, m: seen.append((e, m["epoch"]))])
    assert seen == [(1, 1), (2, 2)]  # the callback's epoch is metrics["epoch"]
    assert _state_bits(b) == _state_bits(a)
    c, pc, sc = _run(opt, sched)
    ft.manual_seed(99)
    lc = _loader()
    ft.load(path, pc, scheduler=sc, loader=lc)
    assert ft.fit(pc, lc, 1, scheduler=sc, progress=False)["epoch"] == [2]
    assert _state_bits(c) == _state_bits(a)


def test_resume_mid_epoch_through_fit_equals_an_uninterrupted_run(tmp_path):
    def opt(ps):
        return ft.optim.SGD(ps, lr=0.05, momentum=0.9)

    a, pa, _ = _run(opt)
    la = _loader()
    it = iter(la)
    for _ in range(2):
        pa.train_step(*next(it))
    path = str(tmp_path / "c.safetensors")
    ft.save(path, pa, loader=la)
    for x, y in it:  # the rest of epoch 0
        pa.train_step(x, y)
    for x, y in la:  # epoch 1
        pa.train_step(x, y)
    b, pb, _ = _run(opt)
    lb = _loader()
    ft.load(path, pb, loader=lb)
    assert ft.fit(pb, lb, 2, progress=False)["epoch"] == [1, 2]
    assert _state_bits(b) == _state_bits(a)


@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_fit_schedules_one_cycle_momentum_per_step_as_the_manual_loop(optimizer):
    def opt(ps):
        return ft.optim.SGD(ps, lr=0.05, momentum=0.9) if optimizer == "sgd" else ft.optim.AdamW(ps, lr=1e-3)

    def sched(o):
        return ft.optim.lr_scheduler.OneCycleLR(o, max_lr=0.1, total_steps=12, cycle_momentum=True)

    a, pa, sa = _run(opt, sched)
    la = _loader()
    for _ in range(2):
        for x, y in la:
            pa.train_step(x, y)
            sa.step()
    b, pb, sb = _run(opt, sched)
    ft.fit(pb, _loader(), 2, scheduler=sb, progress=False)
    assert _state_bits(b) == _state_bits(a)
    assert pb.optimizer.param_groups[0]["lr"] == pa.optimizer.param_groups[0]["lr"]


# ---------------------------------------------------------------- 20. output_shape

def test_output_shape_of_composite_modules():
    m = nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(16, CLASSES))
    assert m.output_shape((1, 6, 6)) == (CLASSES,)
    assert nn.Sequential(nn.Conv2d(1, 4, 3, stride=2)).output_shape((1, 7, 7)) == (4, 3, 3)

    class Head(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(6, 2)

        def forward(self, x):
            return self.fc(x).relu()

    assert Head().output_shape((4, 6)) == (4, 2)
    x = nn.Input((1, 6, 6))
    assert nn.Model(x, nn.Flatten()(nn.Conv2d(1, 2, 3)(x))).output_shape((1, 6, 6)) == (32,)
    assert nn.MultiheadAttention(8, 2, batch_first=True).output_shape((5, 8), (5, 8), (5, 8)) == ((5, 8), None)
    assert nn.ReLU().output_shape((3, 4)) == (3, 4)
    with pytest.raises(ValueError):
        m.output_shape((2, 6, 6))


# ---------------------------------------------------------------- 19. comparisons

def test_tensor_comparisons_are_elementwise():
    a, b = ft.tensor([1.0, 2.0]), ft.tensor([1.0, 3.0])
    assert (a == ft.tensor([1.0, 2.0])).tolist() == [True, True]
    assert (a == b).tolist() == [True, False] and (a != b).tolist() == [False, True]
    assert (a > 1).tolist() == [False, True] and (a >= 2).tolist() == [False, True]
    assert (a < b).tolist() == [False, True] and (a <= np.array([0.0, 2.0])).tolist() == [False, True]
    assert (2 < a).tolist() == [False, False] and (a == [1, 5]).tolist() == [True, False]
    assert (a == b).dtype is ft.bool
    with pytest.raises(ValueError):
        bool(a == b)  # an ambiguous truth value, never a silent identity test
    assert bool(ft.tensor(3) == 3)
    assert {a: 1}[a] == 1  # hashing stays by identity


def test_a_multistep_schedulers_milestones_come_back_from_a_checkpoint(tmp_path):
    """MultiStepLR's milestones, a Counter of steps whose keys JSON writes as strings, load as the Counter."""
    program = compile_small(small_net())
    sched = ft.optim.lr_scheduler.MultiStepLR(program.optimizer, milestones=[1, 3, 3], gamma=0.5)
    sched.step()
    path = str(tmp_path / "m.safetensors")
    ft.save(path, program, scheduler=sched)
    target = compile_small(small_net(3))
    restored = ft.optim.lr_scheduler.MultiStepLR(target.optimizer, milestones=[7], gamma=0.5)
    ft.load(path, target, scheduler=restored)
    assert restored.state_dict() == sched.state_dict() and restored.milestones == {1: 1, 3: 2}
    for _ in range(3):
        sched.step(), restored.step()
    assert restored.get_last_lr() == sched.get_last_lr()


@pytest.mark.parametrize("key,value", [("last_epoch", "abc"), ("gamma", "abc"), ("base_lrs", [0.1, 0.2]),
                                        ("_last_lr", 0.1)])
def test_a_scheduler_state_of_the_wrong_kinds_is_refused_at_load(tmp_path, key, value):
    """Checked when loading (the values' kinds against the scheduler's own), not found out in the next fit."""
    import json
    program = compile_small(small_net())
    path = str(tmp_path / "c.safetensors")
    ft.save(path, program, scheduler=ft.optim.lr_scheduler.StepLR(program.optimizer, 2))

    def corrupt(header):
        state = json.loads(header["__metadata__"]["scheduler"])
        state[key] = value
        header["__metadata__"]["scheduler"] = json.dumps(state)
    _rewrite(path, corrupt)
    target = compile_small(small_net(3))
    sched = ft.optim.lr_scheduler.StepLR(target.optimizer, 2)
    before, sched_before = _state_bits(target.model), sched.state_dict()
    with pytest.raises(ValueError, match=f"corrupt scheduler state: '{key}'"):
        ft.load(path, target, scheduler=sched)
    assert _state_bits(target.model) == before and sched.state_dict() == sched_before
    with pytest.warns(UserWarning, match="scheduler's state that this load does not restore"):
        ft.load(path, target)  # without the scheduler, the rest loads


def test_a_torch_save_file_is_named_as_such(tmp_path):
    """torch.save writes a zip archive (or, legacy, a pickle): said as such, where a safetensors reader would see a
    nonsense header length."""
    import pickle
    import zipfile
    with zipfile.ZipFile(tmp_path / "m.pt", "w") as z:
        z.writestr("archive/data.pkl", pickle.dumps({"w": [1.0, 2.0]}))
    (tmp_path / "legacy.pt").write_bytes(pickle.dumps({"w": [1.0, 2.0]}, protocol=2))
    for name, kind in (("m.pt", "a zip archive"), ("legacy.pt", "a Python pickle")):
        with pytest.raises(ValueError, match=f"{kind} .torch.save's format.., not a safetensors file"):
            ft.load(tmp_path / name)
    model = small_net()
    before = _state_bits(model)
    with pytest.raises(ValueError, match="not a safetensors file"):
        ft.load(tmp_path / "m.pt", model)
    assert _state_bits(model) == before


def test_a_state_that_does_not_fit_names_the_checkpoint(tmp_path):
    x, y = np.zeros((16, 6, 6), np.uint8), np.zeros(16, np.int64)
    program = compile_small(small_net())
    path = str(tmp_path / "c.safetensors")
    ft.save(path, program, loader=ft.data.Loader(ft.data.from_arrays(x, y), 4, seed=7))
    other = ft.data.Loader(ft.data.from_arrays(x, y), 4, seed=0)
    with pytest.raises(ValueError, match=r"c\.safetensors: the state is for seed=7 but this loader has seed=0"):
        ft.load(path, program, loader=other)


def test_resuming_without_the_saved_scheduler_warns(tmp_path):
    """A checkpoint's scheduler state left behind would restart the schedule: said, rather than silent."""
    model = small_net()
    program = compile_small(model)
    sched = ft.optim.lr_scheduler.StepLR(program.optimizer, 2)
    sched.step()
    path = str(tmp_path / "s.safetensors")
    ft.save(path, program, scheduler=sched)
    target = compile_small(small_net(3))
    with pytest.warns(UserWarning, match="scheduler's state that this load does not restore.* pass scheduler="):
        ft.load(path, target)
    again = ft.optim.lr_scheduler.StepLR(target.optimizer, 2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ft.load(path, target, scheduler=again)
        ft.load(path, small_net(4))  # weights alone: no optimizer state resumed, nothing to warn about
    assert again.last_epoch == 1
