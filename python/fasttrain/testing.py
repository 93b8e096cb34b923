"""Helpers for tests of code that uses fasttrain, as torch.testing gives for PyTorch:
assert_close, make_tensor and gradcheck (docs/testing.md)."""
import math

import numpy as np

from ._C import TensorBase
from ._math import largest_finite
from ._tensor import _sizes
from ._types import _BY_NAME, as_dtype
from .creation import empty, from_numpy
from .random import Generator, randint

# (rtol, atol) of a comparison by dtype, torch.testing's defaults; integers and bool compare exactly.
_TOLERANCES = {"float16": (1e-3, 1e-5), "bfloat16": (1.6e-2, 1e-5), "float32": (1.3e-6, 1e-5),
               "float64": (1e-7, 1e-7), "complex64": (1.3e-6, 1e-5), "complex128": (1e-7, 1e-7)}


def _is_torch(x):
    """Whether x is a PyTorch tensor (read without importing torch)."""
    return hasattr(x, "detach") and hasattr(x, "dtype") and not isinstance(x, TensorBase)


def _values(x):
    """(values as a NumPy array, fasttrain dtype or None for a Python scalar or list that carries none)."""
    if isinstance(x, TensorBase):
        return np.asarray(x), x.dtype  # bfloat16 and CUDA tensors arrive as float32 host copies
    if isinstance(x, (np.ndarray, np.generic)):
        return np.asarray(x), as_dtype(x.dtype)
    if _is_torch(x):  # tracking gradients, on a GPU, bfloat16
        name = str(x.dtype).rpartition(".")[2]
        x = x.detach().cpu()
        return (x.float() if name == "bfloat16" else x).numpy(), as_dtype(name)
    try:
        return np.asarray(x), None
    except ValueError as e:  # ragged nested lists
        raise TypeError(f"assert_close: cannot compare {type(x).__name__} values: {e}") from None


def _length(x):
    return len(x) if isinstance(x, (list, tuple)) else f"(a {type(x).__name__})"


def _item(x, y, where, options):
    """assert_close of one item of a sequence or mapping, its failure naming the item."""
    try:
        assert_close(x, y, **options)
    except AssertionError as e:
        raise AssertionError(f"The failure occurred for {where}: {e}") from None


def _index(flat, shape):
    return tuple(int(i) for i in np.unravel_index(flat, shape)) if shape else ()


def _holds_arrays(x):
    """Whether a list or tuple holds tensors or arrays (at any depth): compared item by item, not as one array."""
    return isinstance(x, (list, tuple)) and any(
        isinstance(v, (TensorBase, np.ndarray, dict)) or _is_torch(v) or v is None or _holds_arrays(v) for v in x)


