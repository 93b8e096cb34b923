"""ft.fit: the epoch loop around a compiled program, with a progress bar,
per-epoch metrics, learning-rate schedules and callbacks."""
from __future__ import annotations

import collections.abc
import copy
import sys
import time
import warnings
import weakref
from typing import TYPE_CHECKING

import numpy as np

from .history import History
from .nn.program import NO_TALLY, _as, add_tallies, tally_means
from .progress import ProgressBar

if TYPE_CHECKING:
    from typing import Any, Callable, Iterable, Mapping, Sequence, TextIO

    from .nn.program import Program
    from .optim.ema import EMA
    from .optim.lr_scheduler import LRScheduler, ReduceLROnPlateau


def _lr(optimizer):
    return optimizer.param_groups[0]["lr"]


def _is_c_loader(loader):
    from .data import Loader
    return isinstance(loader, Loader)


def _with_targets(program, data):
    """Data for a program whose loss reads no targets may be its inputs alone (x, or x1, ..., xk), or with None
    for the targets: given here zeros for targets, which no node reads. Other data as it is."""
    if program.target_dtype is not None:
        return data
    parts = data if isinstance(data, tuple) else (data,)
    if len(parts) == 2 and parts[1] is None:
        parts = parts[0] if isinstance(parts[0], tuple) else parts[:1]
    if len(parts) != len(program._input_dtypes) or not all(len(getattr(a, "shape", ())) for a in parts):
        return data
    return (*parts, np.zeros(parts[0].shape[0], np.int64))


def _split(program, batch):
    """A batch as (x, y): (x, y), or for a forward of k inputs (x1, ..., xk, y) or ((x1, ..., xk), y) with x the
    tuple of the k; for a program that reads no targets, the inputs alone too (_with_targets)."""
    batch = _with_targets(program, batch)
    k = len(program._input_dtypes)
    if not isinstance(batch, (tuple, list)) or len(batch) not in (2, k + 1):
        shape = f"(x1, ..., x{k}, y) or ((x1, ..., x{k}), y)" if k > 1 else "(x, y)"
        got = f"a {type(batch).__name__} of {len(batch)}" if isinstance(batch, (tuple, list)) else \
            type(batch).__name__
        raise TypeError(f"a batch must be {shape}, got {got}")
    return (tuple(batch[:k]), batch[k]) if k > 1 and len(batch) == k + 1 else (batch[0], batch[1])


class _InputBatches:
    """Batches ((x1, ..., xk), y) of the arrays of a forward's k inputs and of the targets (of one input, (x, y):
    one value per sample, which a Loader's features cannot be; y a tuple of several targets' arrays, (x, (y1,
    y2))), in the order of a Loader over the sample indices: shuffled, seeded, and continued from epoch to epoch
    (and from where a fit stopped) as a Loader of (x, y) arrays is, its epoch and position being that Loader's."""

    def __init__(self, inputs, targets, batch_size, shuffle, dtypes, seed=None, drop_last=False):
        from .data import Loader, _host_tensor
        self._inputs = [_host_tensor(a, "the inputs") for a in inputs]
        if any(a.dtype.name == "uint8" and d.is_floating_point for a, d in zip(self._inputs, dtypes)):
            raise TypeError("uint8 arrays for a float input are images that a Loader scales to [0, 1], which it "
                            "does for (x, y) arrays of one input and one target only: give float32 images (x / 255)")
        self._targets = [_host_tensor(a, "the targets") for a in targets] if isinstance(targets, tuple) else None
        n = len(targets[0] if self._targets else targets)
        if any(len(a) != n for a in [*self._inputs, *(self._targets or ())]):
            raise ValueError(f"the input arrays have {[len(a) for a in self._inputs]} samples, the targets "
                             f"{[len(a) for a in self._targets] if self._targets else n}")
        labels = np.zeros(n, np.int64) if self._targets else targets  # the index Loader's own, then
        self._indices = Loader((np.arange(n, dtype=np.int64).reshape(n, 1), labels), batch_size, shuffle=shuffle,
                               seed=seed, drop_last=drop_last)

    def __len__(self):
        return len(self._indices)

    epoch = property(lambda self: self._indices.epoch, lambda self, epoch: setattr(self._indices, "epoch", epoch))
    _resume = property(lambda self: self._indices._resume,
                       lambda self, resume: setattr(self._indices, "_resume", resume))
    _tally = property(lambda self: self._indices._tally, lambda self, tally: setattr(self._indices, "_tally", tally))
    _unique_samples = property(lambda self: self._indices._unique_samples)

    def _position(self):
        return self._indices._position()

    def _seek(self, epoch, batch):
        self._indices._seek(epoch, batch)

    def set_epoch(self, epoch):
        self._indices.set_epoch(epoch)

    def state_dict(self):
        """The position in the order (ft.save(program) keeps it): the index Loader's state."""
        return self._indices.state_dict()

    def load_state_dict(self, state):
        self._indices.load_state_dict(state)

    def __iter__(self):
        for rows, y in self._indices:
            rows = rows[:, 0]
            x = tuple(a[rows] for a in self._inputs)
            yield x if len(x) > 1 else x[0], tuple(a[rows] for a in self._targets) if self._targets else y


