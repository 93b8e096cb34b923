"""The Loader's public iteration state: errors mid-epoch, evaluate over a loader already iterated, the default
seed, and close() from another thread while an epoch runs in C."""
import threading

import numpy as np
import pytest

import fasttrain as ft

D = ft.data
nn = ft.nn


def bad_record_file(path, n=6, bad=2):
    """n raw 4x4 records labelled 0..n-1; record `bad`'s payload is damaged (its CRC fails)."""
    D.write_records(path, (np.arange(n * 16, dtype=np.uint8).reshape(n, 4, 4), np.arange(n)))
    data = bytearray(path.read_bytes())
    data[64 + bad * 56 + 40] ^= 0x55
    path.write_bytes(bytes(data))
    return path


@pytest.mark.parametrize("workers", [0, 2])
def test_raise_then_the_iterator_continues_with_the_next_batch(tmp_path, workers):
    loader = D.Loader(bad_record_file(tmp_path / "b.rec"), batch_size=1, num_workers=workers)
    it = iter(loader)
    got = [int(next(it)[1][0]), int(next(it)[1][0])]
    with pytest.raises(ValueError, match=r"b\.rec#2"):
        next(it)
    got += [int(y[0]) for _, y in it]
    assert got == [0, 1, 3, 4, 5] and loader.epoch == 1
    # A new `for` loop after the error goes on from the next batch too, not from batch 0.
    seen = []
    with pytest.raises(ValueError, match=r"b\.rec#2"):
        for _, y in loader:
            seen.append(int(y[0]))
    assert seen == [0, 1]
    assert [int(y[0]) for _, y in loader] == [3, 4, 5] and loader.epoch == 2
    it = iter(loader)  # the next epoch starts from its first batch
    assert [int(next(it)[1][0]), int(next(it)[1][0])] == [0, 1]


def test_loader_seed_follows_the_global_seed():
    images, labels = np.zeros((64, 2, 2), np.uint8), np.arange(64)

    def order(**kw):
        return np.concatenate([y.numpy() for _, y in D.Loader((images, labels), batch_size=16, shuffle=True,
                                                               num_workers=1, **kw)])

    ft.seed_everything(1)
    a = order()
    ft.seed_everything(2)
    b = order()
    ft.manual_seed(1)
    assert np.array_equal(order(), a) and not np.array_equal(a, b)
    assert D.Loader((images, labels)).seed == 1
    ft.seed_everything(2)
    assert np.array_equal(order(seed=7), order(seed=7)) and D.Loader((images, labels), seed=7).seed == 7
    # a seed is an int in [-2**63, 2**64), as ft.manual_seed's: 1.5 or "1" would collide with seed=1
    assert D.Loader((images, labels), seed=-1).seed == 2 ** 64 - 1
    for bad, error in ((1.5, TypeError), (True, TypeError), ("1", TypeError), (np.float32(1.2), TypeError),
                       (2 ** 64 + 1, ValueError), (-2 ** 64 + 1, ValueError)):
        with pytest.raises(error, match="seed"):
            D.Loader((images, labels), seed=bad)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_batch_whose_samples_are_all_skipped_is_not_handed_out(tmp_path, workers):
    """on_error="skip": a batch of bad samples only is passed over (it came out empty, and fit stopped at it:
    "the batch is empty"); the epoch's other batches come, and fit trains on them."""
    path = bad_record_file(tmp_path / "b.rec", n=4, bad=2)
    loader = D.Loader(path, batch_size=1, num_workers=workers, on_error="skip")
    assert [int(y[0]) for _, y in loader] == [0, 1, 3]
    assert loader.stats()["skipped"] == 1
    program = small_program()
    history = ft.fit(program, loader, 2, progress=False)
    assert program.step_count == 2 * 3 and history["epoch"] == [2, 3]


def small_program():
    ft.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(16, 4))
    return model.compile(ft.optim.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss(), batch_size=4,
                         input_shape=(1, 4, 4))


@pytest.mark.parametrize("workers", [0, 2])
def test_a_loop_over_a_loader_goes_on_after_evaluate_on_it(workers):
    """ft.evaluate on the loader a hand-written loop is going over (the training split's metrics mid-epoch): the
    loop goes on with the batches it would have had (it raised, ended by evaluate's pass)."""
    rng = np.random.default_rng(1)
    images, labels = rng.integers(0, 256, (28, 4, 4), np.uint8), rng.integers(0, 4, 28)
    program = small_program()
    train = D.Loader((images, labels), batch_size=4, shuffle=True, seed=3, num_workers=workers)
    want = [y.numpy().copy() for _, y in train]
    train.set_epoch(0)
    got = []
    for i, (_, y) in enumerate(train):
        got.append(y.numpy().copy())
        if i == 2:
            ft.evaluate(program, train)
    assert len(got) == len(want) and all(np.array_equal(a, b) for a, b in zip(got, want))


