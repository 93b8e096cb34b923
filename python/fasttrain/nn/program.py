"""model.compile(): a model graph turned into a C training program.

The compiler walks the graph in topological order, fuses what the C ops can
fuse (conv/linear/batch-norm/add followed by an activation), folds conv
biases that a following batch norm cancels into its running mean, moves every
parameter into one flat buffer and every gradient into another (each
parameter object becomes a view, so optimizers built earlier see the flat
memory), and hands the node list to C, which plans the activation memory and
runs whole training steps."""
import dis
import functools
import gc
import inspect
import math
import numbers
import sys
import warnings
import weakref
import zlib

import numpy as np

from .. import _C, creation
from .._display import Column, Table, summary as _summary
from .._types import _BY_NAME
from ..random import _check_seed
from . import modules as M
from .graph import (Common, Gathered, Input, MergedRows, Node, Symbolic, TracingError, _output_leaves, _Refusing,
                    buffers_read, checkpointed, input_shapes, mode_readers, mode_was_read, read_modes, target,
                    topological, trace, trace_loss, tracing, watch, watched_read)

# Node kinds, activations and reductions as the extension numbers them.
_K = _C.NODE_KINDS
(INPUT, CONV2D, LINEAR, BATCHNORM, ACT, MAXPOOL, AVGPOOL, ADAPTIVE_AVGPOOL, ADAPTIVE_MAXPOOL, ADD, CAT, RESHAPE,
 DROPOUT, IDENTITY, LAYERNORM, MUL, SCALE, PERMUTE, SLICE, PARAM, TARGET, CROSS_ENTROPY, NLL, SUM, SOFTMAX,
 LOG_SOFTMAX, GROUPNORM, EMBEDDING, UPSAMPLE, MATMUL, ATTENTION, EXPAND, SUM_DIMS, ONE_HOT, DETACH,
 UPSAMPLE_BILINEAR, NOISE, CONV_TRANSPOSE2D, MATH, LSTM_CELL, LSTM_HIDDEN, LSTM, GRU, MASKED_FILL) = (_K[k] for k in (
    "input", "conv2d", "linear", "batch_norm", "activation", "max_pool2d", "avg_pool2d", "adaptive_avg_pool2d",
    "adaptive_max_pool2d", "add", "cat", "reshape", "dropout", "identity", "layer_norm", "mul", "scale", "permute",
    "slice", "parameter", "target", "cross_entropy", "nll", "sum", "softmax", "log_softmax", "group_norm",
    "embedding", "upsample_nearest", "matmul", "attention", "expand", "sum_dims", "one_hot", "detach",
    "upsample_bilinear", "noise", "conv_transpose2d", "math", "lstm_cell", "lstm_hidden", "lstm", "gru",
    "masked_fill"))
ACTS = _C.ACTIVATIONS
REDUCTIONS = _C.REDUCTIONS
# Activations whose derivative follows from their output: these can be fused
# into an op that does not keep the activation's input.
FROM_OUTPUT = {"relu", "sigmoid", "tanh", "leaky_relu"}


def _act_of(m):
    name = m.act
    if isinstance(m, M.GELU) and m.approximate == "tanh":
        name = "gelu_tanh"
    alpha = m.negative_slope if isinstance(m, M.LeakyReLU) else getattr(m, "alpha", 0.0)
    return name, alpha


def _as_2d(m, name, fill):
    """A layer's spatial sizes as pairs: 1-d layers run as 2-d ones over (C, 1, L)."""
    v = getattr(m, name)
    return (fill, *v) if len(v) == 1 else v


def _node_of(module, shape):
    """(kind, fields) for one layer whose input has per-sample shape `shape`."""
    m = module
    if isinstance(m, M._ConvNd):
        kind = CONV_TRANSPOSE2D if isinstance(m, M._ConvTransposeNd) else CONV2D
        return kind, dict(stride=_as_2d(m, "stride", 1), padding=_as_2d(m, "padding", 0),
                          dilation=_as_2d(m, "dilation", 1), groups=m.groups)
    if isinstance(m, M.Linear):
        return LINEAR, {}
    if isinstance(m, M._BatchNorm):
        # momentum None (a cumulative average) goes to C as -1
        return BATCHNORM, dict(eps=m.eps, momentum=-1.0 if m.momentum is None else m.momentum,
                               sync=int(isinstance(m, M.SyncBatchNorm)),
                               abn=int(isinstance(m, M.InPlaceABN)))
    if isinstance(m, M._Activation):
        name, alpha = _act_of(m)
        return ACT, dict(act=name, alpha=alpha)
    if isinstance(m, M._MaxPool):
        return MAXPOOL, dict(kernel=_as_2d(m, "kernel_size", 1), stride=_as_2d(m, "stride", 1),
                             padding=_as_2d(m, "padding", 0), dilation=_as_2d(m, "dilation", 1),
                             ceil_mode=int(m.ceil_mode))
    if isinstance(m, M._AvgPool):
        return AVGPOOL, dict(kernel=_as_2d(m, "kernel_size", 1), stride=_as_2d(m, "stride", 1),
                             padding=_as_2d(m, "padding", 0), ceil_mode=int(m.ceil_mode),
                             count_include_pad=int(m.count_include_pad),
                             divisor_override=int(getattr(m, "divisor_override", None) or 0))
    if isinstance(m, M._AdaptivePool):
        return ADAPTIVE_AVGPOOL if m._kind == "avg" else ADAPTIVE_MAXPOOL, {}
    if isinstance(m, M.Add):
        return ADD, {}
    if isinstance(m, M.Cat):
        return CAT, dict(dim=m.sample_dim(len(shape)))
    if isinstance(m, (M.Flatten, M.Reshape)):
        return RESHAPE, {}
    if isinstance(m, M.Dropout):  # in eval mode the identity, in the training step too
        return DROPOUT, dict(p=m.p if m.training else 0.0, channels=int(m._dims > 0))
    if isinstance(m, M.Identity):
        return IDENTITY, {}
    if isinstance(m, M.LayerNorm):
        return LAYERNORM, dict(norm_dims=len(m.normalized_shape), layer_eps=m.eps)
    if isinstance(m, M.Mul):
        return MUL, {}
    if isinstance(m, M.Scale):
        return SCALE, dict(scale=m.factor)
    if isinstance(m, M.Permute):
        return PERMUTE, dict(perm=m.perm)
    if isinstance(m, M.Slice):
        return SLICE, dict(slice_dim=m.dim, slice_start=m.start, slice_step=m.step)
    if isinstance(m, M.Value):
        return PARAM, dict(dim=m.dim)
    if isinstance(m, M.Target):
        return TARGET, dict(dtype=m.dtype._code)
    if isinstance(m, M._ClassLoss):
        fields = dict(reduction=REDUCTIONS[m.reduction], ignore_index=m.ignore_index)
        if isinstance(m, M.CrossEntropyLoss):
            return CROSS_ENTROPY, dict(fields, label_smoothing=m.label_smoothing, dim=m._classes_dim)
        return NLL, fields
    if isinstance(m, M.GroupNorm):
        return GROUPNORM, dict(groups=m.num_groups, layer_eps=m.eps)
    if isinstance(m, M.Embedding):
        return EMBEDDING, dict(padding_idx=-1 if m.padding_idx is None else m.padding_idx)
    if isinstance(m, M.Upsample) and m.mode != "nearest":
        _, (sh, sw) = m.lerp(shape)
        return UPSAMPLE_BILINEAR, dict(align_corners=int(m.align_corners), scale_h=sh, scale_w=sw)
    if isinstance(m, M.Upsample):
        f = m.factors(shape)
        return UPSAMPLE, dict(factor=f if len(f) == 2 else (1, *f))
    if isinstance(m, M.Matmul):
        return MATMUL, {}
    if isinstance(m, M.Expand):
        return EXPAND, {}
    if isinstance(m, M.SumDims):
        return SUM_DIMS, dict(scale=m.scale)
    if isinstance(m, M.OneHot):
        return ONE_HOT, {}
    if isinstance(m, M.Detach):
        return DETACH, {}
    if isinstance(m, M.Math):
        return MATH, dict(math_op=m.op, scale=m.number)
    if isinstance(m, M.MaskedFill):
        return MASKED_FILL, dict(scale=m.value)
    if isinstance(m, M.LSTMState):
        return LSTM_CELL, {}
    if isinstance(m, M.LSTMOutput):
        return LSTM_HIDDEN, {}
    if isinstance(m, M.LSTMLayer):
        return LSTM, dict(reverse=int(m.reverse))
    if isinstance(m, M.GRULayer):
        return GRU, dict(reverse=int(m.reverse))
    if isinstance(m, M.Noise):
        return NOISE, dict(uniform=int(m.uniform))
    if isinstance(m, M.Attention):
        return ATTENTION, dict(groups=m.heads, causal=int(m.causal), scale=m.scale or 0.0, p=m.dropout,
                               score_bias=int(m.bias))
    if isinstance(m, M.Softmax):
        from .graph import _dim
        return LOG_SOFTMAX if isinstance(m, M.LogSoftmax) else SOFTMAX, dict(dim=_dim(m.dim, len(shape)))
    if isinstance(m, M.Sum):
        return SUM, dict(reduction=REDUCTIONS[m.reduction], count_offset=m.offset, count_floor=m.floor)
    if isinstance(m, M.CountFloor):
        raise TracingError(f"a batch sum clamped other than as a masked mean's count cannot be compiled (at "
                           f"{m.where}); clamp only the count of (loss * mask).sum() / mask.sum().clamp(min=1)")
    raise NotImplementedError(f"{type(m).__name__} has no compiled form yet: see docs/models.md for the layers "
                              "a compiled program supports")


_MODAL = ((M.Dropout, ("training", "p")), (M._BatchNorm, ("training", "momentum", "eps")),
          (M.MultiheadAttention, ("training", "dropout")), (M._RNNBase, ("training", "dropout")))


def tally_means(tally, program):
    """(mean loss, accuracy) of a program's tally, (loss * weight, weight, correct, labelled) summed over batches:
    the loss averaged over what the final loss averages (the targets not ignored, a masked mean's count, the
    samples), or of a loss summed over the batch (reduction='sum') its sum over them all, as of one batch holding
    them; the accuracy over the labels not ignored (None unless the program classifies); NaN where none counted."""
    loss, weight, correct, labelled = tally
    accuracy = (correct / labelled if labelled else math.nan) if program.classifies else None
    return (loss if program.sums_loss else loss / weight) if weight else math.nan, accuracy


def add_tallies(a, b):
    """The tally of the batches of two tallies."""
    return tuple(x + y for x, y in zip(a, b))


NO_TALLY = (0.0, 0.0, 0, 0)