def _map_dataset(data):
    """Whether data is a map-style Dataset of samples (fasttrain's, or torch's where torch is imported), which ft.fit
    cannot take as batches; a stream of them may give batches."""
    from .utils import data as ud
    kinds = [(ud.Dataset, ud.IterableDataset)]
    if (torch_data := sys.modules.get("torch.utils.data")) is not None:
        kinds.append((torch_data.Dataset, torch_data.IterableDataset))
    return any(isinstance(data, mapped) and not isinstance(data, stream) for mapped, stream in kinds)


def _as_loader(program, data, batch_size, shuffle, drop_last=False):
    """A fasttrain Loader of batch_size (None: the program's) over (x, y) arrays (shuffled when training, seeded
    from the global seed as every Loader is; drop_last leaves out a last batch short of batch_size), or for a
    forward of several inputs their batches in a Loader's order (_InputBatches); a loader or iterable as it is.
    The program keeps the loader of the arrays it last trained on (and evaluated on), so that fit on the same
    arrays again goes on with the next epoch's order, and fit on new arrays (augmented afresh for each call)
    starts at that epoch too, in its order rather than the first epoch's again."""
    if isinstance(data, list) and len(data) == 2 and all(hasattr(d, "shape") and len(d.shape) for d in data) \
            and data[0].shape[0] == data[1].shape[0]:
        raise TypeError("give (x, y) arrays as a tuple: a list is taken as an iterable of (x, y) batches")
    data = _with_targets(program, data)
    if _map_dataset(data):
        raise TypeError(f"{type(data).__name__} is a dataset of samples: batch it with "
                        "ft.utils.data.DataLoader(dataset, batch_size=...) (or torch's DataLoader)")
    if not isinstance(data, tuple):
        if hasattr(data, "shape"):
            raise TypeError(f"give the data as (x, y) arrays or a loader, got one {type(data).__name__}: the "
                            "program's loss reads targets")
        for name, given in (("batch_size", batch_size is not None), ("drop_last", drop_last)):
            if given:
                raise ValueError(f"{name} applies to (x, y) arrays: a loader makes batches of its own")
        return data
    batch_size = batch_size or program.batch_size
    try:
        x, y = _split(program, data)
    except TypeError:
        raise TypeError(f"give the data as a loader or as (x, y) arrays, got a tuple of {len(data)}") from None
    if y is None and program.target_dtype is not None:
        raise TypeError("the targets are None, but the program's loss reads targets: give (x, y) arrays")
    from .data import Loader
    loaders = program.__dict__.setdefault("_array_loaders", {})
    # the arrays by identity: the kept loader holds them, so their ids are not reused (targets made up for a
    # program that reads none are new each time)
    key = (tuple(map(id, x)) if isinstance(x, tuple) else id(x),
           program.target_dtype and (tuple(map(id, y)) if isinstance(y, tuple) else id(y)), batch_size, drop_last)
    kept = loaders.get(shuffle)
    if kept is None or kept[0] != key:
        resume = program.__dict__.pop("_resume_arrays", None) if shuffle else None  # a checkpoint's (ft.load)
        seed = None if resume is None else resume["seed"]
        if isinstance(x, tuple) or isinstance(y, tuple) or program.input_shape == ():
            made = _InputBatches(x if isinstance(x, tuple) else (x,), y, batch_size, shuffle, program._input_dtypes,
                                 seed, drop_last)
        else:  # the targets as train_step takes them: int regression targets as floats, float labels refused
            if y is not None and program.target_dtype is not None and not isinstance(program.target_dtype, tuple):
                y = _as(y, program.target_dtype, "labels")
            made = Loader((x, y), batch_size, shuffle=shuffle, seed=seed, drop_last=drop_last)
        if resume is not None:
            made.load_state_dict(resume)
        elif kept is not None and shuffle:
            made.set_epoch(kept[1].epoch)
        kept = loaders[shuffle] = key, made
    return kept[1]


