"""Parameter initialisation with PyTorch's rules, drawn from fasttrain's Philox generator."""
import math

import numpy as np

from .. import creation
from ..random import default_generator


def _fans(t):
    if t.ndim < 2:
        raise ValueError("fan in and fan out need a tensor with at least 2 dimensions")
    receptive = math.prod(t.shape[2:])
    return t.shape[1] * receptive, t.shape[0] * receptive


def calculate_gain(nonlinearity, param=None):
    """The recommended gain for a nonlinearity, as torch.nn.init.calculate_gain: 1 for linear, conv2d, sigmoid and
    identity; 5/3 for tanh; sqrt(2) for relu; sqrt(2 / (1 + slope^2)) for leaky_relu (param the slope, 0.01 by default);
    3/4 for selu."""
    if nonlinearity in ("linear", "conv2d", "sigmoid", "identity"):
        return 1.0
    if nonlinearity == "tanh":
        return 5.0 / 3
    if nonlinearity == "relu":
        return math.sqrt(2.0)
    if nonlinearity == "leaky_relu":
        slope = 0.01 if param is None else param
        return math.sqrt(2.0 / (1 + slope ** 2))
    if nonlinearity == "selu":
        return 3.0 / 4
    raise ValueError(f"unsupported nonlinearity {nonlinearity!r}")


def uniform_(t, a=0.0, b=1.0, generator=None):
    """Fills t in place with values from U(a, b), drawn from generator (default: the global one); returns t."""
    return t.uniform_(a, b, generator=generator or default_generator)


def normal_(t, mean=0.0, std=1.0, generator=None):
    """Fills t in place with values from N(mean, std^2), drawn from generator (default: the global one); returns t."""
    return t.normal_(mean, std, generator=generator or default_generator)


def zeros_(t):
    """Fills t with zeros in place; returns t."""
    return t.fill_(0)


def ones_(t):
    """Fills t with ones in place; returns t."""
    return t.fill_(1)


def constant_(t, value):
    """Fills t with value in place; returns t."""
    return t.fill_(value)


def eye_(t):
    """Fills the 2-d t with the identity matrix in place, as torch.nn.init.eye_; returns t."""
    if t.ndim != 2:
        raise ValueError(f"eye_: only 2-d tensors are supported, got {t.ndim}-d")
    t.fill_(0)
    n = min(t.shape)
    t.diagonal()[:n].fill_(1)
    return t


