"""ft.utils.data, torch.utils.data's names for Python datasets: DataLoader's batches (every sample once per epoch,
partial and dropped last batches, shuffles reproducible from the seed and new each epoch, thread workers giving the
same batches in the same order, a sample's exception at its batch), the samplers, default_collate against
torch's, splits and concatenations, training through ft.fit, and the options torch refuses."""
import collections

import numpy as np
import pytest

import fasttrain as ft
from fasttrain.utils.data import (BatchSampler, ConcatDataset, DataLoader, Dataset, IterableDataset, RandomSampler,
                                  SequentialSampler, Subset, SubsetRandomSampler, TensorDataset,
                                  WeightedRandomSampler, default_collate, random_split)

try:
    import torch
    import torch.utils.data as tud
except Exception:  # not installed, or a broken install
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed")


class Squares(Dataset):
    """Sample i: (a float32 row of i's, i * i), as a PyTorch user's dataset returns them; raises at `bad`."""

    def __init__(self, n=10, bad=None):
        self.n, self.bad = n, bad

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i == self.bad:
            raise ValueError(f"sample {i} is broken")
        return np.full(3, i, np.float32), i * i


def labels(loader):
    return [batch[1].tolist() for batch in loader]


@pytest.mark.parametrize("workers", [0, 2])
def test_batches_in_order_with_a_partial_or_dropped_last_batch(workers):
    loader = DataLoader(Squares(), batch_size=4, num_workers=workers)
    assert len(loader) == 3 and labels(loader) == [[0, 1, 4, 9], [16, 25, 36, 49], [64, 81]]
    x, y = next(iter(loader))
    assert isinstance(x, ft.Tensor) and x.dtype == ft.float32 and x.shape == (4, 3) and y.dtype == ft.int64
    np.testing.assert_array_equal(x.numpy()[:, 0], [0, 1, 2, 3])
    dropped = DataLoader(Squares(), batch_size=4, drop_last=True, num_workers=workers)
    assert len(dropped) == 2 and labels(dropped) == [[0, 1, 4, 9], [16, 25, 36, 49]]
    single = DataLoader(Squares(3), batch_size=None, num_workers=workers)
    assert [(tuple(x.shape), y) for x, y in single] == [((3,), 0), ((3,), 1), ((3,), 4)]


@pytest.mark.parametrize("workers", [0, 3])
def test_shuffles_see_every_sample_once_differ_by_epoch_and_repeat_from_the_seed(workers):
    def epochs(seed, n=3):
        ft.manual_seed(seed)
        loader = DataLoader(Squares(20), batch_size=6, shuffle=True, num_workers=workers)
        return [sum(labels(loader), []) for _ in range(n)]

    runs = epochs(1)
    for order in runs:
        assert sorted(order) == [i * i for i in range(20)]
    assert runs[0] != runs[1] and runs[1] != runs[2]
    assert epochs(1) == runs and epochs(2) != runs
    g = ft.Generator().manual_seed(7)  # a generator of the loader's own: the global seed does not matter
    ft.manual_seed(3)
    a = sum(labels(DataLoader(Squares(20), batch_size=6, shuffle=True, generator=g)), [])
    g.manual_seed(7)
    ft.manual_seed(4)
    assert sum(labels(DataLoader(Squares(20), batch_size=6, shuffle=True, generator=g)), []) == a


def test_thread_workers_give_the_batches_of_none_and_raise_at_the_broken_sample():
    started = []
    loader = DataLoader(Squares(40, bad=21), batch_size=5, num_workers=3, worker_init_fn=started.append,
                        prefetch_factor=1)
    seen = []
    with pytest.raises(ValueError, match="sample 21 is broken"):
        for _, y in loader:
            seen.append(y.tolist())
    assert seen == [[i * i for i in range(k, k + 5)] for k in range(0, 20, 5)]  # the batches before the broken one
    assert sorted(started) == [0, 1, 2]