def evaluate(program: Program, loader: Iterable[Any], tta_flip: bool = False) -> tuple[float, float | None]:
    """(mean loss, accuracy) of the program over a loader (or (x, y) arrays, in batches of the program's size), in
    eval mode, as over one batch of the whole split for a loss of one term: the loss averaged over what the loss
    averages (the targets it does not ignore, a masked mean's count, the samples; a loss of several terms weighs
    each batch by its samples; a loss summed over the batch, reduction='sum', sums over the split), the accuracy
    over the labels it does not ignore (None unless the model classifies); a batch of ignored targets only counts
    for nothing. With tta_flip the logits of each image and of its horizontal mirror are averaged (test-time
    augmentation). A fasttrain loader runs entirely in C. Under ft.distributed every rank evaluates its shard
    and the figures are the whole split's: the samples a sharded loader repeats at its end, to give every rank as
    many, count once."""
    _check_labels(program, loader, "evaluate: the targets")
    loader = _as_loader(program, loader, None, False)
    program._check_evaluable()
    if _is_c_loader(loader):
        # The whole split, wherever an earlier iteration (or a restored state) left the loader, which is then
        # put back where it was (fit goes on from a loader's position)
        (epoch, batch), kept = loader._position(), (loader.epoch, loader._resume, loader._tally, loader._pass)
        loader.set_epoch(loader.epoch)
        try:
            tally, count = program._eval_c.eval_epoch(loader, tta_flip)
        finally:
            if not loader.closed:
                loader._seek(epoch, batch)
                loader.epoch, loader._resume, loader._tally, loader._pass = kept
                if (live := loader._pass and loader._pass()) is not None:  # a loop over it goes on from there
                    live._ended = False
    else:
        tally, count = NO_TALLY, 0
        left = getattr(loader, "_unique_samples", None)  # a sharded epoch's repeated samples count once
        for batch in loader:
            x, y = _split(program, batch)
            if left is not None and len(y) > left:
                x, y = tuple(a[:left] for a in x) if isinstance(x, tuple) else x[:left], y[:left]
            if len(y):
                tally = add_tallies(tally, program._eval_c.evaluate(*program._batch(x, y), tta_flip))
            count += len(y)
            left = None if left is None else left - len(y)
    if program.distributed:  # every rank evaluated its shard: the whole split's figures
        from . import distributed
        from .creation import tensor
        *tally, count = distributed.all_reduce(tensor([*tally, count], dtype="float64")).tolist()
    if count == 0:
        raise ValueError("evaluate: the loader gave no samples")
    return tally_means(tally, program)


def _fit_epoch_in_c(program, loader, scheduler, interval, bar, start, on_step, every, resumed, ema):
    """One epoch (or what is left of it, after a restored position) in C, in parts (_steps_in_c): a step callback
    that changes the optimizer's hyperparameters or the scheduler (an lr set by hand) ends one, and the next goes
    on from there with them. Returns (the tally of the steps not skipped, `resumed`'s (a stopped fit's) included,
    samples, last lr, stopped)."""
    done = [resumed, 0, 0]  # the tally, samples and steps of the parts before
    while True:
        tally, samples, steps, lr, stopped, changed = _steps_in_c(
            program, loader, scheduler if interval == "step" else None, bar, start, on_step, every, done, ema)
        done = [add_tallies(done[0], tally), done[1] + samples, done[2] + steps]
        if not changed:
            return done[0], done[1], lr, stopped