def dirac_(t, groups=1):
    """Fills the 3-, 4- or 5-d convolution weight t in place with the Dirac delta (the identity convolution),
    groups as in the convolution, as torch.nn.init.dirac_; returns t."""
    if t.ndim not in (3, 4, 5):
        raise ValueError(f"dirac_: only 3-, 4- and 5-d tensors are supported, got {t.ndim}-d")
    out = t.shape[0]
    if out % groups:
        raise ValueError("dirac_: dim 0 must be divisible by groups")
    per = out // groups
    t.fill_(0)
    centre = tuple(k // 2 for k in t.shape[2:])
    for g in range(groups):
        for d in range(min(per, t.shape[1])):
            t[(g * per + d, d) + centre] = 1
    return t


def _fan(t, mode):
    """t's fan_in or fan_out, as mode names it."""
    if mode not in ("fan_in", "fan_out"):
        raise ValueError(f"mode {mode!r} not supported, please use one of fan_in, fan_out")
    return _fans(t)[mode == "fan_out"]


def kaiming_uniform_(t, a=0.0, mode="fan_in", nonlinearity="leaky_relu", generator=None):
    """Fills t in place from U(-bound, bound), bound = gain * sqrt(3 / fan) (He et al.), as
    torch.nn.init.kaiming_uniform_: gain from calculate_gain(nonlinearity, a), fan the fan_in or fan_out of t (at least
    2-d) as mode says. Returns t."""
    fan = _fan(t, mode)
    bound = calculate_gain(nonlinearity, a) * math.sqrt(3.0 / fan) if fan else 0.0
    return uniform_(t, -bound, bound, generator)


def kaiming_normal_(t, a=0.0, mode="fan_in", nonlinearity="leaky_relu", generator=None):
    """Fills t in place from N(0, std^2), std = gain / sqrt(fan) (He et al.), as torch.nn.init.kaiming_normal_: gain
    from calculate_gain(nonlinearity, a), fan the fan_in or fan_out of t (at least 2-d) as mode says. Returns t."""
    fan = _fan(t, mode)
    return normal_(t, 0.0, calculate_gain(nonlinearity, a) / math.sqrt(fan) if fan else 0.0, generator)


def xavier_uniform_(t, gain=1.0, generator=None):
    """Fills t in place from U(-bound, bound), bound = gain * sqrt(6 / (fan_in + fan_out)) (Glorot & Bengio), as
    torch.nn.init.xavier_uniform_; t has at least 2 dimensions. Returns t."""
    fan_in, fan_out = _fans(t)
    bound = gain * math.sqrt(6.0 / (fan_in + fan_out))
    return uniform_(t, -bound, bound, generator)


def xavier_normal_(t, gain=1.0, generator=None):
    """Fills t in place from N(0, std^2), std = gain * sqrt(2 / (fan_in + fan_out)) (Glorot & Bengio), as
    torch.nn.init.xavier_normal_; t has at least 2 dimensions. Returns t."""
    fan_in, fan_out = _fans(t)
    return normal_(t, 0.0, gain * math.sqrt(2.0 / (fan_in + fan_out)), generator)


def trunc_normal_(t, mean=0.0, std=1.0, a=-2.0, b=2.0, generator=None):
    """Fills t in place with values from N(mean, std^2) truncated to [a, b] (bounds in the values' units, as
    torch.nn.init.trunc_normal_), drawn from generator by rejection: draws outside [a, b] are drawn again.
    Returns t."""
    if not (std > 0 and a < b and math.isfinite(mean)):
        raise ValueError(f"trunc_normal_: needs std > 0 and a < b, got std={std}, a={a}, b={b}")
    gen, n = generator or default_generator, t.numel()
    if math.erfc(max(a - mean, mean - b) / std / math.sqrt(2)) < 1e-6 and not (a <= mean <= b):
        raise ValueError(f"trunc_normal_: [{a}, {b}] is more than 5 standard deviations from the mean {mean}")
    kept = np.empty(0)
    while kept.size < n:
        draw = np.asarray(creation.empty(max(2 * (n - kept.size), 64)).normal_(mean, std, generator=gen), np.float64)
        kept = np.concatenate([kept, draw[(draw >= a) & (draw <= b)]])
    return t.copy_(creation.tensor(kept[:n].reshape(t.shape).astype(np.float32)))


def orthogonal_(t, gain=1.0, generator=None):
    """Fills t (at least 2-d, seen as rows by the rest) in place with a (semi-)orthogonal matrix times gain, as
    torch.nn.init.orthogonal_: the Q of a QR factorisation of a normal matrix drawn from generator, its signs
    fixed by R's diagonal. Returns t."""
    if t.ndim < 2:
        raise ValueError(f"orthogonal_: needs a tensor of at least 2 dimensions, got {t.ndim}")
    if t.numel() == 0:  # nothing to fill, as PyTorch's
        return t
    rows, cols = t.shape[0], t.numel() // t.shape[0]
    flat = np.asarray(creation.empty(rows, cols).normal_(0.0, 1.0, generator=generator or default_generator),
                      np.float64)
    q, r = np.linalg.qr(flat.T if rows < cols else flat)
    q *= np.sign(np.diag(r))
    q = q.T if rows < cols else q
    return t.copy_(creation.tensor((gain * q).reshape(t.shape).astype(np.float32)))
