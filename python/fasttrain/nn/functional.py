"""PyTorch's torch.nn.functional names, arguments and defaults over fasttrain's
C ops (forward only: new outputs are allocated unless ``inplace=True``).

The backward of each op is ``ft.ops.<op>_backward``; the training step in C
calls the same entry points.
"""
import functools
import inspect
import math
import numbers
import warnings

import numpy as np

from .. import _C, _math, creation
from .._math import cat, where
from ..amp import cast, widen
from .._C import TensorBase
from ..random import default_generator
from . import modules as M
from .graph import (Common, Gathered, MergedRows, Symbolic, common_value, fail, in_place, missing as graph_missing,
                    read_by_op, uses_trainable)


# The functions of one value elementwise.
_ELEMENTWISE = {"relu", "leaky_relu", "gelu", "silu", "sigmoid", "tanh", "hardswish", "softplus"}
# Those of each row alone, which rows merged from the batch take (GPT-2's x.view(-1, C) through its projection).
_ROW_WISE = _ELEMENTWISE | {"_linear", "layer_norm", "dropout"}


def _traced(layer):
    """On a traced value (model.compile), the function records layer(*args) applied to it instead of
    computing: each F.* is the layer of the same name. Of a trainable parameter while a forward is traced, it
    records it on the parameter's value (graph.Common, which trains through it); in place it is refused, as the
    parameter would change in the forward."""
    def wrap(fn):
        signature = inspect.signature(fn)

        @functools.wraps(fn)
        def call(input, *args, **kwargs):
            if isinstance(input, MergedRows) and fn.__name__ in _ROW_WISE:
                return input.rowwise(call, *args, **kwargs)
            inplace = fn.__name__.endswith("_") or signature.bind(input, *args, **kwargs).arguments.get("inplace")
            if isinstance(input, Gathered) or not isinstance(input, Symbolic) and uses_trainable([input]):
                input, = read_by_op(fn.__name__, [input], not inplace)
            elif isinstance(input, TensorBase) and input.dtype.is_floating_point and (uses_trainable(
                    others := [*args, *kwargs.values()]) or any(isinstance(a, (Symbolic, Common, Gathered))
                                                                for a in others)):
                input = common_value(input)  # values through parameters (F.linear(self.coords, self.w1.weight));
                # (fixed ids of a table are its rows, F.embedding's own)
            if isinstance(input, (Symbolic, Common)):
                out = layer(*args, **kwargs)(input)
                return in_place(input, out) if inplace else out
            return fn(input, *args, **kwargs)
        return call
    return wrap


def _shell(cls, **fields):
    """A layer of class cls around the caller's own parameters (F.linear(x, self.w, self.b)): the node reads
    them where the model keeps them, under the model's names."""
    from .graph import _viewed_parameter
    m = cls.__new__(cls)
    M.Module.__init__(m)
    for name in ("weight", "bias"):
        t = fields.pop(name)
        if isinstance(t, Gathered):  # a copy of a parameter's view (w.t().contiguous()): its elements computed on
            t = t.common()
        elif (p := _viewed_parameter(t)) is not None and p is not t:  # a view (self.W.t()): its elements
            t = common_value(t)
        if isinstance(t, Common) and name == "weight" and cls in (M.Conv2d, M.Conv1d, M.ConvTranspose2d,
                                                                   M.ConvTranspose1d, M.Linear):
            object.__setattr__(m, "_computed_weight", t.value)  # the node's last input, which its gradient reaches
            t = None
        elif isinstance(t, Common):
            fail(f"a value computed from parameters as the {name} of {cls.__name__.lower()}", "only a "
                 "convolution's or a linear layer's weight may be computed in forward; add a computed bias to the "
                 "layer's output")
        elif isinstance(t, Symbolic):
            fail(f"a value computed from traced values as the {name} of {cls.__name__.lower()}", "compute the "
                 "weight from parameters alone (a weight standardized, normalized or masked), or add the bias to "
                 "the layer's output")
        object.__setattr__(m, name, t)
    for key, value in fields.items():
        object.__setattr__(m, key, value)
    return m

__all__ = [
    "conv1d", "conv2d", "linear", "batch_norm", "layer_norm", "group_norm", "embedding", "interpolate", "relu",
    "relu_", "leaky_relu", "leaky_relu_", "gelu", "silu", "sigmoid", "tanh", "max_pool1d", "max_pool2d", "avg_pool1d",
    "avg_pool2d", "adaptive_avg_pool1d", "adaptive_avg_pool2d", "adaptive_max_pool1d", "adaptive_max_pool2d",
    "hardswish", "softplus", "dropout", "dropout1d", "dropout2d", "softmax", "log_softmax", "cross_entropy",
    "nll_loss", "mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "binary_cross_entropy_with_logits", "kl_div",
    "add", "mul", "cat", "flatten", "scaled_dot_product_attention", "one_hot", "hardtanh", "relu6", "elu", "normalize",
    "binary_cross_entropy", "cosine_similarity", "pairwise_distance", "triplet_margin_loss", "margin_ranking_loss",
    "soft_margin_loss", "multilabel_soft_margin_loss", "gaussian_nll_loss", "poisson_nll_loss",
    "cosine_embedding_loss", "hardsigmoid", "mish", "selu", "celu", "logsigmoid", "softsign", "tanhshrink",
    "prelu", "glu", "rms_norm", "pixel_shuffle", "pixel_unshuffle", "pad", "conv_transpose1d", "conv_transpose2d",
    "softmin", "threshold", "threshold_", "hardshrink", "softshrink", "hardtanh_", "elu_", "selu_", "celu_",
    "bilinear", "embedding_bag", "channel_shuffle",
]


def _check(x, name, fn):
    if isinstance(x, MergedRows):  # refused by what it is, not by its class's name
        x.__getattr__(fn)
    if not isinstance(x, TensorBase):
        how = (" (convert a NumPy array with ft.from_numpy(a), or ft.tensor(a) for a copy)" if isinstance(x, np.ndarray)
               else " (convert another library's tensor with ft.from_dlpack(t), sharing its memory)"
               if hasattr(x, "__dlpack__") else "")
        kind = type(x).__name__ if type(x).__module__ == "builtins" else \
            f"{type(x).__module__.split('.')[0]}.{type(x).__name__}"
        raise TypeError(f"{fn}: {name} must be a fasttrain Tensor, got {kind}{how}")


# ---- convolution, linear, normalization ----

