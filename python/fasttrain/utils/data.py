"""torch.utils.data's names, for datasets written in Python as PyTorch code writes them (a Dataset's __getitem__ and
__len__): DataLoader batches their samples with torch's samplers, collation and splits into fasttrain tensors, which
ft.fit, train_step and evaluate take. Arrays, image folders, record files and tar shards load faster through
ft.data.Loader, whose C workers read, decode and batch without Python; this layer runs the dataset's own Python
(with num_workers > 0, in that many threads: NumPy and file reads release the GIL, pure Python does not)."""
import bisect
import collections
import collections.abc
import itertools
import math
import numbers
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from .. import creation
from .._C import TensorBase
from .._math import stack
from ..random import Generator, multinomial, randint, randperm

__all__ = ["BatchSampler", "ConcatDataset", "DataLoader", "Dataset", "IterableDataset", "RandomSampler", "Sampler",
           "SequentialSampler", "Subset", "SubsetRandomSampler", "TensorDataset", "WeightedRandomSampler",
           "default_collate", "random_split"]


# ---------------------------------------------------------------- datasets

class Dataset:
    """A map-style dataset: dataset[i] is sample i and len(dataset) their number, as the subclass defines them;
    dataset + other concatenates two."""

    def __getitem__(self, index):
        raise NotImplementedError(f"{type(self).__name__} must define __getitem__")

    def __add__(self, other):
        return ConcatDataset([self, other])


class IterableDataset(Dataset):
    """A dataset read as a stream (the subclass's __iter__), batched in its order: no sampler or shuffle applies."""

    def __iter__(self):
        raise NotImplementedError(f"{type(self).__name__} must define __iter__")

    def __add__(self, other):
        raise TypeError("an IterableDataset is a stream: chain the iterables instead (itertools.chain)")


class TensorDataset(Dataset):
    """Samples taken along the first dimension of tensors (or arrays) of one length: dataset[i] is
    (t[i] for each tensor)."""

    def __init__(self, *tensors):
        if not tensors:
            raise ValueError("TensorDataset needs at least one tensor")
        sizes = [len(t) for t in tensors]
        if len(set(sizes)) > 1:
            raise ValueError(f"Size mismatch between tensors: first dimensions {sizes}")
        self.tensors = tensors

    def __getitem__(self, index):
        return tuple(t[index] for t in self.tensors)

    def __len__(self):
        return len(self.tensors[0])


class Subset(Dataset):
    """The samples of dataset at indices, in their order."""

    def __init__(self, dataset, indices):
        self.dataset, self.indices = dataset, indices

    def __getitem__(self, index):
        if isinstance(index, list):
            return [self.dataset[self.indices[i]] for i in index]
        return self.dataset[self.indices[index]]

    def __len__(self):
        return len(self.indices)


class ConcatDataset(Dataset):
    """Datasets one after the other: sample i of the first, then of the second, ..."""

    def __init__(self, datasets):
        self.datasets = list(datasets)
        if not self.datasets:
            raise ValueError("ConcatDataset: datasets should not be an empty iterable")
        if any(isinstance(d, IterableDataset) for d in self.datasets):
            raise TypeError("ConcatDataset does not support IterableDataset")
        self.cumulative_sizes = list(itertools.accumulate(len(d) for d in self.datasets))

    def __len__(self):
        return self.cumulative_sizes[-1]

    def __getitem__(self, index):
        if index < 0:
            if -index > len(self):
                raise ValueError("absolute value of index should not exceed dataset length")
            index += len(self)
        k = bisect.bisect_right(self.cumulative_sizes, index)
        if k == len(self.datasets):
            raise IndexError(f"index {index} is out of range for a ConcatDataset of {len(self)} samples")
        return self.datasets[k][index - (self.cumulative_sizes[k - 1] if k else 0)]