def test_evaluate_covers_the_whole_split_after_partial_iteration():
    rng = np.random.default_rng(0)
    images, labels = rng.integers(0, 256, (20, 4, 4), np.uint8), rng.integers(0, 4, 20)
    program = small_program()
    val = D.Loader((images, labels), batch_size=4, num_workers=1)
    whole = ft.evaluate(program, val)
    next(iter(val))
    assert ft.evaluate(program, val) == whole
    it = iter(val)
    next(it), next(it), next(it)
    assert ft.evaluate(program, val) == whole
    val.load_state_dict({"epoch": 0, "batch": 3})
    assert ft.evaluate(program, val) == whole
    # a restored position outlives the evaluation (as a stopped fit's does): the pass resumes at batch 3, and
    # whole epochs follow
    assert sum(len(y) for _, y in val) == 8
    assert sum(len(y) for _, y in val) == 20


def close_once_running(loader, errors):
    """Closes `loader` from this thread once an epoch runs in another: the loader says it is in use, or (without
    a guard) its counters move."""
    try:
        while True:
            try:
                if loader.stats()["batches"] >= 3:
                    break
            except RuntimeError:  # in use by the epoch
                break
        loader.close()
    except BaseException as e:  # surfaced by the test, not lost in the thread
        errors.append(e)


def long_loader():
    images, labels = np.zeros((200_000, 4, 4), np.uint8), np.zeros(200_000, np.int64)
    return D.Loader((images, labels), batch_size=4, num_workers=1)


@pytest.mark.parametrize("run", ["fit", "evaluate"])
def test_close_from_another_thread_stops_the_epoch_in_c(run):
    program, loader, errors = small_program(), long_loader(), []
    closer = threading.Thread(target=close_once_running, args=(loader, errors))
    closer.start()
    with pytest.raises(RuntimeError, match="the loader was closed during the epoch"):
        if run == "fit":
            ft.fit(program, loader, 1, progress=False)
        else:
            ft.evaluate(program, loader)
    closer.join()
    assert not errors and loader.closed
    with pytest.raises(ValueError, match="closed"):
        ft.evaluate(program, loader)


def test_close_from_the_progress_callback_ends_the_epoch():
    program, loader, seen = small_program(), long_loader(), []

    def progress(steps, loss, samples):
        seen.append(steps)
        loader.close()  # the epoch still runs below this call: the loader goes when it ends

    loader.set_epoch(0)
    with pytest.raises(RuntimeError, match="the loader was closed during the epoch"):
        program._c.fit_epoch(loader, program.optimizer, None, progress, 0.0)
    assert seen == [1] and loader.closed


def test_close_from_another_thread_while_iterating():
    loader, errors, stopped = long_loader(), [], []

    def iterate():
        try:
            for _ in loader:
                pass
        except (RuntimeError, ValueError) as e:
            stopped.append(e)

    reader = threading.Thread(target=iterate)
    reader.start()
    close_once_running(loader, errors)
    reader.join()
    assert not errors and loader.closed
    assert len(stopped) == 1 and "closed" in str(stopped[0])


def test_a_new_pass_ends_the_one_under_way():
    """A Loader has one position in C: a new pass takes it over and the old iterator raises when used again,
    where a nested loop used to restart its outer loop forever and two live iterators took every other batch;
    peeking with an iterator kept in a variable and then looping is fine."""
    x, y = np.zeros((64, 5), np.float32), np.arange(64)
    for workers in (0, 2):
        loader = ft.data.Loader((x, y), 16, num_workers=workers)
        with pytest.raises(RuntimeError, match="ended by a newer one"):
            for _ in loader:
                for _ in loader:
                    pass
        first = iter(loader)
        assert int(next(first)[1][0]) == 0
        assert [int(b[0]) for _, b in loader] == [0, 16, 32, 48]  # a whole pass of its own
        with pytest.raises(RuntimeError, match="ended by a newer one"):
            next(first)
        second = iter(loader)
        loader.set_epoch(1)
        with pytest.raises(RuntimeError, match="ended by a newer one"):
            next(second)
        assert sum(len(b) for _, b in loader) == 64