def _steps_in_c(program, loader, scheduler, bar, start, on_step, every, done, ema):
    """The rest of the epoch in C, until a step callback stops it or changes the optimizer's hyperparameters or the
    scheduler. Every step's hyperparameters (the learning rate, and the momentum or betas a scheduler cycles) are
    computed up front by stepping the scheduler, and Python runs only for the progress bar and for on_step(step,
    loss, lr, grad_norm) every `every` steps of the program (one returning True stops the epoch there), which sees
    the optimizer and the scheduler as a Python loop leaves them after that step. `done`: the tally, samples and
    steps of the epoch's parts before. Returns this part's (tally, samples, steps), its last lr, whether a callback
    stopped it, and whether one changed the optimizer or the scheduler (the epoch goes on with them)."""
    optimizer = program.optimizer
    groups = optimizer.param_groups

    def hyper():
        return [optimizer._group_tuple(g, i) for i, g in enumerate(groups)]

    plan = None  # after k scheduler steps: (the C groups of step k + 1, the param groups, the scheduler's state)
    if scheduler is not None:
        # The scheduler's step after the part's last waits until the part is done, so that the optimizer never
        # sees values from beyond the schedule's end.
        n = max(len(loader) - loader._position()[1], 1)
        plan = []
        for k in range(n):
            if k:
                scheduler.step()
            kept = k in (0, n - 1) or (on_step is not None and (program.step_count + k) % every == 0)  # one stands
            plan.append((hyper(), [dict(g) for g in groups], copy.deepcopy(scheduler.state_dict()) if kept else None))

    def stand(k):
        """The param groups and the scheduler as a Python loop leaves them after k steps of this part."""
        if plan is None:
            return
        at = min(k, len(plan) - 1)
        while plan[at][2] is None:  # stopped by an exception between callbacks: replayed from the last kept
            at -= 1
        scheduler.load_state_dict(copy.deepcopy(plan[at][2]))
        for g, values in zip(groups, plan[at][1]):
            g.update(values)
        for _ in range(at, k):
            scheduler.step()

    schedule = [row[0] for row in plan] if plan else None
    lrs = [[t[0] for t in row] for row in schedule] if schedule else [[g["lr"] for g in groups]]
    stand(0)

    def lr_at(steps):
        return lrs[min(steps, len(lrs)) - 1][0]

    def progress(steps, loss, samples):
        if bar:
            bar.update(done[2] + steps - bar.count, loss=loss, lr=lr_at(steps),
                       img_s=(done[1] + samples) / max(time.perf_counter() - start, 1e-9))

    first_step = program.step_count
    # the step a callback last saw, whether it changed the optimizer or scheduler, and whether it asked to stop
    standing = [None, False, False]

    def step(steps, loss, grad_norm, tally):
        nonlocal first_step
        program.step_count = first_step + steps  # as a callback reading the program expects it
        stand(steps)
        loader._tally = add_tallies(done[0], tally)  # the epoch's so far, which a checkpoint saved now keeps
        before = hyper(), scheduler.state_dict() if scheduler is not None else None
        stop = on_step(program.step_count, loss, lr_at(steps), grad_norm)
        if not stop:  # what the callback changed that the compiled step cannot follow (a layer unfrozen): refused
            program._check_compiled()  # at the next step, as a Python loop's train_step refuses it
        moved = program.step_count != first_step + steps  # the callback set the count (ft.load of a checkpoint)
        first_step = program.step_count - steps
        changed = (hyper(), scheduler.state_dict() if scheduler is not None else None) != before or moved
        standing[:] = steps, changed, bool(stop)
        return stop or changed

    def settle(steps, skipped):
        """The program's counts, the scheduler and the optimizer as they stand after the steps that ran (again the
        same, should a Ctrl-C interrupt it and the handler settle once more)."""
        program.step_count = first_step + steps
        program.skipped_steps = skipped_before + skipped
        if ema is not None:
            ema.num_updates = updates_before + steps
        if standing[0] != steps:  # else as the callback at that step left them
            stand(steps)
        if schedule is not None:
            optimizer._pushed = list(schedule[steps - 1] if steps else schedule[0])  # what C holds now

    if ema is not None:
        ema._follow()
    calls, skipped_before = program._c.fit_record[0], program.skipped_steps
    updates_before = ema.num_updates if ema is not None else 0
    try:
        tally, samples, steps, skipped, stopped = program._c.fit_epoch(
            loader, optimizer, schedule, progress, 0.25, program.clip_grad_norm, program.nan_policy,
            step if on_step else None, every, first_step, ema._c if ema is not None else None,
            ema.decay if ema is not None else 0.0)
        settle(steps, skipped)
    except BaseException as e:  # a callback's exception, Ctrl-C, a bad batch: the steps before it were applied
        now, steps, skipped, tally = program._c.fit_record
        if now != calls:  # the call ran (Ctrl-C may come as its result reaches Python, or during settle)
            settle(steps, skipped)
            loader._resume = True  # the next pass (or fit) goes on after them, past a bad batch too
        e._ft_tally = add_tallies(done[0], tally if now != calls else NO_TALLY)  # the epoch's so far
        raise
    asked = stopped and standing[0] == steps and standing[2]
    # a change at the epoch's last step leaves nothing to go on with: the epoch ends as any does
    changed = stopped and not asked and standing[:2] == [steps, True] and loader._position()[1] < len(loader)
    if bar:
        bar.update(done[2] + steps - bar.count)
    return tally, samples, steps, lr_at(max(steps, 1)), asked, changed


