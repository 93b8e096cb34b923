"""ft.metrics against references computed independently: a stable argsort for top-k, explicit loops for the
confusion matrix, and PyTorch's topk when it is installed."""
import numpy as np
import pytest

import fasttrain as ft


def topk_reference(scores, y, k):
    """Top-k by a stable sort on descending scores (ties: lower class first, as argmax)."""
    order = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    return float(np.mean([y[i] in order[i] for i in range(len(y))]))


@pytest.mark.parametrize("seed", range(3))
def test_accuracy_matches_a_sort(seed):
    rng = np.random.default_rng(seed)
    scores = rng.integers(0, 4, (200, 7)).astype(np.float32)  # many ties
    y = rng.integers(0, 7, 200)
    got = ft.metrics.accuracy(ft.tensor(scores), ft.tensor(y), topk=(1, 3, 7))
    assert got == [topk_reference(scores, y, k) for k in (1, 3, 7)]
    assert got[-1] == 1.0
    assert ft.metrics.accuracy(scores, y) == float((scores.argmax(1) == y).mean())  # NumPy in, and argmax's ties


def test_accuracy_matches_torch_topk():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(5)
    scores, y = rng.standard_normal((300, 10)).astype(np.float32), rng.integers(0, 10, 300)
    for k in (1, 5):
        hit = (torch.from_numpy(scores).topk(k, 1).indices == torch.from_numpy(y)[:, None]).any(1)
        assert ft.metrics.accuracy(scores, y, topk=k) == pytest.approx(hit.float().mean().item(), abs=1e-7)


def test_nan_scores_rank_first_as_in_torch_topk():
    scores = np.array([[np.nan, 1.0, 2.0], [0.5, np.nan, np.nan], [np.nan, np.nan, 0.0], [3.0, 1.0, 0.0]],
                      np.float32)
    y = np.array([1, 1, 2, 0])
    # torch.topk puts NaN above every number and, among NaNs, the lower index first
    want = {1: [False, True, False, True], 2: [False, True, False, True], 3: [True, True, True, True]}
    for k, hits in want.items():
        assert ft.metrics.accuracy(scores, y, topk=k) == np.mean(hits)
    torch = pytest.importorskip("torch")
    for k in (1, 2):
        hit = (torch.from_numpy(scores).topk(k, 1).indices == torch.from_numpy(y)[:, None]).any(1)
        assert ft.metrics.accuracy(scores, y, topk=k) == hit.float().mean().item()


def test_confusion_matrix_counts_each_pair():
    rng = np.random.default_rng(1)
    scores, y = rng.standard_normal((500, 4)).astype(np.float32), rng.integers(0, 4, 500)
    want = np.zeros((4, 4), np.int64)
    for t, p in zip(y, scores.argmax(1)):
        want[t, p] += 1
    np.testing.assert_array_equal(ft.metrics.confusion_matrix(ft.tensor(scores), ft.tensor(y)), want)
    np.testing.assert_array_equal(ft.metrics.confusion_matrix(scores.argmax(1), y, num_classes=4), want)
    assert ft.metrics.confusion_matrix(np.array([0, 2]), np.array([1, 2])).shape == (3, 3)


@pytest.mark.parametrize("dtype", ["int8", "uint8", "int16", "int32"])
def test_confusion_matrix_of_narrow_label_dtypes(dtype):
    classes = min(np.iinfo(dtype).max, 200)
    y = np.array([classes - 1, 3, 0, classes - 1], dtype)
    pred = np.array([classes - 1, classes - 2, 0, 1], dtype)
    got = ft.metrics.confusion_matrix(ft.tensor(pred), ft.tensor(y), classes)
    want = np.zeros((classes, classes), np.int64)
    for t, p in zip(y.astype(int), pred.astype(int)):
        want[t, p] += 1
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(ft.metrics.confusion_matrix(pred, y), want)  # the classes seen: all here


def test_running_mean_weights_batches_by_size():
    m = ft.metrics.RunningMean()
    assert np.isnan(m.mean)
    for value, n in ((1.0, 10), (ft.tensor(np.float32(4.0)), 30), (np.float64(0.5), 0)):
        m.update(value, n)
    assert m.mean == pytest.approx((1.0 * 10 + 4.0 * 30) / 40) and m.count == 40
    m.update(ft.zeros(0).mean(), 0)  # an empty batch: its mean is nan and weighs nothing
    m.update(ft.tensor([4.0]), 40)  # a one-element loss
    assert m.mean == pytest.approx((1.0 * 10 + 4.0 * 70) / 80) and m.count == 80
    m.reset()
    assert m.count == 0


def test_bad_input():
    s, y = np.zeros((4, 3), np.float32), np.array([0, 1, 2, 0])
    with pytest.raises(ValueError, match=r"topk must be in \[1, 3\]"):
        ft.metrics.accuracy(s, y, topk=(1, 4))
    with pytest.raises(ValueError, match=r"target must be \(N,\) class indices for 4 samples"):
        ft.metrics.accuracy(s, y[:3])
    with pytest.raises(ValueError, match=r"target holds class 3, outside \[0, 3\)"):
        ft.metrics.accuracy(s, np.array([0, 1, 3, 0]))
    with pytest.raises(TypeError, match="integer class indices"):
        ft.metrics.accuracy(s, y.astype(np.float32))
    with pytest.raises(ValueError, match=r"output must be \(N, C\) scores"):
        ft.metrics.accuracy(s[0], y)
    with pytest.raises(ValueError, match="empty batch"):
        ft.metrics.accuracy(np.zeros((0, 3), np.float32), np.zeros(0, np.int64))
    with pytest.raises(ValueError, match=r"predictions hold a class outside \[0, 2\)"):
        ft.metrics.confusion_matrix(np.array([0, 2]), np.array([0, 1]), num_classes=2)
    with pytest.raises(ValueError, match="n must be a count"):
        ft.metrics.RunningMean().update(1.0, -1)
    with pytest.raises(ValueError, match=r"value must be one number, got shape \(2,\)"):
        ft.metrics.RunningMean().update(ft.tensor([1.0, 2.0]), 2)
    with pytest.raises(ValueError, match="empty batch needs num_classes"):
        ft.metrics.confusion_matrix(np.zeros(0, np.int64), np.zeros(0, np.int64))