def random_split(dataset, lengths, generator=None):
    """Subsets of dataset of the given lengths (or fractions summing to 1, the samples left over by their floors
    given one each to the first subsets, as torch's), taken in turn from one random permutation of its indices drawn
    from generator (by default fasttrain's, which ft.manual_seed fixes)."""
    n = len(dataset)
    lengths = list(lengths)
    if lengths and all(isinstance(f, float) and 0 <= f <= 1 for f in lengths) and math.isclose(sum(lengths), 1):
        counts = [math.floor(n * f) for f in lengths]
        for i in range(n - sum(counts)):
            counts[i % len(counts)] += 1
        lengths = counts
    if any(isinstance(k, bool) or not isinstance(k, numbers.Integral) or k < 0 for k in lengths):
        raise ValueError(f"random_split: lengths must be sample counts >= 0 or fractions summing to 1, got {lengths}")
    if sum(lengths) != n:
        raise ValueError(f"Sum of input lengths ({sum(lengths)}) does not equal the length of the input dataset ({n})!")
    order = randperm(n, generator=generator).tolist()
    return [Subset(dataset, order[end - k:end]) for end, k in zip(itertools.accumulate(lengths), lengths)]


# ---------------------------------------------------------------- samplers

class Sampler:
    """An iterable of sample indices (a subclass defines __iter__, and __len__ when it knows its length)."""

    def __init__(self, data_source=None):
        pass

    def __iter__(self):
        raise NotImplementedError(f"{type(self).__name__} must define __iter__")


def _pass_generator(generator):
    """The generator of one pass over a sampler: the given one, or one seeded by a draw from fasttrain's (as torch's
    samplers draw a seed from the global generator for each pass), so that ft.manual_seed fixes every epoch's
    order and each epoch has its own."""
    return generator if generator is not None else Generator().manual_seed(int(randint(2 ** 62, (1,))[0]))


def _count(value, what):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value <= 0:
        raise ValueError(f"{what} should be a positive integer value, but got {what}={value!r}")
    return int(value)


def _flag(value, what):
    if not isinstance(value, bool):
        raise TypeError(f"{what} should be a boolean value, but got {what}={value!r}")
    return value


class SequentialSampler(Sampler):
    """0, 1, ..., len(data_source) - 1."""

    def __init__(self, data_source):
        self.data_source = data_source

    def __iter__(self):
        return iter(range(len(self.data_source)))

    def __len__(self):
        return len(self.data_source)


class RandomSampler(Sampler):
    """A random permutation of the indices for each pass (num_samples of them: whole permutations, then part of
    one), or with replacement num_samples independent uniform draws."""

    def __init__(self, data_source, replacement=False, num_samples=None, generator=None):
        self.data_source, self.replacement, self.generator = data_source, _flag(replacement, "replacement"), generator
        self._num_samples = num_samples
        _count(self.num_samples, "num_samples")  # (an empty dataset's 0 too, as torch's)

    @property
    def num_samples(self):
        return len(self.data_source) if self._num_samples is None else self._num_samples

    def __iter__(self):
        n, g = len(self.data_source), _pass_generator(self.generator)
        if self.replacement:
            yield from randint(n, (self.num_samples,), generator=g).tolist()
            return
        for _ in range(self.num_samples // n):
            yield from randperm(n, generator=g).tolist()
        yield from randperm(n, generator=g).tolist()[:self.num_samples % n]

    def __len__(self):
        return self.num_samples


class SubsetRandomSampler(Sampler):
    """The given indices in a random order for each pass."""

    def __init__(self, indices, generator=None):
        self.indices, self.generator = indices, generator

    def __iter__(self):
        for i in randperm(len(self.indices), generator=_pass_generator(self.generator)).tolist():
            yield self.indices[i]

    def __len__(self):
        return len(self.indices)


class WeightedRandomSampler(Sampler):
    """num_samples indices drawn with probabilities proportional to weights (one per sample), with replacement
    unless replacement=False (then each at most once): the balanced sampling of an imbalanced dataset."""

    def __init__(self, weights, num_samples, replacement=True, generator=None):
        self.num_samples, self.replacement = _count(num_samples, "num_samples"), _flag(replacement, "replacement")
        w = np.asarray(weights.numpy() if isinstance(weights, TensorBase) else weights, dtype=np.float64)
        if w.ndim != 1 or not np.isfinite(w).all() or (w < 0).any() or not w.sum() > 0:
            raise ValueError(f"WeightedRandomSampler: weights must be a 1-d sequence of finite values >= 0, not all "
                             f"0; got shape {w.shape}")
        if not replacement and num_samples > np.count_nonzero(w):
            raise ValueError(f"WeightedRandomSampler: {num_samples} samples without replacement, but only "
                             f"{np.count_nonzero(w)} weights are > 0")
        self.weights, self.generator = creation.tensor(w), generator

    def __iter__(self):
        yield from multinomial(self.weights, self.num_samples, self.replacement,
                               generator=_pass_generator(self.generator)).tolist()

    def __len__(self):
        return self.num_samples


class BatchSampler(Sampler):
    """The indices of sampler in lists of batch_size (the last one shorter unless drop_last)."""

    def __init__(self, sampler, batch_size, drop_last):
        self.sampler, self.batch_size = sampler, _count(batch_size, "batch_size")
        self.drop_last = _flag(drop_last, "drop_last")

    def __iter__(self):
        it = iter(self.sampler)
        while batch := list(itertools.islice(it, self.batch_size)):
            if len(batch) == self.batch_size or not self.drop_last:
                yield batch

    def __len__(self):
        n = len(self.sampler)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)