def test_samplers():
    data = Squares(10)
    assert list(SequentialSampler(data)) == list(range(10))
    ft.manual_seed(0)
    order = list(RandomSampler(data))
    assert sorted(order) == list(range(10)) and order != list(range(10))
    longer = list(RandomSampler(data, num_samples=25))
    assert len(longer) == 25 and sorted(longer[:10]) == sorted(longer[10:20]) == list(range(10))
    drawn = list(RandomSampler(data, replacement=True, num_samples=1000))
    assert len(drawn) == 1000 and set(drawn) == set(range(10))
    assert sorted(SubsetRandomSampler([3, 5, 7])) == [3, 5, 7]
    assert set(WeightedRandomSampler([0, 2.0, 0, 1.0], 50)) == {1, 3}
    assert sorted(WeightedRandomSampler([0, 2.0, 0, 1.0], 2, replacement=False)) == [1, 3]
    counts = np.bincount(list(WeightedRandomSampler([1.0, 3.0], 20000)), minlength=2)
    assert abs(counts[1] / 20000 - 0.75) < 0.02  # within 7 standard deviations
    assert list(BatchSampler(range(7), 3, False)) == [[0, 1, 2], [3, 4, 5], [6]]
    assert list(BatchSampler(range(7), 3, True)) == [[0, 1, 2], [3, 4, 5]] and len(BatchSampler(range(7), 3, True)) == 2
    loader = DataLoader(data, batch_sampler=BatchSampler(SubsetRandomSampler([1, 2, 3]), 2, False))
    assert sorted(sum(labels(loader), [])) == [1, 4, 9] and len(loader) == 2
    weighted = DataLoader(data, batch_size=4, sampler=WeightedRandomSampler([0.0] * 9 + [1.0], 8))
    assert labels(weighted) == [[81] * 4] * 2


def test_splits_subsets_and_concatenations():
    ft.manual_seed(0)
    parts = random_split(Squares(10), [7, 3])
    assert [len(p) for p in parts] == [7, 3]
    assert sorted(parts[0].indices + parts[1].indices) == list(range(10))
    assert [len(p) for p in random_split(Squares(10), [0.5, 0.3, 0.2])] == [5, 3, 2]
    assert [len(p) for p in random_split(Squares(11), [0.5, 0.5])] == [6, 5]  # the leftover sample to the first
    ft.manual_seed(0)
    assert random_split(Squares(10), [7, 3])[1].indices == parts[1].indices
    with pytest.raises(ValueError, match=r"Sum of input lengths \(9\) does not equal the length"):
        random_split(Squares(10), [6, 3])
    sub = Subset(Squares(10), [9, 2])
    assert len(sub) == 2 and sub[0][1] == 81 and [s[1] for s in sub[[1, 0]]] == [4, 81]
    both = Squares(3) + TensorDataset(np.zeros((2, 3), np.float32), np.array([7, 8]))
    assert isinstance(both, ConcatDataset) and len(both) == 5
    assert [both[i][1] for i in range(5)] == [0, 1, 4, 7, 8] and both[-1][1] == 8
    with pytest.raises(IndexError):
        both[5]
    with pytest.raises(ValueError, match="Size mismatch between tensors"):
        TensorDataset(np.zeros(3), np.zeros(4))


@needs_torch
def test_default_collate_is_torchs():
    Point = collections.namedtuple("Point", "x y")
    samples = [{"image": np.full((2, 2), k, np.float32), "label": k, "weight": 0.5 * k, "keep": k > 0,
                "name": f"s{k}", "pair": (np.int64(k), [k, 2 * k]), "point": Point(k, float(k))} for k in range(3)]

    def same(ours, theirs):
        if isinstance(theirs, torch.Tensor):
            assert isinstance(ours, ft.Tensor) and ours.dtype.name == str(theirs.dtype).split(".")[1]
            np.testing.assert_array_equal(ours.numpy(), theirs.numpy())
        elif isinstance(theirs, dict):
            assert type(ours) is type(theirs) and ours.keys() == theirs.keys()
            for k in theirs:
                same(ours[k], theirs[k])
        elif isinstance(theirs, (list, tuple)):
            assert type(ours) is type(theirs) and len(ours) == len(theirs)
            for a, b in zip(ours, theirs):
                same(a, b)
        else:
            assert ours == theirs

    same(default_collate(samples), tud.default_collate(samples))
    same(default_collate([1, 2.5]), tud.default_collate([1, 2.5]))  # inferred from all: float32
    same(DataLoader([Point(np.ones(2), (3, np.zeros(1)))], batch_size=None).__iter__().__next__(),
         next(iter(tud.DataLoader([Point(np.ones(2), (3, np.zeros(1)))], batch_size=None))))
    with pytest.raises(RuntimeError, match="each element in list of batch should be of equal size"):
        default_collate([[1, 2], [3]])


def test_a_stuck_worker_times_out_and_leaving_early_does_not_wait():
    import threading
    import time
    release = threading.Event()

    class Slow(Dataset):
        def __len__(self):
            return 8

        def __getitem__(self, i):
            if i == 2:
                release.wait(10)
            return np.float32([i]), i

    start = time.monotonic()
    with pytest.raises(TimeoutError):
        for _ in DataLoader(Slow(), batch_size=1, num_workers=2, timeout=0.2):
            pass
    assert time.monotonic() - start < 5
    release.set()