class _Entry:
    __slots__ = ("kind", "module", "inputs", "shape", "fields", "act", "alpha", "bias_into", "fused", "scope",
                 "common")

    def __init__(self, kind, module, inputs, shape, fields, scope=(), common=False):
        self.kind, self.module, self.inputs, self.shape, self.fields = kind, module, inputs, shape, fields
        self.act, self.alpha, self.bias_into, self.fused = None, 0.0, None, []  # bias_into: the batch norm
        self.scope = scope  # the modules whose calls recorded it, and its own
        self.common = common  # computed once per step, from parameters alone (graph.Common)


def _inputs(model, input_shape, input_dtype):
    """The (per-sample shape, dtype) of each input of the model's forward, from compile's input_shape (one shape,
    or one for each input) and input_dtype (one dtype for all, or one for each): float32 features, int64 token ids,
    or bool masks."""
    from .._types import as_dtype
    if isinstance(model, M.Model):
        input_shape, input_dtype = model.input_shape, model.input_dtype if input_dtype is None else input_dtype
    elif input_shape is None:
        raise ValueError("compile: give input_shape, the per-sample shape such as (1, 28, 28)")
    shapes = input_shapes(input_shape)
    dtypes = input_dtype if isinstance(input_dtype, (tuple, list)) else [input_dtype] * len(shapes)
    if len(dtypes) != len(shapes):
        raise ValueError(f"compile: input_dtype gives {len(dtypes)} dtypes for {len(shapes)} input shapes")
    dtypes = [as_dtype(d or "float32") for d in dtypes]
    for d in dtypes:
        if d.name not in ("float32", "int64", "bool"):
            raise TypeError(f"compile: input_dtype must be float32, int64 (token ids) or bool (masks), got {d.name}")
    return list(zip(shapes, dtypes))


def _numbers_read(model, loss, modal):
    """[name, read, value] of each number traced code may have read into the program as a constant: those the
    model's modules hold (and a loss module's, or the object of a loss method or callable) but the settings compile
    fixes (modal), and the globals and closure variables a loss function, or a module's own forward, reads."""
    found = []
    modules = [*model.modules(), *(loss.modules() if isinstance(loss, M.Module) else ())]
    owner = getattr(loss, "__self__", None) if inspect.ismethod(loss) else \
        loss if loss is not None and not inspect.isfunction(loss) and not isinstance(loss, M.Module) else None
    for m in (*modules, *([owner] if owner is not None and hasattr(owner, "__dict__") else ())):  # a loss method's
        found += [[f"{type(m).__name__}.{k}", functools.partial(getattr, m, k, v), v] for k, v in vars(m).items()
                  if _is_number(v) and not k.startswith("_") and k != "training" and
                  k not in modal.get(id(m), (None, {}))[1]]
    callables = (getattr(loss, "__func__", None) or (loss if inspect.isfunction(loss) else
                                                      getattr(type(loss), "__call__", None)),
                 *(type(m).forward for m in modules))  # a bound method's function, a callable object's __call__
    functions = [f for f in callables if inspect.isfunction(f) and not (f.__module__ or "").startswith("fasttrain.")]
    for f in dict.fromkeys(functions):
        cells = dict(zip(f.__code__.co_freevars, f.__closure__ or ()))
        loaded = {i.argval for i in dis.get_instructions(f) if i.opname == "LOAD_GLOBAL"}  # not attributes' names
        for k in sorted(loaded):
            v = f.__globals__.get(k)
            if _is_number(v):
                found.append([f"the global {k} that {f.__qualname__} reads", functools.partial(
                    f.__globals__.get, k, v), v])
        for k, cell in cells.items():
            v = getattr(cell, "cell_contents", None)
            if _is_number(v):
                found.append([f"the variable {k} that {f.__qualname__} reads", functools.partial(
                    getattr, cell, "cell_contents", v), v])
    return found


def _is_number(v):
    return isinstance(v, numbers.Real) and not isinstance(v, (_C.TensorBase, Symbolic))


def _fingerprint(b):
    """A checksum of a buffer's bytes, to tell a change from (rather than a copy of it)."""
    return zlib.crc32(np.ascontiguousarray(np.asarray(b.cpu())).view(np.uint8))


_TABLES = ("_parameters", "_buffers", "_modules")


def _attributes(model):
    """[(module name, module, its plain attributes (not parameters, buffers or children), copies of the lists and
    dicts among them)]: what a traced forward may rebind or fill (_rebound)."""
    out = []
    for name, m in model.named_modules():
        attrs = {k: v for k, v in vars(m).items() if k not in _TABLES and not any(k in vars(m)[t] for t in _TABLES)}
        out.append((name, m, attrs, {k: _copied(v) for k, v in attrs.items() if type(v) in (list, dict)}))
    return out


def _copied(value, depth=3):
    """value with its lists, tuples and dicts (to a few levels) copied, what they hold shared."""
    if depth and type(value) in (list, tuple):
        return type(value)(_copied(v, depth - 1) for v in value)
    if depth and type(value) is dict:
        return {k: _copied(v, depth - 1) for k, v in value.items()}
    return value


def _holds(value, test, depth=3):
    """The objects passing test that value is or holds in lists, tuples and dicts (to a few levels)."""
    if test(value):
        return [value]
    if depth and isinstance(value, (list, tuple, dict)):
        return [x for v in (value.values() if isinstance(value, dict) else value) for x in _holds(v, test, depth - 1)]
    return []


def _traced(value):
    return isinstance(value, (Symbolic, Common, Gathered, MergedRows, _Refusing))


def _tensor(value):
    return isinstance(value, _C.TensorBase)


def _rebound(snapshot):
    """Puts back each plain attribute a traced forward bound to a traced value or to a list, tuple or dict holding
    one (d2l's self.attention_weights, a new list of them), or filled so in place (an entry of a list); returns
    [(name, the value before)] of those."""
    found = []
    for prefix, m, before, copies in snapshot:
        now = vars(m)
        for key in [k for k in now if k not in _TABLES and _holds(now[k], _traced)]:
            found.append((f"{prefix or type(m).__name__}.{key}", before.get(key)))
            if key in copies and now[key] is before[key]:  # filled in place
                if type(now[key]) is list:
                    now[key][:] = copies[key]
                else:
                    now[key].clear()
                    now[key].update(copies[key])
            elif key in before:
                object.__setattr__(m, key, before[key])
            else:
                del now[key]
    return found


def _graph(model, *args, **kwargs):
    """_traced_graph's result, the model's buffers, parameters and plain attributes left as they were: tracing runs
    the forward's eager code once, and its in-place updates (timm's self.num_batches_tracked.add_(1)) and the values
    it binds (d2l's self.attention_weights) are no step's. One that changed a trainable parameter (through a .clone()
    of it, which reads as the parameter) fails: each step would train the parameter, not what the forward made of
    it; so does a tensor attribute the forward reads and rebinds to a traced value (a running statistic kept by
    hand, an RNN's state kept across batches), state each step would carry to the next, which a compiled step,
    running no Python, does not."""
    kept = [(name, t, t.clone()) for name, t in (*model.named_buffers(), *model.named_parameters())]
    attributes = _attributes(model)
    watch([t for _, _, attrs, _ in attributes for v in attrs.values() for t in _holds(v, _tensor)])
    try:
        out = _traced_graph(model, *args, **kwargs)
        changed = [(name, t, isinstance(t, M.Parameter) and t.requires_grad) for name, t, value in kept
                   if _fingerprint(t) != _fingerprint(value)]
    finally:
        for _, t, value in kept:
            t.copy_(value)
        rebound, read = _rebound(attributes), watched_read()
        watch(())
    for name, old in rebound:
        if any(id(t) in read for t in _holds(old, _tensor)):
            raise TracingError(
                f"forward reads {name} and rebinds it to a value computed in the traced forward: a compiled step runs "
                "no Python, so it would not carry the value to the next step (a running statistic kept by hand, an "
                "RNN state kept across batches); running statistics are F.batch_norm(x, running_mean, running_var, "
                "weight, bias, training, momentum) of buffers, which the step moves; an RNN starts each batch from "
                "its initial state")
    name = next((name for name, t, trained in changed if trained), None)
    if name is not None:
        raise TracingError(f"{type(model).__name__}.forward changed trainable parameter {name} in place (an "
                           "in-place op on it, on a view of it or on its .clone(), which a traced forward reads as "
                           "the parameter): write it out of place, b = ft.cat((b[:k], ft.zeros_like(b[k:2 * k]), "
                           "b[2 * k:])) rather than b[k:2 * k].zero_()")
    values = [e.module.tensor for e in out[0] if isinstance(e.module, M.Value)]
    name = next((name for name, t, _ in changed if any(_overlap(t, v) for v in values)), None)
    if name is not None:
        raise TracingError(f"{type(model).__name__}.forward writes buffer {name} in place and reads it as a value: "
                           "the write would run once, at compile, and every step would read the buffer as it was; "
                           "compute the value out of place (scale = ft.ones_like(self.scale)), or write the buffer "
                           "outside forward")
    return out


def _references_of_an_unheld_view():
    """sys.getrefcount of a view that only Program._grad_views holds, as _let_go's loop counts it."""
    for i, (p, view) in enumerate([(None, object())]):
        return sys.getrefcount(view)


_UNHELD = _references_of_an_unheld_view()


def _overlap(a, b):
    """Whether tensors a and b share memory."""
    ends = [t.data_ptr() + t.numel() * t.element_size() for t in (a, b)]
    return a.device == b.device and a.numel() > 0 and b.numel() > 0 and a.data_ptr() < ends[1] and \
        b.data_ptr() < ends[0]


