"""ft.fit: the epoch loop around a compiled program, with a progress bar,
per-epoch metrics, learning-rate schedules and callbacks."""
import time

from .progress import ProgressBar


def _lr(optimizer):
    return optimizer.param_groups[0]["lr"]


def evaluate(program, loader, tta_flip=False):
    """(mean loss, accuracy) of the program over a loader, in eval mode. With tta_flip the logits of each image
    and its horizontal mirror are averaged (test-time augmentation)."""
    loss_sum, correct, count = 0.0, 0, 0
    for x, y in loader:
        n = len(y)
        if tta_flip:
            import numpy as np
            logits = program.predict(x).numpy() + program.predict(x[..., ::-1].contiguous()).numpy()
            labels = y.numpy() if hasattr(y, "numpy") else np.asarray(y)
            correct += int((logits.argmax(1) == labels).sum())
            # the loss of the averaged logits is not defined by the program: report the plain one
            loss_sum += program.evaluate(x, y)[0] * n
        else:
            loss, acc = program.evaluate(x, y)
            loss_sum += loss * n
            correct += round(acc * n)
        count += n
    if count == 0:
        raise ValueError("evaluate: the loader gave no samples")
    return loss_sum / count, correct / count


def fit(program, loader, epochs=1, *, val_loader=None, scheduler=None, scheduler_interval="step", tta_flip=False,
        progress=True, callbacks=(), stream=None):
    """Trains `program` for `epochs` passes over `loader` (batches of (images, labels)). Returns the history:
    per-epoch lists of train_loss, val_loss, val_accuracy, lr, seconds and images_per_second.

    scheduler: an ft.optim.lr_scheduler stepped after every batch ("step") or every epoch ("epoch").
    callbacks: functions called as cb(epoch, metrics) after each epoch; one returning True stops training."""
    if scheduler_interval not in ("step", "epoch"):
        raise ValueError("scheduler_interval must be 'step' or 'epoch'")
    history = {k: [] for k in ("epoch", "train_loss", "val_loss", "val_accuracy", "lr", "seconds",
                               "images_per_second")}
    for epoch in range(epochs):
        program.model.train()
        if hasattr(loader, "set_epoch"):
            loader.set_epoch(epoch)
        bar = ProgressBar(len(loader), f"epoch {epoch + 1}/{epochs}", stream=stream) if progress else None
        start = time.perf_counter()
        loss_sum, samples, lr = 0.0, 0, _lr(program.optimizer)
        for x, y in loader:
            lr = _lr(program.optimizer)
            loss = program.train_step(x, y)
            n = len(y)
            loss_sum += loss * n
            samples += n
            if scheduler is not None and scheduler_interval == "step":
                scheduler.step()
            if bar:
                bar.update(1, loss=loss, lr=lr, img_s=samples / max(time.perf_counter() - start, 1e-9))
        seconds = time.perf_counter() - start
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
        if any(cb(epoch, metrics) for cb in callbacks):
            break
    return history