def test_the_state_after_a_loop_left_early_is_where_the_next_pass_starts():
    """A loop left with break drops its pass: the next `for` starts the epoch over, and state_dict() says so (it
    said the batch the dropped pass stood at, so a checkpoint taken then skipped those batches); while a pass is
    under way it says that pass's batch."""
    x, y = np.zeros((28, 2), np.float32), np.arange(28)
    loader = D.Loader((x, y), 4, shuffle=True, seed=5, num_workers=1)
    for i, _ in enumerate(loader):
        if i == 2:
            assert loader.state_dict()["batch"] == 3
            break
    assert (loader.state_dict()["epoch"], loader.state_dict()["batch"]) == (0, 0)
    resumed = D.Loader((x, y), 4, shuffle=True, seed=5, num_workers=1)
    resumed.load_state_dict(loader.state_dict())
    assert [b.tolist() for _, b in resumed] == [b.tolist() for _, b in loader]
    assert loader.epoch == resumed.epoch == 1


def test_a_state_taken_at_an_epochs_last_batch_resumes_with_the_next_epoch():
    """A hand-written loop that saves state_dict() at each epoch's last batch and resumes with
    `for epoch in range(loader.epoch, total): for batch in loader` sees every batch of the uninterrupted run (the
    first pass after the restore was the empty rest of the finished epoch, so an epoch was lost)."""
    x, y = np.zeros((12, 2), np.float32), np.arange(12)
    loader = D.Loader((x, y), 4, shuffle=True, seed=6)
    want = [b.tolist() for _ in range(3) for _, b in loader]
    run = D.Loader((x, y), 4, shuffle=True, seed=6)
    for i, (_, b) in enumerate(run):
        if i == 2:
            state = run.state_dict()
    assert (state["epoch"], state["batch"]) == (0, 3)
    resumed = D.Loader((x, y), 4, shuffle=True, seed=6)
    resumed.load_state_dict(state)
    assert resumed.epoch == 1
    got = [b.tolist() for _ in range(resumed.epoch, 3) for _, b in resumed]
    assert got == want[3:]


def test_a_states_tally_is_checked_and_kept():
    """state_dict's tally (the training metrics of the epoch so far, which fit puts there) comes back from
    load_state_dict; one that is no tally is refused before anything moves."""
    x, y = np.zeros((28, 2), np.float32), np.arange(28)
    loader = D.Loader((x, y), 4, num_workers=0)
    state = dict(loader.state_dict(), batch=3, tally=[2.5, 12.0, 7, 12])
    loader.load_state_dict(state)
    assert loader.state_dict()["tally"] == [2.5, 12.0, 7, 12] and loader.state_dict()["batch"] == 3
    for bad in ([1.0, -1.0, 0, 0], [1.0, 2.0, 0.5, 1], [float("nan"), 1.0, 0, 0], [1.0, 2.0, 0], "1,2,0,0",
                [True, 1.0, 0, 0]):
        with pytest.raises(ValueError, match="tally must be"):
            loader.load_state_dict(dict(state, batch=5, tally=bad))
        assert loader.state_dict()["batch"] == 3


def test_fit_on_a_loader_without_batches_warns_and_trains_nothing():
    """10 samples in batches of 16 with drop_last: no batch, so fit says so instead of epochs of NaN losses (and
    the loader's epoch does not move)."""
    x, y = np.zeros((10, 4), np.float32), np.zeros(10, np.int64)
    model = ft.nn.Linear(4, 2)
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), ft.nn.CrossEntropyLoss(), batch_size=16,
                            input_shape=(4,))
    for loader in (D.Loader((x, y), 16, drop_last=True, num_workers=1), []):
        with pytest.warns(UserWarning, match="the loader has no batches"):
            history = ft.fit(program, loader, 2, progress=False)
        assert history["epoch"] == [] and program.step_count == 0
        assert getattr(loader, "epoch", 0) == 0


