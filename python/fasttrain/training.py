"""ft.fit: the epoch loop around a compiled program, with a progress bar,
per-epoch metrics, learning-rate schedules and callbacks."""
from __future__ import annotations

import time
from typing import TYPE_CHECKING

from .history import History
from .progress import ProgressBar

if TYPE_CHECKING:
    from typing import Any, Callable, Iterable, Mapping, Sequence, TextIO

    from .nn.program import Program
    from .optim.lr_scheduler import LRScheduler


def _lr(optimizer):
    return optimizer.param_groups[0]["lr"]


def _is_c_loader(loader):
    from .data import Loader
    return isinstance(loader, Loader)


def evaluate(program: Program, loader: Iterable[Any], tta_flip: bool = False) -> tuple[float, float | None]:
    """(mean loss, accuracy) of the program over a loader, in eval mode. With tta_flip the logits of each image
    and of its horizontal mirror are averaged (test-time augmentation). A fasttrain loader runs entirely in C."""
    if _is_c_loader(loader):
        # The whole split, wherever an earlier iteration (or a restored state) left the loader.
        loader.set_epoch(loader.epoch)
        loss_sum, correct, count = program._c.eval_epoch(loader, tta_flip)
    else:
        loss_sum, correct, count = 0.0, 0, 0
        for x, y in loader:
            s, c = program._c.evaluate(*program._batch(x, y), tta_flip)
            loss_sum, correct, count = loss_sum + s, correct + c, count + len(y)
    if program.distributed:  # every rank evaluated its shard: the whole split's figures
        from . import distributed
        from .creation import tensor
        loss_sum, correct, count = distributed.all_reduce(tensor([loss_sum, correct, count], dtype="float64")).tolist()
    if count == 0:
        raise ValueError("evaluate: the loader gave no samples")
    return loss_sum / count, correct / count if program.classifies else None


def _fit_epoch_in_c(program, loader, scheduler, interval, bar, start):
    """One epoch (or what is left of it, after a restored position) in C: every step's hyperparameters (the
    learning rate, and the momentum or betas a scheduler cycles) are computed up front by stepping the scheduler,
    and Python runs only for the progress bar. Returns (loss sum, samples, last lr)."""
    optimizer = program.optimizer
    groups = optimizer.param_groups

    def hyper():
        return [optimizer._group_tuple(g, i) for i, g in enumerate(groups)]

    schedule = None
    if scheduler is not None and interval == "step":
        # The scheduler's last step of the epoch waits until the epoch is done, so that the optimizer starts the
        # epoch with its first step's values and never sees one from beyond the schedule's end.
        steps = len(loader) - loader._position()[1]
        first = [dict(g) for g in groups]
        schedule = [hyper()]
        for _ in range(steps - 1):
            scheduler.step()
            schedule.append(hyper())
        last = [dict(g) for g in groups]
        for g, saved in zip(groups, first):
            g.update(saved)
    lrs = [[t[0] for t in row] for row in schedule] if schedule else [[g["lr"] for g in groups]]

    def progress(steps, loss, samples):
        if bar:
            bar.update(steps - bar.count, loss=loss, lr=lrs[min(steps, len(lrs)) - 1][0],
                       img_s=samples / max(time.perf_counter() - start, 1e-9))

    loss_sum, samples, steps, skipped, _ = program._c.fit_epoch(loader, optimizer, schedule, progress, 0.25,
                                                                program.clip_grad_norm, program.nan_policy)
    program.step_count += steps
    program.skipped_steps += skipped
    if schedule is not None:
        for g, saved in zip(groups, last):
            g.update(saved)
        optimizer._pushed = list(schedule[steps - 1] if steps else schedule[0])  # what C holds now
        scheduler.step()
    if bar:
        bar.update(steps - bar.count)
    return loss_sum, samples, lrs[-1][0]