def assert_close(actual, expected, *, rtol=None, atol=None, equal_nan=False, check_device=True, check_dtype=True,
                 msg=None):
    """Raises AssertionError unless actual and expected (fasttrain tensors, NumPy arrays, scalars or nested
    lists) have the same shape and dtype and |actual - expected| <= atol + rtol * |expected| everywhere.
    Sequences of tensors and mappings (a state_dict) compare item by item, each at its own dtype's tolerances,
    as torch.testing.assert_close; None equals only None.

    Without rtol and atol the tolerances follow the dtype as in torch.testing.assert_close (float32: 1.3e-6 and
    1e-5; integers and bool: exact); with check_dtype=False (or a scalar or list, which carries no dtype) the
    looser of the two dtypes' tolerances applies. NaNs compare equal only with equal_nan=True. Two tensors on
    different devices fail unless check_device=False. msg replaces the report, or, when callable, is called with it
    and returns the message."""
    if (rtol is None) != (atol is None):
        raise ValueError("assert_close: give both rtol and atol, or neither (for the dtype's defaults)")
    options = dict(rtol=rtol, atol=atol, equal_nan=equal_nan, check_device=check_device, check_dtype=check_dtype,
                   msg=msg)
    if actual is None or expected is None:
        if actual is not expected:
            raise AssertionError(f"None mismatch: {actual!r} is not {expected!r}")
        return
    if isinstance(actual, dict) or isinstance(expected, dict):
        if not (isinstance(actual, dict) and isinstance(expected, dict)):
            raise AssertionError(f"Cannot compare {type(actual).__name__} with {type(expected).__name__}")
        if actual.keys() != expected.keys():
            raise AssertionError(f"The mappings' keys do not match: {sorted(map(str, actual))} != "
                                 f"{sorted(map(str, expected))}")
        for key in actual:
            _item(actual[key], expected[key], f"item [{key!r}]", options)
        return
    if _holds_arrays(actual) or _holds_arrays(expected):
        if not isinstance(actual, (list, tuple)) or not isinstance(expected, (list, tuple)) or \
                len(actual) != len(expected):
            raise AssertionError(f"The sequences do not match: lengths {_length(actual)} != {_length(expected)}")
        for i, (x, y) in enumerate(zip(actual, expected)):
            _item(x, y, f"item [{i}]", options)
        return
    a, a_dtype = _values(actual)
    e, e_dtype = _values(expected)

    def fail(report):
        raise AssertionError(msg(report) if callable(msg) else msg or report)

    if check_device and all(isinstance(v, TensorBase) for v in (actual, expected)) and \
            actual.device != expected.device:
        fail(f"The values are on different devices: {actual.device} and {expected.device}.")
    if a.shape != e.shape:
        fail(f"The shapes do not match: {a.shape} != {e.shape}.")
    if check_dtype and a_dtype is not None and e_dtype is not None and a_dtype is not e_dtype:
        fail(f"The dtypes do not match: {a_dtype} != {e_dtype}.")
    dtypes = [d.name for d in (a_dtype, e_dtype) if d is not None] or [
        "float64" if v.dtype.kind in "fc" else v.dtype.name for v in (a, e)]
    exact = rtol is None and not any(name in _TOLERANCES for name in dtypes)
    if rtol is None:
        rtol, atol = (0.0, 0.0) if exact else max(_TOLERANCES.get(name, (0.0, 0.0)) for name in dtypes)
    shape, a, e = a.shape, a.reshape(-1), e.reshape(-1)  # 1-d: scalars too take item assignment
    integers = exact and a.dtype.kind in "biu" and e.dtype.kind in "biu"
    if integers:
        close = a == e  # in the integers themselves: int64 values beyond 2**53 stay exact
    else:
        a64, e64 = (v.astype(np.complex128 if v.dtype.kind == "c" else np.float64) for v in (a, e))
        close = np.isclose(a64, e64, rtol=rtol, atol=atol, equal_nan=equal_nan)
    mismatched = int(np.size(close) - np.count_nonzero(close))
    if not mismatched:
        return
    if integers:  # as Python integers: exact for any int64 and uint64 values
        diff = np.zeros(a.size)
        diff[~close] = [abs(int(x) - int(y)) for x, y in zip(a[~close], e[~close])]
    else:
        with np.errstate(invalid="ignore"):  # inf - inf
            diff = np.abs(a64 - e64)
        diff[a64 == e64] = 0
    nans = np.flatnonzero(np.isnan(diff) & ~close)  # reported apart, so that they hide no numeric difference
    diff[np.isnan(diff) | close] = 0  # the greatest differences are the mismatched elements', as torch reports
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = np.where(diff == 0, 0.0, diff / np.abs(e.astype(np.complex128 if e.dtype.kind == "c" else np.float64)))
    worst_abs, worst_rel = int(np.argmax(diff)), int(np.argmax(rel))
    lines = [f"{'Scalars' if not shape else 'Tensor-likes'} are not {'equal' if exact else 'close'}!", "",
             f"Mismatched elements: {mismatched} / {a.size} ({100 * mismatched / a.size:.1f}%)"]
    if nans.size:
        lines.append(f"Mismatched NaNs: {nans.size}, the first at index {_index(nans[0], shape)}")
    if nans.size == mismatched:  # no numeric difference: the NaN's, as torch reports it
        diff[nans[0]] = rel[nans[0]] = np.nan
        worst_abs = worst_rel = int(nans[0])
    lines += [f"Greatest absolute difference: {diff[worst_abs]:.6g} at index {_index(worst_abs, shape)} "
              f"(up to {atol:g} allowed)",
              f"Greatest relative difference: {rel[worst_rel]:.6g} at index {_index(worst_rel, shape)} "
              f"(up to {rtol:g} allowed)"]
    fail("\n".join(lines))


