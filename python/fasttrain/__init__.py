"""fasttrain: neural-network training loops in C, driven from Python.

``import fasttrain as ft`` gives tensors that share memory with NumPy and
DLPack, counter-based (Philox) seeding that makes runs reproducible for any
thread count, and the training machinery built on them.
"""
from . import _C
from ._types import DTYPES as _DTYPES, _ALIASES, _BY_NAME, channels_last, contiguous_format, device, dtype, finfo, \
    iinfo, preserve_format
from ._tensor import Tensor
from . import accelerator, backends, cuda
from . import optim
from . import nn, ops
from .nn.functional import flatten
from ._math import (abs, acos, add, addmm, all, allclose, amax, amin, any, argmax, argmin, argsort, argwhere, asin,
                    atan, atan2, baddbmm, bincount, bmm, bucketize, cat, ceil, chunk, clamp, clamp_max, clamp_min, clip,
                    concat, concatenate, cos, cosh, count_nonzero, cumprod, cumsum, diag, diagonal, diff, div, divide,
                    dot, einsum, eq, equal, erf, erfc, exp, exp2, expm1, eye, flip, floor, floor_divide, fmax, fmin,
                    fmod, gather, ge, gt, hstack, hypot, index_add, index_select, isclose, isfinite, isin, isinf, isnan,
                    le, lerp, linspace, log, log10, log1p, log2, log_softmax, logaddexp, logical_and, logical_not,
                    logical_or, logical_xor, logsumexp, lt, masked_fill, masked_select, matmul, max, maximum, mean,
                    median, meshgrid, min, minimum, mm, moveaxis, movedim, mul, multiply, mv, nan_to_num, nanmean,
                    nansum, ne, neg, nonzero, norm, numel, outer, permute, pow, prod, promote_types, quantile,
                    reciprocal, relu, remainder, repeat_interleave, reshape, result_type, roll, round, rsqrt, scatter,
                    scatter_add, searchsorted, select, sigmoid, sign, sin, sinh, softmax, sort, split, sqrt, square,
                    squeeze, stack, std, std_mean, sub, sum, swapaxes, swapdims, t, take, tan, tanh, topk, trace,
                    transpose, tril, tril_indices, triu, triu_indices, trunc, unbind, unique, unsqueeze, var, var_mean,
                    vstack, where)
from .creation import (arange, as_tensor, empty, empty_like, from_dlpack, from_numpy, full, full_like, ones,
                       ones_like, tensor, zeros, zeros_like)
from .random import (Generator, bernoulli, default_generator, get_rng_state, initial_seed, manual_seed, multinomial,
                     normal, rand, rand_like, randint, randn, randn_like, randperm, seed, seed_everything,
                     set_rng_state)
from .settings import (are_deterministic_algorithms_enabled, empty_cache, enable_grad, get_num_threads,
                       inference_mode, is_grad_enabled, memory_stats, no_grad, reset_peak_memory_stats,
                       set_grad_enabled,
                       set_num_threads, use_deterministic_algorithms)
from . import data
from . import distributed
from . import metrics
from . import fx, jit, testing, utils
from .amp import autocast
from .checkpoint import load, save
from .history import History
from .training import evaluate, fit

__version__ = "0.1.0"


def __getattr__(name):
    from .nn.graph import missing
    raise missing(__name__, name)


def _assert(condition, message):
    """torch._assert: AssertionError(message) unless condition holds (torchvision's models check shapes so)."""
    if not condition:
        raise AssertionError(message)

# ft.float32, ... and PyTorch's aliases ft.float, ft.long, ...; these (and ft.sum, ft.max, ft.abs ... above) shadow
# builtins inside this module only, so nothing below may use int/float/bool/sum/max/min/abs/all/any/pow.
for _d in _DTYPES:
    globals()[_d.name] = _d
for _alias, _name in _ALIASES.items():
    globals()[_alias] = _BY_NAME[_name]
del _d, _alias, _name