def _conv_layer(weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    from .modules import _tuple
    K, Cg, *kernel = weight.shape
    n = len(kernel)
    return _shell(M.Conv2d if n == 2 else M.Conv1d, weight=weight, bias=bias, in_channels=Cg * groups,
                  out_channels=K, groups=groups, kernel_size=tuple(kernel), stride=_tuple(stride, n),
                  padding=_tuple(padding, n), dilation=_tuple(dilation, n), padding_mode="zeros")


def _conv_transpose_layer(weight, bias=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1):
    from .modules import _tuple
    C, Kg, *kernel = weight.shape
    n = len(kernel)
    return _shell(M.ConvTranspose2d if n == 2 else M.ConvTranspose1d, weight=weight, bias=bias, in_channels=C,
                  out_channels=Kg * groups, groups=groups, kernel_size=tuple(kernel), stride=_tuple(stride, n),
                  padding=_tuple(padding, n), dilation=_tuple(dilation, n), output_padding=_tuple(output_padding, n),
                  padding_mode="zeros")


def _lift(v, fill):
    """A 1-d size as the 2-d one of height 1 (1-d ops run as 2-d ones over (C, 1, L))."""
    from .modules import _tuple
    return None if v is None else (fill, *_tuple(v, 1))


def _via_2d(fn, input, name):
    """fn, a 2-d op, applied to sequences (N, C, L) or (C, L) seen as images of height 1."""
    _check(input, "input", name)
    if input.ndim not in (2, 3):
        raise ValueError(f"{name}: expected a 2-d (C, L) or 3-d (N, C, L) input, got shape {tuple(input.shape)}")
    return fn(input.unsqueeze(-2)).squeeze(-2)


def _products(op, x, weight, *args):
    """op(None, x, weight, *args), a oneDNN convolution or inner product. bfloat16 operands on a CPU whose oneDNN
    has no bfloat16 products (one without AVX-512, where torch emulates them) are multiplied as float32 and the
    result rounded to bfloat16 once, as autocast code run there expects."""
    try:
        return op(None, x, weight, *args)
    except RuntimeError as e:
        if "oneDNN has no implementation" not in str(e) or "bfloat16" not in (x.dtype.name, weight.dtype.name):
            raise
    return op(None, x.float(), weight.float(), *args).bfloat16()


def _wide_bias(bias):
    """The bias as the ops add it, in float32: a bfloat16 model's (Module.bfloat16()) is widened, exactly."""
    return bias.float() if bias is not None and bias.dtype.name == "bfloat16" else bias


def string_padding(padding, kernel, stride, dilation, name):
    """padding='valid' or 'same' in elements: (each side's, the extra element an odd total pads on the right only),
    as PyTorch pads for 'same' (stride 1)."""
    from .modules import _tuple
    n = len(kernel)
    if padding == "valid":
        return (0,) * n, (0,) * n
    if padding != "same":
        raise ValueError(f"{name}: padding must be a number of elements, 'valid' or 'same', got {padding!r}")
    if any(s != 1 for s in _tuple(stride, n)):
        raise ValueError(f"{name}: padding='same' is not supported for strided convolutions")
    totals = [d * (k - 1) for d, k in zip(_tuple(dilation, n), kernel)]
    return tuple(t // 2 for t in totals), tuple(t % 2 for t in totals)


def _string_padded(conv):
    """conv taking padding 'valid' and 'same' too: an odd total's extra element padded on the right first."""
    @functools.wraps(conv)
    def call(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
        if isinstance(padding, str):
            padding, extra = string_padding(padding, tuple(weight.shape[2:]), stride, dilation, conv.__name__)
            if any(extra):
                input = pad(input, tuple(p for e in reversed(extra) for p in (0, e)))
        return conv(input, weight, bias, stride, padding, dilation, groups)
    return call


@_string_padded
@_traced(_conv_layer)
def conv1d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """1-d convolution of input (N, C_in, L), or unbatched (C_in, L), with weight (C_out, C_in / groups, K), as
    torch.nn.functional.conv1d; it runs as conv2d over (C_in, 1, L). Padding is given in elements, or as 'valid'
    or 'same'."""
    _check(weight, "weight", "conv1d")
    w = weight.unsqueeze(2)
    return _via_2d(lambda x: conv2d(x, w, bias, _lift(stride, 1), _lift(padding, 0), _lift(dilation, 1), groups),
                   input, "conv1d")


@_traced(_conv_transpose_layer)
def conv_transpose2d(input, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1):
    """Transposed 2-d convolution of input (N, C_in, H, W), or unbatched (C_in, H, W), with weight (C_in, C_out /
    groups, kH, kW) and an optional bias (C_out,), as torch.nn.functional.conv_transpose2d: the output is
    (H - 1) stride - 2 padding + dilation (kH - 1) + output_padding + 1 high (and as wide)."""
    _check(input, "input", "conv_transpose2d")
    squeeze = input.ndim == 3
    x = input.unsqueeze(0) if squeeze else input
    x, weight = cast(x, weight)
    out = _products(_C.conv_transpose2d_forward, x, weight, _wide_bias(bias), stride, padding, dilation, groups,
                    output_padding)
    return out[0] if squeeze else out


@_traced(_conv_transpose_layer)
def conv_transpose1d(input, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1):
    """Transposed 1-d convolution of input (N, C_in, L), or unbatched (C_in, L), with weight (C_in, C_out / groups,
    K), as torch.nn.functional.conv_transpose1d; it runs as conv_transpose2d over (C_in, 1, L)."""
    _check(weight, "weight", "conv_transpose1d")
    w = weight.unsqueeze(2)
    return _via_2d(lambda x: conv_transpose2d(x, w, bias, _lift(stride, 1), _lift(padding, 0),
                                              _lift(output_padding, 0), groups, _lift(dilation, 1)),
                   input, "conv_transpose1d")


@_string_padded
@_traced(_conv_layer)
def conv2d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """2-d convolution of input (N, C_in, H, W), or unbatched (C_in, H, W), with weight (C_out, C_in / groups, kH, kW)
    and an optional bias (C_out,), as torch.nn.functional.conv2d. Padding is given in pixels, or as 'valid' or 'same'.
    Under ft.autocast float32 operands are multiplied as bfloat16."""
    _check(input, "input", "conv2d")
    squeeze = input.ndim == 3
    x = input.unsqueeze(0) if squeeze else input
    x, weight = cast(x, weight)
    out = _products(_C.conv2d_forward, x, weight, _wide_bias(bias), stride, padding, dilation, groups)
    return out[0] if squeeze else out


def linear(input, weight, bias=None):
    """input W^T + b, as torch.nn.functional.linear: input (..., in_features), weight (out_features, in_features), bias
    (out_features,); the output is (..., out_features). Under ft.autocast float32 operands are multiplied as
    bfloat16. Traced, a bias computed from parameters (BEiT's ft.cat of its q, k and v biases) is added after."""
    if isinstance(bias, (Symbolic, Common)) and not isinstance(input, MergedRows):
        return _linear(input, weight) + bias
    return _linear(input, weight, bias)


@_traced(lambda weight, bias=None: _shell(M.Linear, weight=weight, bias=bias, in_features=weight.shape[1],
                                          out_features=weight.shape[0]))
def _linear(input, weight, bias=None):
    _check(input, "input", "linear")
    if input.ndim == 0:
        raise ValueError("linear: the input must have at least 1 dimension")
    lead = input.shape[:-1]
    x = input.reshape(-1, input.shape[-1]) if input.ndim != 2 else input
    x, weight = cast(x, weight)
    out = _products(_C.linear_forward, x, weight, _wide_bias(bias))
    return out.reshape(*lead, weight.shape[0]) if input.ndim != 2 else out


def _batch_norm_layer(running_mean, running_var, weight=None, bias=None, training=False, momentum=0.1, eps=1e-5):
    from .graph import callers
    if running_mean is None and not training:
        raise ValueError("batch_norm: running_mean and running_var are needed with training=False")
    counted = None
    owner = callers[-1] if callers else None
    if running_mean is not None and isinstance(owner, M._BatchNorm) and owner.running_mean is running_mean:
        # the batch norm's own forward (timm's BatchNormAct2d): its count moves, and its momentum=None is PyTorch's
        # cumulative average, not the 1 / count its code computed at compile
        counted, momentum = owner.num_batches_tracked, owner.momentum
    return _shell(M._BatchNorm, weight=weight, bias=bias, running_mean=running_mean, running_var=running_var,
                  num_batches_tracked=counted,
                  num_features=next((t.shape[0] for t in (running_mean, weight) if t is not None), None),
                  eps=eps, momentum=momentum, affine=weight is not None, track_running_stats=running_mean is not None,
                  training=bool(training), _ranks=(1, 2, 3))


@_traced(_batch_norm_layer)
def batch_norm(input, running_mean, running_var, weight=None, bias=None, training=False, momentum=0.1, eps=1e-5):
    """Batch normalization of (N, C), (N, C, L) or (N, C, H, W) inputs per channel, as torch.nn.functional.batch_norm:
    with training=True the batch's statistics, updating running_mean and running_var in place with momentum; else the
    running ones. Traced, a batch norm node, its statistics updated in every training step; in a batch norm's own
    forward (timm's BatchNormAct2d) with its num_batches_tracked counted and its momentum (None: the cumulative
    average)."""
    _check(input, "input", "batch_norm")
    if input.ndim == 3:  # (N, C, L) sequences as (N, C, 1, L) images
        return batch_norm(input.unsqueeze(2), running_mean, running_var, weight, bias, training, momentum,
                          eps).squeeze(2)
    out, _, _ = _C.batch_norm_forward(None, None, None, input, weight, bias, running_mean, running_var, training,
                                      momentum, eps)
    return out


def _layer_norm_layer(normalized_shape, weight=None, bias=None, eps=1e-5):
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    return _shell(M.LayerNorm, weight=weight, bias=bias, normalized_shape=shape, eps=eps)


@_traced(_layer_norm_layer)
def layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5):
    """Layer normalization over the trailing dimensions normalized_shape, with an optional elementwise weight and bias
    of that shape, as torch.nn.functional.layer_norm."""
    _check(input, "input", "layer_norm")
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    if tuple(input.shape[input.ndim - len(shape):]) != shape:
        raise ValueError(f"layer_norm: input of shape {input.shape} does not end with normalized_shape {shape}")
    out, _, _ = _C.layer_norm_forward(None, None, None, input.contiguous(), weight, bias, shape, eps)
    return out


def _norm_layout(x):
    """x itself when group norm takes its layout (contiguous, or channels-last 4-d), else a contiguous copy."""
    if x.is_contiguous():
        return x
    if x.ndim == 4:
        N, C, H, W = x.shape
        if all(n == 1 or s == want for n, s, want in zip(x.shape, x.stride(), (H * W * C, 1, W * C, C))):
            return x
    return x.contiguous()


@_traced(lambda num_groups, weight=None, bias=None, eps=1e-5: _shell(
    M.GroupNorm, weight=weight, bias=bias, num_groups=num_groups,
    num_channels=None if weight is None else weight.shape[0], eps=eps, affine=weight is not None))
def group_norm(input, num_groups, weight=None, bias=None, eps=1e-5):
    """Group normalization of input (N, C, ...): the C channels in num_groups groups, each normalized over its channels
    and the remaining dimensions, then an optional per-channel weight and bias, as torch.nn.functional.group_norm."""
    _check(input, "input", "group_norm")
    weight, bias = (None if p is None else p.contiguous() for p in (weight, bias))
    out, _, _ = _C.group_norm_forward(None, False, False, _norm_layout(input), weight, bias, int(num_groups), eps)
    return out


def _embedding_options(max_norm, scale_grad_by_freq, sparse):
    for name, given, why in (
            ("max_norm", max_norm is not None, "it renormalizes the weight's rows in place as it reads them"),
            ("scale_grad_by_freq", scale_grad_by_freq, "it scales the gradient by the ids' counts in the batch"),
            ("sparse", sparse, "fasttrain's embedding gradient is dense, which the fused optimizer pass updates: "
             "leave sparse out, and plain SGD updates the same rows")):
        if given:
            raise NotImplementedError(f"embedding: {name} is not supported ({why})")


def _embedding_layer(weight, padding_idx=None, max_norm=None, norm_type=2.0, scale_grad_by_freq=False, sparse=False):
    _embedding_options(max_norm, scale_grad_by_freq, sparse)
    return _shell(M.Embedding, weight=weight, bias=None, num_embeddings=weight.shape[0],
                  embedding_dim=weight.shape[1],
                  padding_idx=None if padding_idx is None else padding_idx % weight.shape[0])


@_traced(_embedding_layer)
def embedding(input, weight, padding_idx=None, max_norm=None, norm_type=2.0, scale_grad_by_freq=False, sparse=False):
    """Rows of weight (num_embeddings, embedding_dim) for integer ids of any shape: the output is (*input.shape,
    embedding_dim). Ids narrower than int64 are widened first. max_norm, scale_grad_by_freq and sparse are not supported
    (NotImplementedError)."""
    _check(input, "input", "embedding")
    _check(weight, "weight", "embedding")
    _embedding_options(max_norm, scale_grad_by_freq, sparse)
    if input.dtype.name in ("int32", "int16", "int8", "uint8"):
        input = input.long()
    if uses_trainable([weight]):  # fixed ids (T5's relative position buckets) while a forward is traced
        from .graph import Gathered
        g = Gathered.of(weight)[input]
        if padding_idx is not None and g.parameter is not weight:  # its rows are the parameter's, not the view's
            fail("F.embedding with padding_idx of a view of a trainable table", "pass the table itself")
        return Gathered(g.parameter, g.positions, padding_idx)
    return _C.embedding_forward(None, input.contiguous(), weight.contiguous(), padding_idx)


_ONE_HOT_TABLE = 4096  # classes of the identity table F.one_hot of traced ids reads: 64 MiB of float32


def one_hot(tensor, num_classes=-1):
    """Class indices (int64, any shape) as int64 rows (*tensor.shape, num_classes) with a 1 at each index, as
    torch.nn.functional.one_hot; num_classes=-1 counts up to the largest index. While tracing, the rows are
    floats, as the model or the loss goes on to use them, and num_classes must be given (the program's shapes are
    fixed before it sees a label): of the targets, in the loss's dtype; of the model's ids (d2l's
    F.one_hot(X, vocab_size).float()), the rows of an identity table, which checks the ids as an embedding does."""
    if isinstance(num_classes, bool) or not isinstance(num_classes, numbers.Integral) or num_classes < -1:
        raise ValueError(f"one_hot: num_classes must be a number of classes or -1, got {num_classes!r}")
    if isinstance(tensor, Symbolic):
        if num_classes == -1:
            fail("F.one_hot without num_classes", "give num_classes: F.one_hot(y, num_classes=10)")
        if not tensor._of_targets():
            if tensor.dtype.is_floating_point:
                fail(f"F.one_hot of {tensor.dtype.name} values", "one_hot takes class indices (int64), as PyTorch's")
            if num_classes > _ONE_HOT_TABLE:
                fail(f"F.one_hot of the model's ids into {num_classes} classes (a table of more than "
                     f"{_ONE_HOT_TABLE} rows)", "one-hot rows into a linear layer are an nn.Embedding(num_classes, "
                     "out_features) of the ids")
            return embedding(tensor, _math.eye(int(num_classes)))
        return M.OneHot(int(num_classes))(tensor)
    _check(tensor, "tensor", "one_hot")
    if not tensor.dtype.name.startswith(("int", "uint")):
        raise TypeError(f"one_hot: class indices must be integers, got {tensor.dtype.name}")
    tensor = tensor.long().contiguous()
    if num_classes == -1:
        if tensor.numel() == 0:
            raise ValueError("one_hot: cannot count the classes of an empty tensor: give num_classes")
        num_classes = max(int(tensor.max()) + 1, 0)
    return _C.one_hot_forward(None, tensor, int(num_classes)).long()


# ---- activations ----

def _act(input, act, alpha=0.0, inplace=False, fn="activation"):
    _check(input, "input", fn)
    return _C.activation_forward(input if inplace else None, input, act, alpha)


def _result(input, out, inplace):
    """out, or with inplace=True out written into input (an eager tensor's memory, a traced value's name)."""
    if not inplace:
        return out
    return in_place(input, out) if isinstance(input, Symbolic) else input.copy_(out)


def hardtanh(input, min_val=-1.0, max_val=1.0, inplace=False):
    """input limited to [min_val, max_val] (clamp's values and gradient); inplace=True overwrites an eager input."""
    if min_val > max_val:
        raise ValueError(f"hardtanh: min_val {min_val} must not exceed max_val {max_val}")
    return input.clamp_(min_val, max_val) if inplace else input.clamp(min_val, max_val)


def relu6(input, inplace=False):
    """hardtanh(input, 0, 6)."""
    return hardtanh(input, 0.0, 6.0, inplace)


def elu(input, alpha=1.0, inplace=False):
    """input where positive, alpha (exp(input) - 1) elsewhere, as torch's: the gradient at 0 is alpha's side (a
    zero-initialised layer before an ELU trains; relu and a clamp at 0 gave 0 there). The exponential reads
    min(x, 1), finite where it is not chosen."""
    return _result(input, _math.where(input > 0, input, alpha * (input.clamp(max=1.0).exp() - 1.0)), inplace)


def normalize(input, p=2.0, dim=1, eps=1e-12):
    """input divided by its Euclidean norm along dim, held at eps or above (PyTorch's F.normalize with p=2)."""
    if p != 2:
        raise NotImplementedError(f"normalize: p={p} (only the Euclidean norm, p=2)")
    # sqrt(max(|x|^2, eps^2)) is max(|x|, eps), with a finite gradient at a zero vector (0, as PyTorch's)
    return input / input.square().sum(dim, keepdim=True).clamp_min(eps * eps).sqrt()


@_traced(lambda inplace=False: M.ReLU())
def relu(input, inplace=False):
    """max(0, input) elementwise; inplace=True overwrites input."""
    return _act(input, "relu", inplace=inplace, fn="relu")


@_traced(lambda: M.ReLU())
def relu_(input):
    """max(0, input) elementwise, in place; returns input."""
    return _act(input, "relu", inplace=True, fn="relu_")


@_traced(lambda negative_slope=0.01, inplace=False: M.LeakyReLU(negative_slope))
def leaky_relu(input, negative_slope=0.01, inplace=False):
    """input where input >= 0, negative_slope * input elsewhere; inplace=True overwrites input."""
    return _act(input, "leaky_relu", float(negative_slope), inplace, "leaky_relu")


@_traced(lambda negative_slope=0.01: M.LeakyReLU(negative_slope))
def leaky_relu_(input, negative_slope=0.01):
    """leaky_relu in place; returns input."""
    return _act(input, "leaky_relu", float(negative_slope), True, "leaky_relu_")


@_traced(lambda approximate="none": M.GELU(approximate))
def gelu(input, approximate="none"):
    """input * Phi(input) elementwise (Phi the standard normal CDF), or its tanh approximation with approximate='tanh',
    as torch.nn.functional.gelu."""
    if approximate not in ("none", "tanh"):
        raise ValueError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    return _act(input, "gelu" if approximate == "none" else "gelu_tanh", fn="gelu")


@_traced(lambda inplace=False: M.SiLU())
def silu(input, inplace=False):
    """input * sigmoid(input) elementwise; inplace=True overwrites input."""
    return _act(input, "silu", inplace=inplace, fn="silu")


@_traced(lambda: M.Sigmoid())
def sigmoid(input):
    """1 / (1 + exp(-input)) elementwise."""
    return _act(input, "sigmoid", fn="sigmoid")


@_traced(lambda: M.Tanh())
def tanh(input):
    """tanh(input) elementwise."""
    return _act(input, "tanh", fn="tanh")


# ---- pooling: 4-d (N, C, H, W) or unbatched 3-d (C, H, W) inputs ----

def _batched(input, fn):
    _check(input, "input", fn)
    if input.ndim == 3:
        return input.unsqueeze(0), True
    if input.ndim != 4:
        raise ValueError(f"{fn}: expected a 3-d (C, H, W) or 4-d (N, C, H, W) input, got shape {tuple(input.shape)}")
    return input, False


def _unbatch(t, squeeze):
    return t[0] if squeeze else t


def _max_pool_layer(kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False):
    return M.MaxPool2d(kernel_size, stride or None, padding, dilation, return_indices, ceil_mode)


@_traced(_max_pool_layer)
def max_pool2d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False):
    """Max pooling of (N, C, H, W) input, or unbatched (C, H, W), as torch.nn.functional.max_pool2d (stride defaults to
    kernel_size). With return_indices=True (eagerly only) it returns (output, indices)."""
    x, squeeze = _batched(input, "max_pool2d")
    out, indices = _C.max_pool2d_forward(None, None if return_indices else False, x, kernel_size,
                                         stride if stride not in (None, ()) else None, padding, dilation, ceil_mode)
    if return_indices:
        return _unbatch(out, squeeze), _unbatch(indices, squeeze)
    return _unbatch(out, squeeze)


def _avg_pool_layer(kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
                    divisor_override=None):
    return M.AvgPool2d(kernel_size, stride or None, padding, ceil_mode, count_include_pad, divisor_override)


@_traced(_avg_pool_layer)
def avg_pool2d(input, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
               divisor_override=None):
    """Average pooling of (N, C, H, W) input, or unbatched (C, H, W), as torch.nn.functional.avg_pool2d (stride defaults
    to kernel_size); each window's sum divided by divisor_override when given."""
    x, squeeze = _batched(input, "avg_pool2d")
    out = _C.avg_pool2d_forward(None, x, kernel_size, stride if stride not in (None, ()) else None, padding,
                                ceil_mode, count_include_pad, divisor_override)
    return _unbatch(out, squeeze)


def _adaptive_size(output_size, x):
    if isinstance(output_size, int):
        output_size = (output_size, output_size)
    output_size = tuple(output_size)
    if len(output_size) == 1:
        output_size = output_size * 2
    if len(output_size) != 2:
        raise ValueError(f"output_size must be an int or a pair, got {output_size}")
    return tuple(x.shape[2 + i] if s is None else int(s) for i, s in enumerate(output_size))


@_traced(lambda output_size: M.AdaptiveAvgPool2d(output_size))
def adaptive_avg_pool2d(input, output_size):
    """Average pooling of (N, C, H, W) input, or unbatched (C, H, W), to output_size (an int, or a pair whose None
    entries keep the input's size)."""
    x, squeeze = _batched(input, "adaptive_avg_pool2d")
    return _unbatch(_C.adaptive_avg_pool2d_forward(None, x, _adaptive_size(output_size, x)), squeeze)


def _adaptive_max_pool_layer(output_size, return_indices=False):
    if return_indices:
        raise TypeError("adaptive_max_pool2d: return_indices=True cannot be traced")
    return M.AdaptiveMaxPool2d(output_size)


@_traced(_adaptive_max_pool_layer)
def adaptive_max_pool2d(input, output_size, return_indices=False):
    """Max pooling of (N, C, H, W) input, or unbatched (C, H, W), to output_size (an int, or a pair whose None entries
    keep the input's size). With return_indices=True (eagerly only) it returns (output, indices)."""
    x, squeeze = _batched(input, "adaptive_max_pool2d")
    out, indices = _C.adaptive_max_pool2d_forward(None, None if return_indices else False, x,
                                                  _adaptive_size(output_size, x))
    if return_indices:
        return _unbatch(out, squeeze), _unbatch(indices, squeeze)
    return _unbatch(out, squeeze)


@_traced(lambda kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False: M.MaxPool1d(
    kernel_size, stride or None, padding, dilation, ceil_mode))
def max_pool1d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False):
    """Max pooling of (N, C, L) input, or unbatched (C, L), as max_pool2d over (C, 1, L); no return_indices."""
    return _via_2d(lambda x: max_pool2d(x, _lift(kernel_size, 1), _lift(stride or None, 1), _lift(padding, 0),
                                        _lift(dilation, 1), ceil_mode), input, "max_pool1d")