def _traced_graph(model, inputs, loss=None, target_shape=None, target_dtype=None, training=True):
    """The entries of the model's graph on `inputs` (_inputs), with the loss's after them when a loss is given, the
    index of the model's (first) output, whether the forward's code read a module's training mode (which reads
    `training`), and, in eval mode, the TracingError of a loss that cannot read the eval-mode output (PSPNet's
    main, aux = out of a forward returning aux in training only), whose graph then has no loss. The inputs come
    first, in forward's order, read or not."""
    read_modes(training)
    ins = [Input(shape, dtype) for shape, dtype in inputs]
    in_nodes = [i.node for i in ins]  # (an in-place op on an input, x.mul_(2), rebinds its Symbolic)
    outputs = trace(model, ins)
    first = outputs if not isinstance(outputs, (tuple, list)) else outputs[0]
    # every node up to the first output is the model's (a mixed-precision program computes them in low precision),
    # the nodes after it the loss's: the first output comes after the others' nodes (an auxiliary head), or a
    # view of it does where it is a batch norm's, whose statistics then still move in the order of the calls
    roots = [s.node for s in _output_leaves(outputs) if isinstance(s, Symbolic) and s.node is not first.node]
    if roots and isinstance(first.node.module, M._BatchNorm):
        first = Symbolic(Node(M.Identity(), [first.node], first.node.shape))
    output = first.node  # (an in-place op of the loss on the output, x.sigmoid_(), rebinds its Symbolic)
    roots.append(output)
    of_model = {id(n) for n in topological(roots)}
    unread = None
    if loss is not None:
        with tracing(model):  # a penalty on the weights written in the loss trains them
            targets = target(target_shape, target_dtype)
            target_nodes = [t.node for t in (targets if isinstance(targets, tuple) else (targets,))]  # (as output)
            try:
                value = trace_loss(loss, outputs, targets)
            except TracingError as e:
                if training:
                    raise
                unread, target_nodes = e, []
                value = Symbolic(output).reduce("mean")  # a stand-in, so that predict runs
    if loss is not None:
        read = {id(n) for n in topological([value.node])}
        for k, t in enumerate(target_nodes):
            t.module.index = k  # its place in the batch's tuple of targets
            if isinstance(targets, tuple) and id(t) not in read:
                raise TracingError(f"the loss reads no value of target {k} of {len(targets)}: give target_shape= "
                                   "the shapes of those it reads")
            if t.module.dtype is None:  # only viewed (y.unsqueeze(1)) into a loss of values
                t.module.dtype = _BY_NAME["float32"]
        if value.node is output:
            raise TracingError("the loss is the model's output itself: compute it from the output and the targets")
        roots.append(value.node)
    # the output's ancestors first: the nodes after it are the loss's
    nodes = in_nodes + [n for n in topological(
        roots, lambda n: 2 if id(n) not in of_model else n is output) if n.module is not None]
    index = {id(n): i for i, n in enumerate(nodes)}
    entries = []
    for n in nodes:
        kind, fields = (INPUT, dict(dtype=n.dtype._code)) if n.module is None else \
            _node_of(n.module, n.inputs[0].shape if n.inputs else n.shape)
        entries.append(_Entry(kind, n.module, [index[id(i)] for i in n.inputs], n.shape, fields,
                              (*n.scope, n.module), n.common))
    return entries, index[id(output)], mode_was_read(), unread


def _fused(entries, output, low=False):
    """The entries _fuse keeps, and the index among them of the output (where an activation fused into the layer
    before it, that layer's)."""
    kept_entries = _fuse(entries, output, low)
    kept = {id(e): i for i, e in enumerate(kept_entries)}
    while id(entries[output]) not in kept:
        output = entries[output].inputs[0]
    return kept_entries, kept[id(entries[output])]


def _in_eval_mode(entries, output):
    """What a graph computes in eval mode, to compare two: each node's C description with its tensors by identity,
    but dropouts and identities (which eval mode passes through), and the output's place."""
    place, described = {}, []
    for i, e in enumerate(entries):
        if e.kind in (DROPOUT, IDENTITY):
            place[i] = place[e.inputs[0]]
            continue
        place[i] = len(described)
        d = _node_dict(e, ())
        d["inputs"] = tuple(place[j] for j in e.inputs)
        described.append({k: ("tensor", id(v)) if isinstance(v, _C.TensorBase) else v for k, v in d.items()})
    return described, place[output]


def _consumers(entries):
    users = [[] for _ in entries]
    for j, e in enumerate(entries):
        for i in e.inputs:
            users[i].append(j)
    return users


def _commutes_with_shift(e):
    """Whether pooling(x + b) == pooling(x) + b for a per-channel constant b: max pooling always; average
    pooling when no padded zero enters a window's average."""
    if e.kind == MAXPOOL:
        return True
    m = e.module
    return e.kind == AVGPOOL and (not any(m.padding) or not m.count_include_pad) and not m.ceil_mode and \
        getattr(m, "divisor_override", None) is None


def _fuse(entries, output, low=False):
    """Folds single-consumer activations into their producer and drops conv
    biases a batch norm cancels. Returns the surviving entries, re-indexed.
    The model's output (entry `output`) keeps its values: an activation that
    only the loss applies to it (binary_cross_entropy(o.sigmoid(), y)) does
    not fold into it, or predict would give the activated values. In a
    mixed-precision program (low) an activation that is a model output (the
    first, or one only the loss reads) stays a node of its own, which
    computes in float32: a sigmoid's probabilities within 2^-9 of 1 would
    round to 1 in bfloat16 (BCELoss's log(1 - p) at its floor, its gradient
    NaN)."""
    users = _consumers(entries)
    remap = list(range(len(entries)))
    for e in entries:  # InPlace-ABN's activation is its own, and must stay invertible: nothing fuses into it
        if isinstance(e.module, M.InPlaceABN) and e.module.activation == "leaky_relu":
            e.act, e.alpha = "leaky_relu", e.module.activation_param
    for j, e in enumerate(entries):
        if e.kind != ACT:
            continue
        src = remap[e.inputs[0]]
        prod = entries[src]
        name = e.fields["act"]
        ok = prod.act is None and not isinstance(prod.module, M.InPlaceABN) and len(users[e.inputs[0]]) == 1 and (
            prod.kind == ADD or (prod.kind in (CONV2D, LINEAR, BATCHNORM) and name in FROM_OUTPUT))
        if (name == "leaky_relu" and e.fields["alpha"] < 0) or (e.inputs[0] == output and j != output) or \
                (low and (j == output or (users[j] and min(users[j]) > output))):
            ok = False
        if ok:
            prod.act, prod.alpha = name, e.fields["alpha"]
            prod.fused.append(type(e.module).__name__)
            prod.scope += (e.module,)  # a module listed in recompute= for itself is computed by this node
            remap[j] = src
    # A conv whose output reaches a batch norm only through pooling that
    # commutes with adding a per-channel constant needs no bias (a frozen
    # bias is kept: it must stay as it was).
    for i, e in enumerate(entries):
        if e.kind != CONV2D or e.module.bias is None or not e.module.bias.requires_grad or e.act is not None:
            continue
        k = i
        while len(users[k]) == 1 and _commutes_with_shift(entries[users[k][0]]) and remap[users[k][0]] == users[k][0]:
            k = users[k][0]
            if entries[k].act is not None:
                break
        nxt = users[k][0] if len(users[k]) == 1 else None
        # (a batch norm in eval mode normalizes by its running statistics: it cancels nothing)
        if nxt is not None and entries[nxt].kind == BATCHNORM and entries[k].act is None and \
                entries[nxt].module.training:
            e.bias_into = entries[nxt].module
    keep = [i for i in range(len(entries)) if remap[i] == i]
    new_index = {old: new for new, old in enumerate(keep)}
    out = []
    for i in keep:
        e = entries[i]
        e.inputs = [new_index[remap[x]] for x in e.inputs]
        out.append(e)
    return out


# id(parameter) -> the program that trains it (its optimizer holds it, and it sits in that program's flat buffer)
_TRAINERS = {}


def _trainer(p):
    """The live program that trains p, or None."""
    ref = _TRAINERS.get(id(p))
    program = ref() if ref else None
    if program is None or program._trains.get(id(p)) is not p:
        return None
    buf = program.flat_params
    return program if 0 <= p.data_ptr() - buf.data_ptr() < buf.numel() * buf.element_size() else None


def _flatten_parameters(model, lent):
    """Moves every float32 parameter but those in `lent` (ids) into one flat buffer (and its gradient into another);
    idempotent."""
    params = [p for p in dict.fromkeys(model.parameters()) if id(p) not in lent]
    flat = getattr(model, "_flat", None)
    if flat is not None and flat[2] == [id(p) for p in params]:
        offset = 0
        for p in params:  # a gradient set to None (zero_grad) is its view of the flat gradients again, zeroed
            if p.grad is None:
                p.grad = flat[1].as_strided(p.shape, _contiguous(p.shape), offset).zero_()
            offset += p.numel()
        return flat[0], flat[1]
    for p in params:
        if p.dtype is not _BY_NAME["float32"]:
            name = next(n for n, q in model.named_parameters() if q is p)
            raise TypeError(f"compile: parameter {name!r} is {p.dtype.name}, but a compiled program keeps float32 "
                            f"weights: call model.float() before compile, and compile with precision='bf16-mixed' "
                            f"to train in bfloat16 (float32 master weights, docs/precision.md)")
    devices = {p.device for p in params} | {b.device for b in model.buffers()}
    if len(devices) > 1:
        raise RuntimeError(f"compile: the model's parameters and buffers are on several devices "
                           f"({', '.join(sorted(map(str, devices)))}); move the model with model.to(device)")
    device = devices.pop() if devices else "cpu"
    total = sum(p.numel() for p in params)
    buf = creation.empty(max(total, 1), device=device)
    grads = creation.zeros(max(total, 1), device=device)
    offset = 0
    for p in params:
        n = p.numel()
        p._rebind(buf, offset)
        p.grad = grads.as_strided(p.shape, _contiguous(p.shape), offset)
        offset += n
    object.__setattr__(model, "_flat", (buf, grads, [id(p) for p in params]))
    return buf, grads


def _contiguous(shape):
    strides, s = [], 1
    for n in reversed(shape):
        strides.append(s)
        s *= max(n, 1)
    return strides[::-1]


def _read_parameters(e):
    """The parameters of an entry's node: those it reads, and a conv bias that the batch norm after it cancels
    (folded into its running mean: still a parameter the loss reaches, with a zero gradient where PyTorch's is
    about zero)."""
    m = e.module
    if e.kind == PARAM:
        return [m.tensor]
    if e.kind not in (CONV2D, CONV_TRANSPOSE2D, LINEAR, BATCHNORM, LAYERNORM, GROUPNORM, EMBEDDING, LSTM, GRU):
        return []
    return [t for t in (m.weight, getattr(m, "bias", None)) if t is not None]


def _detached_parameters(model, entries):
    """The ids of the model's parameters that no gradient from the loss (the last entry) reaches: those the
    forward never reads (a layer left out of it) and those only entries behind a detach read."""
    reached = [False] * len(entries)
    reached[-1] = True
    for i in range(len(entries) - 1, -1, -1):
        if reached[i] and entries[i].kind != DETACH:
            for j in entries[i].inputs:
                reached[j] = True
    return {id(p) for p in model.parameters()} - {id(p) for e, r in zip(entries, reached) if r
                                                  for p in _read_parameters(e)}


def _node_dict(e, trainable):
    """The C node of an entry; `trainable` holds the ids of the parameters that get gradients (the model's,
    with requires_grad): a frozen one is read, never differentiated."""
    def grad(p):
        return p.grad if id(p) in trainable else None

    d = dict(kind=e.kind, inputs=tuple(e.inputs), shape=tuple(e.shape), flops=float(_flops(e)), common=int(e.common))
    for key, value in e.fields.items():
        if key not in ("act", "alpha"):
            d[key] = value
    if e.act is not None or e.kind == ACT:
        d["act"] = ACTS[e.act if e.kind != ACT else e.fields["act"]]
        d["alpha"] = e.alpha if e.kind != ACT else e.fields["alpha"]
    m = e.module
    if e.kind in (CONV2D, CONV_TRANSPOSE2D, LINEAR, BATCHNORM, LAYERNORM, GROUPNORM, EMBEDDING, LSTM, GRU):
        if m.weight is not None:
            d["weight"], d["dweight"] = m.weight, grad(m.weight)
        elif getattr(m, "_computed_weight", None) is not None:
            d["weight_input"] = len(e.inputs) - 1
        if getattr(m, "bias", None) is not None and e.bias_into is None:
            d["bias"], d["dbias"] = m.bias, grad(m.bias)
    if e.kind == PARAM:
        d["weight"], d["dweight"] = m.tensor, grad(m.tensor)
    if e.kind in (CROSS_ENTROPY, NLL):
        d["weight"] = m.weight  # class weights: constants
    if e.kind == MASKED_FILL and m.mask is not None:
        d["weight"] = m.mask
    if e.kind == BATCHNORM:
        d["running_mean"] = getattr(m, "running_mean", None)
        d["running_var"] = getattr(m, "running_var", None)
        d["num_batches_tracked"] = getattr(m, "num_batches_tracked", None)
        d["batch_stats"] = int(m.training)  # in eval mode its running statistics, in the training step too
    return d