def _check_labels(program, data, what):
    """Fails before any step where (x, y) arrays give class labels to a program whose loss takes class
    probabilities (a soft-target loss, validated on labels as timm does), saying how to validate on them."""
    if not (isinstance(data, tuple) and len(data) == 2) or program.target_dtype is None or \
            isinstance(program.target_dtype, tuple) or not program.target_dtype.is_floating_point:
        return
    y = data[1] if hasattr(data[1], "dtype") and hasattr(data[1], "shape") else np.asarray(data[1])
    floating = y.dtype.kind == "f" if isinstance(y.dtype, np.dtype) else y.dtype.is_floating_point  # or a tensor's
    if not floating and tuple(y.shape[1:]) != tuple(program.target_shape):
        raise TypeError(f"{what} are class labels, but the program's loss takes float targets of shape "
                        f"{tuple(program.target_shape)} (class probabilities): to validate on labels, compile the "
                        "model a second time with nn.CrossEntropyLoss() (both programs train and read the same "
                        "weights) and ft.evaluate that one in an epoch callback or after fit")


def _stops(returned):
    """Whether a callback's return asks fit to stop: True only (a lambda returning what it appended, a tuple or a
    list, would stop training silently)."""
    return returned is True or isinstance(returned, np.bool_) and bool(returned)


def _epoch_done(loader, epoch):
    """Whether a kept loader's position is past the epoch's steps: at its end, or at the next epoch's start (where
    the C epoch leaves it once it read the end)."""
    at, batch = loader._position()
    return at > epoch or batch >= len(loader)


def _validate(program, val_loader, tta_flip):
    program.model.eval()
    try:
        return evaluate(program, val_loader, tta_flip)
    finally:
        program._train_modes()  # as compile found them: a train_step after fit runs as fit's steps did