@_traced(lambda kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True: M.AvgPool1d(
    kernel_size, stride or None, padding, ceil_mode, count_include_pad))
def avg_pool1d(input, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True):
    """Average pooling of (N, C, L) input, or unbatched (C, L), as avg_pool2d over (C, 1, L)."""
    return _via_2d(lambda x: avg_pool2d(x, _lift(kernel_size, 1), _lift(stride or None, 1), _lift(padding, 0),
                                        ceil_mode, count_include_pad), input, "avg_pool1d")


@_traced(lambda output_size: M.AdaptiveAvgPool1d(output_size))
def adaptive_avg_pool1d(input, output_size):
    """Average pooling of (N, C, L) input, or unbatched (C, L), to output_size steps."""
    return _via_2d(lambda x: adaptive_avg_pool2d(x, _lift(output_size, 1)), input, "adaptive_avg_pool1d")


@_traced(lambda output_size: M.AdaptiveMaxPool1d(output_size))
def adaptive_max_pool1d(input, output_size):
    """Max pooling of (N, C, L) input, or unbatched (C, L), to output_size steps; no return_indices."""
    return _via_2d(lambda x: adaptive_max_pool2d(x, _lift(output_size, 1)), input, "adaptive_max_pool1d")


def _nearest_factors(input, size, scale_factor):
    """The integer (h, w) factors of a nearest upsampling to `size` or by `scale_factor`."""
    if (size is None) == (scale_factor is None):
        raise ValueError("interpolate: give exactly one of size and scale_factor")
    H, W = input.shape[2:]
    if size is not None:
        size = (size, size) if isinstance(size, int) else tuple(int(v) for v in size)
        if len(size) != 2:
            raise ValueError(f"interpolate: size must be an int or a pair for a 4-d input, got {size}")
        if H == 0 or W == 0 or size[0] % H or size[1] % W or size[0] < H or size[1] < W:
            raise NotImplementedError(f"interpolate: size {size} is not an integer multiple of the input's size "
                                      f"{(H, W)}; only integer upsampling factors are supported")
        return size[0] // H, size[1] // W
    factors = (scale_factor, scale_factor) if not isinstance(scale_factor, (tuple, list)) else tuple(scale_factor)
    if len(factors) != 2:
        raise ValueError(f"interpolate: scale_factor must be a number or a pair for a 4-d input, got {scale_factor}")
    if not all(float(f) >= 1 and float(f).is_integer() for f in factors):
        raise NotImplementedError(f"interpolate: scale_factor {scale_factor} is not supported; only integer "
                                  f"upsampling factors (1, 2, 3, ...) are")
    return int(factors[0]), int(factors[1])