def _recompute(recompute, model, entries):
    """What compile's recompute= asks the C program for: None, "auto", a budget in bytes, or each entry's segment:
    the index of the listed module whose call recorded it, -1 for none."""
    usage = "None, 'auto', a budget in bytes or a list of the model's modules"
    if recompute is None or isinstance(recompute, str):
        if recompute not in (None, "auto"):
            raise ValueError(f"compile: recompute must be {usage}, got {recompute!r}")
        return recompute
    if isinstance(recompute, numbers.Integral) and not isinstance(recompute, bool):
        if recompute < 0:
            raise ValueError(f"compile: a recompute budget is the bytes the training activations may take "
                             f"(memory_plan()['activations']), got {recompute}")
        return int(recompute)

    def members(m):
        """A ModuleList or ModuleDict (never called itself) stands for its modules."""
        return list(m.values()) if isinstance(m, M.ModuleDict) else list(m) if isinstance(m, M.ModuleList) else [m]

    # each item a segment: a module, or modules together (as checkpoint_sequential cuts a Sequential's layers)
    bad = TypeError(f"compile: recompute must be {usage} (or of lists of modules, each list one segment), got "
                    f"{type(recompute).__name__}")
    if isinstance(recompute, M.Module):
        recompute = members(recompute)
    if not isinstance(recompute, (list, tuple)):
        raise bad
    groups = []
    for item in recompute:
        if isinstance(item, M.Module):
            groups += [[m] for m in members(item)]
        elif isinstance(item, (list, tuple)) and all(isinstance(m, M.Module) for m in item):
            groups.append([x for m in item for x in members(m)])
        else:
            raise bad
    listed = [m for g in groups for m in g]
    names = {}
    for name, m in model.named_modules():
        names.setdefault(id(m), repr(name) if name else "the model itself")
    for m in listed:
        if id(m) not in names:
            raise ValueError(f"compile: recompute lists a {type(m).__name__} that is not a submodule of the model")
        inner = next((o for o in listed if o is not m and any(o is sub for sub in m.modules())), None)
        if inner is not None or sum(o is m for o in listed) > 1:
            raise ValueError(f"compile: recompute lists {names[id(m)]} and " + (
                f"its submodule {names[id(inner)]}: list one of them" if inner is not None else "lists it again"))
    if not listed:
        return None
    segment = [-1] * len(entries)
    for k, group in enumerate(groups):
        for m in group:
            hits = [i for i, e in enumerate(entries) if any(s is m for s in e.scope)]
            if not hits:
                raise ValueError(f"compile: recompute lists {names[id(m)]}, which the model's forward does not "
                                 f"call")
            for i in hits:
                segment[i] = k
    return segment


def _flops(e):
    """Multiply-adds x 2 of one forward pass per sample (none for a node computed once per step)."""
    m = e.module
    if e.common:
        return 0
    if e.kind in (CONV2D, CONV_TRANSPOSE2D):  # a transposed one: its adjoint's, whose output is its input
        c, k = m.in_channels // m.groups, m.out_channels
        positions = e.shape[1:] if e.kind == CONV2D else m.input_size(e.shape[1:])
        return 2 * k * c * math.prod(m.kernel_size) * math.prod(positions)
    if e.kind == LINEAR:
        return 2 * m.in_features * m.out_features * math.prod(e.shape[:-1])
    if e.kind == MATMUL:
        return 2 * math.prod(e.shape) * m.inner
    if e.kind in (LSTM, GRU):  # each step's h W_hh^T
        return 2 * m.weight.numel() * e.shape[0]
    if e.kind == ATTENTION:  # q k^T and p v, half of each under a causal mask
        Tq, E = e.shape
        return 4 * Tq * m.keys * E // (2 if m.causal else 1)
    return 0 if e.kind in (INPUT, TARGET, PARAM) else math.prod(e.shape)


def _table(entries, dtypes=None, recomputed=None):
    """The node table of summary(), as rows (its text and its HTML both come from them): shapes, parameters,
    forward FLOPs, fusions and dropped biases, and with dtypes and recomputed (a compiled program's) the dtype each
    node's output is stored in and whether the backward computes it again."""
    columns = [Column("#", 3, ">"), Column("node", 22, gap="  "), Column("output", 18), Column("params", 10, ">"),
               Column("MFLOP", 10, ">")]
    columns += ([Column("dtype", 9, gap="  ")] if dtypes else []) + [Column("notes", gap="  ")]
    rows, counted, total_flops = [], {}, 0
    for i, e in enumerate(entries):
        name = "input" if e.module is None else type(e.module).__name__.lstrip("_")
        read = [getattr(e.module, k, None) for k in ("weight", "bias", "tensor")]  # a shell's or value's too
        read = [t for t in read if isinstance(t, M.Parameter)]
        params = sum(t.numel() for t in read)
        counted.update((id(t), t.numel()) for t in read)  # a tied weight counts once in the total
        flops = _flops(e)
        total_flops += flops
        notes = []
        if e.act:
            notes.append(f"+{e.act} fused")
        if e.bias_into is not None:
            notes.append("bias folded into the batch norm's running mean")
        if recomputed and recomputed[i]:
            notes.append("recomputed in the backward")
        if e.common:
            notes.append("of the parameters alone: once per step")
        rows.append([str(i), name, str(tuple(e.shape)), f"{params:,}", f"{flops / 1e6:.2f}"]
                    + ([dtypes[i]] if dtypes else []) + [", ".join(notes)])
    totals = {"params": ("parameters", f"{sum(counted.values()):,}"),
              "MFLOP": ("forward MFLOP per sample", f"{total_flops / 1e6:.2f}")}
    return Table(columns, rows, totals)


def summary(model, input_shape=None, batch_size=1, input_dtype=None):
    """What compile() would make of the model: its nodes with output shapes, parameters, FLOPs, fusions and
    dropped biases, and an estimate of the activation memory of a training step (every output and its
    gradient kept; the compiled program plans less). Changes nothing. The text prints as a table; in Jupyter it
    shows as an HTML table."""
    entries = _fuse(*_graph(model, _inputs(model, input_shape, input_dtype))[:2])
    per_sample = sum(math.prod(e.shape) for e in entries if e.kind != INPUT) * 4
    table = _table(entries)
    table.notes.append(f"activation memory (upper bound): {2 * per_sample * batch_size / 2**20:.1f} MiB "
                       f"for {batch_size} samples")
    return _summary(table)


def _forward_strides(t):
    """t, or its copy where a stride is negative (x[::-1]): the C ops read memory forwards."""
    return t.contiguous() if any(s < 0 for s in t.stride()) else t


def _as(t, dtype, what):
    """t as a tensor of dtype: integers (token ids, labels) refused, not truncated, when given as floats, and masks
    taken as bool only (a float 0.3 is no mask value)."""
    from ..creation import _check_int64_range, as_tensor
    t = _forward_strides(as_tensor(t))
    if dtype is _BY_NAME["bool"] and t.dtype is not dtype:
        raise TypeError(f"{what} must be bool, got {t.dtype.name} (compare them to make a mask: m != 0)")
    if dtype is _BY_NAME["int64"]:
        if t.dtype.is_floating_point or t.dtype.is_complex:
            raise TypeError(f"{what} must be integers, got {t.dtype.name}" + (
                "; class probabilities (mixup's soft targets) need compile(..., target_shape=(classes,), "
                "target_dtype=ft.float32)" if what == "labels" else ""))
        _check_int64_range(t, what)
    return t.to(dtype)


class _Fixed:
    """An attribute compile fixes: read as any, refused when set afterwards, which the C program would ignore."""

    def __set_name__(self, owner, name):
        self.name = name

    def __get__(self, program, owner=None):
        if program is None:
            return self
        try:
            return program.__dict__[self.name]
        except KeyError:
            raise AttributeError(self.name) from None

    def __set__(self, program, value):
        if self.name in program.__dict__:
            def shown(v):
                return repr(v) if isinstance(v, (int, float, str)) else type(v).__name__
            raise AttributeError(f"program.{self.name} is fixed at compile ({shown(program.__dict__[self.name])}): "
                                 f"compile the model again with {self.name}={shown(value)}")
        program.__dict__[self.name] = value