# ---------------------------------------------------------------- collation

def default_collate(batch):
    """Samples joined into a batch as torch's default_collate joins them: tensors and arrays (NumPy's, or anything NumPy
    reads, a torch tensor) stacked along a new first dimension as fasttrain tensors, Python floats as float64, ints
    and bools as ft.tensor infers them (int64, bool; float32 when a float is among them); dicts, named tuples,
    tuples and lists collated field by field (a tuple's fields as a list, as torch's); strings and bytes kept as a
    list."""
    elem = batch[0]
    if isinstance(elem, TensorBase):
        return stack(batch)
    if isinstance(elem, (str, bytes)):
        return list(batch)
    if isinstance(elem, np.generic) or hasattr(elem, "__array__"):
        arrays = [np.asarray(sample) for sample in batch]
        if arrays[0].dtype.kind not in "USOV":  # (strings and objects have no tensor)
            return creation.from_numpy(np.stack(arrays))
    elif isinstance(elem, float):
        return creation.tensor(batch, dtype="float64")
    elif isinstance(elem, numbers.Real):  # ints (and bools) as torch.tensor infers them: [1, 2.5] is float32
        return creation.tensor(batch)
    elif isinstance(elem, collections.abc.Mapping):
        fields = {key: default_collate([sample[key] for sample in batch]) for key in elem}
        try:
            return type(elem)(fields)
        except TypeError:  # (a defaultdict)
            return fields
    elif isinstance(elem, tuple) and hasattr(elem, "_fields"):
        return type(elem)(*(default_collate(list(fields)) for fields in zip(*batch)))
    elif isinstance(elem, collections.abc.Sequence):
        if len({len(sample) for sample in batch}) > 1:
            raise RuntimeError("each element in list of batch should be of equal size")
        return [default_collate(list(fields)) for fields in zip(*batch)]
    raise TypeError(f"default_collate: batch must contain tensors, numpy arrays, numbers, dicts or lists; found "
                    f"{type(elem).__name__}")


def _convert(sample):
    """A sample as torch's default_convert leaves it when batch_size=None (no batching): NumPy arrays as fasttrain
    tensors, inside dicts, named tuples, tuples and lists too (a tuple becomes a list, as there)."""
    if isinstance(sample, np.ndarray) and sample.dtype.kind not in "USOV":  # (strings and objects have no tensor)
        return creation.from_numpy(sample)
    if isinstance(sample, collections.abc.Mapping):
        return {key: _convert(value) for key, value in sample.items()}
    if isinstance(sample, tuple) and hasattr(sample, "_fields"):
        return type(sample)(*(_convert(value) for value in sample))
    if isinstance(sample, (tuple, list)):
        return [_convert(value) for value in sample]
    return sample


# ---------------------------------------------------------------- the loader

