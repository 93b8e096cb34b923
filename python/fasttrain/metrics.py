"""ft.metrics: what training loops compute every epoch, on fasttrain tensors or NumPy arrays (computed with
NumPy on the host; CUDA tensors are copied there first)."""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np


def _host(x: Any, what: str) -> np.ndarray:
    try:
        return np.asarray(x.cpu() if hasattr(x, "cpu") else x)
    except (TypeError, ValueError) as e:
        raise TypeError(f"{what} must be a tensor or an array, got {type(x).__name__}: {e}") from None


def _labels(y: Any, n: int, classes: int | None) -> np.ndarray:
    y = _host(y, "target")
    if y.ndim != 1 or y.shape[0] != n:
        raise ValueError(f"target must be (N,) class indices for {n} samples, got shape {y.shape}")
    if y.dtype.kind not in "iu":
        raise TypeError(f"target must hold integer class indices, got {y.dtype}")
    if classes is not None and n and (y.min() < 0 or y.max() >= classes):
        bad = int(y[(y < 0) | (y >= classes)][0])
        raise ValueError(f"target holds class {bad}, outside [0, {classes})")
    return y


def accuracy(output: Any, target: Any, topk: int | Sequence[int] = 1) -> float | list[float]:
    """The fraction of samples whose class target is among the k highest scores of output (N, C), for k in
    topk: one float for an int topk, a list for a sequence (as torchvision's reference scripts compute it).
    Ties go to the lower class index, as argmax; NaN ranks above every number, as in torch.topk."""
    scores = _host(output, "output")
    if scores.ndim != 2:
        raise ValueError(f"output must be (N, C) scores, got shape {scores.shape}")
    n, classes = scores.shape
    y = _labels(target, n, classes)
    ks = [topk] if isinstance(topk, (int, np.integer)) else list(topk)
    if not ks or any(not 1 <= k <= classes for k in ks):
        raise ValueError(f"topk must be in [1, {classes}] (the number of classes), got {topk!r}")
    if n == 0:
        raise ValueError("accuracy of an empty batch is undefined")
    # rank of each target's score: classes scoring higher, and equal ones with a lower index, come first
    own = scores[np.arange(n), y][:, None]
    nan, own_nan = np.isnan(scores), np.isnan(own)
    higher = (scores > own) | (nan & ~own_nan)
    equal = (scores == own) | (nan & own_nan)
    rank = higher.sum(1) + (equal & (np.arange(classes) < y[:, None])).sum(1)
    result = [float((rank < k).mean()) for k in ks]
    return result[0] if isinstance(topk, (int, np.integer)) else result


def confusion_matrix(output: Any, target: Any, num_classes: int | None = None) -> np.ndarray:
    """(C, C) int64 counts: row t, column p counts the samples of class t predicted as p (scikit-learn's
    layout). output is (N, C) scores (the prediction is their argmax) or (N,) predicted classes;
    num_classes defaults to C of the scores, or one more than the largest class seen."""
    out = _host(output, "output")
    if out.ndim == 2:
        pred = out.argmax(1)
        num_classes = out.shape[1] if num_classes is None else num_classes
    elif out.ndim == 1 and out.dtype.kind in "iu":
        pred = out
    else:
        raise ValueError(f"output must be (N, C) scores or (N,) class indices, got shape {out.shape} "
                         f"of {out.dtype}")
    if num_classes is None:
        if not pred.size:
            raise ValueError("confusion_matrix of an empty batch needs num_classes")
        t = _host(target, "target")
        num_classes = max(int(pred.max()), int(t.max()) if t.size else -1) + 1  # -1: not in a uint8 array
    if not isinstance(num_classes, (int, np.integer)) or num_classes < 1:
        raise ValueError(f"num_classes must be a positive int, got {num_classes!r}")
    y = _labels(target, pred.shape[0], num_classes)
    if pred.size and (pred.min() < 0 or pred.max() >= num_classes):
        raise ValueError(f"the predictions hold a class outside [0, {num_classes})")
    cells = y.astype(np.int64) * num_classes + pred.astype(np.int64)  # not in a narrow label dtype
    return np.bincount(cells, minlength=num_classes * num_classes).reshape(num_classes, num_classes)


class RunningMean:
    """The mean of values added in batches: update(value, n) adds a batch's mean value over n samples; mean is
    the mean over every sample so far (sums in float64)."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Forgets every value."""
        self.total, self.count = 0.0, 0

    def update(self, value: Any, n: int = 1) -> None:
        """Adds a batch whose mean is value (one number) over n samples; a batch of none changes nothing."""
        v = _host(value, "value")
        if v.size != 1:
            raise ValueError(f"value must be one number, got shape {v.shape}")
        if not isinstance(n, (int, np.integer)) or n < 0:
            raise ValueError(f"n must be a count >= 0, got {n!r}")
        if n == 0:  # an empty batch's mean is nan and weighs nothing
            return
        self.total += float(v.reshape(-1)[0]) * n
        self.count += int(n)

    @property
    def mean(self) -> float:
        """The mean so far (nan before any sample)."""
        return self.total / self.count if self.count else float("nan")

    def __repr__(self) -> str:
        return f"RunningMean(mean={self.mean:.6g}, count={self.count})"