class Program:
    """A compiled model: train_step, predict and evaluate run in C."""

    batch_size, accumulate_steps, precision = _Fixed(), _Fixed(), _Fixed()
    model, loss = _Fixed(), _Fixed()  # the C program runs the ones it was compiled with

    def __init__(self, model, optimizer, loss, batch_size, input_shape, memory_format, accumulate_steps,
                 clip_grad_norm, nan_policy, seed, target_shape=None, target_dtype=None, input_dtype=None,
                 precision="32-true", distributed=False, recompute=None, bucket_cap_mb=25, grad_scaler=None):
        from ..amp import GradScaler
        precision = _precision_name(precision)
        if grad_scaler is not None and not isinstance(grad_scaler, GradScaler):
            raise TypeError(f"compile: grad_scaler must be an ft.amp.GradScaler, got {type(grad_scaler).__name__}")
        if isinstance(loss, type):
            raise TypeError(f"compile: the loss is the class {loss.__name__}; give an instance, {loss.__name__}()")
        if not callable(loss):
            raise TypeError(f"compile: the loss must be an ft.nn loss, a Module or a function f(output, target), "
                            f"got {type(loss).__name__}")
        if nan_policy not in ("raise", "skip"):
            raise ValueError(f"nan_policy must be 'raise' or 'skip', got {nan_policy!r}")
        if clip_grad_norm is not None and not (isinstance(clip_grad_norm, (int, float)) and clip_grad_norm > 0
                                               and math.isfinite(clip_grad_norm)):
            raise ValueError(f"clip_grad_norm must be a positive number or None, got {clip_grad_norm!r}")
        if isinstance(bucket_cap_mb, bool) or not isinstance(bucket_cap_mb, (int, float)) \
                or not (0 < bucket_cap_mb < math.inf):
            raise ValueError(f"bucket_cap_mb must be a positive number, got {bucket_cap_mb!r}")
        if isinstance(accumulate_steps, bool) or not isinstance(accumulate_steps, int) or accumulate_steps < 1:
            raise ValueError(f"accumulate_steps must be an int of at least 1, got {accumulate_steps!r}")
        if isinstance(batch_size, bool) or not isinstance(batch_size, numbers.Integral) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        batch_size = int(batch_size)
        seed = None if seed is None else _check_seed(seed)
        if batch_size % accumulate_steps:
            raise ValueError(f"batch_size {batch_size} must be a multiple of accumulate_steps {accumulate_steps}")
        # model.to(memory_format=ft.channels_last), as a PyTorch speed guide writes it: a preference, which a model
        # that cannot take it (below) overrides
        hinted = memory_format is None and getattr(model, "_memory_format", None) not in (None, "preserve")
        if hinted:
            memory_format = model._memory_format
        if memory_format == "preserve":
            memory_format = None
        if memory_format not in (None, "channels_last", "contiguous"):
            raise ValueError("memory_format must be 'channels_last' (ft.channels_last), 'contiguous' "
                             "(ft.contiguous_format) or None (channels_last where the model allows it)")
        self.model, self.optimizer, self.loss = model, optimizer, loss
        self.batch_size, self.accumulate_steps = batch_size, accumulate_steps
        self.clip_grad_norm, self.nan_policy = clip_grad_norm, nan_policy
        inputs = _inputs(model, input_shape, input_dtype)
        self._input_dtypes = [dtype for _, dtype in inputs]
        entries, output, branches, _ = _graph(model, inputs, loss, target_shape, target_dtype)
        readers, read, checkpoints = mode_readers(), buffers_read(), checkpointed()
        if not model.training:
            raise ValueError("compile: the model is in eval mode (.eval()), which would freeze every batch norm and "
                             "dropout in the training step; call .train() first (predict and evaluate run in eval "
                             "mode by themselves). Put only the layers to freeze in eval mode.")
        # What the nodes of batch norms and dropout fix: their mode (in eval mode a training step runs batch norms by
        # their running statistics and dropout as the identity, as PyTorch's step runs a frozen teacher or batch
        # norms frozen for fine-tuning), dropout's p (an attention layer's too), and the batch norms' momentum and
        # eps; an RNN's dropout between layers, and the mode of each module the forward's own code read.
        self._modal = {id(m): (m, {k: getattr(m, k) for k in fixed}) for e in entries for m in e.scope
                       for cls, fixed in _MODAL if isinstance(m, cls) and not (isinstance(m, M._RNNBase) and
                                                                               not m.dropout)}
        self._modal.update((id(m), (m, {"training": m.training})) for m in readers)
        self._low = precision != "32-true"  # as asked (a CPU without bfloat16 then runs float32 on the same graph)
        self.entries, self.output = _fused(entries, output, self._low)
        # the modules the forward ran through torch.utils.checkpoint's checkpoint, unless recompute= says otherwise
        segments = _recompute(recompute if recompute is not None or not checkpoints else checkpoints, model,
                              self.entries)
        # A LayerNorm or Linear over the last dimension of 3-d per-sample values (ConvNeXt's x.permute(0, 2, 3, 1))
        # or a LayerNorm over whole images reads them in their (d0, d1, d2) order, which channels_last moves.
        last = next((e for e in self.entries if e.kind in (LAYERNORM, LINEAR) and
                     len((e if e.kind == LAYERNORM else self.entries[e.inputs[0]]).shape) == 3), None)
        if memory_format is None or (hinted and last):
            memory_format = "contiguous" if last else "channels_last"
        elif memory_format == "channels_last" and last:
            raise ValueError(f"compile: a {type(last.module).__name__} over 3-d samples of shape "
                             f"{tuple(self.entries[last.inputs[0]].shape)} (images, or ConvNeXt's x.permute(0, 2, 3, "
                             "1)) needs memory_format='contiguous' (compile's default then)")
        self.memory_format = memory_format
        own = {id(p) for p in model.parameters()}
        held = [p for g in optimizer.param_groups for p in g["params"]]
        if any(id(p) not in own for p in held):
            lacking = [n for n, p in model.named_parameters() if id(p) not in {id(q) for q in held}]
            loss_own = isinstance(loss, M.Module) and any(id(p) in {id(q) for q in loss.parameters()} for p in held)
            loose = not loss_own and any(not isinstance(p, M.Parameter) for p in held if id(p) not in own)
            why = ("the loss module's own parameters (a learned loss weight) are trained as the model's: assign "
                   "them to the model (model.log_var = nn.Parameter(...)) and read them in the loss") if loss_own \
                else ("a tensor made with requires_grad=True is no module's parameter: wrap it, self.W = "
                      "nn.Parameter(ft.randn(n, h) * 0.01), or hold several in an nn.ParameterList") if loose \
                else "an optimizer of another model?"
            raise ValueError(f"compile: the optimizer holds tensors that are not parameters of this model ({why}); "
                             f"of this model's parameters it lacks {lacking}")
        held = {id(p) for p in held}
        late = next((n for n, m in model.named_modules() if m.__dict__.get("_made_lazily") and
                     any(p.requires_grad and id(p) not in held and _trainer(p) is None for p in m.parameters())), None)
        if late is not None:  # (PyTorch's optimizer holds the lazy parameters it materializes)
            raise ValueError(f"compile: the optimizer lacks the parameters of {late or 'the model'}, a lazy layer "
                             "that its first call sized after the optimizer was made: make the optimizer after that "
                             "call (model(x)), as PyTorch asks")
        # A parameter another program trains and this optimizer does not hold (a GAN's discriminator in the
        # generator's step) is lent: read where it is, frozen here, so the two programs alternate. Parameters read
        # but frozen get no gradient; the others the optimizer does not hold are differentiated (their .grad is
        # filled) but not updated, as with torch.optim.
        self._lent = {id(p) for p in model.parameters()
                      if id(p) not in held and (t := _trainer(p)) is not None and t.model is not model}
        self.flat_params, self.flat_grads = _flatten_parameters(model, self._lent)
        compute, precision = _compute_dtype(precision, self.flat_params.device)
        if precision == "16-mixed" and grad_scaler is None:
            grad_scaler = GradScaler()  # float16's range needs one (Lightning's 16-mixed scales too)
        self._compute = compute
        if self.flat_params.device.type != "cpu" and any(isinstance(e.module, M.InPlaceABN) for e in self.entries):
            raise NotImplementedError("compile: InPlaceABN runs on the CPU so far; on CUDA use BatchNorm2d and "
                                      "LeakyReLU, with recompute= to save their memory")
        self.precision = precision
        self.trainable = {id(p) for p in model.parameters() if p.requires_grad and id(p) not in self._lent}
        # A parameter that the forward does not read, or reads only through a detach, gets no gradient: as PyTorch
        # leaves its .grad None, the optimizer skips it (no weight decay either).
        self._detached = _detached_parameters(model, self.entries)
        self.trainable -= self._detached
        self._trains = {id(p): p for p in model.parameters() if id(p) in held and id(p) in self.trainable}
        self._folded = [e for e in self.entries if e.bias_into is not None]
        self._eval_loss_error = None
        evaluation = self._eval_graph((model, inputs, loss, target_shape, target_dtype)) if branches else None
        self._fold_biases()
        self._compiled_params = dict(model.named_parameters())
        self._compiled_modules = self._module_layout()
        self._compiled_buffers = self._named_buffers()
        self._places = {name: p.data_ptr() for name, p in self._compiled_params.items()}
        self._nodes = [_node_dict(e, self.trainable) for e in self.entries]
        # views of its own (another program of the same model, compiled again, shares the memory, not the objects)
        self._grad_views = [(p, p.grad.detach()) for p in dict.fromkeys(model.parameters())
                            if id(p) in self.trainable]
        for p, view in self._grad_views:
            p.grad = view
        for p in model.parameters():  # a frozen one's, or one the loss does not reach: None, as PyTorch's
            if id(p) not in self.trainable and id(p) not in self._lent:
                p.grad = None
        if seed is None:  # ft.manual_seed before compile fixes the masks, as torch.manual_seed fixes PyTorch's
            from ..random import randint
            seed = int(randint(0, 2 ** 62, (1,)).item())
        self._c = _C.Program(self._nodes, self.flat_params, self.flat_grads, self.output,
                             batch_size // accumulate_steps, memory_format == "channels_last", seed, compute._code,
                             segments)
        if isinstance(segments, list):
            recomputed = self._c.recomputed()
            idle = sorted({k for k in segments if k >= 0} - {k for k, r in zip(segments, recomputed) if r})
            if idle:
                warnings.warn(f"compile: recompute= item(s) {idle} recompute nothing: every output of their nodes "
                              f"is read outside them (list the block around them instead)", RuntimeWarning,
                              stacklevel=3)
        targets = [e for e in self.entries if e.kind == TARGET]
        self._target_order = [e.module.index for e in targets]  # the batch's tuple of targets in node order
        targets.sort(key=lambda e: e.module.index)
        self.target_dtype = targets[0].module.dtype if targets else None
        self.target_shape = tuple(targets[0].shape) if targets else None  # per sample
        if len(targets) > 1:
            self.target_dtype = tuple(e.module.dtype for e in targets)
            self.target_shape = tuple(tuple(e.shape) for e in targets)
        # evaluate() counts correct argmax predictions of (classes,) outputs against class targets
        self.classifies = self.target_dtype is _BY_NAME["int64"] and targets[0].shape == () \
            and len(self.entries[self.output].shape) == 1
        self.sums_loss = self._c.sums_loss()  # (see tally_means)
        self.step_count = 0
        self.skipped_steps = 0
        self.distributed = bool(distributed)
        if self.distributed:
            from .. import distributed as dist
            if not dist.is_initialized():
                raise RuntimeError("compile(..., distributed=True) needs ft.distributed.init() first")
            self._check_ranks_agree(model)
            self._c._set_distributed(max(4, min(round(bucket_cap_mb * 2 ** 20), 2 ** 62)))
            # Every rank starts from rank 0's weights and buffers, as DistributedDataParallel does.
            for t in (self.flat_params, *model.buffers()):
                dist.broadcast(t, 0)
        self._eval_c, self._eval_nodes = self._c, self._nodes
        if evaluation is not None:
            self._eval_nodes = [_node_dict(e, ()) for e in evaluation[0]]
            self._eval_c = _C.Program(self._eval_nodes, self.flat_params, self.flat_grads, evaluation[1],
                                      batch_size // accumulate_steps, memory_format == "channels_last", 0,
                                      compute._code, None)
        # the numbers forward and the loss may have read once traced (in eval mode too), and the buffers eager ops
        # read: the program keeps what they computed
        self._numbers = _numbers_read(model, loss, self._modal)
        names = {id(b): name for name, b in (*model.named_buffers(), *model.named_parameters())}
        stepped = {id(getattr(e.module, k, None)) for e in entries if e.kind == BATCHNORM  # the step moves them
                   for k in ("running_mean", "running_var", "num_batches_tracked")}
        self._buffers_read = [[names[i], b, _fingerprint(b), line] for i, (b, line) in
                              {**read, **buffers_read()}.items() if i not in stepped]
        self.grad_scaler = grad_scaler  # attached last: a compile that fails leaves it free for the next
        if grad_scaler is not None:
            grad_scaler._attach(self._c)
        for key in [k for k, ref in _TRAINERS.items() if ref() is None]:
            del _TRAINERS[key]
        # the model compiled again with its optimizer (a backbone unfrozen): the steps go on being counted
        before = next((q for q in (r() for r in map(_TRAINERS.get, self._trains) if r) if q is not None and
                       q.optimizer is optimizer), None)
        if before is not None:
            self.step_count, self.skipped_steps = before.step_count, before.skipped_steps
        _TRAINERS.update(dict.fromkeys(self._trains, weakref.ref(self)))

    def _eval_graph(self, graph):
        """The graph (entries, output) predict and evaluate run when the forward branches on self.training and its
        graph in eval mode computes something else than the training step's (a program of its own then, which
        reads the same weights and trains nothing); else None. `graph` is _graph's arguments."""
        entries, output, _, unread = _graph(*graph, training=False)
        entries, output = _fused(entries, output, self._low)
        if _in_eval_mode(entries, output) == _in_eval_mode(self.entries, self.output):
            return None
        self._eval_loss_error = unread
        folded = {id(e.module): e.bias_into for e in self._folded}
        for e in entries:
            if id(e.module) in folded and e.bias_into is not folded[id(e.module)]:
                raise NotImplementedError(
                    f"compile: the {type(e.module).__name__} before {type(folded[id(e.module)]).__name__} in the "
                    "training step, whose bias compile folds into the batch norm's running mean, is read without "
                    "it in eval mode (a branch on self.training between them): create the convolution with "
                    "bias=False")
            if e.bias_into is not None and id(e.module) not in folded:
                e.bias_into = None  # the training step reads the bias: folded here it would move under that step
        return entries, output

    def _input(self, x):
        """x as the inputs' dtypes (a float batch in a mixed-precision program's compute dtype goes as it is): one
        tensor, or a tuple of one for each input of forward."""
        dtypes = self._input_dtypes
        if len(dtypes) > 1:
            if not isinstance(x, (tuple, list)) or len(x) != len(dtypes):
                got = f"a {type(x).__name__} of {len(x)}" if isinstance(x, (tuple, list)) else type(x).__name__
                raise TypeError(f"the model's forward takes {len(dtypes)} inputs: give x as a tuple of as many "
                                f"batches, got {got} (batches are (x1, ..., x{len(dtypes)}, y) or ((x1, ..., "
                                f"x{len(dtypes)}), y))")
            return tuple(self._input_as(t, dtype) for t, dtype in zip(x, dtypes))
        return self._input_as(x, dtypes[0])

    def _input_as(self, x, dtype):
        if self._compute is not _BY_NAME["float32"] and dtype.is_floating_point and \
                getattr(x, "dtype", None) is self._compute:
            return _forward_strides(x)
        what = {"int64": "token ids", "bool": "masks"}.get(dtype.name, "inputs")
        if dtype.is_floating_point:
            from ..creation import as_tensor
            x = as_tensor(x)
            if not x.dtype.is_floating_point:  # PyTorch's layers refuse them too; cast, they would read raw bytes
                raise TypeError(f"{what} must be floating point, got {x.dtype.name}" + (
                    ": uint8 images as ft.fit and ft.data.Loader feed them are scaled to [0, 1] (x / 255)"
                    if x.dtype.name == "uint8" else " (x.astype(np.float32) if they are values)"))
        return _as(x, dtype, what)

    def _batch(self, x, y):
        """x as the inputs' dtypes, and the targets as the loss reads them (None when it reads none)."""
        xt = self._input(x)
        shapes = [tuple(t.shape) for t in (xt if isinstance(xt, tuple) else (xt,))]
        if shapes == [tuple(s) for s in (self.input_shape if isinstance(xt, tuple) else (self.input_shape,))]:
            raise ValueError(f"train_step, backward and evaluate take a batch, got one sample of shape "
                             f"{shapes[0] if len(shapes) == 1 else tuple(shapes)}: add the batch dimension "
                             "(x[None], y[None]); predict takes one sample as it is")
        if self.target_dtype is None or y is None:
            return xt, None
        if not isinstance(self.target_dtype, tuple):
            return xt, _as(y, self.target_dtype, "labels")
        if not isinstance(y, (tuple, list)) or len(y) != len(self.target_dtype):
            got = f"a {type(y).__name__} of {len(y)}" if isinstance(y, (tuple, list)) else type(y).__name__
            raise TypeError(f"the program's loss reads {len(self.target_dtype)} targets: give y as a tuple of as many "
                            f"batches, got {got}")
        if any(t is None for t in y):
            raise TypeError(f"target {[t is None for t in y].index(True)} is None: the program's loss reads all "
                            f"{len(y)} targets")
        ys = [_as(t, dtype, f"labels of target {k}") for k, (t, dtype) in enumerate(zip(y, self.target_dtype))]
        return xt, tuple(ys[k] for k in self._target_order)

    def _training_batch(self, x, y, stacklevel):
        """_batch for a training step, which warns once when a batch larger than the compiled one meets a batch norm
        in training mode: it runs as micro-batches, each normalized by its own statistics; one that would leave a
        micro-batch of one sample to a batch norm of one value per channel (BatchNorm1d on features) is refused."""
        xt, yt = self._batch(x, y)
        first = (xt[0] if isinstance(xt, tuple) else xt).shape
        n = first[0] if first else 0  # a 0-d input: refused by the step
        self._check_split(n)
        self._warn_split(n, stacklevel + 1)
        return xt, yt

    def _warn_split(self, n, stacklevel):
        """Warns once when batches of n samples, more than the compiled batch, meet a batch norm in training mode
        (a train_step's, a Loader's in ft.fit): they run as micro-batches, each normalized by its own statistics."""
        if n > self.batch_size and not self.__dict__.get("_warned_split") and any(
                e.kind == BATCHNORM and e.module.training for e in self.entries):
            self._warned_split = True
            warnings.warn(f"a batch of {n} samples trains as micro-batches of at most "
                          f"{self.batch_size // self.accumulate_steps} (the compiled batch_size "
                          f"{self.batch_size}): each batch norm normalizes every micro-batch by its own statistics, "
                          f"where a step of {n} at once would use the {n} samples' (compile with batch_size={n} for "
                          "that)", stacklevel=stacklevel + 1)

    def _check_split(self, n):
        """Fails where a batch of n would leave a (micro-)batch of one sample to a batch norm of one value per
        channel in training mode (BatchNorm1d on features), as PyTorch's fails for a batch of one."""
        micro = self.batch_size // self.accumulate_steps
        norms = [e for e in self.entries if e.kind == BATCHNORM and e.module.training]
        if n % micro == 1 and micro > 1 and any(math.prod(e.shape[1:]) == 1 for e in norms):
            what = "a batch of 1 sample, which" if n == 1 else \
                f"a batch of {n} samples trains as micro-batches of {micro}, the last of 1 sample, which"
            raise ValueError(f"{what} a batch norm in training mode cannot normalize (it needs more than 1 value per "
                             f"channel, as PyTorch's); give batches of {micro} samples or a multiple (drop_last=True "
                             "of a Loader, or of ft.fit on arrays, leaves out a short last batch)"
                             + (f", or compile with batch_size={n}" if n > 1 else ""))

    @property
    def input_shape(self):
        """The per-sample shape of the program's input (without the batch dimension); for a forward of several
        inputs a tuple of their shapes."""
        shapes = [e.shape for e in self.entries if e.kind == INPUT]
        return shapes[0] if len(shapes) == 1 else tuple(shapes)

    def train_step(self, x, y):
        """One optimizer step on the batch (x, y): forward, loss, backward, update, all in C. Returns the loss."""
        return self._step(x, y)[0]

    def _check_modes(self):
        """Fails where a batch norm, a dropout (an RNN's between layers too) or a module whose mode the forward's own
        code reads is not in the mode compile fixed for the training step (predict and evaluate run every layer in
        eval mode by themselves)."""
        for m, fixed in self._modal.values():
            if m.training != fixed["training"]:
                now, then = ("training", "eval") if m.training else ("eval", "training")
                name = next((n for n, o in self.model.named_modules() if o is m and n), None)
                raise ValueError(f"{type(m).__name__}{f' {name!r}' if name else ''} is in {now} mode, but was in "
                                 f"{then} mode at compile, which the compiled training step keeps; call "
                                 f".{'train' if fixed['training'] else 'eval'}() on it again, or compile again")

    def _check_settings(self):
        """Fails where a batch norm's momentum or eps or a dropout's p changed since compile; warns (once each) where
        another number a module holds did (a temperature its forward reads), which the program keeps as compile
        read it."""
        for m, fixed in self._modal.values():
            for k, v in fixed.items():
                if k != "training" and getattr(m, k) != v:
                    raise ValueError(f"{type(m).__name__}.{k} changed from {v} to {getattr(m, k)} after compile, "
                                     "which the compiled program does not see: set it back, or compile again")
        for number in self._numbers:
            name, now, v = number[0], number[1](), number[2]
            if not _is_number(now) or now != v and now == now:  # NaN: itself
                number[2] = now
                warnings.warn(f"{name} changed from {v!r} to {now!r} after compile: the compiled program keeps the "
                              "value its forward (or loss) read at compile; compile again to use the new one; a number "
                              "that changes every batch belongs in the batch (a soft target: mixup's "
                              "lam * onehot(a) + (1 - lam) * onehot(b))", RuntimeWarning, stacklevel=4)
        for entry in self._buffers_read:
            name, b, then, line = entry
            now = _fingerprint(b)
            if now != then:
                entry[2] = now
                warnings.warn(f"{name} changed after compile, but what forward computed from it by eager ops (or "
                              f"copied of it, {line}) keeps the value it had at compile: compile again to use the "
                              "new one, or use it itself in traced ops", RuntimeWarning, stacklevel=4)

    def _train_modes(self):
        """The model in training mode, but for the layers compile found in eval mode (what ft.fit sets each
        epoch, where a PyTorch loop calls model.train())."""
        self.model.train()
        for m, fixed in self._modal.values():
            m.training = fixed["training"]

    def _fold_biases(self):
        """The compiled model computes a convolution before a batch norm without its bias. Moved into the running
        mean (x + b - mean = x - (mean - b)), it leaves the function as it was, in eval mode too (a pretrained
        model's running mean holds its bias), and the saved model describes what is trained. Run before every use
        of the program too, for a bias loaded since (load_state_dict after compile)."""
        for e in self._folded:  # a batch norm without running statistics cancels the bias in eval mode too
            if getattr(e.bias_into, "running_mean", None) is not None:
                e.bias_into.running_mean.sub_(e.module.bias)
            e.module.bias.fill_(0)

    def _check_ranks_agree(self, model):
        """Fails on every rank where a rank compiled another program than rank 0's: rank 0's weights would be
        broadcast into another layout (of as many parameters, silently) and the gradient sums would not match."""
        import hashlib

        from .. import distributed as dist
        from ..creation import tensor
        opt = self.optimizer
        groups = [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups]
        what = repr(([(n, tuple(p.shape), p.dtype.name, p.requires_grad) for n, p in model.named_parameters()],
                     [(e.kind, tuple(e.shape)) for e in self.entries], type(opt).__name__, groups,
                     self.batch_size, self.accumulate_steps, self.precision))
        mine = tensor(list(hashlib.sha256(what.encode()).digest()[:8]), dtype="float64")
        first = dist.broadcast(mine.clone(), 0)
        differs = tensor([0.0] * dist.get_world_size(), dtype="float64")
        differs[dist.get_rank()] = float(not bool((mine == first).all()))
        ranks = [r for r, d in enumerate(dist.all_reduce(differs).tolist()) if d]
        if ranks:
            raise ValueError(f"compile(..., distributed=True): rank(s) {ranks} compiled another program than rank 0 "
                             "(the parameters' names, shapes or dtypes, the layers, the optimizer or its "
                             "hyperparameters, batch_size, accumulate_steps or precision differ): every rank must "
                             "compile the same model, optimizer and options")

    def _named_buffers(self):
        """The model's buffers, and the loss module's (a class weight), by name."""
        found = dict(self.model.named_buffers())
        if isinstance(self.loss, M.Module):
            found.update(self.loss.named_buffers(prefix="loss"))
        return found

    def _module_layout(self):
        return [(name, id(m)) for name, m in self.model.named_modules(remove_duplicate=False)]

    def _check_parameters(self, training=False):
        """Fails where the modules or the parameters compile read have changed since (a layer added, removed or
        replaced; parameters replaced by new ones, moved into another program's buffer, or, for a training step,
        which of them train), rather than running on the ones it compiled."""
        now, before = dict(self.model.named_parameters()), self._compiled_params
        if now.keys() != before.keys():
            raise ValueError(f"the model's parameters changed after compile (added {sorted(now.keys() - before.keys())}"
                             f", removed {sorted(before.keys() - now.keys())}): compile again")
        if self._module_layout() != self._compiled_modules:
            raise ValueError("the model's modules changed after compile (a layer added, removed or replaced), which "
                             "the compiled program does not see: compile again")
        buffers = self._named_buffers()
        for name, b in self._compiled_buffers.items():
            if buffers.get(name) is not b:
                raise ValueError(f"{name} was replaced after compile by {'a new tensor' if name in buffers else 'None'}"
                                 ", which the compiled program does not read: copy the values into the one it "
                                 "compiled (its .copy_(), .zero_(), load_state_dict), or compile again")
        for name, p in now.items():
            if p is not before[name]:
                raise ValueError(f"{name} was replaced after compile by a new tensor, which the compiled program does "
                                 "not read: copy the values into the one it compiled (load_state_dict, or its .copy_() "
                                 "under ft.no_grad()), or compile again")
            if p.data_ptr() != self._places[name]:
                if id(p) in self._trains:
                    raise ValueError(f"{name} moved after compile (compiling another model that holds this module, "
                                     "with an optimizer that holds it too, moves its parameters into that program's "
                                     "flat buffer; so does model.to()), so this program would train its old values: "
                                     "compile this model again. A parameter trains in one program: give it to one "
                                     "optimizer, and the other programs read it where it is")
                self._follow(name, p)
            if training and id(p) not in self._lent | self._detached and \
                    p.requires_grad != (id(p) in self.trainable):
                raise ValueError(f"{name}.requires_grad became {p.requires_grad} after compile, which the compiled "
                                 "training step does not see: compile again to train with it "
                                 f"{'frozen' if not p.requires_grad else 'trained'} (predict and evaluate run as "
                                 "they are)")
        self._check_settings()
        self._fold_biases()

    def _follow(self, name, p):
        """Points the nodes reading p, which this program does not train, at its new place: the compile of a
        program that trains it took it into that program's flat buffer (whose .grad it is now)."""
        for c, nodes in {id(c): (c, nodes) for c, nodes in ((self._c, self._nodes),
                                                             (self._eval_c, self._eval_nodes))}.values():
            for i, d in enumerate(nodes):
                for key in ("weight", "bias"):
                    if d.get(key) is p:
                        c._move_weight(i, key == "bias", p)
        self._places[name] = p.data_ptr()
        self._grad_views = [(q, view) for q, view in self._grad_views if q is not p]
        self._lent.add(id(p))  # read from another program's buffer now: its requires_grad is that program's

    def _check_compiled(self):
        """Fails where what compile fixed has changed since (the parameters, the layers' training mode), rather than
        training on as compiled."""
        self._check_parameters(training=True)
        self._check_modes()

    def _step(self, x, y):
        """train_step, returning (the loss, its tally: see tally_means; the accuracy's counts from the training-mode
        output)."""
        self._check_compiled()
        loss, skipped, tally = self._c.train_step(*self._training_batch(x, y, 3), self.optimizer, self.clip_grad_norm,
                                                  self.nan_policy)
        self.step_count += 1
        self.skipped_steps += skipped
        return loss, tally

    @property
    def last_grad_norm(self):
        """The L2 norm of the whole gradient in the last step (train_step or ft.fit), before clipping: every step
        computes it, since it refuses (or with nan_policy="skip" skips) a non-finite one (inf or nan then); None
        before the first step and after a step stopped by its loss."""
        return self._c.last_grad_norm

    @property
    def gradient_buckets(self):
        """A distributed program on the CPU: {"buckets": how many its gradient is summed in, "started_early": how
        many of them the last step started before its backward ended (overlapping the rest), "wait_seconds": how
        long the last step then waited for the sums (the part the backward did not hide)}; else None."""
        got = self._c.gradient_buckets
        return None if got is None else dict(zip(("buckets", "started_early", "wait_seconds"), got))

    def backward(self, x, y):
        """Forward and backward of the batch in training mode, without an update (batch-norm running statistics
        are updated as in a step); returns the loss. As PyTorch's loss.backward(), the gradients are added to
        what .grad holds, so that several batches' gradients sum until optimizer.zero_grad(); after
        zero_grad(set_to_none=True) (PyTorch's default) they are written anew into .grad. A batch whose loss is not
        finite is refused with a ValueError, .grad as it was."""
        self._check_compiled()
        x, y = self._training_batch(x, y, 2)
        # .grad set to None or to another tensor (not to another program's view of the same memory, whose gradients
        # add up with these, as two backwards of PyTorch's)
        replaced = [(p, p.grad) for p, view in self._grad_views if p.grad is None or p.grad.data_ptr() !=
                    view.data_ptr()]
        # a loss found not finite in a later micro-batch comes after the earlier ones' gradients were added
        rows = ((x[0] if isinstance(x, tuple) else x).shape or (0,))[0]  # a 0-d x: C names the mistake
        kept = self.flat_grads.clone() if not replaced and rows > self.batch_size // self.accumulate_steps else None
        self._let_go({id(p) for p, _ in replaced})
        for p, view in self._grad_views:
            p.grad = view  # (set to None or replaced) the program's memory is .grad again
        try:
            return self._c.backward(x, y, not replaced)
        except BaseException:
            if kept is not None:
                self.flat_grads.copy_(kept)
            for p, grad in replaced:
                p.grad = grad
            raise

    def _let_go(self, dropped):
        """New views of the program's gradient memory for the parameters (by id) whose .grad was set to None
        (zero_grad's default) or replaced. An old view still held elsewhere (g1 = p.grad before zero_grad(), kept to
        compare with the next batch's) moves into memory of its own with its values, as the tensor that PyTorch's
        zero_grad drops keeps them."""
        for i, (p, view) in enumerate(self._grad_views):
            if id(p) in dropped and sys.getrefcount(view) > _UNHELD:
                self._grad_views[i] = (p, view.detach())
                view._rebind(creation.empty(view.numel(), dtype=view.dtype, device=view.device), 0)

    def predict(self, x):
        """The model's (first) output for x, in eval mode (running batch-norm statistics, no dropout): for a batch
        (N, *input_shape) the outputs (N, ...); for one sample of shape input_shape its output alone, without the
        batch dimension. Any other shape is a ValueError naming both. A forward of several inputs takes a tuple
        of them, all one sample or all batches."""
        self._check_parameters()
        xt = self._input(x)
        many = isinstance(xt, tuple)
        parts = xt if many else (xt,)
        shapes = [tuple(t.shape) for t in parts]
        ones = [tuple(s) for s in (self.input_shape if many else (self.input_shape,))]
        if shapes == ones:
            batch = tuple(t.reshape(1, *one) for t, one in zip(parts, ones))
            return self._eval_c.forward(batch if many else batch[0])[0]
        try:
            return self._eval_c.forward(xt)
        except ValueError as e:
            if all(s[1:] == one for s, one in zip(shapes, ones)):
                raise
            why = f" ({e})" if all(len(s) == len(one) + 1 for s, one in zip(shapes, ones)) else ""  # read as a batch
            want, batched = (" and ".join(map(str, ones)), " and ".join(f"(N, {', '.join(map(str, one))})"
                                                                         for one in ones))
            got = " and ".join(map(str, shapes))
            raise ValueError(f"predict: x must be one sample of shape {want} or a batch of shape {batched}, got "
                             f"{got}{why}") from None

    def evaluate(self, x, y):
        """(loss, accuracy) of one batch in eval mode: the loss as training computes it, and the fraction of
        argmax predictions equal to the labels among those the loss does not ignore (None unless the model
        classifies: (classes,) outputs, class targets). NaN where the loss ignores every target."""
        self._check_evaluable()
        return tally_means(self._eval_c.evaluate(*self._batch(x, y)), self)

    def _check_evaluable(self):
        """_check_parameters, and a failure where the loss cannot read the eval-mode output (so that predict
        alone runs in eval mode)."""
        self._check_parameters()
        if self._eval_loss_error is not None:
            raise TracingError(f"evaluate: the loss cannot read the model's eval-mode output ({self._eval_loss_error})"
                               "; predict runs, and training; to evaluate, let the loss take both outputs (if not "
                               "isinstance(out, tuple): return F.cross_entropy(out, y)), or return the same "
                               "structure in both modes")

    def summary(self):
        """A table of the compiled nodes: output shapes, parameters, FLOPs, dtypes, fusions, and the memory the
        program holds (memory_plan()). The text prints as a table; in Jupyter it shows as an HTML table."""
        plan = self.memory_plan()
        mib = {k: v / 2**20 for k, v in plan.items() if k != "nodes"}
        recomputed = self._c.recomputed()
        table = _table(self.entries, self._c.node_dtypes(), recomputed)
        table.notes += [f"precision: {self.precision}"]
        if self._eval_c is not self._c:
            table.notes.append(f"eval mode: the forward reads self.training; predict and evaluate run its graph "
                               f"traced reading False, a program of its own ({len(self._eval_nodes)} nodes)")
        if self._lent:
            lent = sum(p.numel() for p in dict.fromkeys(self.model.parameters()) if id(p) in self._lent)
            table.notes.append(f"read from another program, which trains them (frozen here): {lent:,} parameters")
        if any(recomputed):
            again = sum(_flops(e) for e, r in zip(self.entries, recomputed) if r)
            table.notes.append(f"recompute: {sum(recomputed)} node outputs computed again in the backward, "
                               f"{again / 1e6:.2f} MFLOP per sample ({again / max(self.flops_per_sample(), 1):.0%} "
                               f"of the forward)")
        table.notes += [
            f"activation memory: training {mib['activations']:.1f} MiB for "
            f"{self.batch_size // self.accumulate_steps} samples, evaluation {mib['evaluation']:.1f} MiB",
            f"memory: parameters {mib['parameters']:.1f} MiB, gradients {mib['gradients']:.1f} MiB, optimizer "
            f"state {mib['optimizer_state']:.1f} MiB, "
            + (f"bfloat16 weight copy {mib['weights_copy']:.1f} MiB, " if plan["weights_copy"] else "")
            + f"total {mib['total']:.1f} MiB"]
        return _summary(table)

    def __repr__(self):
        return (f"Program({type(self.model).__name__}, {len(self.entries)} nodes, batch_size={self.batch_size}, "
                f"precision={self.precision!r})")

    def _repr_html_(self):
        return self.summary().table.html(caption=repr(self))

    def memory_plan(self):
        """The bytes the compiled program holds, as a dict: "activations" (the training arena, planned by
        liveness: the outputs a backward reads, saved data, gradients; allocated at the first training step),
        "evaluation" (its arena, and where the forward branches on self.training that of the eval-mode program
        predict and evaluate run),
        "parameters" and "gradients" (the flat float32 buffers), "optimizer_state" (the optimizer's buffers,
        counted before its first step allocates them), "weights_copy" (bf16-mixed's bfloat16 weights), "total",
        and "nodes": per node a dict of the bytes of its output, of what it saves for its backward and of its
        gradient in the training arena (the arena reuses memory, so these add up to more than it), and whether
        it is "recomputed": not kept from the forward for the backward, but computed again just before the
        backward needs it (compile's recompute=)."""
        train, evaluation, copy = self._c.memory()
        if self._eval_c is not self._c:
            evaluation, copy = evaluation + self._eval_c.memory()[1], copy + self._eval_c.memory()[2]
        state = self.optimizer._state_nbytes()
        plan = {"activations": train, "evaluation": evaluation, "parameters": self.flat_params.nbytes,
                "gradients": self.flat_grads.nbytes, "optimizer_state": state, "weights_copy": copy}
        plan["total"] = sum(plan.values())
        plan["nodes"] = [{"node": type(e.module).__name__.lstrip("_") if e.module is not None else "input",
                          "output": o, "saved": a, "gradient": g, "recomputed": r}
                         for e, (o, a, g), r in zip(self.entries, self._c.node_bytes(), self._c.recomputed())]
        return plan

    def profile(self):
        """[(node, forward seconds, backward seconds)] of each compiled node since compile: where steps spend
        their time (a frozen node that needs no gradient spends none in backward; a recomputed node's forward
        seconds include its recomputations)."""
        return [(type(e.module).__name__.lstrip("_") if e.module is not None else "input", f, b)
                for e, (f, b) in zip(self.entries, self._c.profile())]

    def flops_per_sample(self):
        """Floating-point operations (multiply-adds count two) of one forward pass of one sample, up to the model's
        output (the loss excluded)."""
        return sum(_flops(e) for e in self.entries[:self.output + 1])