def fit(program: Program, loader: Iterable[Any], epochs: int = 1, *, val_loader: Iterable[Any] | None = None,
        scheduler: LRScheduler | None = None, scheduler_interval: str = "step", tta_flip: bool = False,
        progress: bool = True, callbacks: Sequence[Callable[[int, Mapping[str, Any]], Any]] = (),
        stream: TextIO | None = None) -> History:
    """Trains `program` for `epochs` passes over `loader` (batches of (images, labels)). Returns the history, a
    dict (ft.History, which adds plot()) of per-epoch lists of train_loss, val_loss, val_accuracy, lr, seconds and
    images_per_second.

    progress: a progress bar per epoch that ends in one final line, written to `stream` (sys.stdout by default);
    in a Jupyter notebook with ipywidgets the bar on the notebook's own output is a widget that becomes that line.
    Under ft.distributed only rank 0 shows it.

    scheduler: an ft.optim.lr_scheduler stepped after every batch ("step") or every epoch ("epoch").
    callbacks: functions called as cb(epoch, metrics) after each epoch, epoch being metrics["epoch"] (counted
    from 1); one returning True stops training.

    A fasttrain Loader says which epoch runs (its shuffle order and augmentations): its own count of epochs
    done, or the position ft.load restored, whose epoch is finished first. So fit(1) twice is fit(2), and a
    resumed run equals an uninterrupted one."""
    if scheduler_interval not in ("step", "epoch"):
        raise ValueError("scheduler_interval must be 'step' or 'epoch'")
    history = History((k, []) for k in ("epoch", "train_loss", "val_loss", "val_accuracy", "lr", "seconds",
                                        "images_per_second"))
    c_loader = _is_c_loader(loader)
    from . import distributed
    progress = progress and distributed.get_rank() == 0
    for count in range(epochs):
        program.model.train()
        if c_loader:
            epoch = loader.epoch
            if loader._resume and loader._position()[1] < len(loader):
                loader._resume = False  # finish the restored epoch from its position
            else:
                if loader._resume:  # a position restored at an epoch's end: the next one
                    epoch += 1
                loader.set_epoch(epoch)
        else:
            epoch = count
            if hasattr(loader, "set_epoch"):
                loader.set_epoch(epoch)
        bar = ProgressBar(len(loader), f"epoch {epoch + 1} ({count + 1}/{epochs})", stream=stream) \
            if progress else None
        start = time.perf_counter()
        loss_sum, samples, lr = 0.0, 0, _lr(program.optimizer)
        if _is_c_loader(loader):
            loss_sum, samples, lr = _fit_epoch_in_c(program, loader, scheduler, scheduler_interval, bar, start)
        else:
            for step, (x, y) in enumerate(loader):
                lr = _lr(program.optimizer)
                skipped_before = program.skipped_steps
                try:
                    loss = program.train_step(x, y)
                except (ValueError, TypeError, IndexError, RuntimeError) as e:  # say where it happened
                    raise type(e)(f"epoch {epoch + 1}, step {step + 1}: {e}") from e
                n = len(y)
                if program.skipped_steps == skipped_before:  # a skipped step's loss is not finite
                    loss_sum += loss * n
                samples += n
                if scheduler is not None and scheduler_interval == "step":
                    scheduler.step()
                if bar:
                    bar.update(1, loss=loss, lr=lr, img_s=samples / max(time.perf_counter() - start, 1e-9))
        seconds = time.perf_counter() - start
        if c_loader:
            loader.epoch = epoch + 1
        if scheduler is not None and scheduler_interval == "epoch":
            scheduler.step()
        metrics = {"epoch": epoch + 1, "train_loss": loss_sum / max(samples, 1), "lr": lr, "seconds": seconds,
                   "images_per_second": samples / seconds if seconds > 0 else 0.0,
                   "val_loss": None, "val_accuracy": None}
        if val_loader is not None:
            program.model.eval()
            metrics["val_loss"], metrics["val_accuracy"] = evaluate(program, val_loader, tta_flip)
        if bar:
            shown = {"loss": metrics["train_loss"], "img_s": metrics["images_per_second"]}
            if metrics["val_accuracy"] is not None:
                shown["val_acc"] = metrics["val_accuracy"]
            bar.close(**shown)
        for k in history:
            history[k].append(metrics[k])
        if any(cb(metrics["epoch"], metrics) for cb in callbacks):
            break
    return history