def _no_antialias(antialias):
    if antialias:
        raise NotImplementedError("interpolate: antialias=True is not supported")


def _interpolate_layer(size=None, scale_factor=None, mode="nearest", align_corners=None, recompute_scale_factor=None,
                       antialias=False):
    _no_antialias(antialias)
    return M.Upsample(size, scale_factor, mode, align_corners, recompute_scale_factor)


@_traced(_interpolate_layer)
def interpolate(input, size=None, scale_factor=None, mode="nearest", align_corners=None,
                recompute_scale_factor=None, antialias=False):
    """Upsampling of input to size or by scale_factor, as torch.nn.functional.interpolate: mode='nearest' of
    (N, C, H, W) input by integer factors, 'bilinear' of (N, C, H, W) and 'linear' of (N, C, L) input to any size,
    with align_corners. Other modes and antialias raise NotImplementedError."""
    _check(input, "input", "interpolate")
    _no_antialias(antialias)
    layer = M.Upsample(size, scale_factor, mode, align_corners, recompute_scale_factor)
    if mode != "nearest":
        (P, Q), (sh, sw) = layer.lerp(tuple(input.shape[1:]))
        x = input if mode == "bilinear" else input.unsqueeze(2)
        out = _C.upsample_bilinear2d_forward(None, x, (P, Q), layer.align_corners, sh, sw)
        return out if mode == "bilinear" else out.squeeze(2)
    if input.ndim != 4:
        raise NotImplementedError(f"interpolate: mode='nearest' takes 4-d (N, C, H, W) input, got shape "
                                  f"{tuple(input.shape)}")
    return _C.upsample_nearest2d_forward(None, input, _nearest_factors(input, size, scale_factor))


# ---- dropout ----

def _take_blocks(generator, n):
    """(seed, offset) for a draw of n Philox blocks; the generator moves past them."""
    g = generator or default_generator
    with g._lock:
        seed, offset = g._seed, g._offset
        g._offset += n
    return seed, offset


def upsample(input, size=None, scale_factor=None, mode="nearest", align_corners=None):
    """F.interpolate under its old name, as torch.nn.functional.upsample (which warns that it is deprecated)."""
    warnings.warn("nn.functional.upsample is deprecated. Use nn.functional.interpolate instead.", UserWarning,
                  stacklevel=2)
    return interpolate(input, size, scale_factor, mode, align_corners)


def _dropout_layer(cls):
    def layer(p=0.5, training=True, inplace=False, *, generator=None):
        if generator is not None:
            raise TypeError("dropout: a generator cannot be traced (compiled programs key masks by their seed)")
        return cls(p) if training else M.Identity()
    return layer