_PRECISIONS = {"32-true": "float32", "bf16-mixed": "bfloat16", "16-mixed": "float16"}
_ALIASES = {"32": "32-true", 32: "32-true", "bf16": "bf16-mixed", "16": "16-mixed", 16: "16-mixed"}  # Lightning's


def _precision_name(precision):
    """precision= as its name in _PRECISIONS (Lightning's short forms taken too): ValueError for an unknown one."""
    name = _ALIASES.get(precision, precision) if isinstance(precision, (str, int)) and \
        not isinstance(precision, bool) else None
    if name not in _PRECISIONS:
        raise ValueError(f"compile: precision must be one of {', '.join(map(repr, _PRECISIONS))} (or Lightning's "
                         f"short forms {', '.join(map(repr, _ALIASES))}), got {precision!r}")
    return name


def _compute_dtype(precision, device):
    """(the dtype a precision's name computes in, the precision that runs) on device; where the CPU has no bfloat16
    instructions, or the GPU no bfloat16 tensor cores, bf16-mixed runs as 32-true, with a warning."""
    if precision == "16-mixed" and device.type != "cuda":
        raise ValueError("compile: precision='16-mixed' computes in float16, which fasttrain runs on CUDA only (the "
                         "CPU has no float16 arithmetic); use precision='bf16-mixed'")
    if precision == "bf16-mixed":
        from .. import cuda
        from ..backends import cpu_has_bf16
        if device.type == "cuda" and not cuda.is_bf16_supported(device):
            major, minor = cuda.get_device_capability(device)
            lacks = (f"this GPU ({cuda.get_device_name(device)}, compute capability {major}.{minor}) lacks the "
                     f"bfloat16 tensor cores of 8.0 (Ampere) and later,")
        elif device.type == "cpu" and not cpu_has_bf16():
            lacks = ("this CPU lacks the AVX512-BF16 instructions (avx512_bf16 in /proc/cpuinfo), or "
                     "ONEDNN_MAX_CPU_ISA excludes them,")
        else:
            lacks = None
        if lacks:
            import warnings
            warnings.warn(f"compile: {lacks} which bf16-mixed runs on: the program runs as precision='32-true' "
                          f"instead", RuntimeWarning, stacklevel=5)
            precision = "32-true"
    return _BY_NAME[_PRECISIONS[precision]], precision