class DataLoader:
    """Batches of a dataset's samples, as torch.utils.data.DataLoader: a batch_size of them each (batch_size=None:
    the samples one by one, unbatched), in order or shuffled (a new order for each pass, from fasttrain's generator
    unless generator is given), or in a sampler's or batch_sampler's order, joined by collate_fn (default_collate).
    With num_workers > 0 the batches are made ahead, in order, by that many threads (worker_init_fn(worker_id) runs
    first in each; prefetch_factor batches each, 2 by default); an exception a sample raises reaches the loop at
    its batch. pin_memory is taken: fasttrain moves host batches to a device itself."""

    def __init__(self, dataset, batch_size=1, shuffle=None, sampler=None, batch_sampler=None, num_workers=0,
                 collate_fn=None, pin_memory=False, drop_last=False, timeout=0, worker_init_fn=None,
                 multiprocessing_context=None, generator=None, *, prefetch_factor=None, persistent_workers=False,
                 pin_memory_device=""):
        if isinstance(num_workers, bool) or not isinstance(num_workers, numbers.Integral) or num_workers < 0:
            raise ValueError("num_workers option should be non-negative; use num_workers=0 to disable "
                             "multiprocessing.")
        if timeout < 0:
            raise ValueError("timeout option should be non-negative")
        if num_workers == 0 and prefetch_factor is not None:
            raise ValueError("prefetch_factor option could only be specified in multiprocessing. let num_workers > 0 "
                             "to enable multiprocessing, otherwise set prefetch_factor to None.")
        if persistent_workers and num_workers == 0:
            raise ValueError("persistent_workers option needs num_workers > 0")
        if isinstance(dataset, IterableDataset):
            for name, value in (("shuffle", shuffle), ("sampler", sampler), ("batch_sampler", batch_sampler)):
                if value not in (None, False):
                    raise ValueError(f"DataLoader with IterableDataset: expected unspecified {name} option, but got "
                                     f"{name}={value!r}")
        elif batch_sampler is not None:
            if batch_size != 1 or shuffle or sampler is not None or drop_last:
                raise ValueError("batch_sampler option is mutually exclusive with batch_size, shuffle, sampler, and "
                                 "drop_last")
            batch_size, drop_last = None, False
        elif batch_size is None and drop_last:
            raise ValueError("batch_size=None option disables auto-batching and is mutually exclusive with drop_last")
        if sampler is not None and shuffle:
            raise ValueError("sampler option is mutually exclusive with shuffle")
        if batch_size is not None:
            _count(batch_size, "batch_size")
        self.dataset, self.batch_size, self.drop_last = dataset, batch_size, _flag(drop_last, "drop_last")
        self.num_workers, self.prefetch_factor = int(num_workers), prefetch_factor or 2
        self.pin_memory, self.timeout, self.worker_init_fn, self.generator = pin_memory, timeout, worker_init_fn, \
            generator
        self._iterable = isinstance(dataset, IterableDataset)
        if not self._iterable and sampler is None:
            sampler = RandomSampler(dataset, generator=generator) if shuffle else SequentialSampler(dataset)
        if not self._iterable and batch_size is not None and batch_sampler is None:
            batch_sampler = BatchSampler(sampler, batch_size, drop_last)
        self.sampler, self.batch_sampler = sampler, batch_sampler
        self.collate_fn = collate_fn or (default_collate if batch_size is not None or batch_sampler is not None
                                         else _convert)

    def __len__(self):
        return len(self._jobs(range(len(self.dataset))) if self._iterable else
                   self.batch_sampler if self.batch_sampler is not None else self.sampler)

    def _jobs(self, stream=None):
        """What makes each batch, in order: lists of indices (or one index, unbatched) of a map-style dataset, or
        the samples of a stream (of `stream` in place of the dataset's), in lists of batch_size unless unbatched."""
        if not self._iterable:
            return iter(self.batch_sampler if self.batch_sampler is not None else self.sampler)
        samples = iter(self.dataset) if stream is None else stream
        return samples if self.batch_size is None else BatchSampler(samples, self.batch_size, self.drop_last)

    def _batch(self, job):
        if self._iterable:
            return self.collate_fn(job)
        if self.batch_sampler is None:
            return self.collate_fn(self.dataset[job])
        return self.collate_fn([self.dataset[i] for i in job])

    def __iter__(self):
        if self.num_workers == 0:
            for job in self._jobs():
                yield self._batch(job)
            return
        ids, lock = itertools.count(), threading.Lock()

        def start():
            if self.worker_init_fn is not None:
                with lock:
                    worker = next(ids)
                self.worker_init_fn(worker)

        pending = collections.deque()
        # a stream is read by one thread at a time, in order: the workers then collate its batches
        jobs = self._jobs()
        pool, done = ThreadPoolExecutor(self.num_workers, initializer=start), False
        try:
            for job in jobs:
                pending.append(pool.submit(self._batch, job))
                if len(pending) >= self.num_workers * self.prefetch_factor:
                    yield pending.popleft().result(timeout=self.timeout or None)
            while pending:
                yield pending.popleft().result(timeout=self.timeout or None)
            done = True
        finally:  # left early (a break, an error, a timeout): the loop does not wait for the batches under way
            pool.shutdown(wait=done, cancel_futures=True)