def fit(program: Program, loader: Iterable[Any], epochs: int = 1, *, val_loader: Iterable[Any] | None = None,
        scheduler: LRScheduler | ReduceLROnPlateau | None = None, scheduler_interval: str | None = None,
        tta_flip: bool = False, progress: bool = True,
        callbacks: Sequence[Callable[[int, Mapping[str, Any]], Any]] = (), stream: TextIO | None = None,
        batch_size: int | None = None, drop_last: bool = False,
        step_callbacks: Sequence[Callable[[int, Mapping[str, Any]], Any]] = (),
        every_n_steps: int = 1, ema: EMA | None = None) -> History:
    """Trains `program` for `epochs` passes over `loader` (batches of (images, labels)), or over (x, y) arrays
    (NumPy arrays or CPU tensors: uint8 images or floating-point features, see ft.data.from_arrays) in shuffled
    batches of `batch_size` (the program's by default; drop_last=True leaves out a last batch short of it, which
    a batch norm of one value per channel cannot normalize when it has one sample), made by a Loader seeded from
    the global seed. Returns the history, a dict (ft.History, which adds plot()) of per-epoch lists of
    train_loss, train_accuracy, val_loss, val_accuracy, lr, seconds and images_per_second. train_accuracy (None
    unless the model classifies) counts the argmax of the logits of each training step's own forward, in
    training mode (dropout on, batch statistics), as the weights stood before that step's update; under
    ft.distributed it is this rank's.

    progress: a progress bar per epoch that ends in one final line, written to `stream` (sys.stdout by default);
    in a Jupyter notebook with ipywidgets the bar on the notebook's own output is a widget that becomes that line.
    Under ft.distributed only rank 0 shows it.

    scheduler: an ft.optim.lr_scheduler stepped after every batch (scheduler_interval="step") or every epoch
    ("epoch"); by default as PyTorch's documentation steps each: OneCycleLR and CyclicLR (whose lengths count
    batches) after every batch, the others (StepLR, CosineAnnealingLR(T_max=epochs), ...) after every epoch, as
    Lightning's default interval; a per-step warmup (a LambdaLR of the step) needs scheduler_interval="step". A
    ReduceLROnPlateau is stepped after every epoch with the metric it watches, as Lightning's monitor="val_loss":
    in mode "min" the epoch's val_loss (train_loss without val_loader), in mode "max" its val_accuracy
    (train_accuracy).
    callbacks: functions called as cb(epoch, metrics) after each epoch, epoch being metrics["epoch"] (counted
    from 1); one returning True (itself, not any truthy value) stops training.
    step_callbacks: functions called as cb(step, metrics) after every `every_n_steps`-th optimizer step of the
    program (step counted from 1 over the program's life, and on from the last one's in a model compiled again
    with its optimizer; program.step_count), metrics holding "step",
    "epoch", "loss" (that step's), "lr" (the first group's, for that step) and "grad_norm" (its gradient norm
    before clipping, program.last_grad_norm);
    one returning True stops training after that step. A fasttrain Loader's epoch stays in C between them; a step
    callback sees the optimizer's param_groups and the scheduler as a Python loop leaves them after its step, what
    it changes there applies from the next step, and ft.save(..., scheduler=, loader=) called in it saves that
    step's position (at an epoch's last step, before that epoch's scheduler step, which a fit resumed from it
    takes first).
    val_loader may be (x, y) arrays too (in batches of the program's size).
    ema: an ft.optim.EMA of the weights, updated after every optimizer step (in the C epoch of a fasttrain Loader,
    with no Python per step), as a loop calling ema.update() after each step (timm's ModelEmaV2) updates it.

    A fasttrain Loader says which epoch runs (its shuffle order and augmentations): its own count of epochs
    done, or the position ft.load restored, whose epoch is finished first. So fit(1) twice is fit(2), and a
    resumed run equals an uninterrupted one; after a step callback stopped training (or an exception, Ctrl-C), the
    next fit goes on from the step where it stopped, as does a pass over the loader by hand, and the next fit then
    goes on from where that pass left it. An epoch stopped by an exception at its last step leaves its end (the
    epoch's scheduler step, a plateau's validation) to the next fit."""
    from .optim.ema import EMA
    from .optim.lr_scheduler import CyclicLR, OneCycleLR, ReduceLROnPlateau
    if ema is not None and not isinstance(ema, EMA):
        raise TypeError(f"fit: ema must be an ft.optim.EMA, got {type(ema).__name__}")
    if scheduler_interval is None:
        scheduler_interval = "step" if isinstance(scheduler, (OneCycleLR, CyclicLR)) else "epoch"
    if scheduler_interval not in ("step", "epoch"):
        raise ValueError("scheduler_interval must be 'step', 'epoch' or None (the scheduler's own)")
    if isinstance(every_n_steps, bool) or not isinstance(every_n_steps, int) or every_n_steps < 1:
        raise ValueError(f"every_n_steps must be a positive int, got {every_n_steps!r}")
    for name, given in (("callbacks", callbacks), ("step_callbacks", step_callbacks)):  # before any step
        if callable(given) or not isinstance(given, (list, tuple)) or not all(map(callable, given)):
            raise TypeError(f"fit: {name} must be a list of functions, got {given!r}"
                            + (f" (give [{getattr(given, '__name__', 'fn')}])" if callable(given) else ""))
    if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 0:
        raise ValueError(f"epochs must be an int >= 0, got {epochs!r}")
    if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1):
        raise ValueError(f"batch_size must be a positive int (or None for the program's), got {batch_size!r}")
    if scheduler is not None and getattr(scheduler, "optimizer", None) is not program.optimizer:
        raise ValueError(f"fit: the scheduler ({type(scheduler).__name__}) is not one of the program's optimizer, "
                         "whose learning rate it would not set")
    plateau = scheduler if isinstance(scheduler, ReduceLROnPlateau) else None
    if plateau is not None:
        if plateau.mode == "max" and not program.classifies:
            raise ValueError("fit: a ReduceLROnPlateau in mode 'max' watches the accuracy, which this program (no "
                             "classifier of class targets) has none of: use mode='min', which watches the loss")
        scheduler = None  # stepped by the epoch's metric, after validation
    loader = _as_loader(program, loader, batch_size, True, drop_last)
    if val_loader is not None:
        program._check_evaluable()
        _check_labels(program, val_loader, "fit: val_loader's targets")
        val_loader = _as_loader(program, val_loader, None, False)
        if epochs > 1 and isinstance(val_loader, collections.abc.Iterator):
            raise TypeError(f"fit: val_loader is a {type(val_loader).__name__}, used up after one pass, and each of "
                            f"the {epochs} epochs evaluates it: give a list, a Loader or (x, y) arrays")
    for fed in (loader, val_loader):  # before any step: a validation loader that cannot feed the program too
        if _is_c_loader(fed):
            program._c._check_loader()
    batches = loader._indices if isinstance(loader, _InputBatches) else loader
    if _is_c_loader(batches):  # before any step: a batch, or the epoch's last, that leaves one sample to a norm
        full = min(batches.batch_size, batches.num_samples)
        program._check_split(full)
        program._warn_split(full, 2)
        if not batches.drop_last and batches.num_samples % batches.batch_size:
            program._check_split(batches.num_samples % batches.batch_size)
    history = History((k, []) for k in ("epoch", "train_loss", "train_accuracy", "val_loss", "val_accuracy", "lr",
                                        "seconds", "images_per_second", "skipped_steps", "loss_scale"))
    c_loader = _is_c_loader(loader)
    kept = c_loader or isinstance(loader, _InputBatches)  # keeps its epoch, and the position a stop left
    if kept:  # ft.save of the program says when it does not keep this loader's position
        program.__dict__["_fitted_loader"] = weakref.ref(loader)
    from . import distributed
    if program.distributed and c_loader and loader.world_size != distributed.get_world_size():
        raise ValueError(f"fit: the Loader shards its samples over {loader.world_size} rank(s), the program trains "
                         f"on {distributed.get_world_size()}: a Loader built before ft.distributed.init() is not "
                         "sharded, and every rank would train on every sample; build it after init()")
    progress = progress and distributed.get_rank() == 0
    if epochs and hasattr(loader, "__len__") and not len(loader):  # rather than epochs of NaN losses
        warnings.warn("fit: the loader has no batches (an empty list, or fewer samples than one batch with "
                      "drop_last=True), so nothing trains", stacklevel=2)
        return history
    for count in range(epochs):
        program._train_modes()
        program._check_compiled()
        skipped_before_epoch = program.skipped_steps
        resumed = NO_TALLY  # the tally of the epoch's steps a stopped fit ran
        if kept:
            # the loader's position says where to go on: after a finished epoch the next one's start, which is
            # ahead of loader.epoch when Ctrl-C came between an epoch's end and fit's bookkeeping; where a stopped
            # (or restored) run left it, to be finished; else its epoch, started over
            epoch, batch = loader._position()
            if loader._resume and batch < len(loader):
                # finish the restored epoch from its position: the C epoch starts there, a pass in Python (iter)
                # takes the position up itself
                loader._resume = not c_loader
                resumed = loader._tally or NO_TALLY
            else:
                if batch >= len(loader):  # the epoch's steps are done: the next one
                    epoch += 1
                if loader._resume and batch >= len(loader):
                    # a position restored at an epoch's end (ft.save in a step callback at its last step): the
                    # epoch's steps ran, its end did not
                    if scheduler is not None and scheduler_interval == "epoch":
                        scheduler.step()
                    if plateau is not None:
                        if val_loader is not None:
                            watched = _validate(program, val_loader, tta_flip)
                        elif loader._tally is not None:  # the epoch's training metrics, kept with the position
                            watched = tally_means(loader._tally, program)
                        else:
                            watched = None
                            warnings.warn(f"fit: the loader's position is the end of epoch {epoch}, whose "
                                          "ReduceLROnPlateau step watches that epoch's training metrics, which "
                                          "were not kept: it is not taken (give a val_loader to watch its "
                                          "metrics, or save after fit returns)", stacklevel=2)
                        if watched is not None:
                            plateau.step(watched[0] if plateau.mode == "min" else watched[1])
                loader.set_epoch(epoch)
        else:
            epoch = count
            if hasattr(loader, "set_epoch"):
                loader.set_epoch(epoch)
        total = len(loader) if hasattr(loader, "__len__") else None  # a generator's is unknown
        bar = ProgressBar(total, f"epoch {epoch + 1} ({count + 1}/{epochs})", stream=stream) if progress else None
        start = time.perf_counter()
        tally, samples, lr, stopped = resumed, 0, _lr(program.optimizer), False

        def on_step(step, loss, lr, grad_norm):
            metrics = {"step": step, "epoch": epoch + 1, "loss": loss, "lr": lr, "grad_norm": grad_norm}
            return any(_stops(cb(step, metrics)) for cb in step_callbacks)

        try:
            if _is_c_loader(loader):
                tally, samples, lr, stopped = _fit_epoch_in_c(
                    program, loader, scheduler, scheduler_interval, bar, start, on_step if step_callbacks else None,
                    every_n_steps, resumed, ema)
            else:
                for step, batch in enumerate(loader):
                    lr = _lr(program.optimizer)
                    skipped_before = program.skipped_steps
                    try:
                        x, y = _split(program, batch)
                        loss, step_tally = program._step(x, y)
                        if ema is not None:
                            ema.update()
                    except (ValueError, TypeError, IndexError, RuntimeError) as e:  # say where it happened
                        raise type(e)(f"epoch {epoch + 1}, step {step + 1}: {e}") from e
                    n = len(y)
                    if program.skipped_steps == skipped_before:  # a skipped step's loss is not finite
                        tally = add_tallies(tally, step_tally)
                    samples += n
                    if scheduler is not None and scheduler_interval == "step":
                        scheduler.step()
                    if bar:
                        bar.update(1, loss=loss, lr=lr, img_s=samples / max(time.perf_counter() - start, 1e-9))
                    if kept:
                        loader._tally = tally  # the epoch's so far, which a checkpoint saved in a callback keeps
                    if step_callbacks and program.step_count % every_n_steps == 0 and \
                            on_step(program.step_count, loss, lr, program.last_grad_norm):
                        stopped = True
                        break
                if not samples:  # said, and no epoch of NaN in the history
                    warnings.warn(f"fit: epoch {epoch + 1} got no batches, so training stops there (a generator or "
                                  "iterator is used up after one pass: give a list, a Loader or (x, y) arrays to "
                                  "train several epochs)", stacklevel=2)
                    if bar:
                        bar.close()
                    break
        except BaseException as e:  # a callback's, Ctrl-C, a bad batch
            if kept and not getattr(loader, "closed", False):  # the next fit goes on after the steps that ran
                if _epoch_done(loader, epoch):
                    # they were the whole epoch: its end (scheduler steps, a plateau's validation) is the next
                    # fit's to run, as after a checkpoint saved at its last step
                    loader._seek(epoch, len(loader))
                    loader.epoch = epoch + 1  # whose batches are done
                loader._resume = True
                loader._tally = getattr(e, "_ft_tally", tally) if c_loader else tally
            if type(e) in (ValueError, TypeError, IndexError, RuntimeError) and str(e).startswith("step "):
                raise type(e)(f"epoch {epoch + 1}, {e}") from e  # the C epoch's own, which says the step
            raise
        seconds = time.perf_counter() - start
        # an epoch is over at its last step, a stop there included (the next fit, and a checkpoint saved now, start
        # the following epoch); a stop before it leaves the position where the next fit goes on
        over = not stopped or (kept and _epoch_done(loader, epoch))
        if kept:
            if over and stopped:
                loader.set_epoch(epoch + 1)
            elif stopped:
                loader._resume, loader._tally = True, tally
            else:
                loader.epoch, loader._tally = epoch + 1, None
        if scheduler is not None and scheduler_interval == "epoch" and over:
            scheduler.step()
        # the loss and accuracy of the epoch's steps, a stopped fit's before this one included (a skipped step's
        # loss is not finite; NaN when none ran); the speed of this fit's
        train_loss, train_accuracy = tally_means(tally, program)
        metrics = {"epoch": epoch + 1, "train_loss": train_loss, "lr": lr, "seconds": seconds,
                   "train_accuracy": train_accuracy,
                   "images_per_second": samples / seconds if seconds > 0 else 0.0,
                   "val_loss": None, "val_accuracy": None,
                   "skipped_steps": program.skipped_steps - skipped_before_epoch,
                   "loss_scale": program.grad_scaler.get_scale() if program.grad_scaler is not None else None}
        if val_loader is not None:
            metrics["val_loss"], metrics["val_accuracy"] = _validate(program, val_loader, tta_flip)
        if plateau is not None and over:
            watched = ("val_" if val_loader is not None else "train_") + ("loss" if plateau.mode == "min" else
                                                                          "accuracy")
            plateau.step(metrics[watched])
        if bar:
            shown = {"loss": metrics["train_loss"], "lr": metrics["lr"], "img_s": metrics["images_per_second"]}
            if metrics["val_accuracy"] is not None:
                shown["val_acc"] = metrics["val_accuracy"]
            bar.close(**shown)
        for k in history:
            history[k].append(metrics[k])
        if any(_stops(cb(metrics["epoch"], metrics)) for cb in callbacks) or stopped:
            break
    return history