def compile(model, optimizer, loss=None, *, batch_size, input_shape=None, memory_format=None,
            accumulate_steps=1, clip_grad_norm=None, nan_policy="raise", seed=None, target_shape=None,
            target_dtype=None, input_dtype=None, precision="32-true", distributed=False, recompute=None,
            bucket_cap_mb=25, grad_scaler=None):
    """Compiles `model` for training with `optimizer` on batches of `batch_size` samples.

    loss: an ft.nn loss (CrossEntropyLoss by default), a Module whose forward(output, target) returns the loss,
    or a function f(output, target); traced with the model, it is part of the compiled graph. A model returning
    several outputs passes them to the loss as a tuple. The targets' per-sample shape and dtype follow from the
    loss that reads them (class indices: () int64; regression: the output's shape, float32) unless given as
    target_shape and target_dtype. input_dtype=ft.int64 takes token ids (for a model starting with an Embedding).
    A forward of several inputs takes input_shape=(shape, shape, ...), one per-sample shape each, and input_dtype
    one dtype for all or a tuple of one each (float32, int64 token ids, bool masks); its batches are then
    (x1, ..., xk, y), and train_step, predict and evaluate take x as the tuple (x1, ..., xk).

    seed keys the dropout masks (by default drawn from fasttrain's generator at compile, so ft.manual_seed before
    compile fixes it; the program's stream then goes on by itself: re-seeding later does not change its masks, a
    checkpoint keeps where it stands).

    memory_format: how images lie between layers: "channels_last" (NHWC, oneDNN's fastest convolutions) or
    "contiguous" (NCHW); None (the default) is channels_last unless a LayerNorm or Linear reads 3-d samples along
    their own order (ConvNeXt's LayerNorm after x.permute(0, 2, 3, 1), a LayerNorm over (C, H, W)), which
    channels_last would move; ft.channels_last and ft.contiguous_format name them too, and model.to(memory_format=)
    sets the default (for a model that allows it). program.memory_format says which the program runs.

    precision: "32-true" (float32 throughout) or "bf16-mixed": convolutions and linear layers multiply bfloat16
    copies of the weights and activations with float32 accumulation, activations between layers are stored in
    bfloat16, and the loss, normalization statistics, gradients of the weights, the weights themselves and the
    optimizer state stay float32 (docs/precision.md). summary() shows each node's dtype. The model's parameters must
    be float32: a model converted with half() or bfloat16() is refused with a TypeError saying so (model.float()
    converts it back); precision="bf16-mixed" is the way to train in bfloat16.

    distributed=True (after ft.distributed.init()): data-parallel training, batch_size being each rank's. Rank 0's
    weights are broadcast, and every train_step (and ft.fit step) averages the gradients and the loss over the
    ranks before the update; program.backward does not communicate (docs/distributed.md). On the CPU the gradients
    are summed in buckets of bucket_cap_mb MiB (as DistributedDataParallel's), each started as soon as the backward
    has finished it, while the backward goes on.

    recompute trades compute for activation memory (gradient checkpointing, docs/memory.md): outputs that are not
    kept from the forward for the backward but computed again just before the backward needs them, in the same C
    step, with the same values (dropout masks and batch statistics are the same; running statistics are updated
    once). None keeps every output (the default); a list of the model's modules (or one module), as
    torch.utils.checkpoint wraps a block, recomputes what only each module's own nodes read, and an item that is
    a list of modules makes them one segment (as checkpoint_sequential runs a Sequential's layers); "auto" lets the
    planner cut the model into about sqrt(N) segments of its N nodes, where the fewest bytes cross (none when
    they would not shrink the arena); an int is a budget in bytes for the training activations
    (memory_plan()["activations"]), which the planner meets at the least recomputation it finds (a ValueError
    says the least it can reach when the budget is below it).
    memory_plan() and summary() show the smaller arena and which outputs are recomputed.

    grad_scaler=ft.amp.GradScaler(): dynamic loss scaling in every step, as torch.amp.GradScaler (skipped steps
    count in skipped_steps; fit's history gets the scale per epoch)."""
    if loss is None:
        loss = M.CrossEntropyLoss()
    if isinstance(optimizer, (list, tuple)):
        raise TypeError(f"compile takes one optimizer, got a {type(optimizer).__name__} of {len(optimizer)}: give one "
                        "optimizer the parameters of every module it trains (param groups keep their own learning "
                        "rates: ft.optim.Adam([{'params': enc.parameters()}, {'params': dec.parameters(), 'lr': "
                        "1e-4}])), or fill the gradients with program.backward(x, y) and call each optimizer's "
                        "step()")
    collecting = gc.isenabled()
    gc.disable()  # a traced forward makes objects by the hundred thousand: collected once compile is done
    try:
        return Program(model, optimizer, loss, batch_size, input_shape, memory_format, accumulate_steps,
                       clip_grad_norm, nan_policy, seed, target_shape, target_dtype, input_dtype, precision,
                       distributed, recompute, bucket_cap_mb, grad_scaler)
    finally:
        if collecting:
            gc.enable()