def _dropout(input, p, training, inplace, generator, fn, dims=0):
    """dropout, or with dims spatial dimensions a channel's values dropped together (dropout1d, dropout2d)."""
    _check(input, "input", fn)
    span = _channel_dims(input, fn, dims) if dims else 1
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
    if not training or p == 0.0:
        return input
    span = max(span, 1)  # a channel of no values
    seed, offset = _take_blocks(generator, _C.dropout_blocks(input.numel() // span))
    return _C.dropout_forward(input if inplace else None, input, float(p), seed, offset, span=span)


@_traced(_dropout_layer(M.Dropout))
def dropout(input, p=0.5, training=True, inplace=False, *, generator=None):
    """Zeroes each element with probability p and scales the rest by 1 / (1 - p). The mask is a pure function
    of the generator's (seed, offset) and the element's index; ``ft.ops.dropout_backward`` with the same
    (p, seed, offset) regenerates it. Returns input itself when not training or p == 0."""
    return _dropout(input, p, training, inplace, generator, "dropout")


def _channel_dims(input, fn, dims):
    """The number of values a channel of input has: input is (N, C, *spatial) or (C, *spatial) with `dims`
    spatial dimensions; a 3-d input to dropout2d is read as (N, C, L), with PyTorch's warning."""
    if fn == "dropout2d" and input.ndim == 3:
        warnings.warn("dropout2d: Received a 3D input to dropout2d and assuming that channel-wise 1D dropout "
                      "behavior is desired - input is interpreted as shape (N, C, L), where C is the channel dim. "
                      "This behavior will change in a future release to interpret the input as one without a batch "
                      "dimension, i.e. shape (C, H, W). To maintain the 1D channel-wise dropout behavior, please "
                      "switch to using dropout1d instead.", stacklevel=5)
        dims = 1
    elif input.ndim not in (dims + 1, dims + 2):
        raise ValueError(f"{fn}: expected a {dims + 1}-d (unbatched) or {dims + 2}-d (batched) input, got "
                         f"{input.ndim}-d")
    return math.prod(input.shape[input.ndim - dims:])


@_traced(_dropout_layer(M.Dropout1d))
def dropout1d(input, p=0.5, training=True, inplace=False):
    """Zeroes each channel of (N, C, L) or (C, L) input whole with probability p and scales the rest by 1 / (1 - p),
    as torch.nn.functional.dropout1d; a channel's values share one draw of the generator (see dropout)."""
    return _dropout(input, p, training, inplace, None, "dropout1d", 1)


@_traced(_dropout_layer(M.Dropout2d))
def dropout2d(input, p=0.5, training=True, inplace=False):
    """Zeroes each channel of (N, C, H, W) or (C, H, W) input whole with probability p and scales the rest by
    1 / (1 - p), as torch.nn.functional.dropout2d (which reads a 3-d input as (N, C, L), and warns)."""
    return _dropout(input, p, training, inplace, None, "dropout2d", 2)


@_traced(lambda inplace=False: M.Hardswish())
def hardswish(input, inplace=False):
    """input * relu6(input + 3) / 6 elementwise; inplace=True overwrites input."""
    return _act(input, "hardswish", inplace=inplace, fn="hardswish")


@_traced(lambda beta=1.0, threshold=20.0: M.Softplus(beta, threshold))
def softplus(input, beta=1.0, threshold=20.0):
    """log(1 + exp(beta input)) / beta elementwise, and input itself where beta input > threshold, as
    torch.nn.functional.softplus. A compiled program computes the logarithm exactly everywhere, which is input to
    float32's precision above 15: it refuses a lower threshold."""
    if beta == 0:
        raise ValueError("softplus: beta must not be 0")
    z = input * beta if beta != 1.0 else input
    out = _act(z, "softplus", fn="softplus")
    return where(z > threshold, input, out if beta == 1.0 else out * (1.0 / beta))


# ---- written with the ops above (traced and eager alike) ----

def hardsigmoid(input, inplace=False):
    """relu6(input + 3) / 6, as torch.nn.functional.hardsigmoid."""
    return _result(input, relu6(input + 3.0) * (1.0 / 6.0), inplace)


def mish(input, inplace=False):
    """input * tanh(softplus(input)), as torch.nn.functional.mish."""
    return _result(input, input * tanh(softplus(input)), inplace)


def selu(input, inplace=False):
    """scale * elu(input, alpha) with SELU's constants (scale 1.0507..., alpha 1.6732...), as
    torch.nn.functional.selu."""
    return _result(input, elu(input, 1.6732632423543772848170429916717) * 1.0507009873554804934193349852946, inplace)


def celu(input, alpha=1.0, inplace=False):
    """max(0, input) + min(0, alpha (exp(input / alpha) - 1)) = alpha elu(input / alpha), as
    torch.nn.functional.celu."""
    if alpha == 0:
        raise ValueError("celu: alpha must not be 0")
    return _result(input, elu(input * (1.0 / alpha)) * alpha, inplace)


def logsigmoid(input):
    """log(sigmoid(input)) = -softplus(-input), as torch.nn.functional.logsigmoid."""
    return -softplus(-input)


def softsign(input):
    """input / (1 + |input|), as torch.nn.functional.softsign."""
    return input / (input.abs() + 1.0)


def tanhshrink(input):
    """input - tanh(input), as torch.nn.functional.tanhshrink."""
    return input - tanh(input)


def prelu(input, weight):
    """max(0, input) + weight * min(0, input), weight one value or one per channel (dimension 1)."""
    if weight.numel() != 1:
        weight = weight.view(-1, *(1,) * (input.ndim - 2))
    return relu(input) - relu(-input) * weight


def softmin(input, dim=None, _stacklevel=3, dtype=None):
    """softmax(-input) along dim, as torch.nn.functional.softmin."""
    return softmax(-input, dim, _stacklevel + 1, dtype)


def _thresholded(input, at, value, inplace):
    return _result(input, where(input <= at, float(value), input), inplace)  # NaN kept, as PyTorch's


def threshold(input, threshold, value, inplace=False):
    """input where it exceeds threshold, value elsewhere (the gradient passes where it exceeds), as
    torch.nn.functional.threshold."""
    return _thresholded(input, threshold, value, inplace)


def threshold_(input, threshold, value):
    """threshold in place; returns input."""
    return _thresholded(input, threshold, value, True)


def hardshrink(input, lambd=0.5):
    """input where |input| > lambd, 0 elsewhere (NaN kept), as torch.nn.functional.hardshrink."""
    return where(input.abs() <= lambd, 0.0, input)


def softshrink(input, lambd=0.5):
    """input moved towards 0 by lambd, 0 within [-lambd, lambd]: input - clamp(input, -lambd, lambd), as
    torch.nn.functional.softshrink."""
    if lambd < 0:
        raise ValueError(f"softshrink: lambd must be at least 0, got {lambd}")
    return where(input.abs() <= lambd, 0.0, input - input.clamp(-lambd, lambd))  # no gradient at +-lambd


def hardtanh_(input, min_val=-1.0, max_val=1.0):
    """hardtanh in place; returns input."""
    return hardtanh(input, min_val, max_val, inplace=True)


def elu_(input, alpha=1.0):
    """elu in place; returns input."""
    return elu(input, alpha, inplace=True)


def selu_(input):
    """selu in place; returns input."""
    return selu(input, inplace=True)


def celu_(input, alpha=1.0):
    """celu in place; returns input."""
    return celu(input, alpha, inplace=True)


def bilinear(input1, input2, weight, bias=None):
    """x1^T A_k x2 + b_k for each output k, weight A of shape (out, in1, in2), as torch.nn.functional.bilinear:
    A_k x2 for every k in one product with weight's rows (out * in1, in2), then each one's dot product with x1."""
    out, in1, in2 = weight.shape
    if tuple(input1.shape[:-1]) != tuple(input2.shape[:-1]):
        raise ValueError(f"bilinear: input1 and input2 must have the same leading shape, got {tuple(input1.shape)} "
                         f"and {tuple(input2.shape)}")
    rows = (weight.reshape(out * in1, in2) @ input2.unsqueeze(-1)).squeeze(-1)
    y = (rows.reshape(*rows.shape[:-1], out, in1) * input1.unsqueeze(-2)).sum(-1)
    return y if bias is None else y + bias


def embedding_bag(input, weight, offsets=None, max_norm=None, norm_type=2, scale_grad_by_freq=False, mode="mean",
                  sparse=False, per_sample_weights=None, include_last_offset=False, padding_idx=None):
    """The sum, mean or max of each bag's rows of weight, as torch.nn.functional.embedding_bag: bags of one length
    as the rows of a 2-d input (B, L), padding_idx leaving its ids out of the sums and the counts (an empty bag
    gives 0), or, eagerly, a 1-d input cut at offsets. per_sample_weights (the input's shape) scale the rows in
    mode 'sum'. A compiled model takes the 2-d form: pad the bags to one length with padding_idx."""
    if mode not in ("sum", "mean", "max"):
        raise ValueError(f"embedding_bag: mode must be 'sum', 'mean' or 'max', got {mode!r}")
    if per_sample_weights is not None and mode != "sum":
        raise NotImplementedError(f"embedding_bag: per_sample_weights is only supported for mode='sum' (got mode="
                                  f"{mode!r}), as PyTorch's")
    if input.ndim == 1 or isinstance(input, Symbolic) and offsets is not None:
        return _bags_of_offsets(input, weight, offsets, max_norm, scale_grad_by_freq, mode, sparse,
                                per_sample_weights, include_last_offset, padding_idx)
    if input.ndim != 2 or offsets is not None:
        raise ValueError(f"embedding_bag: input must be bags of one length (B, L) without offsets, or 1-d ids with "
                         f"offsets; got {input.ndim}-d ids{' and offsets' if offsets is not None else ''}")
    rows = embedding(input, weight, padding_idx, max_norm, norm_type, scale_grad_by_freq, sparse)
    kept = None if padding_idx is None else (input != (padding_idx % weight.shape[0])).unsqueeze(-1)
    if per_sample_weights is not None:
        rows = rows * per_sample_weights.unsqueeze(-1)
    if kept is None:
        return rows.amax(1) if mode == "max" else rows.sum(1) if mode == "sum" else rows.mean(1)
    count = kept.float().sum(1)
    if mode == "max":
        return rows.masked_fill(~kept, float("-inf")).amax(1).masked_fill(count == 0, 0.0)
    total = rows.masked_fill(~kept, 0.0).sum(1)  # whatever the padding row holds
    return total if mode == "sum" else total / count.clamp_min(1.0)


def _bags_of_offsets(input, weight, offsets, max_norm, scale_grad_by_freq, mode, sparse, per_sample_weights,
                     include_last_offset, padding_idx):
    """embedding_bag of 1-d ids cut at offsets: the bags one by one (eager values)."""
    if isinstance(input, Symbolic):
        fail("embedding_bag of 1-d ids cut at offsets", "a compiled model reads each sample on its own: pad the bags "
             "to one length with padding_idx (ft.nn.utils.rnn.pad_sequence) and pass them as a 2-d input")
    if offsets is None or offsets.ndim != 1 or offsets.dtype.is_floating_point or \
            (include_last_offset and not offsets.shape[0]):
        raise ValueError("embedding_bag: 1-d ids need 1-d integer offsets, where each bag starts (and with "
                         "include_last_offset, where the last ends)")
    if per_sample_weights is not None and tuple(per_sample_weights.shape) != tuple(input.shape):
        raise ValueError(f"embedding_bag: per_sample_weights must have the ids' shape {tuple(input.shape)}, got "
                         f"{tuple(per_sample_weights.shape)}")
    starts = [int(v) for v in offsets.tolist()]
    if include_last_offset:
        starts, end = starts[:-1], starts[-1]
    else:
        end = input.shape[0]
    if (starts and starts[0] != 0) or any(b < a for a, b in zip(starts, starts[1:] + [end])) or end > input.shape[0]:
        raise ValueError(f"embedding_bag: offsets must rise from 0 to at most {input.shape[0]}, got {starts}")
    bags = []
    for a, b in zip(starts, starts[1:] + [end]):
        ids = input[a:b].unsqueeze(0)
        w = None if per_sample_weights is None else per_sample_weights[a:b].unsqueeze(0)
        bags.append(embedding_bag(ids, weight, None, max_norm, 2, scale_grad_by_freq, mode, sparse, w,
                                  padding_idx=padding_idx) if b > a else
                    creation.zeros(1, weight.shape[1], device=weight.device))
    return cat(bags, 0) if bags else creation.zeros(0, weight.shape[1], device=weight.device)


def channel_shuffle(input, groups):
    """The channels of (N, C, ...) regrouped: (N, groups, C / groups, ...) transposed to (N, C / groups, groups,
    ...), as torch.nn.functional.channel_shuffle (ShuffleNet)."""
    N, C = input.shape[0], input.shape[1]
    if isinstance(groups, bool) or not isinstance(groups, int) or groups < 1 or C % groups:
        raise ValueError(f"channel_shuffle: {C} channels do not split into {groups!r} groups")
    rest = tuple(input.shape[2:])
    return input.reshape(N, groups, C // groups, *rest).transpose(1, 2).reshape(N, C, *rest)


def glu(input, dim=-1):
    """a * sigmoid(b) of input's two halves a, b along dim, as torch.nn.functional.glu."""
    if input.shape[dim] % 2:
        raise ValueError(f"glu: dimension {dim} of size {input.shape[dim]} is not even")
    a, b = input.chunk(2, dim)
    return a * sigmoid(b)


def rms_norm(input, normalized_shape, weight=None, eps=None):
    """input / sqrt(mean(input^2) + eps) over the trailing normalized_shape, times weight, as
    torch.nn.functional.rms_norm; eps defaults to float32's machine epsilon, as PyTorch's for float32."""
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    if tuple(input.shape[-len(shape):]) != shape:
        raise ValueError(f"rms_norm: normalized_shape {shape} is not the trailing shape of {tuple(input.shape)}")
    eps = float(np.finfo(np.float32).eps) if eps is None else eps
    dims = tuple(range(-len(shape), 0))
    out = input * (input * input).mean(dims, keepdim=True).add(eps).rsqrt()
    return out if weight is None else out * weight


def pixel_shuffle(input, upscale_factor):
    """(N, C r^2, H, W) to (N, C, H r, W r), as torch.nn.functional.pixel_shuffle."""
    r = upscale_factor
    N, C, H, W = input.shape
    if C % (r * r):
        raise ValueError(f"pixel_shuffle: {C} channels are not divisible by upscale_factor^2 = {r * r}")
    x = input.reshape(N, C // (r * r), r, r, H, W).permute(0, 1, 4, 2, 5, 3)
    return x.reshape(N, C // (r * r), H * r, W * r)


def pixel_unshuffle(input, downscale_factor):
    """(N, C, H r, W r) to (N, C r^2, H, W), as torch.nn.functional.pixel_unshuffle."""
    r = downscale_factor
    N, C, H, W = input.shape
    if H % r or W % r:
        raise ValueError(f"pixel_unshuffle: {H} x {W} is not divisible by downscale_factor {r}")
    x = input.reshape(N, C, H // r, r, W // r, r).permute(0, 1, 3, 5, 2, 4)
    return x.reshape(N, C * r * r, H // r, W // r)


def pad(input, pad, mode="constant", value=None):
    """input padded on both sides of its last len(pad) / 2 dimensions, the last first: (left, right, top, bottom,
    ...), as torch.nn.functional.pad. mode 'constant' fills value (0 by default) and a negative pad crops; 'reflect'
    mirrors the values next to the edge, 'replicate' repeats the edge, 'circular' wraps around. Made of slices and
    cat, so it traces and trains."""
    if mode not in ("constant", "reflect", "replicate", "circular"):
        raise NotImplementedError(f"pad: mode={mode!r} is not supported; use 'constant', 'reflect', 'replicate' or "
                                  "'circular'")
    pad = tuple(int(p) for p in pad)
    lead = 1 if isinstance(input, Symbolic) else 0  # a traced value's batch dimension
    if len(pad) % 2 or len(pad) // 2 > input.ndim - lead:
        raise ValueError(f"pad: {pad} does not pad pairs of the last dimensions of {tuple(input.shape)}")
    if mode != "constant" and value is not None:
        raise ValueError(f"pad: value={value} is only used by mode='constant', not {mode!r}")
    out = input
    for k in range(len(pad) // 2):
        d, (before, after) = out.ndim - 1 - k, pad[2 * k:2 * k + 2]
        size = out.shape[d]

        def part(start, stop):
            return out[(slice(None),) * d + (slice(start, stop),)]
        if mode == "constant":
            if before < 0 or after < 0:
                out = part(max(-before, 0), size - max(-after, 0))
            fill = (0 if value is None else value) if lead == 0 else 0.0 if value is None else float(value)
            blocks = [creation.full(tuple(out.shape[lead:d]) + (n,) + tuple(out.shape[d + 1:]), fill,
                                    dtype=None if lead else out.dtype, device=getattr(out, "device", None))
                      if n else None for n in (max(before, 0), max(after, 0))]
        else:
            limit = {"reflect": size - 1, "circular": size, "replicate": math.inf if size else 0}[mode]
            if min(before, after) < 0 or max(before, after) > limit:
                why = ("only mode='constant' crops" if min(before, after) < 0 else
                       f"it pads by at most {limit}" + (" (the size less one)" if mode == "reflect" else ""))
                raise ValueError(f"pad: mode={mode!r} cannot pad dimension {d} of size {size} by ({before}, "
                                 f"{after}): {why}")
            if mode == "circular":
                blocks = [part(size - before, size) if before else None, part(0, after) if after else None]
            elif mode == "replicate":
                keep = (-1,) * out.ndim
                blocks = [part(at, at + 1).expand(*keep[:d], n, *keep[d + 1:]) if n else None
                          for at, n in ((0, before), (size - 1, after))]
            else:  # the values next to each edge, mirrored
                near = ([part(i, i + 1) for i in range(before, 0, -1)],
                        [part(size - 1 - i, size - i) for i in range(1, after + 1)])
                blocks = [cat(b, dim=d) if len(b) > 1 else (b[0] if b else None) for b in near]
        parts = [b for b in (blocks[0], out, blocks[1]) if b is not None]
        out = cat(parts, dim=d) if len(parts) > 1 else out
    return out


# ---- softmax ----

def _softmax_dim(ndim, fn, stacklevel):
    # stacklevel counts from here, as torch's _get_softmax_dim does: 3 names softmax's caller
    warnings.warn(f"Implicit dimension choice for {fn} has been deprecated. Change the call to include dim=X "
                  "as an argument.", stacklevel=stacklevel)
    return 0 if ndim in (0, 1, 3) else 1


@_traced(lambda dim=None, _stacklevel=3, dtype=None: M.Softmax(dim))
def softmax(input, dim=None, _stacklevel=3, dtype=None):
    """exp(input) normalized to sum 1 along dim, as torch.nn.functional.softmax; dtype converts input first. Without dim
    it warns and picks PyTorch's implicit dimension."""
    _check(input, "input", "softmax")
    dim = _softmax_dim(input.ndim, "softmax", _stacklevel + 1) if dim is None else dim  # + 1: _traced's frame
    return _math.softmax(input, dim, dtype)


@_traced(lambda dim=None, _stacklevel=3, dtype=None: M.LogSoftmax(dim))
def log_softmax(input, dim=None, _stacklevel=3, dtype=None):
    """log(softmax(input)) along dim, as torch.nn.functional.log_softmax; dtype converts input first. Without dim it
    warns and picks PyTorch's implicit dimension. Of a sequence's scores merged into rows (logits.view(-1, V)),
    what F.nll_loss takes as their cross entropy."""
    if isinstance(input, MergedRows) and not input.log_probs and dim in (1, -1) and dtype is None:
        return MergedRows(input.source, log_probs=True)
    _check(input, "input", "log_softmax")
    dim = _softmax_dim(input.ndim, "log_softmax", _stacklevel + 1) if dim is None else dim
    return _math.log_softmax(input, dim, dtype)


# ---- attention ----

def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                                 enable_gqa=False):
    """softmax(query key^T * scale + mask) value over (N, H, T, D) or (N, T, D) tensors, fused (the (Tq, Tk)
    matrix is never stored). query, key and value may be views with any strides except along D, such as
    ``x.view(N, T, H, D).transpose(1, 2)``. The kernel takes as attn_mask the causal mask (a bool one True on and
    below the diagonal, or -inf above it and 0 elsewhere), which is is_causal=True, and a mask of keys the same for
    every query and head, shaped (N, 1, 1, Tk) or (1, Tk): a padding mask, bool (True where attention is allowed)
    or additive (0, and -inf where not). A query that sees no key gets 0, as PyTorch 2's. Any other
    mask broadcasting to (N, H, Tq, Tk), bool or added to the scores (ALiBi's, T5's relative positions, a learned
    bias), runs the attention written out as PyTorch's reference formula (see _written_attention). dropout_p drops
    weights as PyTorch does (whatever the mode: pass 0.0 in eval, as its layers do), inside the kernel: the mask is
    F.dropout's of the (N, H, Tq, Tk) weights at the default generator's next draw. The backward is
    ``ft.ops.sdpa_backward``, which needs the log-sum-exp that ``ft.ops.sdpa_forward`` returns (and the same
    dropout_p, seed, offset and key_mask). With enable_gqa, key and value of fewer heads than query (grouped-query
    attention, a divisor of its heads) serve consecutive groups of its heads, as PyTorch's."""
    fn = "scaled_dot_product_attention"
    if enable_gqa and query.ndim >= 3 and key.shape[-3] != query.shape[-3]:
        groups, left = divmod(query.shape[-3], key.shape[-3])
        if left:
            raise ValueError(f"{fn}: enable_gqa needs the query's heads ({query.shape[-3]}) a multiple of the key's "
                             f"({key.shape[-3]})")
        key, value = key.repeat_interleave(groups, dim=-3), value.repeat_interleave(groups, dim=-3)
    if attn_mask is not None and is_causal:
        raise ValueError(f"{fn}: an explicit attn_mask should not be given with is_causal=True (PyTorch's refuses "
                         "it too): add the causal mask to it, or pass one")
    causal, keys, scores = M._attention_mask(attn_mask, query.shape[-2], key.shape[-2], fn, keeps=True,
                                             batched=getattr(attn_mask, "ndim", None) == query.ndim)
    if scores is not None and not _adds_to_scores(scores, query):
        return _written_attention(query, key, value, is_causal, scale, dropout_p, [scores], fn)[0]
    return _attention(query, key, value, causal or is_causal, scale, dropout_p, keys, fn, bias=scores)


def _adds_to_scores(mask, query):
    """Whether the fused kernel takes mask as a bias added to the scores: floats that cannot mask out a query's
    every key (a learned bias, a constant of finite values), on the CPU."""
    from .graph import _device_of
    device = _device_of(query) if isinstance(query, Symbolic) else query.device
    return mask.dtype.name != "bool" and not _may_hide_a_row(mask) and device.type == "cpu"


_NO_KEY = -1e30  # scores held at or above it: a query whose every key is masked out has a finite row to zero


def _attention_probs(query, key, is_causal, scale, masks):
    """softmax(query key^T * scale) under the causal mask and masks, each True where a score is masked out or a float
    added to the scores, written out (the (N, H, Tq, Tk) scores are formed): 0 for a query that sees no key, as the
    fused kernel and PyTorch 2's attention give (a softmax of -inf alone is NaN, and so would its gradient be)."""
    Tq, Tk = query.shape[-2], key.shape[-2]
    if is_causal:
        masks = [creation.tensor(np.triu(np.ones((Tq, Tk), bool), 1), device=query.device), *masks]
    s = (query @ key.transpose(-2, -1)) * (1 / math.sqrt(query.shape[-1]) if scale is None else scale)
    for m in masks:
        s = s.masked_fill(m, float("-inf")) if m.dtype.name == "bool" else s + m.to(s.dtype)
    if not any(_may_hide_a_row(m) for m in masks):  # a bias of finite values (ALiBi's, a learned one)
        return softmax(s, dim=-1)
    s = s.clamp_min(_NO_KEY)
    return softmax(s, dim=-1).masked_fill(s.amax(-1, keepdim=True) <= _NO_KEY, 0.0)


def _may_hide_a_row(mask):
    """Whether mask may mask out every key of a query: a bool one, or one of floats holding -inf (or float32's
    lowest) or computed in the forward; a learned bias, or a constant of finite values, cannot."""
    if mask.dtype.name == "bool":
        return True
    if isinstance(mask, Symbolic):
        if not isinstance(mask.node.module, M.Value):
            return True
        mask = mask.node.module.tensor
    if mask.requires_grad or uses_trainable([mask]):  # trains (its values are not read while tracing)
        return False
    return bool((np.asarray(mask.float().cpu()) <= _NO_KEY).any())


def _written_attention(query, key, value, is_causal, scale, dropout_p, masks, fn):
    """Attention under masks the fused kernel does not take, as PyTorch's reference formula: the weights of
    _attention_probs, dropped out, times value. Returns the output and the weights after dropout."""
    _check_dropout_p(dropout_p, fn)
    if not any(isinstance(x, Symbolic) for x in (query, key, value)):
        for x, name in ((query, "query"), (key, "key"), (value, "value")):
            _check(x, name, fn)
        query, key, value = cast(query, key, value)
    w = _attention_probs(query, key, is_causal, scale, masks)
    if dropout_p:
        w = dropout(w, dropout_p)
    return w @ value, w


def _check_dropout_p(p, fn):
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"{fn}: dropout_p must be in [0, 1], got {p}")


def _attention(query, key, value, is_causal, scale, dropout_p, key_mask, fn, bias=None):
    """scaled_dot_product_attention with its mask read: key_mask True where a key is masked out, (B, Tk) with B the
    batch or 1, or a traced bool value; bias added to the scores, broadcasting to (N, H, Tq, Tk)."""
    _check_dropout_p(dropout_p, fn)
    if any(isinstance(x, Symbolic) for x in (query, key, value)):
        from .graph import attention
        if key_mask is not None and not isinstance(key_mask, Symbolic):
            fail(f"{fn}: a mask of keys fixed for every sample", "compute it from the input, so that each sample "
                 "has its own: (ids == pad)")
        operand = next(x for x in (query, key, value) if isinstance(x, Symbolic))._operand
        return attention(*(operand(x) for x in (query, key, value)), is_causal, scale, float(dropout_p), key_mask,
                         bias)
    for x, name in ((query, "query"), (key, "key"), (value, "value")):
        _check(x, name, fn)
    ranks = {query.ndim, key.ndim, value.ndim}
    if len(ranks) != 1 or query.ndim not in (3, 4):
        raise ValueError(f"{fn}: query, key and value must all be (N, H, T, D) or all (N, T, D), got shapes "
                         f"{tuple(query.shape)}, {tuple(key.shape)} and {tuple(value.shape)}")
    three = query.ndim == 3
    if three:
        query, key, value = query.unsqueeze(1), key.unsqueeze(1), value.unsqueeze(1)
    query, key, value = (x if x.stride(-1) == 1 else x.contiguous() for x in cast(query, key, value))  # D in a row
    N, Tk = query.shape[0], key.shape[2]
    if key_mask is not None:
        if key_mask.shape[0] not in (1, N):
            raise ValueError(f"{fn}: a mask of keys for {key_mask.shape[0]} samples, but the batch has {N}")
        key_mask = key_mask.to(query.device).expand(N, Tk)
    if bias is not None:
        bias = bias.to(query.device).to(query.dtype)  # as the written-out formula adds it
        bias = bias.reshape((1,) * (4 - bias.ndim) + tuple(bias.shape)).expand(*query.shape[:3], Tk)
    seed, offset = _take_blocks(None, _C.dropout_blocks(math.prod(query.shape[:3]) * Tk)) if dropout_p else (0, 0)
    out, _ = _C.sdpa_forward(None, False, query, key, value, scale, is_causal, dropout_p=float(dropout_p), seed=seed,
                             offset=offset, key_mask=key_mask, bias=bias)
    return out.squeeze(1) if three else out


# ---- losses ----

def _legacy_reduction(size_average, reduce, reduction):
    if size_average is None and reduce is None:
        return reduction
    size_average = True if size_average is None else size_average
    reduce = True if reduce is None else reduce
    return "none" if not reduce else "mean" if size_average else "sum"


def _classes_first(fn, input, target):
    """Traced rows merged from a sequence's scores and labels (logits.view(-1, V), y.view(-1)) as the loss's
    (N, C, d...) and (N, d...) form, labels y.view(-1) with (N, C) scores as y; anything else as it is."""
    if not isinstance(input, MergedRows):
        rows = input.node.inputs[0] if isinstance(input, Symbolic) and isinstance(input.node.module, M.Reshape) \
            else None
        if isinstance(target, MergedRows) and rows is not None and len(rows.shape) >= 2 and \
                math.prod(rows.shape[:-1]) == 1 and target.source.node.shape == rows.shape[:-1]:
            # one position per sample (T = 1): logits.view(-1, V) is as many rows as samples, and y.view(-1) too
            return MergedRows(Symbolic(rows)).classes_first(), target.classes_first()
        # y.view(-1) of one label per sample is y
        return input, target.source if isinstance(target, MergedRows) else target
    if not isinstance(target, MergedRows):
        fail(f"{fn} of rows merged from the batch and values that are not",
             "view both: logits.view(-1, V) and y.view(-1)")
    return input.classes_first(), target.classes_first()


def cross_entropy(input, target, weight=None, size_average=None, ignore_index=-100, reduce=None, reduction="mean",
                  label_smoothing=0.0):
    """Class-index targets (int64 or int32) of shape (N) or (N, d...) for input (N, C) or (N, C, d...), or class
    probabilities of input's shape (soft labels, mixup's), as torch.nn.functional.cross_entropy."""
    reduction = _legacy_reduction(size_average, reduce, reduction)
    merged = isinstance(input, MergedRows)
    input, target = _classes_first("cross_entropy", input, target)
    if isinstance(input, Symbolic):
        loss = M.CrossEntropyLoss(weight, ignore_index=ignore_index, reduction=reduction,
                                  label_smoothing=label_smoothing)(input, target)
        return MergedRows(loss) if merged and reduction == "none" else loss  # per-position losses, merged too
    _check(input, "input", "cross_entropy")
    _check(target, "target", "cross_entropy")
    if target.dtype.is_floating_point:  # class probabilities: in float64 NumPy, as the other eager losses
        if tuple(target.shape) != tuple(input.shape):
            raise TypeError(f"cross_entropy: target must hold class indices as int64 or int32, or class "
                            f"probabilities of the input's shape {tuple(input.shape)}; got {target.dtype.name} of "
                            f"shape {tuple(target.shape)}")
        logp, p = _host(log_softmax(input.double(), min(input.ndim - 1, 1))), _host(target)
        if logp.ndim == 1:  # one unbatched sample
            logp, p = logp[None], p[None]
        classes = logp.shape[1]
        p = p * (1 - label_smoothing) + label_smoothing / classes
        w = np.ones(classes) if weight is None else _host(weight)
        values = -(p * logp * w.reshape(-1, *(1,) * (logp.ndim - 2))).sum(1)
        return _eager(values if input.ndim > 1 else values[0], _reduction_of("cross_entropy", reduction), input)
    loss, _ = _C.cross_entropy_forward(None, False, *widen(input, target, weight), reduction, int(ignore_index),
                                       float(label_smoothing))
    return loss


# The losses below are, traced, compositions of recorded ops (an elementwise loss, then its reduction) and,
# eager, a forward in float64 NumPy: values to look at (the compiled program trains with the traced form).

def _host(t):
    return np.asarray(t.cpu() if isinstance(t, TensorBase) else t, dtype=np.float64)


def _eager(values, reduction, like, divisor=None):
    """PyTorch's reduction of NumPy per-element losses, as a float32 tensor on like's device."""
    out = values if reduction == "none" else values.sum() / (divisor if divisor is not None else values.size) \
        if reduction == "mean" else values.sum() / values.shape[0] if reduction == "batchmean" else values.sum()
    return creation.as_tensor(np.asarray(out, dtype=np.float32)).to(like.device)


def _pair_check(input, target, fn):
    """The target, checked to have input's shape; a target (N,) for an input (N, 1) is taken as the column (N, 1)
    (one regression target per sample; PyTorch would broadcast the two to (N, N) with a warning)."""
    _check(input, "input", fn)
    _check(target, "target", fn)
    if len(input.shape) == 2 and input.shape[1] == 1 and tuple(target.shape) == (input.shape[0],):
        return target.reshape(input.shape[0], 1)
    if tuple(input.shape) != tuple(target.shape):
        raise ValueError(f"{fn}: target should have the shape of input {tuple(input.shape)}, got {tuple(target.shape)}")
    return target


def _reduction_of(fn, reduction, allowed=("none", "mean", "sum")):
    if reduction not in allowed:
        raise ValueError(f"{fn}: reduction must be one of {', '.join(map(repr, allowed))}, got {reduction!r}")
    return reduction


def _on_device_of(x, array):
    """A constant tensor for a traced loss, where x's program runs."""
    from .graph import _device_of
    return creation.as_tensor(np.asarray(array, dtype=np.float32)).to(_device_of(x))


def _log_softmax_source(x):
    """The scores whose log_softmax over the classes x (N, C, d...) is, seen in x's order (moved classes first by a
    transpose or permute after the log_softmax too), or None."""
    from .graph import _dim
    node, perm = x.node, None
    if isinstance(node.module, M.Permute):
        perm, node = node.module.perm, node.inputs[0]
    if not isinstance(node.module, M.LogSoftmax) or _dim(node.module.dim, len(node.shape)) != (perm or (0,))[0]:
        return None
    scores = Symbolic(node.inputs[0])
    return scores.permute(0, *(p + 1 for p in perm)) if perm else scores


def nll_loss(input, target, weight=None, size_average=None, ignore_index=-100, reduce=None, reduction="mean"):
    """The negative log-likelihood of log-probabilities input (N, C) or (N, C, d...) for class targets (N,) or
    (N, d...); of a sequence's rows F.log_softmax(logits.view(-1, V), 1), or of F.log_softmax(logits, -1)
    moved classes first, the cross entropy of the logits (the same loss)."""
    reduction = _legacy_reduction(size_average, reduce, reduction)
    if isinstance(input, MergedRows) and input.log_probs:
        return cross_entropy(MergedRows(input.source), target, weight, ignore_index=ignore_index, reduction=reduction)
    if isinstance(input, MergedRows):  # rows of log-probabilities: the cross entropy of what log_softmax read
        lsm = input.source.node
        if not (isinstance(lsm.module, M.LogSoftmax) and lsm.module.dim in (-1, len(lsm.shape))):
            fail("F.nll_loss of rows merged from values that are not log_softmax's over their last dimension",
                 "pass F.log_softmax(logits.view(-1, V), 1), or F.cross_entropy(logits.view(-1, V), y.view(-1))")
        return cross_entropy(MergedRows(Symbolic(lsm.inputs[0])), target, weight, ignore_index=ignore_index,
                             reduction=reduction)
    if isinstance(input, Symbolic) and len(input.node.shape) > 1:
        scores = _log_softmax_source(input)
        if scores is None:
            fail("F.nll_loss of (N, C, d...) values other than a log_softmax's over C", "pass F.log_softmax(logits, "
                 "1) (or moved classes first after it), or F.cross_entropy of the scores")
        return cross_entropy(scores, target, weight, ignore_index=ignore_index, reduction=reduction)
    if isinstance(input, Symbolic):
        return M.NLLLoss(weight, ignore_index=ignore_index, reduction=reduction)(input, target)
    _check(input, "input", "nll_loss")
    _check(target, "target", "nll_loss")
    _reduction_of("nll_loss", reduction)
    if target.dtype.is_floating_point or target.dtype.name == "bool":
        raise TypeError(f"nll_loss: expected integer class targets (int64), got {target.dtype.name}")
    x, t = _host(input), np.asarray(target.cpu()).astype(np.int64)
    if x.ndim < 2 or t.shape != (x.shape[0], *x.shape[2:]):
        raise ValueError(f"nll_loss: input (N, C, d...) and target (N, d...), got {tuple(input.shape)} and "
                         f"{tuple(target.shape)}")
    positions = t.shape
    x, t = np.moveaxis(x, 1, -1).reshape(-1, x.shape[1]), t.reshape(-1)  # one row per position
    keep = t != ignore_index
    if np.any((t[keep] < 0) | (t[keep] >= x.shape[1])):
        raise IndexError(f"nll_loss: a target is outside [0, {x.shape[1]})")
    w = _host(weight) if weight is not None else np.ones(x.shape[1])
    if w.shape != (x.shape[1],):
        raise ValueError(f"nll_loss: weight must have one value per class ({x.shape[1]}), got shape {w.shape}")
    safe = np.where(keep, t, 0)
    wt = w[safe] * keep
    values = -x[np.arange(len(t)), safe] * wt
    return _eager(values.reshape(positions), reduction, input, divisor=wt.sum())


def mse_loss(input, target, size_average=None, reduce=None, reduction="mean"):
    """The squared error (input - target)^2 of equally shaped tensors, reduced as reduction says ('none', 'mean',
    'sum'). A target (N,) for an input (N, 1) counts as (N, 1), eagerly and in a compiled program (whose targets
    per sample are then (1,)): one value per sample, not PyTorch's broadcast to an (N, N) loss."""
    reduction = _legacy_reduction(size_average, reduce, reduction)
    if isinstance(input, Symbolic):
        d = input - target
        return (d * d).reduce(_reduction_of("mse_loss", reduction))
    target = _pair_check(input, target, "mse_loss")
    if input.dtype != target.dtype:  # promoted, as PyTorch: to float32 (the other float is 16-bit)
        input, target = input.float(), target.float()
    return _C.mse_loss_forward(None, *widen(input, target), reduction)


def _distance_loss(fn, act, alpha, scale, host_fn, input, target, reduction):
    """act(input - target) * scale, reduced: L1, smooth L1 and Huber."""
    _reduction_of(fn, reduction)
    if isinstance(input, Symbolic):
        values = M._Elementwise(act, alpha)(input - target)
        return (values if scale == 1.0 else values * scale).reduce(reduction)
    target = _pair_check(input, target, fn)
    return _eager(host_fn(_host(input) - _host(target)), reduction, input)


def _huber(d, delta):
    a = np.abs(d)
    return np.where(a < delta, 0.5 * d * d, delta * (a - 0.5 * delta))


def l1_loss(input, target, size_average=None, reduce=None, reduction="mean"):
    """The absolute error |input - target| of equally shaped tensors, reduced as reduction says. Called eagerly it
    computes in float64 NumPy and returns a float32 tensor on input's device (a value to look at); traced, it records
    the elementwise loss and its reduction, which the compiled program differentiates."""
    return _distance_loss("l1_loss", "abs", 0.0, 1.0, np.abs, input, target,
                          _legacy_reduction(size_average, reduce, reduction))


def smooth_l1_loss(input, target, size_average=None, reduce=None, reduction="mean", beta=1.0):
    """0.5 d^2 / beta where |d| < beta, else |d| - 0.5 beta (the Huber loss divided by beta; L1 at beta 0)."""
    reduction = _legacy_reduction(size_average, reduce, reduction)
    if beta < 0:
        raise ValueError(f"smooth_l1_loss: beta must be >= 0, got {beta}")
    if beta == 0:
        return l1_loss(input, target, reduction=reduction)
    return _distance_loss("smooth_l1_loss", "huber", beta, 1.0 / beta, lambda d: _huber(d, beta) / beta, input,
                          target, reduction)


def huber_loss(input, target, reduction="mean", delta=1.0):
    """0.5 d^2 where |d| < delta, else delta (|d| - 0.5 delta), for d = input - target, reduced as reduction says.
    Called eagerly it computes in float64 NumPy and returns a float32 tensor on input's device (a value to look at);
    traced, it records the elementwise loss and its reduction, which the compiled program differentiates."""
    if not delta > 0:
        raise ValueError(f"huber_loss: delta must be > 0, got {delta}")
    return _distance_loss("huber_loss", "huber", delta, 1.0, lambda d: _huber(d, delta), input, target, reduction)


def binary_cross_entropy_with_logits(input, target, weight=None, size_average=None, reduce=None, reduction="mean",
                                     pos_weight=None):
    """-w [p y log sigmoid(x) + (1 - y) log(1 - sigmoid(x))], p the pos_weight (broadcast over the last
    dimension), computed as softplus(x) (1 + (p - 1) y) - p x y; eagerly as (1 - y) softplus(x) + p y
    softplus(-x), each term left out where its weight is 0, so that an infinite logit's loss is infinite or 0."""
    reduction = _reduction_of("binary_cross_entropy_with_logits", _legacy_reduction(size_average, reduce, reduction))
    if isinstance(input, Symbolic):
        xy = input * target
        sp = M._Elementwise("softplus")(input)
        if pos_weight is None:
            values = sp - xy
        else:
            p = _host(pos_weight)
            values = sp * (target * _on_device_of(input, p - 1) + 1.0) - xy * _on_device_of(input, p)
        if weight is not None:
            values = values * weight
        return values.reduce(reduction)
    target = _pair_check(input, target, "binary_cross_entropy_with_logits")
    x, y = _host(input), _host(target)
    p = _host(pos_weight) if pos_weight is not None else 1.0
    def softplus(v):
        return np.maximum(v, 0) + np.log1p(np.exp(-np.abs(v)))
    with np.errstate(invalid="ignore"):  # 0 * inf in the term left out
        values = np.where(y != 1, (1 - y) * softplus(x), 0) + np.where(p * y != 0, p * y * softplus(-x), 0)
    if weight is not None:
        values = values * _host(weight)
    return _eager(values, reduction, input)


def binary_cross_entropy(input, target, weight=None, size_average=None, reduce=None, reduction="mean"):
    """-w [y log(p) + (1 - y) log(1 - p)] of probabilities p (a sigmoid's output) and targets y in [0, 1] of the
    same shape, each log held at -100 or above, as PyTorch (binary_cross_entropy_with_logits is the stabler form)."""
    reduction = _reduction_of("binary_cross_entropy", _legacy_reduction(size_average, reduce, reduction))
    if isinstance(input, Symbolic):
        def log(p):  # held at -100, with no gradient there (a sigmoid's probability of exactly 1)
            return M._Elementwise("log_floor", -100.0)(p)
        values = -(target * log(input) + (1.0 - target) * log(1.0 - input))
        return (values if weight is None else values * weight).reduce(reduction)
    target = _pair_check(input, target, "binary_cross_entropy")
    p, y = _host(input), _host(target)
    if not ((p >= 0) & (p <= 1)).all():
        raise ValueError("binary_cross_entropy: every element of input must be a probability in [0, 1]")
    with np.errstate(divide="ignore"):
        values = -(y * np.maximum(np.log(p), -100) + (1 - y) * np.maximum(np.log1p(-p), -100))
    if weight is not None:
        values = values * _host(weight)
    return _eager(values, reduction, input)


def kl_div(input, target, size_average=None, reduce=None, reduction="mean", log_target=False):
    """target (log target - input) for log-probabilities input; reduction='batchmean' is the KL divergence."""
    reduction = _reduction_of("kl_div", _legacy_reduction(size_average, reduce, reduction),
                              ("none", "mean", "sum", "batchmean"))
    if isinstance(input, Symbolic):
        if log_target:  # exp(t) (t - input); the difference first, which gives the targets the input's shape
            difference = target - input
            return (target.exp() * difference).reduce(reduction)
        cross = target * input
        return (M._Elementwise("xlogx")(target) - cross).reduce(reduction)
    target = _pair_check(input, target, "kl_div")
    x, t = _host(input), _host(target)
    values = np.exp(t) * (t - x) if log_target else np.where(t > 0, t * np.log(np.where(t > 0, t, 1)), 0) - t * x
    return _eager(values, reduction, input)


def _reduced(values, reduction):
    """Per-sample losses reduced as reduction says, traced or eager."""
    if isinstance(values, Symbolic):
        return values.reduce(reduction)
    return values if reduction == "none" else values.sum() if reduction == "sum" else values.mean()


def cosine_similarity(x1, x2, dim=1, eps=1e-8):
    """The cosine of the angle between x1 and x2 along dim: the sum of their products after each is divided by its
    Euclidean norm held at eps or above, as PyTorch 2 computes it (for vectors shorter than eps, its gradient
    differs from PyTorch's, which does not differentiate the bound)."""
    return (normalize(x1, 2.0, dim, eps) * normalize(x2, 2.0, dim, eps)).sum(dim)


def pairwise_distance(x1, x2, p=2.0, eps=1e-6, keepdim=False):
    """The p-norm of x1 - x2 + eps over the last dimension, as torch.nn.functional.pairwise_distance (p = 2, 1 or
    inf while tracing)."""
    return (x1 - x2 + eps).norm(p, dim=-1, keepdim=keepdim)


def triplet_margin_loss(anchor, positive, negative, margin=1.0, p=2.0, eps=1e-6, swap=False, size_average=None,
                        reduce=None, reduction="mean"):
    """max(d(anchor, positive) - d(anchor, negative) + margin, 0) with d = pairwise_distance, reduced as reduction
    says; swap=True takes the smaller of d(anchor, negative) and d(positive, negative) (eagerly only)."""
    reduction = _reduction_of("triplet_margin_loss", _legacy_reduction(size_average, reduce, reduction))
    if margin <= 0:
        raise ValueError(f"triplet_margin_loss: margin must be greater than 0, got {margin}")
    d_ap = pairwise_distance(anchor, positive, p, eps)
    d_an = pairwise_distance(anchor, negative, p, eps)
    if swap:
        if isinstance(d_an, Symbolic):
            fail("triplet_margin_loss(swap=True)", "the smaller of two traced distances has no node: use swap=False")
        from .._math import minimum
        d_an = minimum(d_an, pairwise_distance(positive, negative, p, eps))
    return _reduced((d_ap - d_an + margin).clamp_min(0.0), reduction)


def soft_margin_loss(input, target, size_average=None, reduce=None, reduction="mean"):
    """log(1 + exp(-target input)) with targets 1 or -1, reduced as reduction says, as
    torch.nn.functional.soft_margin_loss."""
    reduction = _reduction_of("soft_margin_loss", _legacy_reduction(size_average, reduce, reduction))
    return _reduced(softplus(-(target * input)), reduction)


def multilabel_soft_margin_loss(input, target, weight=None, size_average=None, reduce=None, reduction="mean"):
    """-(y log sigmoid(x) + (1 - y) log sigmoid(-x)) averaged over the C classes of (N, C) scores (weight per
    class), reduced over the samples as reduction says, as torch.nn.functional.multilabel_soft_margin_loss."""
    reduction = _reduction_of("multilabel_soft_margin_loss", _legacy_reduction(size_average, reduce, reduction))
    per_class = target * softplus(-input) + (1.0 - target) * softplus(input)  # -log sigmoid(x) = softplus(-x)
    if weight is not None:
        per_class = per_class * weight
    return _reduced(per_class.mean(-1), reduction)


def gaussian_nll_loss(input, target, var, full=False, eps=1e-6, reduction="mean"):
    """0.5 (log(max(var, eps)) + (input - target)^2 / max(var, eps)) (+ 0.5 log(2 pi) with full), var of the
    input's shape (or with a last dimension of 1), reduced as reduction says, as
    torch.nn.functional.gaussian_nll_loss."""
    reduction = _reduction_of("gaussian_nll_loss", reduction)
    if eps < 0:
        raise ValueError(f"gaussian_nll_loss: eps must be >= 0, got {eps}")
    v = var + (var.clamp_min(eps) - var).detach()  # clamped, as PyTorch's in-place clamp: the gradient passes on
    loss = 0.5 * (v.log() + (input - target).square() / v)
    return _reduced(loss + 0.5 * math.log(2 * math.pi) if full else loss, reduction)


def poisson_nll_loss(input, target, log_input=True, full=False, size_average=None, eps=1e-8, reduce=None,
                     reduction="mean"):
    """exp(input) - target input (log_input), or input - target log(input + eps), reduced as reduction says, as
    torch.nn.functional.poisson_nll_loss; full=True (Stirling's term) is not supported."""
    reduction = _reduction_of("poisson_nll_loss", _legacy_reduction(size_average, reduce, reduction))
    if full:
        raise NotImplementedError("poisson_nll_loss: full=True (Stirling's approximation term) is not supported")
    loss = input.exp() - target * input if log_input else input - target * (input + eps).log()
    return _reduced(loss, reduction)


def margin_ranking_loss(input1, input2, target, margin=0.0, size_average=None, reduce=None, reduction="mean"):
    """max(0, -target (input1 - input2) + margin) with targets 1 (input1 should rank higher) or -1, reduced as
    reduction says, as torch.nn.functional.margin_ranking_loss."""
    reduction = _reduction_of("margin_ranking_loss", _legacy_reduction(size_average, reduce, reduction))
    return _reduced((-target * (input1 - input2) + margin).clamp_min(0.0), reduction)


def cosine_embedding_loss(input1, input2, target, margin=0.0, size_average=None, reduce=None, reduction="mean"):
    """1 - cos(input1, input2) where target is 1 and max(0, cos - margin) where it is -1 (the cosine along dim 1),
    reduced as reduction says, as torch.nn.functional.cosine_embedding_loss; targets are 1 or -1."""
    reduction = _reduction_of("cosine_embedding_loss", _legacy_reduction(size_average, reduce, reduction))
    cos = cosine_similarity(input1, input2, dim=1, eps=1e-8)
    similar = (target + 1.0) * 0.5  # 1 where target is 1, 0 where it is -1
    return _reduced(similar * (1.0 - cos) + (1.0 - similar) * (cos - margin).clamp_min(0.0), reduction)


# ---- residual add, mul and concatenation ----

def add(input, other, act=None, alpha=0.0):
    """input + other (equal shapes), with an activation fused in: ``add(a, b, "relu")`` is relu(a + b)."""
    if isinstance(input, Symbolic):
        if act is not None:
            raise TypeError("add: act cannot be traced; write F.relu(a + b) (the compiler fuses it)")
        return input + other
    return _C.add_forward(None, input, other, act, alpha)


def mul(input, other):
    """input * other elementwise, of equal shapes."""
    if isinstance(input, Symbolic):
        return input * other
    return _C.mul_forward(None, input, other)


def flatten(input, start_dim=0, end_dim=-1):
    """torch.flatten: dimensions start_dim..end_dim merged into one (a view where the strides allow)."""
    return input.flatten(start_dim, end_dim)


def __getattr__(name):
    raise graph_missing(__name__, name)