def test_a_stream_is_batched_in_its_order():
    class Stream(IterableDataset):
        def __iter__(self):
            return iter((np.float32([k]), k) for k in range(7))

    for workers in (0, 2):
        assert labels(DataLoader(Stream(), batch_size=3, num_workers=workers)) == [[0, 1, 2], [3, 4, 5], [6]]
        assert labels(DataLoader(Stream(), batch_size=3, drop_last=True, num_workers=workers)) == [[0, 1, 2],
                                                                                                   [3, 4, 5]]
    with pytest.raises(ValueError, match="IterableDataset: expected unspecified shuffle option"):
        DataLoader(Stream(), shuffle=True)

    class Batches(IterableDataset):  # a stream of whole batches, given to ft.fit as it is
        def __iter__(self):
            return iter((np.ones((4, 1), np.float32), np.zeros(4, np.int64)) for _ in range(3))

    m = ft.nn.Linear(1, 2)
    program = m.compile(ft.optim.SGD(m.parameters(), lr=0.1), ft.nn.CrossEntropyLoss(), batch_size=4,
                        input_shape=(1,))
    ft.fit(program, Batches(), 1, progress=False)
    assert program.step_count == 3


def test_fit_trains_on_a_dataloader_as_on_its_batches():
    """A PyTorch user's Dataset batched by DataLoader trains through ft.fit as train_step on the same batches; the
    dataset itself given to fit, or to a Loader, says to batch it."""
    rng = np.random.default_rng(0)
    xs, ys = rng.standard_normal((20, 4)).astype(np.float32), rng.integers(0, 3, 20)

    class Rows(Dataset):
        def __len__(self):
            return 20

        def __getitem__(self, i):
            return xs[i], int(ys[i])

    def program():
        ft.manual_seed(0)
        model = ft.nn.Linear(4, 3)
        return model, model.compile(ft.optim.SGD(model.parameters(), lr=0.1), ft.nn.CrossEntropyLoss(),
                                    batch_size=8, input_shape=(4,))

    a, pa = program()
    history = ft.fit(pa, DataLoader(Rows(), batch_size=8), 2, progress=False)
    b, pb = program()
    losses = []
    for _ in range(2):
        losses.append([pb.train_step(xs[k:k + 8], ys[k:k + 8]) for k in (0, 8, 16)])
    np.testing.assert_array_equal(a.weight.numpy(), b.weight.numpy())
    assert history["train_loss"][0] == pytest.approx((8 * losses[0][0] + 8 * losses[0][1] + 4 * losses[0][2]) / 20)
    with pytest.raises(TypeError, match=r"Rows is a dataset of samples: batch it with ft.utils.data.DataLoader"):
        ft.fit(pa, Rows(), 1, progress=False)
    with pytest.raises(TypeError, match=r"is batched by ft.utils.data.DataLoader\(dataset, batch_size=...\)"):
        ft.data.Loader(Rows())
    with pytest.raises(TypeError, match="the third argument is transforms .* give shuffle=True by name"):
        ft.data.Loader((xs, ys), 8, True)


@pytest.mark.parametrize("make, error, match", [
    (lambda: DataLoader(Squares(), batch_size=0), ValueError, "batch_size should be a positive integer"),
    (lambda: DataLoader(Squares(), num_workers=-1), ValueError, "num_workers option should be non-negative"),
    (lambda: DataLoader(Squares(), sampler=SequentialSampler(range(10)), shuffle=True), ValueError,
     "sampler option is mutually exclusive with shuffle"),
    (lambda: DataLoader(Squares(), batch_size=2, batch_sampler=BatchSampler(range(10), 2, False)), ValueError,
     "batch_sampler option is mutually exclusive"),
    (lambda: DataLoader(Squares(), batch_size=None, drop_last=True), ValueError, "mutually exclusive with drop_last"),
    (lambda: DataLoader(Squares(), prefetch_factor=2), ValueError, "prefetch_factor option could only be specified"),
    (lambda: WeightedRandomSampler([1.0, -1.0], 2), ValueError, "weights must be a 1-d sequence of finite values"),
    (lambda: WeightedRandomSampler([1.0, 0.0], 2, replacement=False), ValueError, "only 1 weights are > 0"),
    (lambda: RandomSampler(Squares(), num_samples=0), ValueError, "num_samples should be a positive integer"),
    (lambda: DataLoader(Squares(0), shuffle=True), ValueError, "num_samples should be a positive integer"),
    (lambda: BatchSampler(range(3), 2, drop_last=1), TypeError, "drop_last should be a boolean value"),
])
def test_options_torch_refuses_are_refused(make, error, match):
    with pytest.raises(error, match=match):
        make()