def make_tensor(*shape, dtype=_BY_NAME["float32"], low=None, high=None, seed=None, device=None):
    """A tensor of the given shape, uniform in [low, high), as torch.testing's: floating values in [-9, 9] by default
    (a bound beyond the dtype's range clamped to it), integers from low up to high - 1 (-9 to 9 by default, from 0
    for unsigned types), bool True or False. The same seed gives the same tensor; without one the values come from
    fasttrain's generator (ft.manual_seed)."""
    dtype = as_dtype(dtype)
    generator = None if seed is None else Generator().manual_seed(seed)
    if dtype.is_floating_point:
        low, high = -9.0 if low is None else low, 9.0 if high is None else high
        if math.isnan(low) or math.isnan(high):
            raise ValueError(f"make_tensor: low and high must be numbers, got {low} and {high}")
        if not low <= high:
            raise ValueError(f"make_tensor: low {low} must not exceed high {high}")
        largest = largest_finite(dtype)
        low, high = max(low, -largest), min(high, largest)
        # drawn in float64 and rounded once, so the narrow types keep their full precision
        values = empty(_sizes(shape), dtype=_BY_NAME["float64"], device=device).uniform_(low, high, generator=generator)
        return values.to(dtype)
    if dtype.is_complex:
        raise TypeError(f"make_tensor: {dtype} is not supported")
    if dtype is _BY_NAME["bool"]:
        return randint(0, 2, _sizes(shape), generator=generator, device=device).to(dtype)
    info = np.iinfo(dtype.name)
    low = max(info.min, -9) if low is None else math.ceil(low)  # PyTorch's rounding of a bound between integers
    high = min(info.max, 9) + 1 if high is None else math.ceil(high)
    if not info.min <= low < high <= info.max + 1:
        raise ValueError(f"make_tensor: [{low}, {high}) is not a range of {dtype} values (high is excluded, as "
                         "torch.testing's)")
    if high <= 2 ** 63 - 1:  # randint's bounds are int64
        return randint(low, high, _sizes(shape), generator=generator, device=device).to(dtype)
    # offsets from low, added with wrap-around: drawn by randint for a span within int64, else (up to uint64's
    # 2**64 values) as 64 random bits from two 32-bit draws, those at or above the span drawn again (at least
    # half of them pass each round)
    span, size = high - low, _sizes(shape)
    offsets = np.empty(int(np.prod(size)), np.uint64)
    todo = np.arange(offsets.size)
    if span <= 2 ** 63 - 1:
        offsets[:] = randint(0, span, (offsets.size,), generator=generator).numpy()
        todo = todo[:0]
    while todo.size:
        halves = randint(0, 2 ** 32, (2, todo.size), generator=generator).numpy().astype(np.uint64)
        bits = (halves[0] << np.uint64(32)) | halves[1]
        ok = bits <= np.uint64(span - 1)
        offsets[todo[ok]] = bits[ok]
        todo = todo[~ok]
    values = (offsets + np.uint64(low % 2 ** 64)).view(np.int64 if info.min < 0 else np.uint64)
    return from_numpy(values.reshape(size).astype(dtype.name)).to(device)