def test_batch_sizes_must_be_whole_numbers():
    x, y = np.zeros((20, 4), np.float32), np.zeros(20, np.int64)
    for bad in (8.7, True, "8"):
        with pytest.raises(TypeError, match="batch_size must be an int"):
            ft.data.Loader((x, y), bad)
    assert ft.data.Loader((x, y), np.int64(4)).batch_size == 4
    model = ft.nn.Linear(4, 2)
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), ft.nn.CrossEntropyLoss(), batch_size=4,
                            input_shape=(4,))
    for bad in (0, -1, 2.5):
        with pytest.raises(ValueError, match="batch_size must be a positive int"):
            ft.fit(program, (x, y), 1, batch_size=bad, progress=False)
    with pytest.raises(TypeError, match=r"give \(x, y\) arrays as a tuple"):
        ft.fit(program, [x, y], 1, progress=False)
    with pytest.raises(TypeError, match="the targets are None, but the program's loss reads targets"):
        ft.fit(program, (x, None), 1, progress=False)
    assert program.step_count == 0
    for name, bad in (("num_workers", 2.5), ("prefetch", 1.5), ("rank", 1.7), ("world_size", 2.0)):
        with pytest.raises(TypeError, match=f"Loader: {name} must be an int, got {bad!r}"):
            ft.data.Loader((x, y), 4, **{name: bad})
    loader = ft.data.Loader((x, y), 4, num_workers=0)
    for bad in (1.5, "3", 2 ** 63, -1):
        with pytest.raises(ValueError, match=r"set_epoch: the epoch must be an int in \[0, 2\*\*63\)"):
            loader.set_epoch(bad)
    assert loader.epoch == 0


def test_a_used_up_iterator_ends_fit_with_a_warning():
    x, y = np.zeros((8, 4), np.float32), np.zeros(8, np.int64)
    model = ft.nn.Linear(4, 2)
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), ft.nn.CrossEntropyLoss(), batch_size=4,
                            input_shape=(4,))
    once = ((x[i:i + 4], y[i:i + 4]) for i in (0, 4))
    with pytest.warns(UserWarning, match="epoch 2 got no batches, so training stops there"):
        history = ft.fit(program, once, 3, progress=False)
    assert history["epoch"] == [1] and np.isfinite(history["train_loss"]).all() and program.step_count == 2
    val = ((x[i:i + 4], y[i:i + 4]) for i in (0, 4))  # evaluated each epoch: refused before the first step
    with pytest.raises(TypeError, match="fit: val_loader is a generator, used up after one pass, and each of the 3 "
                                        "epochs evaluates it"):
        ft.fit(program, [(x, y)], 3, val_loader=val, progress=False)
    assert program.step_count == 2
    assert ft.fit(program, [(x, y)], 1, val_loader=val, progress=False)["val_loss"][0] >= 0  # one epoch: once


def test_fit_after_a_bad_batch_goes_on_past_it(tmp_path):
    """A corrupt record raises out of fit's C epoch after the steps before it were applied: the step count says
    so, and fit again trains the rest of the epoch, past the bad batch, without repeating a batch."""
    ft.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(16, 6))  # the records' labels are 0..5
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss(), batch_size=1,
                            input_shape=(1, 4, 4))
    loader = D.Loader(bad_record_file(tmp_path / "b.rec"), batch_size=1, num_workers=1)
    with pytest.raises(ValueError, match=r"^epoch 1, step 3 of the epoch: .*b\.rec#2"):
        ft.fit(program, loader, 1, progress=False)
    assert program.step_count == 2 and loader.state_dict()["batch"] == 3
    ft.fit(program, loader, 1, progress=False)
    assert program.step_count == 5 and loader.epoch == 1


@pytest.mark.parametrize("workers", [0, 2])
def test_a_loader_iterated_in_a_forked_process(workers):
    """fork copies a Loader but not its worker threads: the child's iteration is refused with the way out (it
    waited forever), its position and counters read without the workers' lock, a batch taken before the fork drops,
    and the child exits without waiting on them; a Loader without workers iterates there. The parent's goes on."""
    import os
    import select
    X, y = np.arange(40 * 4, dtype=np.float32).reshape(40, 4), np.arange(40)
    loader = D.Loader((X, y), batch_size=8, num_workers=workers)
    held = next(iter(loader))  # a batch taken before the fork, dropped in the child
    assert len(held[1]) == 8
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child reports what iterating gave and whether closing the Loader returned
        del held
        position, _ = loader.state_dict()["batch"], loader.stats()
        try:
            message = f"{sum(len(b[1]) for b in loader)} samples"
        except RuntimeError as e:
            message = str(e)
        loader.close()
        message += f" (at batch {position})"
        os.write(write, message.encode())
        os.close(write)
        os._exit(0)
    os.close(write)
    ready, _, _ = select.select([read], [], [], 30)
    message = os.read(read, 4096).decode() if ready else "no answer"
    os.close(read)
    _, status = os.waitpid(pid, 0)
    assert status == 0
    if workers:
        assert "runs worker threads, which a forked process" in message and "num_workers=0" in message
    else:
        assert message.startswith("40 samples")
    assert message.endswith("(at batch 0)")  # the peeking pass was dropped: the next one starts the epoch
    assert sum(len(b[1]) for b in loader) == 40