def gradcheck(model, inputs, targets, loss=None, *, eps=1e-3, rtol=1e-2, atol=1e-4, count=20):
    """Checks the gradients of a compiled model against central differences of its loss; returns True or raises
    AssertionError naming the parameter and its worst element.

    model: an ft.nn.Module, compiled here for one batch of (inputs, targets) with ft.optim.SGD(lr=0) and `loss`
    (by default CrossEntropyLoss for integer targets, MSELoss otherwise; integer inputs are token ids, bool ones
    masks; a tuple of inputs feeds a forward of several, a tuple of targets a loss of several), or a
    compiled ft.nn.Program (its own loss and options). Up to `count` elements of every trainable parameter, picked
    at random but the same each call, are moved by +-eps; each gradient from program.backward must be within
    atol + rtol * |difference quotient| of (loss(+eps) - loss(-eps)) / 2eps. The float32 forward rounds the loss
    by about |loss| * 6e-8, which the quotient divides by eps: large losses need a larger atol or eps, and a kink
    (ReLU, max pooling) closer than eps to a sample spoils its element. Every loss is computed with the dropout
    masks (and noise) of the gradient's step. Batch-norm running statistics move as in training steps; .grad is
    left set to None."""
    from . import nn, optim
    if isinstance(model, nn.Program):
        if loss is not None:
            raise ValueError("gradcheck: a compiled program computes its own loss; pass loss=None")
        program = model
    elif isinstance(model, nn.Module):
        one, single = not isinstance(inputs, tuple), not isinstance(targets, tuple)  # a list is one tensor's values
        try:
            xs = [np.asarray(x) for x in ((inputs,) if one else inputs)]
            ys = [np.asarray(y) for y in ((targets,) if single else targets)]
        except ValueError as e:
            raise TypeError(f"gradcheck: inputs and targets are arrays, or tuples of arrays for several ({e})") \
                from None
        if any(a.ndim == 0 for a in xs + ys):
            raise ValueError("gradcheck: inputs and targets are batches, with the batch dimension first")
        if loss is None and not single:
            raise ValueError("gradcheck: give the loss that reads the tuple of targets")
        if loss is None:
            loss = nn.CrossEntropyLoss() if ys[0].dtype.kind in "iu" else nn.MSELoss()
        shapes = [x.shape[1:] for x in xs]
        dtypes = [_BY_NAME["int64"] if x.dtype.kind in "iu" else _BY_NAME["bool"] if x.dtype.kind == "b" else None
                  for x in xs]
        several = {} if single else dict(target_shape=tuple(y.shape[1:] for y in ys), target_dtype=tuple(
            _BY_NAME["int64"] if y.dtype.kind in "iu" else _BY_NAME["float32"] for y in ys))
        program = model.compile(optim.SGD(model.parameters(), lr=0), loss, batch_size=len(xs[0]),
                                input_shape=shapes[0] if one else tuple(shapes),
                                input_dtype=dtypes[0] if one else tuple(dtypes), **several)
    else:
        raise TypeError(f"gradcheck: expected an ft.nn.Module or a compiled ft.nn.Program, got "
                        f"{type(model).__name__}")
    if program.flat_params.device.type != "cpu":
        raise ValueError("gradcheck: finite differences move parameters in place, on the CPU; this program runs "
                         f"on {program.flat_params.device}")
    # a conv bias that a batch norm cancels is moved into its running mean before every call: the step never reads it
    folded = {id(e.module.bias) for e in program._folded}
    params = [(name, p) for name, p in program.model.named_parameters()
              if id(p) in program.trainable and id(p) not in folded]

    def zero_grad():  # the next backward writes the gradients instead of adding to them
        for _, p in params:
            p.grad = None

    if not eps > 0:
        raise ValueError(f"gradcheck: eps must be positive, got {eps!r}")
    draws = program._c.get_dropout_state()

    def loss():  # each with the first backward's dropout masks (and noise): the same function of the parameters
        program._c.set_dropout_state(*draws)
        return program.backward(inputs, targets)

    zero_grad()
    loss()
    grads = {name: p.grad.numpy().copy() for name, p in params}  # the backwards below overwrite .grad
    rng = np.random.default_rng(0)
    try:
        for name, p in params:
            values = p.numpy()  # shares the parameter's memory
            worst = None
            for flat in rng.choice(values.size, min(count, values.size), replace=False):
                i = _index(flat, values.shape)
                old = values[i]
                values[i] = old + eps
                up, x_up = loss(), float(values[i])
                values[i] = old - eps
                down, x_down = loss(), float(values[i])
                values[i] = old
                if x_up == x_down:
                    raise ValueError(f"gradcheck: eps={eps:g} does not move {name}[{i}] = {old:g} in float32: give "
                                     "a larger eps")
                fd = (up - down) / (x_up - x_down)  # the step float32 could represent, not eps itself
                excess = abs(grads[name][i] - fd) - (atol + rtol * abs(fd))
                excess = np.inf if np.isnan(excess) else excess  # a NaN gradient or loss fails
                if worst is None or excess > worst[0]:
                    worst = (excess, i, float(grads[name][i]), fd)
            if worst is not None and worst[0] > 0:
                excess, i, grad, fd = worst
                raise AssertionError(
                    f"gradcheck: the gradient of {name} at index {i} is {grad:.6g} but central differences give "
                    f"{fd:.6g}: off by {abs(grad - fd):.3g}, more than atol + rtol * |difference quotient| = "
                    f"{abs(grad - fd) - excess:.3g} (atol={atol:g}, rtol={rtol:g}, eps={eps:g})")
    finally:
        zero_grad()
    return True
