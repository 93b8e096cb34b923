"""Symbolic values: how a model's forward becomes a graph the compiler turns into a C program.

``model.compile()`` calls the model's ``forward`` once on a Symbolic input (as torch.fx's symbolic tracing
does). A layer called on a Symbolic records a node; so do the operators and methods below, and the
``ft.nn.functional`` functions. Python control flow that depends on shapes or constructor arguments simply runs
(the recorded graph is the unrolled one); control flow on values cannot be recorded and raises TracingError
naming the line. The functional style builds the same graph by hand::

    x = ft.nn.Input((1, 28, 28))
    y = ft.nn.ReLU()(ft.nn.Conv2d(1, 16, 3, padding=1)(x))
    model = ft.nn.Model(x, ft.nn.Linear(16, 10)(ft.nn.Flatten()(ft.nn.AdaptiveAvgPool2d(1)(y))))

Shapes seen by ``forward`` are PyTorch's, with the batch first: ``x.shape[0]`` (and ``x.size(0)``) is ``N``, a
stand-in for the batch size that ``view``/``reshape``/``expand`` accept in the batch position. Node shapes
(``node.shape``) are per sample."""
import copy
import functools
import heapq
import inspect
import itertools
import math
import numbers
import operator
import os
import sys
import traceback

from .. import _C
from .._math import take_numpy_names
from .._tensor import _moved, _sizes

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class TracingError(TypeError):
    """The model's forward does something a compiled program cannot record."""


def _user_line():
    """'file:line: code' of the innermost frame outside fasttrain (where the user's forward asked for it)."""
    for frame in reversed(traceback.extract_stack()):
        if not os.path.abspath(frame.filename).startswith(_PACKAGE + os.sep):
            return f"{frame.filename}:{frame.lineno}: {(frame.line or '').strip()}"
    return "<unknown>"


class NoAttribute(TracingError, AttributeError):
    """A traced value lacks the attribute: hasattr() says False, a use names the line."""


def fail(what, instead="", error=TracingError):
    """Raises error (TracingError) for `what`, naming the user's line and what to write instead."""
    raise error(f"{what} cannot be compiled (at {_user_line()})" + (f"; {instead}" if instead else ""))


# The trainable parameters (by id) of the model whose forward (and loss) is being traced: an eager op on one
# gives a constant, through which the compiled program would never train it.
_trainable = {}
# The nodes recorded in each open ft.no_grad() block of a traced forward.
_held_back = []
# One entry per traced forward (or loss) under way.
_active = []
# The mode a traced forward's own code reads in Module.training, and whether it read one: a forward that branches on
# self.training (timm's drop path) is traced again reading False, for what predict and evaluate run.
_mode_read = [True, False]
# The modules (by id) whose mode the forward's own code read: the training step keeps the mode each had.
_mode_readers = {}
# The modules (or lists of them) a traced forward ran through torch.utils.checkpoint's checkpoint: the segments
# compile recomputes when not told otherwise.
_checkpointed = []
# The model's buffers and frozen parameters (by id) that an eager op read (or a copy was taken of) while a forward
# (or loss) was traced, each with its first such line: the result is a constant of the program, which a change of
# the buffer after compile would not reach.
_buffers_read = {}
_watched, _watched_read = {}, set()  # a traced model's plain tensor attributes (watch), and the ids of those read


def traced_mode(frame, module, mode):
    """Module.training of module, whose mode is `mode`, as the code of `frame` reads it while a forward is traced:
    fasttrain's layers read the mode (their nodes run in either), the model's own code of a module in training mode
    the mode being traced."""
    if os.path.abspath(frame.f_code.co_filename).startswith(_PACKAGE + os.sep):
        return mode
    _mode_readers[id(module)] = module
    if not mode:
        return False
    _mode_read[1] = True
    return _mode_read[0]


def read_modes(training):
    """Makes the forwards traced from now on read `training` in the modules' training mode (traced_mode)."""
    _mode_read[:] = [training, False]
    _mode_readers.clear()
    _buffers_read.clear()
    _checkpointed.clear()


def checkpointed(segment=None):
    """Notes segment (a module, or a list of modules) run through checkpoint while a forward is traced; returns the
    segments noted since read_modes."""
    if segment is not None and _active:
        _checkpointed.append(segment)
    return list(_checkpointed)


def watch(tensors):
    """Notes from now on which of tensors (a model's plain tensor attributes) a traced forward reads, by an eager
    op, as a number or as a constant: watched_read() gives their ids."""
    _watched.clear()
    _watched.update((id(t), t) for t in tensors if t.numel())
    _watched_read.clear()


def watched_read():
    return set(_watched_read)


def _note_watched(operands):
    from .._C import TensorBase
    for t in operands if _watched else ():
        if isinstance(t, TensorBase) and t.numel():
            _watched_read.update(i for i, w in _watched.items() if _within(t, w))


def _within(t, b):
    """Whether tensor t lies in b's memory."""
    return b.device == t.device and b.data_ptr() <= t.data_ptr() < b.data_ptr() + b.numel() * b.element_size()


def buffers_read():
    """{id: (buffer, line)} of the model's buffers that eager ops read since read_modes."""
    return dict(_buffers_read)


def mode_was_read():
    """Whether a forward's own code read a module's training mode since read_modes."""
    return _mode_read[1]


def mode_readers():
    """The modules whose training mode a forward's own code read since read_modes."""
    return list(_mode_readers.values())


class tracing:
    """The block in which model's forward (on inputs, its Input values) or loss is traced: eager ops refuse its
    trainable parameters."""

    def __init__(self, model, inputs=()):
        self.params = {id(p): p for p in model.parameters() if p.requires_grad}
        self.buffers = [b for b in (*model.buffers(), *model.parameters()) if b.numel() and id(b) not in self.params]
        self.inputs = inputs

    def __enter__(self):
        _trainable.update(self.params)
        _active.append(self)
        _C._set_export_check(_refuse_exported_parameter)

    def __exit__(self, *exc):
        _trainable.clear()
        _held_back.clear()
        _active.pop()
        if not _active:
            _C._set_export_check(None)


def _refuse_exported_parameter(t):
    """Fails for the buffer of a trainable parameter exported while a forward is traced (np.array(self.weight)
    reads it so, memoryview too)."""
    refuse_eager_parameters("a NumPy array (or memoryview)", (t,))


def refuse_draw(fn):
    """Fails for a random draw while a forward is traced: drawn once, at compile, it would be the same constant in
    every step."""
    if _active:
        fail(f"ft.{fn} in a traced forward", "it would be drawn once, at compile, and every step would reuse it: "
             "draw afresh in each step with ft.randn_like(x) or ft.rand_like(x) of a traced value x (of "
             "x[:, :1, :1, :1] for one draw per sample, a drop path's)")


def _viewed_parameter(t):
    """While a forward is traced: the trainable parameter whose memory t lies in (t itself, or any view of it),
    else None."""
    from .._C import TensorBase
    if not _trainable or not isinstance(t, TensorBase) or not t.numel():
        return None
    for p in _trainable.values():
        if _within(t, p):
            return p
    return None


def uses_trainable(tensors):
    """Whether a forward is being traced and one of tensors is a trainable parameter of its model, or a view of
    one."""
    return any(_viewed_parameter(t) is not None for t in tensors)


def read_by_op(op, operands, traceable):
    """The operands of an eager op as it reads them while a forward is traced: each trainable parameter (or view
    of one) of the model becomes a value of its own shape computed once per step (Common), through which it trains
    (self.logit_scale.exp(), ft.sigmoid(self.gate), w - w.mean((1, 2, 3), keepdim=True)), when the op is
    traceable on it; otherwise the op is refused, its result a constant. Operands without such a parameter come
    back as they are."""
    if not uses_trainable(operands) and not any(isinstance(t, Gathered) for t in operands):
        return operands
    if not traceable:
        refuse_eager_parameters(op, operands)
    return [t.common() if isinstance(t, Gathered) else common_value(t) if _viewed_parameter(t) is not None else t
            for t in operands]


def _note_buffers(operands):
    """Records the model's buffers among the operands of an eager op (or a value read as a Python number) while a
    forward is traced (_buffers_read)."""
    from .._C import TensorBase
    _note_watched(operands)
    for t in operands if _active else ():
        if isinstance(t, TensorBase) and t.numel():
            for b in _active[-1].buffers:
                if id(b) not in _buffers_read and _within(t, b):
                    _buffers_read[id(b)] = (b, _user_line())


def refuse_eager_parameters(op, operands):
    """Fails for an eager op on a trainable parameter while a forward is traced; notes the model's buffers it
    reads."""
    _note_buffers(operands)
    if not uses_trainable(operands):
        return
    penalty = "an L2 penalty on the weights (lambda/2 * sum of p.pow(2)) is the optimizer's weight_decay=lambda (SGD, " \
        "Adam)"
    fail(f"{op} of a trainable parameter outside the traced graph", "the result would be a constant through "
         "which the parameter never trains: use the parameter itself with traced values (x * self.gamma, "
         f"F.linear(x, self.weight)), or freeze it with requires_grad_(False) before compile; {penalty}")


def refuse_parameter_write(op, t):
    """Fails for an in-place write into a trainable parameter (or any view of it, or its .clone(), which reads as
    it) while a forward is traced."""
    if _viewed_parameter(t) is not None:
        fail(f"{op} on a trainable parameter (or a view or .clone() of it) in a traced forward", "it would change "
             "the weights once, at compile, and not in each step: compute out of place (w = self.w * 2, "
             "ft.cat((b[:k], ft.zeros_like(b[k:2 * k]), b[2 * k:])) for b[k:2 * k].zero_()), or change the weights "
             "outside forward under ft.no_grad()")


def no_grad_entered():
    """ft.no_grad() entered: in a traced forward, the nodes recorded until it exits are collected."""
    if _trainable:
        _held_back.append([])


def no_grad_exited(failed):
    """ft.no_grad() exited: PyTorch computes no gradient through its block, while a compiled step differentiates
    every traced op, so the block may hold only ops that train nothing (frozen modules)."""
    if not _trainable or not _held_back:
        return
    nodes = _held_back.pop()
    trains = {}
    for n in topological(nodes):
        m = n.module
        own = [] if m is None else [*m.parameters(), *(getattr(m, k, None) for k in ("weight", "bias", "tensor"))]
        trains[id(n)] = any(id(p) in _trainable for p in own) or any(trains[id(i)] for i in n.inputs)
    if not failed and any(trains[id(n)] for n in nodes):
        fail("ft.no_grad() around traced ops that train (parameters, or values made from them)",
             "a compiled step differentiates every traced op: freeze what the block holds back with "
             "requires_grad_(False) before compile (a frozen teacher needs no ft.no_grad())")


# PyTorch names fasttrain does not have, with the way a port goes on without them (see missing())
_VOLUMETRIC = ("3-d (volumetric) layers are not supported: fold the depth into the batch or the channels and use the "
               "2-d ones")
_WITHOUT = {
    **dict.fromkeys(("conv3d", "conv_transpose3d", "max_pool3d", "avg_pool3d", "adaptive_avg_pool3d",
                     "adaptive_max_pool3d", "dropout3d", "LazyConv3d", "LazyConvTranspose3d", "LazyBatchNorm3d",
                     "LazyInstanceNorm3d"), _VOLUMETRIC),
    **dict.fromkeys(("Unfold", "Fold", "unfold", "fold"), "im2col is not supported: a vision transformer's patches "
                    "are Conv2d(C, D, kernel_size=p, stride=p)"),
    **dict.fromkeys(("affine_grid", "grid_sample"), "spatial transformers (affine_grid, grid_sample) are not "
                    "supported"),
    **dict.fromkeys(("CTCLoss", "ctc_loss"), "the CTC loss is not supported"),
    **dict.fromkeys(("pack_padded_sequence", "pack_sequence", "pad_packed_sequence", "PackedSequence"),
                    "packed sequences are not supported: pad the batch to one length (pad_sequence) and keep the "
                    "padding out of the loss (ignore_index) or of attention (a key padding mask)"),
    **dict.fromkeys(("FloatTensor", "DoubleTensor", "HalfTensor", "BFloat16Tensor", "LongTensor", "IntTensor",
                     "ShortTensor", "ByteTensor", "CharTensor", "BoolTensor"), "PyTorch's legacy typed tensor "
                    "classes are not kept: ft.Tensor(2, 3) or ft.empty(2, 3, dtype=ft.float64) make memory, "
                    "ft.tensor(data, dtype=ft.int64) values, and x.dtype == ft.int64 tests a type"),
    "DataParallel": "use the model itself; data-parallel training over processes is compile(..., distributed=True) "
                    "(docs/distributed.md)",
    "autograd": "gradients of gradients (torch.autograd.grad: a WGAN-GP's gradient penalty) are not supported: a "
                "compiled step takes one backward of its loss (program.backward fills each parameter's .grad)",
    **dict.fromkeys(("polar", "view_as_complex", "view_as_real", "complex"), "complex tensors are storage-only: "
                    "rotary embeddings compile with real pairs, rotate_half's ft.cat((-x2, x1), dim=-1) or "
                    "interleaved pairs through ft.stack and flatten"),
}


def missing(module, name):
    """The AttributeError for a name the module (ft.nn, ft.nn.functional, ft.nn.utils.rnn) lacks: for one of
    PyTorch's, what to write instead."""
    if name.startswith("__"):
        return AttributeError(f"module {module!r} has no attribute {name!r}")
    why = _WITHOUT.get(name, "see docs/models.md for the layers and functions it has")
    return AttributeError(f"module {module!r} has no attribute {name!r}: {why}")


class BatchSize:
    """The batch size N while tracing: usable where a shape names the batch dimension, and nowhere else."""

    def __repr__(self):
        return "N"

    def _refuse(self, *args):
        fail("arithmetic on the batch size", "keep the batch dimension as it is (view(N, ...), reshape(N, -1)); "
             "a loss summed over the batch can be divided by it (loss.sum() / x.size(0))")

    def _number(self, *args):
        fail("the batch size as a number (int(N), range(N), N in a size but as a new tensor's first dimension)",
             "one program runs every batch size: ft.ones(x.size(0), k) is a constant for every sample, and "
             "ft.ones_like(x) or x.new_ones(k) make values of a sample's shape")

    def __mul__(self, k):
        if isinstance(k, numbers.Integral) and not isinstance(k, bool):
            return BatchTimes(int(k))
        self._refuse()

    __add__ = __radd__ = __sub__ = __rsub__ = __floordiv__ = __rfloordiv__ = _refuse
    __truediv__ = __rtruediv__ = _refuse
    __rmul__ = __mul__
    __index__ = __int__ = __bool__ = _number


class BatchTimes:
    """N * k while tracing: the first size of a view that merges the batch with k values of each sample, read as
    -1 (nanoGPT's F.cross_entropy(logits.view(B * T, C), targets.view(B * T)))."""

    def __init__(self, k):
        self.k = k

    def __repr__(self):
        return f"N*{self.k}"

    def __mul__(self, k):
        if isinstance(k, numbers.Integral) and not isinstance(k, bool):
            return BatchTimes(self.k * int(k))
        self._refuse()

    __rmul__ = __mul__

    def merged(self, x, shape):
        """shape, of which this is the first size, with -1 there, where it views x's values."""
        if x.node.shape is not None and self.k * math.prod(shape[1:]) != math.prod(x.node.shape):
            fail(f"a view of values of shape {(N, *x.node.shape)} as {shape}", "merge the batch with the sizes that "
                 "multiply to it: x.view(-1, x.size(-1))")
        return (-1, *shape[1:])

    _refuse, _number = BatchSize._refuse, BatchSize._number
    __add__ = __radd__ = __sub__ = __rsub__ = __floordiv__ = __rfloordiv__ = __truediv__ = __rtruediv__ = _refuse
    __index__ = __int__ = __bool__ = _number


def names_batch(size):
    """Whether a new tensor's size has the batch size first (only while a forward is traced)."""
    return bool(size) and isinstance(size[0], BatchSize)


N = BatchSize()


def in_place(target, value):
    """An in-place op on the traced value target: from now on every name bound to target reads value, as
    PyTorch's in-place ops change the one tensor that names share (a = h; F.relu_(h); a is relu(h) too). The
    values that share its memory in PyTorch, its views and what it is a view of, would read the change too:
    they become stale, and reading one fails (record), as a compiled program's values share no memory."""
    if isinstance(target, Common):
        fail("an in-place op on a value of the parameters alone", "write it out of place (y = F.relu(w))")
    where, seen, todo = _user_line(), {id(target)}, [target.base, *target.views]
    while todo:
        s = todo.pop()
        if s is not None and id(s) not in seen:
            seen.add(id(s))
            s.stale = where
            todo.extend([s.base, *s.views])
    target.node = value.node
    return target


def _dtype(name):
    from .._types import _BY_NAME
    return _BY_NAME[name]


def _view(method):
    """A method whose result is a view in PyTorch, sharing the value's memory (see in_place)."""
    @functools.wraps(method)
    def view(self, *args, **kwargs):
        out = method(self, *args, **kwargs)
        if isinstance(out, Symbolic) and out is not self:
            out.base = self
            self.views.append(out)
        return out
    return view


def _count(node):
    """(the batch reduction, the offset added to it, its floor) of a masked mean's denominator: a batch sum, plus a
    constant (mask.sum() + 1e-8), clamped from below (mask.sum().clamp(min=1))."""
    layers, floor, offset = _layers(), -math.inf, 0.0
    if isinstance(node.module, layers.CountFloor):
        node, floor = node.inputs[0], node.module.floor

    def constant(x):  # a number's share per sample (see Symbolic.__add__): the number's Value, or None
        x = x.inputs[0] if isinstance(x.module, layers.Sum) and x.module.reduction == "batchmean" else None
        while x is not None and isinstance(x.module, layers.Expand):
            x = x.inputs[0]
        return x.module.tensor if x is not None and isinstance(x.module, layers.Value) and \
            x.module.tensor.numel() == 1 else None

    if isinstance(node.module, layers.Add):
        values = [constant(x) for x in node.inputs]
        if sum(v is not None for v in values) == 1:
            offset = float(next(v for v in values if v is not None).item())
            node = next(x for x, v in zip(node.inputs, values) if v is None)
    return node, offset, floor


def _ratio(numerator, denominator):
    """A loss over the batch divided by another batch sum: the masked mean (loss * mask).sum() / mask.sum(), each
    sample's share divided by the whole batch's count (of every micro-batch) before the step runs. Two sums, or two
    means of as many values per sample; constant factors on either side move outside the quotient, a numerator
    of several sums divides each, and the count may be offset by a constant or clamped from below."""
    layers, a, b, scale = _layers(), numerator.node, denominator.node, 1.0
    while isinstance(a.module, layers.Scale):
        a, scale = a.inputs[0], scale * a.module.factor
    while isinstance(b.module, layers.Scale):
        b, scale = b.inputs[0], scale / b.module.factor
    if isinstance(a.module, layers.Add):
        quotient = functools.reduce(operator.add, (_ratio(Symbolic(x), Symbolic(b)) for x in a.inputs))
    else:
        b, offset, floor = _count(b)
        if not (isinstance(a.module, layers.Sum) and isinstance(b.module, layers.Sum) and
                (a.module.reduction, b.module.reduction) in (("sum", "sum"), ("mean", "mean")) and
                (a.module.reduction == "sum" or math.prod(a.inputs[0].shape) == math.prod(b.inputs[0].shape))):
            fail("a quotient of batch reductions other than sums (or means of as many values) over one count",
                 "divide sums by a sum, scaled by constants if need be: 0.5 * (loss * mask).sum() / mask.sum()")
        quotient = Symbolic(Node(layers.Sum("ratio", offset, floor), [a.inputs[0], b.inputs[0]], (), True))
    return quotient if scale == 1.0 else quotient * scale


def _per_sample_mean(loss):
    """loss / N for a loss summed over the batch: the same losses with reduction 'batchmean' (the sum divided by the
    batch size, which is known only when the step runs) in place of 'sum', combined as loss combines them."""
    if not loss.node.reduced:
        fail("a value divided by the batch size", "reduce a loss over the batch first (loss.sum() / N, or .mean())")
    modules = _layers()

    def divided(node):
        m = node.module
        if isinstance(m, (modules.Add, modules.Scale)):
            return Symbolic.record(m, [divided(x) for x in node.inputs], node.shape)
        if getattr(m, "reduction", None) != "sum":
            fail(f"a loss with reduction='{m.reduction}' divided by the batch size",
                 "divide a loss with reduction='sum' by N (that is reduction='mean' over the batch)")
        per_sample = copy.copy(m)
        per_sample.reduction = "batchmean"
        return Symbolic(Node(per_sample, node.inputs, node.shape, True))

    return divided(loss.node)


class Node:
    """A recorded op. `reduced`: a loss reduced over the batch, whose per-sample value is each sample's share of
    the batch's loss (their sum is the loss); such values combine only linearly. The targets' node has shape None
    until a loss (or compile's target_shape) fixes it."""
    __slots__ = ("module", "inputs", "shape", "reduced", "owner", "scope", "dtype", "seq", "common")

    def __init__(self, module, inputs, shape, reduced=False):
        self.module, self.inputs, self.reduced = module, list(inputs), reduced
        self.common = False  # a value of the parameters alone, computed once per step (see Common)
        self.seq = next(_recorded)  # the order of the calls, which state updates (batch norms' statistics) follow
        self.dtype = None  # the model input's: float32, or int64 token ids
        self.shape = None if shape is None else tuple(shape)
        self.owner = callers[0] if callers else module  # the outermost module whose call recorded it
        self.scope = tuple(callers)  # every module whose call recorded it (compile's recompute= reads them)
        for block in _held_back:
            block.append(self)


def refuse_assignment():
    """Fails: an assignment into a traced value, or of one into a tensor (a decoder's outputs[:, t] = y)."""
    fail("assigning into a traced value, or a traced value into a tensor (outputs[:, t] = y)", "a compiled "
         "program's values are written once: collect the steps in a list and ft.stack(steps, dim=1) them")


# What to write instead of a tensor method traced values lack, where there is something.
_TRACED_HINTS = dict.fromkeys(
    ("argmax", "argmin", "argsort"),
    "a compiled program computes no integer values of the samples: a decoder fed its own greedy choices "
    "trains on the targets instead (teacher forcing: the ground-truth token at every step), or on the "
    "probabilities (softmax) themselves; choose tokens eagerly at inference (model(x).argmax(-1))")
_TRACED_HINTS.update(dict.fromkeys(
    ("topk", "sort"), "a compiled program does not sort: the largest value along a dimension is x.amax(dim) (or "
    "x.max(dim).values), a smooth top-k a softmax; choose tokens eagerly at inference (model(x).topk(k))"))
_TRACED_HINTS.update(dict.fromkeys(
    ("floor", "floor_"), "a mask keeping each sample with probability p is (ft.rand_like(x[:, :1, :1, :1]) < p), or "
    "timm's drop_path: x.new_empty((x.size(0), 1, 1, 1)).bernoulli_(p)"))
_TRACED_HINTS.update(
    cumsum="a running sum along the last dimension is a product with a triangular matrix of ones: "
    "x @ ft.ones(T, T).triu() (T that dimension's size)",
    flip="reverse a dimension by a product with the reversed identity, x @ ft.eye(T).flip(0) (finite values), or "
    "flip the data before the step")

# What a loss reading integer labels writes for their class rows, where ignored labels (255) must not index.
_CLASS_ROWS = ("; labels as class rows are F.one_hot(y, C).float(), and with labels to ignore (255) "
               "ft.stack([(y == c).float() for c in range(C)], 1), rows of zeros where y is none of the classes")

_SEVERAL_TARGETS = ("for several targets give each one's per-sample shape, compile(..., target_shape=((), (4,)), "
                 "target_dtype=(ft.int64, ft.float32)), and batches (x, (labels, boxes)): the loss gets them as a "
                 "tuple")

# The modules whose forward is being traced, outermost first (nn.Model names its layers after them).
callers = []
_recorded = itertools.count()


class within:
    """The modules of `scope` counted as callers while a block runs (nn.Model records its layers again inside the
    blocks that first recorded them)."""

    def __init__(self, scope):
        self.scope = scope

    def __enter__(self):
        callers.extend(self.scope)

    def __exit__(self, *exc):
        del callers[len(callers) - len(self.scope):]


def _layers():
    from . import modules
    return modules


def _dim(d, ndim):
    """A per-sample dimension from a PyTorch (batch-first) one; the batch dimension itself is refused."""
    if not -ndim - 1 <= d <= ndim:
        raise IndexError(f"dimension {d} is out of range for {ndim + 1} dimensions")
    d = d % (ndim + 1)
    if d == 0:
        fail("an operation over the batch dimension", "compiled models treat samples independently; a batch "
             "norm written out (d2l's X.mean(dim=(0, 2, 3))) is F.batch_norm(X, running_mean, running_var, gamma, "
             "beta, training, momentum, eps) of the module's buffers, or nn.BatchNorm2d; a loss over the batch is "
             "one over each sample, reduced (loss.mean())")
    return d - 1


class MergedRows:
    """Scores (N, d..., C) viewed as (N * prod(d), C) rows, or labels (N, d...) as (N * prod(d),): what PyTorch's
    sequence losses are written with (F.cross_entropy(logits.view(-1, V), y.view(-1))). A class loss takes them
    as its (N, C, d...) form, the same loss, and gives its per-position losses (reduction='none') merged so too;
    merged values of one shape combine elementwise, with each other and with numbers (a mask's
    (y.view(-1) != pad).float(), losses * mask.view(-1)), and reduce by .sum() and .mean(); any other use
    fails."""

    def __init__(self, source, log_probs=False):
        self.source = source
        self.log_probs = log_probs  # F.log_softmax(rows, 1) of scores: what F.nll_loss reads

    @staticmethod
    def of(x, shape):
        """Whether x.view(*shape) merges the batch into rows: scores of more than one row per sample viewed
        as (-1, C), labels (the targets) viewed as (-1,), or values of more than one per sample (per-position
        losses) viewed as (-1,)."""
        if not shape or isinstance(shape[0], BatchSize) or shape[0] != -1:
            return False
        if isinstance(x.node.module, _layers().Target):
            return shape == (-1,)
        if shape == (-1,):
            return not x.node.reduced and math.prod(x.node.shape) > 1
        return len(x.node.shape) >= 2 and shape == (-1, x.node.shape[-1]) and math.prod(x.node.shape[:-1]) > 1

    def mean(self):
        """The mean of every merged value: the source's mean."""
        return self.source.mean()

    def sum(self):
        """The sum of every merged value: the source's sum."""
        return self.source.sum()

    def _elementwise(self, op, other, reflected=False):
        """op of the merged values and a number, merged values of the same per-sample shape, or a tensor the same
        for every row (a bias), merged too."""
        from .._C import TensorBase
        if isinstance(other, MergedRows):
            if other.source.node.shape != self.source.node.shape:
                fail("an operation of rows merged from values of different shapes",
                     "combine per-position values of one shape: losses * mask.view(-1)")
            other = other.source
        elif not (isinstance(other, (numbers.Real, Common)) and math.prod(getattr(other, "shape", ())[:-1]) == 1 or
                  isinstance(other, TensorBase) and math.prod(other.shape[:-1]) == 1):
            fail("an operation of rows merged from the batch with values that are not",
                 "view both: losses * mask.view(-1)")
        return MergedRows(op(other, self.source) if reflected else op(self.source, other))

    def __matmul__(self, other):
        """The rows times a matrix (GPT-2's Conv1D: x.view(-1, C) @ W), merged too."""
        return MergedRows(self.source @ other)

    def rowwise(self, fn, *args, **kwargs):
        """fn (a layer or function of each row alone: Linear, LayerNorm, an activation) of the rows, merged too."""
        return MergedRows(fn(self.source, *args, **kwargs))

    def __neg__(self):
        return MergedRows(-self.source)

    def abs(self):
        """|x| of the merged values, merged too."""
        return MergedRows(self.source.abs())

    __abs__ = abs

    def view(self, *shape):
        """As merged (view(-1) of merged values), or the values unmerged again (view(N, -1), view(N, T), view(-1, T,
        F) of the source's per-sample size)."""
        shape = _sizes(shape)
        if shape == (-1,) and len(self.source.node.shape) == 1:
            return self
        if shape and shape[0] == -1 and -1 not in shape[1:] and \
                math.prod(shape[1:]) == math.prod(self.source.node.shape):
            shape = (N, *shape[1:])
        return self.source.view(*shape) if shape and isinstance(shape[0], BatchSize) else self.__getattr__("view")

    reshape = view
    __hash__ = object.__hash__

    def float(self):
        """The merged values as floats (a mask's 0 and 1)."""
        return MergedRows(self.source.float())

    def classes_first(self):
        """The (N, C, d...) scores, or the (N, d...) labels, of a class loss's own form."""
        x = self.source
        if isinstance(x.node.module, _layers().Target):
            return x
        nd = len(x.node.shape)
        return x.permute(0, nd, *range(1, nd))

    def __getattr__(self, name):
        if name.startswith("__"):  # protocol probes see a plain object
            raise AttributeError(name)
        _refuse_merged()


def _refuse_merged():
    fail("a view merging the batch with other dimensions (x.view(-1, C), Swin's windows x.reshape(B * nW, ws * ws, "
         "C))", "only a class loss takes it (F.cross_entropy(logits.view(-1, V), y.view(-1))), and per-position "
         "losses' .mean() or .sum() (losses.view(-1).mean()); keep the batch first elsewhere: "
         "x.view(x.size(0), ...); windows stay a dimension of each sample, x.reshape(B, nW, ws * ws, C), with "
         "attention over the last two")


def _merged_op(op, reflected=False):
    def method(self, other):
        return self._elementwise(op, other, reflected)
    return method


for _name, _op in (("mul", operator.mul), ("add", operator.add), ("sub", operator.sub),
                   ("truediv", operator.truediv), ("pow", operator.pow), ("eq", operator.eq), ("ne", operator.ne)):
    setattr(MergedRows, f"__{_name}__", _merged_op(_op))
    if _name in ("mul", "add", "sub", "truediv"):
        setattr(MergedRows, f"__r{_name}__", _merged_op(_op, True))
del _name, _op


def _per_sample(shape, numel):
    """The per-sample shape of a batch-first view/reshape target (N or -1 first; one -1 inferred)."""
    shape = _sizes(shape)
    if not shape or not (shape[0] is N or shape[0] == -1):
        fail(f"reshape to {shape}", "keep the batch first: x.view(x.size(0), ...) or x.reshape(N, -1)")
    rest = list(shape[1:])
    if shape[0] == -1 and -1 in rest:
        fail(f"reshape to {shape}", "name the batch dimension with x.size(0)")
    if rest.count(-1) > 1:
        raise ValueError(f"reshape: only one dimension can be -1, got {shape}")
    if -1 in rest:
        known = math.prod(n for n in rest if n != -1)
        if known == 0 or numel % known:
            raise ValueError(f"reshape: {numel} values per sample do not fit {shape}")
        rest[rest.index(-1)] = numel // known
    if shape[0] == -1 and math.prod(rest) and numel % math.prod(rest) == 0 and math.prod(rest) != numel:
        fail(f"reshape to {shape}, which folds {numel // math.prod(rest)} parts of each sample into the batch "
             "(Swin's window partition, heads moved into the batch)", "keep them a dimension of their own, after "
             f"the batch: x.view(x.size(0), {numel // math.prod(rest)}, {', '.join(map(str, rest))})")
    if math.prod(rest) != numel:
        raise ValueError(f"reshape: {numel} values per sample do not fit {shape}")
    return tuple(rest)


def _comparison(op):
    def compare(self, other):
        """A bool mask of where the value compares so with a number (ids == pad: a padding mask, which attention
        layers take as key_padding_mask, and whose .float() weighs a masked mean), with another traced value or with
        a tensor the same for every sample (the two broadcast to each other, as PyTorch's operands: d2l's sequence
        mask ft.arange(T)[None, :] < valid_len[:, None]). Integers compare as the float32 values they are, exact
        below 2 ** 24: a constant of larger ones fails, and so do two traced integer values."""
        from .._C import TensorBase
        if isinstance(other, TensorBase) and other.ndim == 0:
            other = other.item()
        if isinstance(other, numbers.Real):
            return self._math(op, float(other))
        if isinstance(other, TensorBase) and not other.dtype.is_floating_point and other.dtype.name != "bool":
            if other.numel() and int(other.abs().max()) >= 2 ** 24:
                fail("a comparison of a traced value with integers of 2 ** 24 or more", "the program compares "
                     "integers as float32 values, exact below 2 ** 24")
            other = other.float()
        o = self._operand(other)
        if o is None:
            fail(f"a comparison of a traced value with {type(other).__name__}", "compare with a number, a tensor "
                 "or another traced value")
        if o._is_mask() != self._is_mask():
            fail("a comparison of a bool mask with values that are not one", "compare masks with masks, values "
                 "with values")
        if all(not v._is_mask() and not v._own_dtype().is_floating_point and
               not isinstance(v.node.module, _layers().Value) for v in (self, o)):
            fail("a comparison of two traced integer values", "integers compare as the float32 values they are, "
                 "exact below 2 ** 24 only, which a constant is checked to be: compare ids with a number or a "
                 "tensor (ids == pad, ft.arange(T)[None, :] < lengths[:, None])")
        a, b = (v if v._is_mask() else v._numbers() for v in (self, o))
        out = _layers().Math(op)(*_broadcast(a, b))
        out.node.dtype = _dtype("bool")
        return out
    return compare


class Symbolic:
    """A tensor that exists only in the model description: the output of a recorded node."""

    __slots__ = ("node", "base", "views", "stale")
    __array_priority__ = 1000  # NumPy arrays defer to Symbolic's operators

    def __init__(self, node):
        self.node = node
        self.base, self.views = None, []  # what it is a view of, and its views (see in_place)
        self.stale = None  # the line of an in-place op on a value sharing its memory, which it would read

    @staticmethod
    def record(module, inputs, shape, reduced=None):
        """A new node applying module to the traced inputs, with per-sample output shape; returns its output. The output
        is a loss reduced over the batch when reduced says so (by default: when every input is one). A reduced loss can
        only be scaled or added to another reduced loss; any other use fails."""
        for x in inputs:
            x.read()
        layers = _layers()
        inputs = list(inputs)
        weight = inputs.pop() if getattr(module, "_computed_weight", None) is not None else None
        common = any(x.node.common for x in inputs) and all(x.node.common or x._uniform() for x in inputs) and \
            not reduced and \
            not isinstance(module, (layers.Sum, layers.CountFloor)) and \
            getattr(module, "running_mean", None) is None  # (a batch norm's statistics move with the samples)
        if common:  # constants and parameters (and what was computed of them alone) read as its own values
            inputs = [x if x.node.common else _as_common(x) for x in inputs]
        else:  # values of the parameters alone among the samples' values: repeated over the batch
            rank = max((len(x.node.shape) for x in inputs if not x.node.common and x.node.shape is not None),
                       default=None)
            inputs = [_to_samples(x, rank) if x.node.common else x for x in inputs]
        if not isinstance(module, (layers.Math, layers.Attention, layers.Reshape, layers.Slice, layers.Permute,
                                   layers.MaskedFill)):
            inputs = [x._floats() for x in inputs]  # PyTorch's promotion of a bool mask in arithmetic
        if not isinstance(module, (layers.Add, layers.Mul, layers.Matmul, layers.Cat, layers.Expand, layers.Reshape,
                                   layers.Embedding)):
            inputs = [layers.Expand(x.node.shape)(x) if x._broadcast() else x for x in inputs]
        elif isinstance(module, layers.Reshape):  # of a value varying along one dimension only: no dense rows
            inputs = [layers.Expand(x.node.shape)(x) if isinstance(x.node.module, layers.Value) and
                      x.node.module.dim >= 0 else x for x in inputs]
        kept = inputs[0].node.dtype if isinstance(module, (layers.Reshape, layers.Slice, layers.Permute)) and \
            inputs and inputs[0].node.dtype in (_dtype("bool"), _dtype("int64")) else None  # ids and masks moved
        losses = sum(x.node.reduced for x in inputs)
        if reduced is None and losses and losses < len(inputs) and (isinstance(module, layers.Add) or isinstance(
                module, layers.Mul) and losses == 1) and all(x.node.reduced or x._uniform_scalar() for x in inputs):
            # a loss and a value the same for every sample (a learned loss weight): a product weighs each sample's
            # share, a sum adds the value once (its mean over the batch, in shares)
            inputs = [x if x.node.reduced or isinstance(module, layers.Mul) else x._as_loss() for x in inputs]
            reduced = True
        if reduced is None:
            flags = {x.node.reduced for x in inputs}
            if True in flags and isinstance(module, layers.Math) and module.op in ("eq", "ne", "lt", "le", "gt", "ge"):
                fail("a comparison of a value reduced over the batch (CenterNet's if num_pos == 0:)", "a compiled "
                     "program has one graph for every batch, so it cannot branch on one: guard the quotient instead, "
                     "a count clamped from below (mask.sum().clamp(min=1)) or plus a constant")
            if True in flags and (len(flags) > 1 or not isinstance(module, (layers.Add, layers.Scale))):
                fail(f"{type(module).__name__.lstrip('_')} of a loss already reduced over the batch",
                     "combine reduced losses linearly (a + 0.5 * b), or reduce last (reduction='none', then .mean()); "
                     "a mean over the positions a mask keeps compiles as (loss * mask).sum() / mask.sum(), its count "
                     "plus a constant or clamped from below (mask.sum().clamp(min=1)) if need be")
            reduced = flags == {True}
        read = [x.node for x in inputs] + ([weight.node] if weight is not None else [])
        out = Symbolic(Node(module, read, shape, reduced))
        out.node.dtype = kept
        out.node.common = common
        return out

    def read(self):
        """Fails for a value an in-place op has made stale (see in_place); every recorded op reads its inputs so."""
        if self.stale:
            fail(f"a value read after an in-place op on a value sharing its memory (at {self.stale})",
                 "PyTorch reads the changed memory through views (x.view, x[:, 1:], x.detach(), ...), which a "
                 "compiled program's values do not share: do the op out of place (h = F.relu(h)), or take the view "
                 "after it")

    # ---- shape ----
    @property
    def shape(self):
        """(N, *per-sample shape), N standing for the batch size as in PyTorch's batch-first shapes; () for a loss
        reduced over the batch."""
        if self.node.reduced:
            return ()
        if self.node.shape is None:
            fail("the targets' shape before a loss reads them", "give compile(..., target_shape=, target_dtype=)")
        return (N, *self.node.shape)

    def size(self, dim=None):
        """The shape, or the size of dimension dim (0 is the batch, N even for targets of no shape yet)."""
        return self.shape if dim is None else N if dim == 0 and not self.node.reduced else self.shape[dim]

    def dim(self):
        """The number of dimensions, the batch's included."""
        return len(self.node.shape) + 1

    ndim = property(dim)

    def numel(self):
        """Fails: the number of elements depends on the batch size; use the per-sample sizes x.shape[1:]."""
        fail("numel() of a traced value", "use the per-sample sizes x.shape[1:]")

    # ---- arithmetic ----
    def _operand(self, other):
        """other as a Symbolic: traced values as they are, tensors as constant (or parameter) nodes. Targets of
        a yet unknown shape meeting a value take its shape, as float32 (and must have it if fixed already)."""
        if isinstance(other, Common):
            return other.against(self)
        if isinstance(other, Symbolic):
            for a, b in ((self, other), (other, self)):  # targets of no shape yet take the partner's (a mask of
                # a shape given broadcasts against it, as a (1, H, W) mask over (C, H, W) values)
                if isinstance(a.node.module, _layers().Target) and b.node.shape is not None:
                    bind_target(a, a.node.shape or b.node.shape, "float32")
            return other
        from .._C import TensorBase
        if isinstance(other, TensorBase):
            return constant(other, self.node.shape)
        if isinstance(other, Gathered):
            return other.traced(self.node.shape)
        return None

    def _own_dtype(self):
        """The value's dtype; a constant's, its tensor's own."""
        m = self.node.module
        return m.tensor.dtype if isinstance(m, _layers().Value) else self.dtype

    def _numeric(self, other=None):
        """Fails for arithmetic on integer values (token ids, an integer constant of the batch size): the program's
        arithmetic is in floats (a bool mask computes as 0 and 1)."""
        for v in (self, other):
            if not isinstance(v, Symbolic):
                continue
            dtype = v._own_dtype()
            if dtype.name.startswith(("int", "uint")):
                fail(f"arithmetic on traced integer values ({dtype.name}: token ids, or an integer constant)",
                     "compute on the ids before they enter the model, or as a comparison, a mask (ids == pad); "
                     "make a constant of floats (ft.ones(x.size(0), k))" + _CLASS_ROWS)

    def __add__(self, other):
        self._numeric(other)
        if isinstance(other, (int, float)):
            if other == 0:
                return self._renamed()
            self._one_per_sample()
            c = constant_like(self, float(other))
            # a loss's constant is each sample's share of it: summed over the batch, divided by the batch size
            return self + (c.reduce("batchmean") if self.node.reduced else c)
        o = self._operand(other)
        if o is None:
            return NotImplemented
        return _layers().Add()(*_broadcast(self, o))

    __radd__ = __add__

    def __sub__(self, other):
        if isinstance(other, (int, float)):
            return self + (-other)
        o = self._operand(other)
        if o is None:
            return NotImplemented
        return self + (-o)

    def __rsub__(self, other):
        return (-self) + other

    def add(self, other, *, alpha=1):
        """Records self + alpha * other."""
        return self + (other if alpha == 1 else other * alpha)

    def sub(self, other, *, alpha=1):
        """Records self - alpha * other."""
        return self - (other if alpha == 1 else other * alpha)

    def mul(self, other):
        """Records self * other."""
        return self * other

    def div(self, other):
        """Records self / other."""
        return self / other

    # In place: every name bound to this value reads the result (see in_place).
    def __iadd__(self, other):
        return in_place(self, self + other)

    def __isub__(self, other):
        return in_place(self, self - other)

    def __imul__(self, other):
        return in_place(self, self * other)

    def __itruediv__(self, other):
        return in_place(self, self / other)

    def __neg__(self):
        return self * -1.0

    def __mul__(self, other):
        self._numeric(other)
        if isinstance(other, (int, float)):
            return self._renamed() if other == 1 else _layers().Scale(float(other))(self)
        o = self._operand(other)
        if o is None:
            return NotImplemented
        return _layers().Mul()(*_broadcast(self, o))

    __rmul__ = __mul__

    def __truediv__(self, other):
        if isinstance(other, (int, float)):
            return self * (1.0 / other)
        if other is N:
            return _per_sample_mean(self)
        if self.node.reduced and isinstance(other, Symbolic) and other.node.reduced:
            return _ratio(self, other)
        o = self._operand(other)
        if o is None:
            return NotImplemented
        return self * o.reciprocal()

    def __rtruediv__(self, other):
        if isinstance(other, (int, float)):
            return self.reciprocal() * other
        o = self._operand(other)
        return NotImplemented if o is None else o * self.reciprocal()

    def __matmul__(self, other):
        weight = _transposed_parameter(other)
        if weight is not None:  # x @ self.weight.T: a linear layer's product
            from .functional import linear
            return linear(self, weight)
        if isinstance(other, Common):  # its last two dimensions a matrix's, never the batch's
            other = other.against(self, 2)
        o = other if isinstance(other, Symbolic) else _matrix(other)
        if o is None:
            return NotImplemented
        if o.node is self.node:
            fail("x @ x of one traced value", "multiply by a copy's transpose, x @ x.transpose(1, 2)")
        if len(o.node.shape) == 1 and o.node.common:  # times a vector: (.., K) @ (K,) is the matrix times (K, 1)
            return (self @ o.unsqueeze(-1)).squeeze(-1)
        lead, dense = len(self.node.shape) - 2, o.node.common or not o._broadcast()  # (a constant takes any)
        if dense and len(o.node.shape) == 2 and lead > 0:  # (..., M, K) @ (K, P): the ... as rows
            *outer, m, k = self.node.shape
            return (self.reshape(N, -1, k) @ o).reshape(N, *outer, m, o.node.shape[1])
        if dense and lead == 0 and len(o.node.shape) > 2:  # (M, K) @ (..., K, P), transposed
            return (o.transpose(-2, -1) @ self.transpose(-2, -1)).transpose(-2, -1)
        if len(self.node.shape) == 1:  # a vector per sample: (K,) @ (K, P) is the row (1, K) times it
            return _layers().Matmul()(self.unsqueeze(1), o).squeeze(1)
        return _layers().Matmul()(self, o)

    def bmm(self, other):
        """Records self @ other: the samples' matrices multiplied, one product per sample (torch.bmm's batch)."""
        return self @ other

    matmul = bmm

    def __rmatmul__(self, other):
        o = _matrix(other)
        return NotImplemented if o is None else _layers().Matmul()(o, self)

    def __pow__(self, other):
        self._numeric()
        if not isinstance(other, (int, float)):
            fail("a traced value to a traced power", "raise to a constant exponent")
        if other == 1:
            return self._renamed()
        return self * self if other == 2 else _layers()._Elementwise("pow", other)(self)

    def pow(self, exponent):
        """Records x ** exponent, a constant exponent."""
        return self ** exponent

    def square(self):
        """Records x * x."""
        return self * self

    def sqrt(self):
        """Records sqrt(x)."""
        return self ** 0.5

    def rsqrt(self):
        """Records 1 / sqrt(x)."""
        return self ** -0.5

    def reciprocal(self):
        """Records 1 / x."""
        return self ** -1

    def exp(self):
        """Records exp(x)."""
        return _layers()._Elementwise("exp")(self)

    def erf(self):
        """Records the error function of x (BERT's GELU written out: x * 0.5 * (1 + erf(x / sqrt(2))))."""
        return _layers()._Elementwise("erf")(self)

    def sin(self):
        """Records sin x (a sinusoidal embedding of a time computed in forward, DDPM's; Fourier features)."""
        return _layers()._Elementwise("sin")(self)

    def cos(self):
        """Records cos x."""
        return _layers()._Elementwise("cos")(self)

    def log(self):
        """Records the natural logarithm of x."""
        return _layers()._Elementwise("log")(self)

    def abs(self):
        """Records |x|."""
        return _layers()._Elementwise("abs")(self)

    __abs__ = abs

    # ---- views and movement ----
    def _one_per_sample(self):
        """Targets of no shape yet, viewed or computed on before a loss reads them (y.unsqueeze(1), y[:, None],
        -y, 1 + y), are one value per sample: a label or a regression target. Their dtype is the loss's to fix."""
        if self.node.shape is None:
            bind_target(self, (), None)
            self.node.module.assumed = True

    def view(self, *shape):
        """The same as reshape: traced values have no memory layout."""
        return self.reshape(*shape)

    @_view
    def reshape(self, *shape):
        """Records the values in a new shape, the batch first (``x.reshape(N, -1)``, ``x.view(x.size(0), ...)``); one
        other size may be -1. A reshape of a reshape is recorded as one. Merging the batch with the positions of
        a sequence's scores (``logits.view(-1, V)``) or labels (``y.view(-1)``) gives rows only a class loss takes."""
        shape = _sizes(shape)
        merging = shape and isinstance(shape[0], BatchTimes)
        if merging:
            shape = shape[0].merged(self, shape)
        if MergedRows.of(self, shape):
            return MergedRows(self)
        if merging:
            _refuse_merged()
        if self.node.shape is None:
            if any(n not in (1, -1) for n in shape[1:]):
                fail(f"the targets viewed as {shape} before a loss reads them", "give compile(..., target_shape=)")
            self._one_per_sample()
        target = _per_sample(shape, math.prod(self.node.shape))
        if isinstance(self.node.module, _layers().Reshape):  # a reshape of a reshape is one reshape
            self.read()
            return Symbolic(self.node.inputs[0]).reshape(N, *target)
        return self if target == self.node.shape else _layers().Reshape(target)(self)

    def flatten(self, start_dim=0, end_dim=-1):
        """Records merging dimensions start_dim..end_dim; start_dim must be at least 1 (the batch stays apart), but
        for the rows a class loss takes (F.cross_entropy(logits.flatten(0, 1), y.flatten()), as view(-1, V))."""
        if self.node.shape is None:  # targets of no shape yet: one label per sample
            self._one_per_sample()
        shape = self.node.shape
        nd = len(shape)
        s, e = start_dim % (nd + 1), end_dim % (nd + 1)
        if s == 0:
            if e == 0:
                return self
            if MergedRows.of(self, (-1, *shape[e:])):
                return MergedRows(self)
            fail("flatten(0) (it merges the batch into the samples)", "use x.flatten(1); a class loss takes a "
                 "sequence's scores and labels merged (F.cross_entropy(logits.flatten(0, 1), y.flatten()))")
        return self.reshape(N, *shape[:s - 1], math.prod(shape[s - 1:e]), *shape[e:])

    def unsqueeze(self, dim):
        """Records a new dimension of size 1 at dim after the batch; before it (dim 0), the value as the one layer
        of an RNN's initial states (h0 = torch.tanh(self.init_h(features)).unsqueeze(0), image captioning's)."""
        self._one_per_sample()
        nd = len(self.node.shape)
        if not -(nd + 2) <= dim < nd + 2:
            fail(f"unsqueeze({dim}) of a value of shape {self.shape}", f"a dimension in [{-(nd + 2)}, {nd + 1}]")
        d = dim % (nd + 2)
        if d == 0:
            return Layered([self])
        shape = list(self.node.shape)
        shape.insert(d - 1, 1)
        return self.reshape(N, *shape)

    def squeeze(self, dim=None):
        """Records dropping the per-sample dimensions of size 1 (only dim, when given)."""
        shape = self.node.shape
        keep = [n for i, n in enumerate(shape) if not (n == 1 and (dim is None or i == _dim(dim, len(shape))))]
        return self.reshape(N, *keep)

    @_view
    def permute(self, *dims):
        """Records reordering the dimensions, which must keep the batch first (dims[0] == 0); two permutes in a row are
        recorded as one."""
        dims = _sizes(dims)
        nd = len(self.node.shape)
        if len(dims) == nd + 1 and dims[0] % (nd + 1) != 0 and dims[1] % (nd + 1) == 0:
            return Stacked(self, tuple(d % (nd + 1) for d in dims))
        if len(dims) != nd + 1 or dims[0] % (nd + 1) != 0:
            fail(f"permute{tuple(dims)}", "keep the batch dimension first")
        perm = tuple(_dim(d, nd) for d in dims[1:])
        if sorted(perm) != list(range(nd)):
            raise ValueError(f"permute: {dims} is not a permutation of {nd + 1} dimensions")
        if isinstance(self.node.module, _layers().Permute):  # two permutes are one (or none: heads split and joined)
            self.read()
            first = self.node.module.perm
            return Symbolic(self.node.inputs[0]).permute(0, *(first[p] + 1 for p in perm))
        return self if perm == tuple(range(nd)) else _layers().Permute(perm)(self)

    def transpose(self, dim0, dim1):
        """Records swapping dimensions dim0 and dim1 (neither the batch), as permute."""
        nd = len(self.node.shape)
        order = list(range(nd + 1))
        a, b = dim0 % (nd + 1), dim1 % (nd + 1)
        order[a], order[b] = order[b], order[a]
        return self.permute(order)

    swapaxes = swapdims = transpose

    def movedim(self, source, destination):
        """Records moving dimensions source to destination (the batch stays first), as permute."""
        return self.permute(_moved(len(self.node.shape) + 1, source, destination))

    moveaxis = movedim

    def contiguous(self, *args, **kwargs):
        """The value itself, but for a view of a permutation or slice (reshaped or not: x[:, 0]), of which PyTorch
        makes a copy: that under a new name (traced values have no memory layout)."""
        node = self.node
        while isinstance(node.module, _layers().Reshape):
            node = node.inputs[0]
        return self._renamed() if self.base is not None and isinstance(node.module, (
            _layers().Permute, _layers().Slice)) else self

    def _renamed(self):
        """The value under a new name, as PyTorch's x + 0, x * 1 and x.clone() are new tensors: an in-place op on
        one (see in_place) leaves the other as it was. Read now, as an op reads its input."""
        self.read()
        return Symbolic(self.node)

    def clamp(self, min=None, max=None):
        """Records the value limited to [min, max] (constants; either may be None), NaN kept, with PyTorch's
        gradient (1 strictly within the bounds, 0 at and beyond them)."""
        if min is None and max is None:
            raise ValueError("clamp: at least one of 'min' or 'max' must not be None")
        if any(isinstance(b, Symbolic) or not isinstance(b, (int, float, type(None))) for b in (min, max)):
            fail("clamp to bounds that are not numbers", "clamp to constant numbers")
        if self.node.reduced:  # a masked mean's count, mask.sum().clamp(min=1): see _ratio
            if max is not None:
                fail("a batch reduction clamped from above", "clamp a masked mean's count from below only: "
                     "mask.sum().clamp(min=1)")
            return Symbolic(Node(_layers().CountFloor(min, _user_line()), [self.node], (), True))
        out = self if min is None else _layers()._Elementwise("clamp_min", min)(self)
        return out if max is None else _layers()._Elementwise("clamp_max", max)(out)

    clip = clamp

    def clamp_min(self, min):
        """Records clamp(min=min)."""
        return self.clamp(min=min)

    def clamp_max(self, max):
        """Records clamp(max=max)."""
        return self.clamp(max=max)

    def _extremum(self, other, larger):
        """The elementwise larger (or smaller) of the value and another traced value or a tensor, broadcast, as
        torch.maximum: NaN where either is, and at a tie half the gradient to each, as PyTorch's (the tie's value
        a / 2 + b / 2 is a itself, infinities included)."""
        from .._C import TensorBase
        if isinstance(other, numbers.Real) or isinstance(other, TensorBase) and other.ndim == 0:
            fail(f"torch.{'maximum' if larger else 'minimum'} with a number", f"clamp({'min' if larger else 'max'}="
                 "number), which gives the value the gradient at a tie")
        o = self._operand(other)
        if o is None:
            raise TypeError(f"{'maximum' if larger else 'minimum'}: expected a tensor, got {type(other).__name__}")
        a, b = _broadcast(self, o)
        first, second = (a > b, a < b) if larger else (a < b, a > b)
        return where(first, a, where(second, b, a * 0.5 + b * 0.5))

    def lerp(self, end, weight):
        """Records self + weight * (end - self), as torch.lerp (an interpolation in forward)."""
        return self + weight * (end - self)

    def maximum(self, other):
        """Records torch.maximum of the value and another (see _extremum)."""
        return self._extremum(other, True)

    def minimum(self, other):
        """Records torch.minimum of the value and another (see _extremum)."""
        return self._extremum(other, False)

    def roll(self, shifts, dims=None):
        """Records the values shifted cyclically along dims (not the batch), as torch.roll: a concatenation of two
        slices per dimension (Swin's shifted windows)."""
        if dims is None:
            fail("roll without dims (it would roll the flattened batch)", "give the dimensions: x.roll(s, dims=2)")
        shifts, dims = (tuple(v) if isinstance(v, (tuple, list)) else (v,) for v in (shifts, dims))
        if len(shifts) != len(dims):
            raise ValueError(f"roll: shifts {shifts} and dims {dims} must have the same length")
        out = self
        for shift, dim in zip(shifts, dims):
            d = _dim(dim, len(self.node.shape))
            size = self.node.shape[d]
            s = operator.index(shift) % size
            if s:
                head = (slice(None),) * (d + 1)
                out = cat([out[head + (slice(size - s, size),)], out[head + (slice(0, size - s),)]], d + 1)
        return out._renamed() if out is self else out

    def logsumexp(self, dim, keepdim=False):
        """Records log(sum(exp(x))) over dimensions (not the batch) as m + log(sum(exp(x - m))), m the largest
        value (through which no gradient passes: the gradient is softmax(x)), held finite so that a row of -inf
        gives -inf and a +inf gives +inf, as PyTorch's: stable for large values, and for entries far below the others
        (a masked score of -1e9, which x - log_softmax(x) at a fixed index cancelled)."""
        dims = sorted({_dim(d, len(self.node.shape)) + 1 for d in (dim if isinstance(dim, (tuple, list)) else (dim,))})
        from .._math import largest_finite
        big = largest_finite(_dtype("float32"))
        m = self.amax(tuple(dims), keepdim=True).detach().clamp(-big, big)
        out = m + (self - m).exp().sum(tuple(dims), keepdim=True).log()
        for d in dims[::-1] if not keepdim else ():
            out = out.squeeze(d)
        return out

    @property
    def dtype(self):
        """The targets' dtype (int64 for class labels) and the input's (int64 for token ids); float32 for the values
        the model computes (compile's precision decides what the program computes in)."""
        from .._types import _BY_NAME
        m = self.node.module
        if isinstance(m, _layers().Target) and m.dtype is not None:
            return m.dtype
        # a view (of labels, valid_len[:, None]) has its base's dtype, unless the base is labels read as floats
        if self.node.dtype is None and self.base is not None and not getattr(self.base.node.module, "floated", None):
            return self.base.dtype
        return self.node.dtype or _BY_NAME["float32"]

    @property
    def device(self):
        """The device of the model's parameters."""
        from .._types import as_device
        return as_device(_device_of(self))

    def to(self, *args, **kwargs):
        """The value itself for a floating dtype or the model's device (the program chooses the dtypes of its values);
        an integer dtype only for the targets (y.long()), which the losses read as int64, and token ids; integers
        (an attention mask of 0 and 1, Hugging Face's mask.to(dtype)) converted to floats."""
        from .._types import as_dtype
        m, labels = self.node.module, _layers().Target
        if isinstance(m, _layers().Reshape) and isinstance(self.node.inputs[0].module, labels):
            m = self.node.inputs[0].module
        if isinstance(m, labels):
            for a in (*args, *kwargs.values()):
                try:
                    if as_dtype(a).is_floating_point:
                        m.floated = m.floated or _user_line()
                except (TypeError, ValueError):
                    continue
            return self
        for a in (*args, *kwargs.values()):
            try:
                dt = as_dtype(a)
            except (TypeError, ValueError):
                continue
            if self._is_mask() and dt.is_floating_point:
                return self._floats()
            if dt.name == "bool":  # attention_mask.bool(): where the value is not 0, as PyTorch's cast
                return self if self._is_mask() else self != 0
            if dt.is_floating_point != self.dtype.is_floating_point and self._of_targets():
                fail(f"class labels computed from float targets (y[:, 0].to({dt.name}))", _SEVERAL_TARGETS)
            if dt.is_floating_point and not self.dtype.is_floating_point:
                return self._numbers()
            if dt.is_floating_point != self.dtype.is_floating_point:
                fail(f"x.to({dt.name}) of a traced value of {self.dtype.name}", "a compiled program does not turn "
                     "floats into integers: compute integer ids or labels before the step and take them as an input "
                     "(compile(input_dtype=ft.int64)), or compare (x > 0.5) for a mask")
        return self

    def long(self):
        """The targets as they are (see to); any other value fails."""
        return self.to("int64")

    def int(self):
        """Integers as they are (see to), as int64."""
        return self.to("int32")

    def type(self, dtype):
        """self.to(dtype)."""
        return self.to(dtype)

    def is_floating_point(self):
        """Whether the value is of a floating dtype."""
        return self.dtype.is_floating_point

    @property
    def requires_grad(self):
        """Whether the value is computed from a trainable parameter, as PyTorch's flag (DenseNet asks it of its
        features before checkpointing)."""
        stack, seen = [self.node], set()
        while stack:
            n = stack.pop()
            if id(n) not in seen:
                seen.add(id(n))
                if any(getattr(getattr(n.module, k, None), "requires_grad", False) is True
                       for k in ("weight", "bias", "tensor")):
                    return True
                stack.extend(n.inputs)
        return False

    def bool(self):
        """A mask of where the value is not 0 (see to), as PyTorch's cast to bool."""
        return self.to("bool")

    def type_as(self, other):
        """self.to(other.dtype): integers as floats for a float other (see to)."""
        return self.to(other.dtype)

    def float(self):
        """The value itself (see to), a bool mask as 0 and 1: the compiled program chooses the dtypes of its values
        (compile's precision)."""
        return self.to("float32")

    def half(self):
        """The value itself, as float() (see to): a loss's F.cross_entropy(o, y).half() too."""
        return self.to("float16")

    def bfloat16(self):
        """The value itself, as float() (see to)."""
        return self.to("bfloat16")

    def double(self):
        """The value itself, as float() (see to)."""
        return self.to("float64")

    @_view
    def expand(self, *sizes):
        """Records the value repeated along its per-sample dimensions of size 1 to sizes (-1 keeps a size; the
        batch's is N or -1), as torch's expand."""
        sizes = _sizes(sizes)
        if len(sizes) != self.ndim or not (sizes[0] is N or sizes[0] == -1):
            fail(f"expand{sizes} of a traced value", "keep the batch first (N or -1) and the number of dimensions")
        shape = tuple(have if s == -1 else s for s, have in zip(sizes[1:], self.node.shape))
        if shape == self.node.shape:
            return self
        # integers (an attention mask of 0 and 1 in sentence-transformers' pooling) repeat as the floats they become
        return _layers().Expand(shape)(self if self._is_mask() else self._numbers())  # sizes other than 1 are refused by the layer's shape check

    def repeat_interleave(self, repeats, dim=None):
        """Records each value repeated `repeats` times in a row along dim (not the batch), as torch's
        repeat_interleave by a number (Llama's repeat_kv of grouped-query attention): a new dimension expanded
        and merged."""
        if isinstance(repeats, bool) or not isinstance(repeats, int) or dim is None:
            fail("repeat_interleave of a traced value by counts or without dim", "repeat by a number along a "
                 "dimension: x.repeat_interleave(2, dim=1)")
        shape = self.node.shape
        d = _dim(dim, len(shape))
        wide = self.unsqueeze(d + 2).expand(N, *shape[:d + 1], repeats, *shape[d + 1:])
        return wide.reshape(N, *shape[:d], shape[d] * repeats, *shape[d + 1:])

    def repeat(self, *sizes):
        """Records the value tiled sizes[d] times along each dimension (the batch's 1), as torch's repeat."""
        sizes = _sizes(sizes)
        if len(sizes) != self.ndim or sizes[0] != 1:
            fail(f"repeat{sizes} of a traced value", "repeat each dimension but the batch's, which stays 1")
        out = self
        for d, k in enumerate(sizes[1:], 1):
            if k != 1:
                out = cat([out] * k, d)
        return out._renamed() if out is self else out

    @property
    def mT(self):
        """Records the transpose of each sample's last two dimensions."""
        return self.transpose(-2, -1)

    def expand_as(self, other):
        """Records expand(other.shape)."""
        return self.expand(other.shape)

    def __getitem__(self, index):
        labels = isinstance(self.node.module, _layers().Target)
        if labels and not isinstance(index, (tuple, slice)) and index is not None:
            fail(f"the targets taken apart as y[{index!r}] (a tuple or dict of targets)", _SEVERAL_TARGETS)
        self._one_per_sample()
        index = index if isinstance(index, tuple) else (index,)
        if len(index) == 2 and isinstance(index[0], BatchPositions) and isinstance(index[1], Symbolic) and \
                len(self.node.shape) == 1:  # (N, C) scores at (N,) labels
            return self.gather(1, index[1].unsqueeze(1)).squeeze(1)
        for i in index:
            if isinstance(i, BatchPositions):
                i._refuse()
        if any(isinstance(i, Symbolic) for i in index):
            fail("indexing with a traced value (x[mask] selects a number of elements that varies from batch to "
                 "batch)", "weigh by the mask instead: a masked mean is (x * mask).sum() / mask.sum(), a fill "
                 "x.masked_fill(~mask, v)")
        if index and index[0] is Ellipsis:  # x[..., k]: the ellipsis spans the batch
            index = (slice(None), *index)
        if not index or index[0] != slice(None):
            fail(f"indexing [{index}]", "keep the batch dimension whole: x[:, ...]")
        index = tuple(_index_item(i) for i in index)
        if not any(isinstance(i, _Positions) for i in index):
            return self._sliced(index)
        if any(isinstance(i, int) for i in index):  # PyTorch takes the integers first, as a view (x[:, 0, :, ids])
            ints = self._sliced(tuple(slice(None) if isinstance(i, _Positions) else i for i in index))
            return ints._gather(tuple(i if isinstance(i, (_Positions, type(Ellipsis))) else slice(None)
                                      for i in index if not isinstance(i, int)))
        return self._gather(index)

    @_view
    def _sliced(self, index):
        """x[index] of integers, slices, None and ... (the batch's whole slice first): a view."""
        out, dim, shape, kept = self, 0, self.node.shape, []  # kept: the result's per-sample sizes
        for pos, item in enumerate(index[1:], 1):
            if item is Ellipsis:
                spanned = len(shape) - dim - sum(x is not None for x in index[pos + 1:])
                kept.extend(shape[dim:dim + spanned])
                dim += spanned
                continue
            if item is None:  # a new dimension of size 1
                kept.append(1)
                continue
            if dim >= len(shape):
                raise IndexError(f"too many indices for a value of shape {self.shape}")
            size = shape[dim]
            if isinstance(item, int):
                k = item % size if -size <= item < size else None
                if k is None:
                    raise IndexError(f"index {item} is out of range for size {size}")
                out = _layers().Slice(dim, k, 1, 1)(out)
            elif isinstance(item, slice):
                start, stop, step = item.indices(size)
                if step < 1:
                    fail("a slice with a negative step")
                length = len(range(start, stop, step))
                if length == 0:
                    raise IndexError(f"the slice {item} is empty")
                if length != size:
                    out = _layers().Slice(dim, start, step, length)(out)
                kept.append(length)
            else:
                fail(f"indexing with {type(item).__name__}", "use integers, slices, None and ...")
            dim += 1
        kept.extend(shape[dim:])
        return out if tuple(kept) == out.node.shape else out.reshape(N, *kept)

    def _gather(self, index):
        """x[:, ids] or x[:, rows, cols] of constant positions (lists, NumPy arrays, integer tensors; DLRM's
        pairs of features, Z[:, li, lj]), as PyTorch's advanced indexing: the indexed dimensions merged, their
        positions broadcast to one shape that takes their place, then the rest of the index. The positions are
        taken in runs of evenly spaced increasing ones, a slice node each, joined."""
        import numpy as np
        self.read()
        shape, dims, dim = self.node.shape, {}, 0  # dims: the dimension of each index item that takes one
        for pos, item in enumerate(index[1:], 1):
            if item is Ellipsis:
                dim = len(shape) - sum(i is not None and i is not Ellipsis for i in index[pos + 1:])
            elif item is not None:
                dims[pos], dim = dim, dim + 1
        arrays = [pos for pos in dims if isinstance(index[pos], _Positions)]
        if arrays != list(range(arrays[0], arrays[-1] + 1)):
            fail("index arrays apart from each other (PyTorch moves their dimensions before the batch)", "index "
                 "adjacent dimensions together, or one dimension at a time")
        first, count = dims[arrays[0]], len(arrays)
        if first + count > len(shape):
            raise IndexError(f"too many indices for a value of shape {self.shape}")
        sizes = shape[first:first + count]
        found = np.broadcast_arrays(*(index[pos].ids for pos in arrays))
        for ids, size in zip(found, sizes):
            bad = ids[(ids < -size) | (ids >= size)]
            if bad.size:
                raise IndexError(f"index {bad.flat[0]} is out of range for size {size}")
        flat = np.ravel_multi_index(tuple(ids % size for ids, size in zip(found, sizes)), sizes)
        merged = self if count == 1 else self.reshape(N, *shape[:first], math.prod(sizes), *shape[first + count:])
        taken = merged._take(first, [int(p) for p in flat.flat])
        out = taken.reshape(N, *shape[:first], *flat.shape, *shape[first + count:])
        rest = [i for pos, i in enumerate(index) if pos not in arrays[1:]]
        rest[arrays[0]:arrays[0] + 1] = [slice(None)] * flat.ndim
        return out[tuple(rest)]._renamed()  # a copy, as PyTorch's advanced indexing makes: no view of self

    def _take(self, dim, positions):
        """The values at positions along per-sample dimension dim, in runs of evenly spaced increasing ones."""
        runs = []  # [start, step, length]
        for p in positions:
            if runs and runs[-1][2] == 1 and p > runs[-1][0]:
                runs[-1][1:] = p - runs[-1][0], 2
            elif runs and runs[-1][2] > 1 and p == runs[-1][0] + runs[-1][1] * runs[-1][2]:
                runs[-1][2] += 1
            else:
                runs.append([p, 1, 1])
        if len(runs) > _MAX_RUNS:
            fail(f"a gather of {len(positions)} positions in {len(runs)} runs (more than {_MAX_RUNS})", "gather "
                 "fewer scattered positions, or reorder the data before the step")
        size = self.node.shape[dim]
        parts = [self if run == [0, 1, size] else _layers().Slice(dim, *run)(self) for run in runs]
        return parts[0] if len(parts) == 1 else cat(parts, dim + 1)

    def index_select(self, dim, index):
        """Records the values at the constant positions index (1-d) along dim (not the batch)."""
        d = _dim(dim, len(self.node.shape))
        return self[(slice(None),) * (d + 1) + (index if isinstance(index, Symbolic) else _index_item(index, True),)]

    def select(self, dim, index):
        """Records the values at index along dim (not the batch), that dimension dropped, as torch.select."""
        d = _dim(dim, len(self.node.shape))
        return self[(slice(None),) * (d + 1) + (index,)]

    def unbind(self, dim=0):
        """The values at each index along dim (not the batch), as torch.unbind."""
        d = _dim(dim, len(self.node.shape))
        return tuple(self.select(d + 1, i) for i in range(self.node.shape[d]))

    @_view
    def unfold(self, dimension, size, step):
        """Records the windows of size elements along dimension (not the batch), one each step, as a new last
        dimension, as Tensor.unfold (PatchTST's patches, a signal's frames): slices of the value joined."""
        shape = self.node.shape
        d = _dim(dimension, len(shape))
        if step <= 0 or not 0 < size <= shape[d]:
            raise RuntimeError(f"unfold: windows of {size} every {step} of a dimension of size {shape[d]}")
        at = (slice(None),) * (d + 1)
        out = cat([self[at + (slice(k, k + size),)].unsqueeze(d + 1) for k in range(0, shape[d] - size + 1, step)],
                  d + 1)
        last = len(shape) + 1
        return out if d + 2 == last else out.permute(0, *(k for k in range(1, last + 1) if k != d + 2), d + 2)

    def chunk(self, chunks, dim=-1):
        """Records chunks slices along dim, each ceil(size / chunks) long (the last shorter), as torch.chunk; dim is not
        the batch."""
        d = _dim(dim, len(self.node.shape))
        size = self.node.shape[d]
        step = -(-size // chunks)
        return tuple(self[(slice(None),) * (d + 1) + (slice(k, min(k + step, size)),)] for k in range(0, size, step))

    def split(self, split_size, dim=-1):
        """Records slices along dim: of split_size each (the last shorter), or of the sizes in a list, as torch.split;
        dim is not the batch."""
        d = _dim(dim, len(self.node.shape))
        size = self.node.shape[d]
        sizes = [split_size] * (size // split_size) + ([size % split_size] if size % split_size else []) \
            if isinstance(split_size, int) else list(split_size)
        if sum(sizes) != size:
            raise ValueError(f"split: sizes {sizes} do not add up to {size}")
        out, at = [], 0
        for n in sizes:
            out.append(self[(slice(None),) * (d + 1) + (slice(at, at + n),)])
            at += n
        return tuple(out)

    def reduce(self, reduction):
        """The batch's loss from per-sample (or per-element) losses: 'mean' over every value, 'sum', or
        'batchmean' (the sum divided by the batch size); 'none' leaves them. Of a value the same for every sample
        (computed from parameters alone) the whole sum or mean is its own, a value of every sample again, which a
        loss adds once (see _as_loss)."""
        if reduction == "none":
            return self
        if self.node.reduced:
            fail("reducing a loss already reduced over the batch")
        if reduction in ("sum", "mean") and self._uniform():
            dims = list(range(1, self.ndim))
            return self if not dims else self.sum(dims) if reduction == "sum" else self.mean(dims)
        return Symbolic.record(_layers().Sum(reduction), [self], (), reduced=True)

    def _as_loss(self):
        """A value the same for every sample (a penalty of the parameters) as a loss reduced over the batch: each
        sample's share is value / N, so that the batch's loss holds it once."""
        return Symbolic.record(_layers().Sum("mean"), [self], (), reduced=True)

    def _uniform(self):
        """Whether the value is the same for every sample: computed from parameters and constants alone."""
        stack, seen = [self.node], set()
        while stack:
            n = stack.pop()
            if id(n) not in seen:
                seen.add(id(n))
                if n.module is None or isinstance(n.module, (_layers().Target, _layers().Noise)):
                    return False
                stack.extend(n.inputs)
        return True

    def _uniform_scalar(self):
        return self.node.shape == () and not self.node.reduced and self._uniform()

    def _dims(self, dim):
        """The per-sample dimensions dim names (the batch refused), sorted."""
        nd = len(self.node.shape)
        dims = sorted({_dim(d, nd) for d in (dim if isinstance(dim, (tuple, list)) else [dim])})
        if not dims:
            fail("a reduction over every dimension (dim=()), the batch's too", "give the per-sample dimensions")
        return dims

    def _sum_dims(self, dims, keepdim, scale):
        """Records scale * the sum over the per-sample dimensions dims (of integers, such as a mask's count, in
        floats)."""
        out = _layers().SumDims(dims, scale)(self if self._is_mask() else self._numbers())
        return out if keepdim else out.reshape(N, *(n for d, n in enumerate(self.node.shape) if d not in dims))

    def _over_batch(self, dim, keepdim):
        """Whether dim names the batch alone of one value per sample (a VAE's kld.mean(dim=0)): the reduction
        over the batch, as .sum() or .mean()."""
        return not self.node.shape and not keepdim and dim in (0, -1, (0,), (-1,), [0], [-1])

    def sum(self, dim=None, keepdim=False):
        """Records the sum of every value (a loss reduced over the batch), or the sums over the given dimensions
        (not the batch)."""
        if dim is None or self._over_batch(dim, keepdim):
            return self.reduce("sum")
        return self._sum_dims(self._dims(dim), keepdim, 1.0)

    def mean(self, dim=None, keepdim=False):
        """Records the mean of every value (a loss reduced over the batch), or the means over the given dimensions
        (not the batch); the spatial mean (2, 3) of images and the mean over the steps of sequences run as adaptive
        average pooling."""
        if dim is None or self._over_batch(dim, keepdim):
            return self.reduce("mean")
        nd, dims = len(self.node.shape), self._dims(dim)
        if nd == 3 and dims == [1, 2]:  # global average pooling of (C, H, W) images
            out = _layers().AdaptiveAvgPool2d(1)(self)
            return out if keepdim else out.reshape(N, self.node.shape[0])
        if nd == 2 and dims == [1]:  # over the steps of (C, L) sequences
            out = _layers().AdaptiveAvgPool1d(1)(self)
            return out if keepdim else out.reshape(N, self.node.shape[0])
        return self._sum_dims(dims, keepdim, 1.0 / math.prod(self.node.shape[d] for d in dims))

    def var(self, dim=None, unbiased=True, keepdim=False, *, correction=None):
        """Records the variance over dim (not the batch): the squared deviations' sum divided by n - correction
        (correction 1 by default, 0 with unbiased=False), as torch.var (inf where n <= correction)."""
        if dim is None:
            fail("var() over the batch", "give the per-sample dimensions, x.var(dim)")
        dims = self._dims(dim)
        n = math.prod(self.node.shape[d] for d in dims) - ((1 if unbiased else 0) if correction is None else correction)
        centered = self - self.mean([d + 1 for d in dims], keepdim=True)
        return (centered * centered)._sum_dims(dims, keepdim, 1.0 / n if n > 0 else math.inf)

    def std(self, dim=None, unbiased=True, keepdim=False, *, correction=None):
        """Records the standard deviation over dim (not the batch), as torch.std: no gradient where all the values
        are equal (a zero deviation), as PyTorch's."""
        return _layers()._Elementwise("std_sqrt")(self.var(dim, unbiased, keepdim, correction=correction))

    def amax(self, dim, keepdim=False):
        """Records the largest value over dim (not the batch), as torch.amax: adaptive max pooling of the values
        moved last. NaN is the largest. Where several values are the largest, the gradient goes to the first, as
        torch.max(dim)'s does (torch.amax and amin split it evenly among them instead, so ties train otherwise)."""
        dims = self._dims(dim)
        shape = self.node.shape
        kept = [d for d in range(len(shape)) if d not in dims]
        x = self if kept + dims == list(range(len(shape))) else self.permute(0, *(d + 1 for d in kept + dims))
        rows = x.reshape(N, math.prod(shape[d] for d in kept), math.prod(shape[d] for d in dims))
        out = _layers().AdaptiveMaxPool1d(1)(rows)
        return out.reshape(N, *(1 if d in dims else n for d, n in enumerate(shape)) if keepdim else
                           (shape[d] for d in kept))

    def amin(self, dim, keepdim=False):
        """Records the smallest value over dim (not the batch), as torch.amin: -amax(-x)."""
        return -(-self).amax(dim, keepdim)

    def max(self, dim=None, keepdim=False):
        """Records (values, indices) of the largest value along dim (not the batch), as torch.max(x, dim): the
        values are amax's; the indices are no value a compiled program computes, and any use of them fails.
        torch.max(x, other) of a tensor or a traced value is maximum's (d2l's relu, torch.max(X, zeros_like(X)))."""
        from .._C import TensorBase
        if isinstance(dim, (Symbolic, TensorBase)):
            return self.maximum(dim)
        if dim is None or not isinstance(dim, (int, tuple, list)):
            fail("max() of a traced value over the batch, or against another value",
                 "give a per-sample dimension (x.max(dim=1).values), or write ft.clamp(x, min=...)")
        from .._math import ValuesIndices
        return ValuesIndices(self.amax(dim, keepdim), NoIndices("max"))

    def min(self, dim=None, keepdim=False):
        """Records (values, indices) of the smallest value along dim (not the batch), as torch.min(x, dim);
        torch.min(x, other) is minimum's."""
        from .._C import TensorBase
        if isinstance(dim, (Symbolic, TensorBase)):
            return self.minimum(dim)
        if dim is None or not isinstance(dim, (int, tuple, list)):
            fail("min() of a traced value over the batch, or against another value",
                 "give a per-sample dimension (x.min(dim=1).values), or write ft.clamp(x, max=...)")
        from .._math import ValuesIndices
        return ValuesIndices(self.amin(dim, keepdim), NoIndices("min"))

    def norm(self, p="fro", dim=None, keepdim=False, dtype=None):
        """Records the vector norm over dim (not the batch): p = 2 ('fro'), 1 or inf, as torch.norm and
        torch.linalg.vector_norm. The 2-norm is sqrt(max(sum x^2, 2^-126)): a zero vector's norm reads 1e-19, with
        the gradient 0 that PyTorch gives it."""
        if dim is None:
            fail("norm() of a traced value over the batch", "give the per-sample dimensions, x.norm(dim=-1)")
        if p in ("fro", 2):
            return self.square().sum(dim, keepdim).clamp_min(2.0 ** -126).sqrt()
        if p == 1:
            return self.abs().sum(dim, keepdim)
        if p == math.inf:
            return self.abs().amax(dim, keepdim)
        fail(f"norm(p={p!r}) of a traced value", "use p = 2, 1 or inf")

    def gather(self, dim, index):
        """Records the values of scores at the targets' classes along dim: index is the labels with a dimension of
        size 1 there (logp.gather(1, y.unsqueeze(1)) of (N, C) scores, logp.gather(2, y.unsqueeze(2)) of a
        sequence's (N, T, C), as hand-written label smoothing and focal losses pick the true class's
        log-probability). Of (N, C) scores it is -nll_loss(reduction='none') of those classes; of more dimensions
        the scores times the labels' one-hot rows, summed (a score of +-inf among the others then gives NaN). Each
        label must lie in [0, C), which the step checks."""
        shape = self.node.shape
        d = _dim(dim, len(shape))
        labels = _labels_of(index, d)
        bind_target(labels, shape[:d] + shape[d + 1:], "int64")
        if len(shape) == 1:
            return (-_layers().NLLLoss(ignore_index=_NO_LABEL, reduction="none")(self, labels)).unsqueeze(1)
        last = len(shape) - 1
        scores = self if d == last else self.permute(0, *(k + 1 for k in range(len(shape)) if k != d), d + 1)
        picked = (scores * _layers().OneHot(shape[d])(labels)).sum(-1)
        return picked.unsqueeze(d + 1)

    # ---- activations as methods ----
    def relu(self):
        """Records F.relu of the value."""
        return _layers().ReLU()(self)

    def sigmoid(self):
        """Records F.sigmoid of the value."""
        return _layers().Sigmoid()(self)

    def tanh(self):
        """Records F.tanh of the value."""
        return _layers().Tanh()(self)

    def softmax(self, dim):
        """Records F.softmax of the value along dim."""
        return _layers().Softmax(dim)(self)

    def log_softmax(self, dim):
        """Records F.log_softmax of the value along dim."""
        return _layers().LogSoftmax(dim)(self)

    # ---- what cannot be recorded ----
    def _value(self, *args):
        """Fails with a TracingError: a traced value has no Python value (item, tolist, numpy, bool, int, float, len,
        iteration), so control flow in forward may depend on shapes and constructor arguments only."""
        fail("Python control flow or conversion on a traced value (if/while/bool/int/float/len/iteration)",
             "make it depend on shapes or constructor arguments only")

    __bool__ = __int__ = __float__ = __index__ = _value

    def __iter__(self):
        if isinstance(self.node.module, _layers().Target):
            fail("the targets taken apart (yc, yr = y: a tuple of targets)", _SEVERAL_TARGETS)
        self._value()

    def _of_targets(self):
        """Whether the value is the targets or computed from them alone."""
        nodes = topological([self.node])
        return any(isinstance(n.module, _layers().Target) for n in nodes) and all(n.module is not None for n in nodes)

    def __len__(self):
        """Fails: the batch size is known only as N (x.size(0)), which Python's len cannot return."""
        fail("len() of a traced value", "x.size(0) is the batch size N (a loss summed over the batch can be divided "
             "by it); each sample's entry at its label, d2l's y_hat[range(len(y_hat)), y], is "
             "y_hat[ft.arange(y_hat.size(0)), y]")
    item = tolist = numpy = _value

    def clone(self, *args, **kwargs):
        """The value under a new name: an in-place op on one (see in_place) leaves the other as it was."""
        return self._renamed()

    def new_empty(self, *size, **kwargs):
        """Memory of size (N, 1, ...) that a draw fills in place (timm's drop path: x.new_empty((x.shape[0],) +
        (1,) * (x.ndim - 1)).bernoulli_(keep_prob)): a Blank."""
        size = _sizes(size)
        if len(size) != self.ndim or size[0] is not N or any(n != 1 for n in size[1:]):
            fail(f"x.new_empty{size}", "draw per sample with x.new_empty((x.shape[0],) + (1,) * (x.ndim - 1))"
                 ".bernoulli_(p), or ft.rand_like(x)")
        return Blank(size, source=self)

    def new_zeros(self, *size, **kwargs):
        """Zeros of size (a tensor the same for every sample, on the value's device), as torch's new_zeros."""
        from .. import creation
        return creation.zeros(*size, device=_device_of(self))

    def new_ones(self, *size, **kwargs):
        """Ones of size (a tensor the same for every sample, on the value's device), as torch's new_ones."""
        from .. import creation
        return creation.ones(*size, device=_device_of(self))

    def new_tensor(self, data, dtype=None, **kwargs):
        """data as a tensor the same for every sample, on the value's device, of the value's dtype unless dtype is
        given, as torch's new_tensor."""
        from .. import creation
        return creation.tensor(data, dtype=dtype or self.dtype, device=_device_of(self))

    @_view
    def detach(self):
        """Records the value as a constant of the step: no gradient passes back through it (x.data likewise)."""
        return _layers().Detach()(self)

    data = property(detach)

    def masked_fill(self, mask, value):
        """Records value where mask (a bool tensor fixed for every sample, a causal mask, or one computed from
        traced values) holds: a masked-fill node, which selects rather than multiplies (so -inf fills exactly)."""
        return where(mask, value, self)

    # ---- masks ----
    def _math(self, op, number=0.0):
        """Records an elementwise op of fasttrain's tensor math on the value and a number: a comparison or logical
        not gives a bool mask, "mul" by 1 a mask's 0/1 floats."""
        out = _layers().Math(op, number)(self)
        if op != "mul":
            out.node.dtype = _dtype("bool")
        return out

    __eq__, __ne__, __lt__, __le__, __gt__, __ge__ = (_comparison(op) for op in ("eq", "ne", "lt", "le", "gt", "ge"))
    eq, ne, lt, le, gt, ge = __eq__, __ne__, __lt__, __le__, __gt__, __ge__
    __hash__ = object.__hash__  # traced values are keys by identity

    def _broadcast(self):
        """Whether the value is a tensor's, the same for every sample (a parameter expanded over the batch, as
        learned queries are): a program reads it with a batch stride of 0, which only elementwise ops, matmuls and
        concatenations take; other layers get it repeated over the batch (an expand node)."""
        m = self.node.module
        return isinstance(m, _layers().Value) or isinstance(m, _layers().Reshape) and self.node.inputs[0].module \
            is not None and Symbolic(self.node.inputs[0])._broadcast()

    def _is_mask(self):
        return self.node.dtype is _dtype("bool")

    def logical_not(self):
        """The complement of a bool mask (~mask)."""
        if not self._is_mask():
            fail(f"~ (logical_not) of a traced value of {self.dtype.name}", "complement a bool mask (ids == pad)")
        return self._math("logical_not")

    __invert__ = logical_not

    def _logical(self, other, both):
        """The element-wise or (both=False) or and of this bool mask and another (traced, or a bool tensor such as a
        causal mask): their 0/1 floats summed or multiplied, compared with 0.5."""
        from .._C import TensorBase
        what = "| or & of traced values other than bool masks (or bool tensors)"
        mask = _as_mask(self, what)
        floats = other.float() if isinstance(other, TensorBase) and other.dtype.name == "bool" else \
            _as_mask(other, what)._floats()
        return (mask._floats() * floats if both else mask._floats() + floats) > 0.5

    def logical_or(self, other):
        """Where this bool mask or other holds (mask | other)."""
        return self._logical(other, False)

    def logical_and(self, other):
        """Where this bool mask and other hold (mask & other)."""
        return self._logical(other, True)

    __or__ = __ror__ = logical_or
    __and__ = __rand__ = logical_and

    def _floats(self):
        """A bool mask as floats 0 and 1 (what PyTorch's arithmetic promotes it to); any other value as it is."""
        return self._numbers() if self._is_mask() else self

    def _numbers(self):
        """The value as floats: integers and a mask's 0 and 1 converted as a math node reads them (PyTorch's
        cast); floats as they are."""
        return self if self.dtype.is_floating_point else self._math("mul", 1.0)

    def __getattr__(self, name):
        if name.startswith("__"):  # protocol probes (NumPy's, copy's) see a plain object
            raise AttributeError(name)
        if name == "_host_array":  # an eager function reading the values: name it (ft.topk, ft.sort)
            frame = sys._getframe(1)
            while frame.f_code.co_name.startswith("_") and frame.f_back is not None:  # past its helpers
                frame = frame.f_back
            name = frame.f_code.co_name
            fail(f"ft.{name} of a traced value", _TRACED_HINTS.get(name, "see docs/models.md for what traced "
                                                                          "values support"), NoAttribute)
        fail(f"x.{name}", _TRACED_HINTS.get(name, "see docs/models.md for what traced values support"), NoAttribute)

    def __setitem__(self, key, value):
        """x[mask] = v of a traced bool mask of the value's leading sizes (the batch's first) and a number:
        masked_fill_ (GCN's d[torch.isinf(d)] = 0.); any other assignment fails."""
        from .._C import TensorBase
        if isinstance(value, TensorBase) and value.numel() == 1:
            value = value.item()
        if not (isinstance(key, Symbolic) and key._is_mask() and isinstance(value, numbers.Real)):
            refuse_assignment()
        lead, shape = key.node.shape, self.node.shape
        if lead != shape[:len(lead)]:
            raise IndexError(f"the mask of shape {key.shape} does not match the indexed value's {self.shape}")
        self.masked_fill_(key.reshape(N, *lead, *[1] * (len(shape) - len(lead))), value)

    def isnan(self):
        """A bool mask of where the value is NaN (x != x)."""
        return self != self

    def isinf(self):
        """A bool mask of where the value is +-inf."""
        return self.abs() == math.inf

    def isfinite(self):
        """A bool mask of where the value is neither +-inf nor NaN."""
        return self.abs() < math.inf

    def t(self):
        """Fails: the transpose of a batch of vectors or matrices swaps the batch with the features; a product
        across the batch (a contrastive loss's z1 @ z2.T) has no per-sample form."""
        fail("x.T / x.t() of a traced value (it would swap the batch with the features)", "a compiled step "
             "computes each sample on its own: transpose a sample's own dimensions with x.transpose(-2, -1) or "
             "x.mT; for similarities across the batch (a contrastive loss's z1 @ z2.T) compile the batch as one "
             "sample, batch_size=1, input_shape=(B, ...), and multiply z1 @ z2.transpose(-2, -1) (docs/models.md)")

    T = property(t)

    def __repr__(self):
        kind = "input" if self.node.module is None else type(self.node.module).__name__
        return f"Symbolic(shape={self.shape}, from={kind})"


def _in_place_method(name):
    def method(self, *args, **kwargs):
        return in_place(self, getattr(self, name)(*args, **kwargs))
    method.__name__ = method.__qualname__ = name + "_"
    method.__doc__ = f"Records x.{name}(...) in place of x (see in_place)."
    return method


for _name in ("add", "sub", "mul", "div", "relu", "sigmoid", "tanh", "clamp", "clamp_min", "clamp_max", "exp",
              "sqrt", "pow", "masked_fill"):
    setattr(Symbolic, _name + "_", _in_place_method(_name))
del _name
take_numpy_names(Symbolic)


class Common:
    """A value of the parameters and constants alone while a forward is traced (self.w.exp(), w - w.mean((1, 2, 3),
    keepdim=True), ft.cat of biases): a tensor whose dimensions are its own, as in PyTorch, which the program
    computes once per step, not once per sample (Node.common). Where it meets the samples' values it is repeated
    over the batch, its leading dimensions beyond theirs (of size 1) being the batch's broadcast; a convolution or
    a linear layer takes it as its weight (a weight standardized, normalized or masked in forward), which trains
    through it. Its methods take its own dimensions; value is the batch-first traced value the library computes
    with."""

    __slots__ = ("value",)
    __array_priority__ = 1000

    def __init__(self, value):
        self.value = value

    @property
    def shape(self):
        """Its own shape (no batch dimension)."""
        return self.value.node.shape

    def size(self, dim=None):
        return self.shape if dim is None else self.shape[dim]

    def dim(self):
        return len(self.shape)

    ndim = property(dim, doc="The number of its dimensions.")

    def numel(self):
        return math.prod(self.shape)

    def __len__(self):
        if not self.shape:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]

    def __iter__(self):
        return iter(self.unbind(0))

    dtype = property(lambda self: self.value.dtype, doc="The value's dtype.")
    device = property(lambda self: self.value.device, doc="The device of the parameters it is computed from.")
    requires_grad = property(lambda self: self.value.requires_grad, doc="Whether it is differentiated.")

    def is_floating_point(self):
        """Whether its dtype is a float's."""
        return self.value.is_floating_point()

    data = property(lambda self: self.detach(), doc="The value as a constant of the step (detach).")

    def __repr__(self):
        return f"Common(shape={self.shape})"

    __hash__ = object.__hash__

    def for_samples(self, rank):
        """The batch-first value, for values of the samples of `rank` per-sample dimensions: its leading dimensions
        beyond theirs, the batch's broadcast, dropped (each must be 1)."""
        shape, v = self.shape, self.value
        if len(shape) > rank:
            extra = shape[:len(shape) - rank]
            if any(n != 1 for n in extra):
                fail(f"a value of the parameters alone of shape {shape} with values of the samples (of rank {rank} "
                     "each)", "its leading dimensions beyond theirs would be the batch's: give it the samples' own "
                     "shape (or size 1 there)")
            v = v.reshape(N, *shape[len(extra):])
        return v

    def against(self, x, least=0):
        """The batch-first value as traced value x reads it: itself for a common x, else for_samples of x's rank
        (and of at least `least`, a matrix's 2)."""
        return self.value if x.node.common else self.for_samples(max(len(x.node.shape), least))

    def _of_rank(self, rank):
        """The batch-first value of `rank` per-sample dimensions: for_samples of that rank, new leading dimensions
        of size 1 where it has fewer."""
        v = self.for_samples(rank)
        return v.reshape(N, *(1,) * (rank - len(v.node.shape)), *v.node.shape)

    def _own(self, d, extra=0):
        """The batch-first dimension of own dimension d (of ndim + extra, unsqueeze's one more)."""
        nd = self.ndim + extra
        if not -nd <= d < nd:
            raise IndexError(f"dimension {d} is out of range for a {self.ndim}-d value of shape {self.shape}")
        return d % nd + 1

    def _dims(self, dim):
        return tuple(self._own(d) for d in dim) if isinstance(dim, (tuple, list)) else self._own(dim)

    def _all(self, dim):
        """dim, or every dimension for None."""
        return tuple(range(self.ndim)) if dim is None else dim

    # ---- shapes ----
    def reshape(self, *shape):
        return common(self.value.reshape(N, *_sizes(shape)))

    view = reshape

    def flatten(self, start_dim=0, end_dim=-1):
        if not self.ndim:
            return self.reshape(1)
        return common(self.value.flatten(self._own(start_dim), self._own(end_dim)))

    def unsqueeze(self, dim):
        return common(self.value.unsqueeze(self._own(dim, 1)))

    def squeeze(self, dim=None):
        return common(self.value.squeeze(None if dim is None else self._dims(dim)))

    def permute(self, *dims):
        return common(self.value.permute(0, *(self._own(d) for d in _sizes(dims))))

    def transpose(self, dim0, dim1):
        return common(self.value.transpose(self._own(dim0), self._own(dim1)))

    swapaxes = swapdims = transpose

    def t(self):
        return self if self.ndim < 2 else self.transpose(0, 1)

    T = property(lambda self: self.permute(*reversed(range(self.ndim))), doc="Its dimensions reversed.")
    mT = property(lambda self: self.transpose(-2, -1), doc="Its last two dimensions swapped.")

    def expand(self, *sizes):
        """Repeated along its dimensions of size 1 (and new leading ones) to sizes; with the batch size first
        (x.size(0)) a value of every sample (CLIP's class embedding expanded over the batch)."""
        sizes = _sizes(sizes)
        if sizes and isinstance(sizes[0], BatchSize):
            return self._of_rank(len(sizes) - 1).expand(*sizes)
        if len(sizes) < self.ndim:
            raise ValueError(f"expand{sizes}: fewer sizes than the value's {self.ndim} dimensions")
        return common(self._of_rank(len(sizes)).expand(N, *sizes))

    def expand_as(self, other):
        return self.expand(other.shape)

    def reshape_as(self, other):
        return self.reshape(other.shape)

    view_as = reshape_as

    def repeat(self, *sizes):
        sizes = _sizes(sizes)
        if len(sizes) < self.ndim:
            raise ValueError(f"repeat{sizes}: fewer repeats than the value's {self.ndim} dimensions")
        return common(self._of_rank(len(sizes)).repeat(1, *sizes))

    def repeat_interleave(self, repeats, dim=None):
        if dim is None:
            return self.flatten().repeat_interleave(repeats, 0)
        return common(self.value.repeat_interleave(repeats, self._own(dim)))

    def __getitem__(self, index):
        index = index if isinstance(index, tuple) else (index,)
        if any(isinstance(i, (Symbolic, Common)) for i in index):
            fail("indexing a value of the parameters alone at traced positions", "index with integers and slices")
        return common(self.value[(slice(None), *index)])

    def __setitem__(self, key, value):
        refuse_assignment()

    def select(self, dim, index):
        return common(self.value.select(self._own(dim), index))

    def unbind(self, dim=0):
        return tuple(common(v) for v in self.value.unbind(self._own(dim)))

    def chunk(self, chunks, dim=0):
        return tuple(common(v) for v in self.value.chunk(chunks, self._own(dim)))

    def split(self, split_size, dim=0):
        return tuple(common(v) for v in self.value.split(split_size, self._own(dim)))

    def roll(self, shifts, dims=None):
        if dims is None:
            return self.flatten().roll(shifts, 0).reshape(self.shape)
        return common(self.value.roll(shifts, self._dims(dims)))

    # ---- reductions ----
    def sum(self, dim=None, keepdim=False, *, dtype=None):
        return common(self.value.sum(self._dims(self._all(dim)), keepdim)) if self.ndim else self

    def mean(self, dim=None, keepdim=False, *, dtype=None):
        return common(self.value.mean(self._dims(self._all(dim)), keepdim)) if self.ndim else self

    def var(self, dim=None, unbiased=True, keepdim=False, *, correction=None):
        return common(self.value.var(self._dims(self._all(dim)), unbiased, keepdim, correction=correction))

    def std(self, dim=None, unbiased=True, keepdim=False, *, correction=None):
        return common(self.value.std(self._dims(self._all(dim)), unbiased, keepdim, correction=correction))

    def amax(self, dim=(), keepdim=False):
        return common(self.value.amax(self._dims(self._all(None) if dim == () else dim), keepdim)) if self.ndim \
            else self

    def amin(self, dim=(), keepdim=False):
        return -(-self).amax(dim, keepdim)

    def max(self, dim=None, keepdim=False):
        from .._math import ValuesIndices
        if dim is None:
            return self.amax()
        if not isinstance(dim, (int, tuple, list)):  # torch.max(a, b): the larger of each pair
            return self.maximum(dim)
        return ValuesIndices(self.amax(dim, keepdim), NoIndices("max"))

    def min(self, dim=None, keepdim=False):
        from .._math import ValuesIndices
        if dim is None:
            return self.amin()
        if not isinstance(dim, (int, tuple, list)):
            return self.minimum(dim)
        return ValuesIndices(self.amin(dim, keepdim), NoIndices("min"))

    def norm(self, p="fro", dim=None, keepdim=False, dtype=None):
        return common(self.value.norm(p, self._dims(self._all(dim)), keepdim)) if self.ndim else self.abs()

    def logsumexp(self, dim, keepdim=False):
        return common(self.value.logsumexp(self._own(dim), keepdim))

    def softmax(self, dim, dtype=None):
        return common(self.value.softmax(self._own(dim)))

    def log_softmax(self, dim, dtype=None):
        return common(self.value.log_softmax(self._own(dim)))

    # ---- elementwise ----
    def __getattr__(self, name):
        if name.startswith("__"):  # protocol probes see a plain object
            raise AttributeError(name)
        if name not in _COMMON_METHODS:
            fail(f"x.{name} of a value of the parameters alone", _TRACED_HINTS.get(
                name, "see docs/models.md for what values of the parameters support"), NoAttribute)
        method = getattr(self.value, name)

        def call(*args, **kwargs):
            other = next((a for a in args if isinstance(a, (Symbolic, Common))), None) if name in _PAIRED else None
            base = self.value if other is None else _pair(self, other)[0]  # with values of the samples: aligned
            return _user(getattr(base, name)(*[a.value if isinstance(a, Common) else a for a in args], **kwargs))
        return functools.update_wrapper(call, method)

    def _value(self, *args):
        fail("Python control flow or conversion on a value of the parameters alone (if/bool/int/float)", "a "
             "compiled program has one graph for every step: make it depend on shapes or constructor arguments")

    __bool__ = __int__ = __float__ = __index__ = _value


# what a value of the parameters alone takes from the methods of traced values: those without dimensions
_COMMON_METHODS = frozenset((
    "exp", "erf", "sin", "cos", "log", "sqrt", "rsqrt", "reciprocal", "abs", "relu", "sigmoid", "tanh", "square",
    "pow", "clamp", "clip", "clamp_min", "clamp_max", "masked_fill", "lerp", "float", "to", "type", "type_as",
    "detach", "clone", "contiguous", "add", "sub", "mul", "div", "logical_not", "logical_or", "logical_and",
    "requires_grad_"))
_PAIRED = frozenset(("masked_fill", "lerp", "add", "sub", "mul", "div", "logical_or", "logical_and"))  # elementwise


def _pair(a, b, least=0):
    """Common a's batch-first value and b's, for an op of the two: with values of the samples, a's leading
    dimensions beyond theirs (and beyond `least`, a matrix's 2) dropped (Common.for_samples); a tensor b a value of
    its own shape."""
    from .._C import TensorBase
    if isinstance(b, Common):
        return a.value, b.value
    if isinstance(b, Symbolic):
        return a.for_samples(max(len(b.node.shape), least)), b
    if isinstance(b, TensorBase):
        if b.dtype.name == "bool":  # in arithmetic as its 0 and 1, as PyTorch promotes it
            _note_buffers([b])
            b = b.float()
        return a.value, common_value(b).value
    return a.value, b


def _common_operator(name):
    reflected = name.startswith("__r")

    def op(self, other):
        a, b = _pair(self, other, 2 if "matmul" in name else 0)
        if reflected and isinstance(b, Symbolic):  # other OP self, other traced
            return _user(getattr(b, "__" + name[3:])(a))
        return _user(getattr(a, name)(b))
    op.__name__ = name
    return op


for _name in ("__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__", "__truediv__", "__rtruediv__",
              "__matmul__", "__rmatmul__", "__pow__", "__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__",
              "__and__", "__rand__", "__or__", "__ror__", "maximum", "minimum"):
    setattr(Common, _name, _common_operator(_name))
Common.__neg__ = lambda self: common(-self.value)
Common.__abs__ = lambda self: common(self.value.abs())


def _common_rpow(self, base):
    """base ** self of a positive number base, as exp(self ln base)."""
    if not isinstance(base, numbers.Real) or base <= 0:
        fail(f"{base!r} ** a value of the parameters alone", "raise a positive number to it")
    return (self * math.log(base)).exp()


Common.__rpow__ = _common_rpow
Common.__invert__ = lambda self: common(~self.value)
Common.matmul = Common.bmm = Common.__matmul__
for _name, _method in list(vars(Common).items()):  # each as the tensor method of its name
    if inspect.isfunction(_method) and not _name.startswith("_") and not _method.__doc__:
        _method.__doc__ = f"Records Tensor.{_name} of the value, whose dimensions are its own."
del _name, _method


def common(v):
    """v as its user sees it: a Common for a value of the parameters alone, else itself."""
    return Common(v) if isinstance(v, Symbolic) and v.node.common else v


def _user(out):
    """common() over a result: a value, a tuple or list of them, values and indices."""
    from .._math import ValuesIndices
    if isinstance(out, ValuesIndices):
        return ValuesIndices(_user(out.values), out.indices)
    if isinstance(out, (tuple, list)):
        return type(out)(_user(o) for o in out)
    return common(out)


def internal(x):
    """A Common's batch-first value; anything else as it is."""
    return x.value if isinstance(x, Common) else x


def common_value(t):
    """Tensor t read as a value of its own shape, computed once per step: a trainable parameter (or any view of
    one, see _part), through which it trains, or a constant."""
    p = _viewed_parameter(t)
    if p is None:
        _note_watched([t])
        t = _dense(t)
        return Common(_common_node(t, tuple(t.shape)))
    if t.data_ptr() == p.data_ptr() and t.numel() == p.numel() and t.is_contiguous():
        return Common(_common_node(p, tuple(t.shape)))  # the whole parameter, reshaped
    offset = (t.data_ptr() - p.data_ptr()) // p.element_size()
    return _part(p, offset, t.shape, t.stride(), Common(_common_node(p, tuple(p.shape))))


def _dense(t):
    """Constant tensor t as a value node reads it: itself, or the copy of a non-contiguous view, which a change of
    the buffer it views would not reach (so the buffer is watched, _note_buffers)."""
    if t.is_contiguous():
        return t
    _note_buffers([t])
    return t.contiguous()


def _common_node(tensor, shape):
    """A common node reading tensor (a parameter, which trains through it, or a constant) in shape."""
    node = Node(_layers().Value(tensor, shape), [], shape)
    node.common = True
    return Symbolic(node)


def _part(p, offset, shape, strides, whole):
    """The elements of parameter p at flat positions offset + sum(i_k strides_k) over index i of shape (a view of
    p, or a copy of one), as the Common whole (p's value) viewed so: repeated along dimensions of stride 0 (an
    expand); a run of p's memory (a reshape of rows, view(-1)[:k]) or a strided one of one dimension as a slice of p
    flattened; else p indexed and permuted: each dimension along one of p's with a step, p's others fixed (a
    transpose, a slice, an index). Fails for other positions."""
    import numpy as np
    shape, strides = tuple(shape), tuple(strides)
    repeated = [d for d, (n, s) in enumerate(zip(shape, strides)) if s == 0 and n > 1]
    if repeated:
        one = tuple(1 if d in repeated else n for d, n in enumerate(shape))
        return _part(p, offset, one, strides, whole).expand(shape)
    dims = [(n, s) for n, s in zip(shape, strides) if n > 1]
    if all(s == math.prod(n for n, _ in dims[k + 1:]) for k, (_, s) in enumerate(dims)) or len(dims) <= 1:
        step = dims[0][1] if len(dims) == 1 else 1  # a run, or evenly spaced along one dimension
        return whole.flatten()[offset:offset + step * (math.prod(shape) - 1) + 1:step].reshape(shape)
    order = sorted(range(len(shape)), key=lambda d: -strides[d])
    if all(strides[d] == math.prod(shape[e] for e in order[k + 1:]) for k, d in enumerate(order) if shape[d] > 1):
        # a run permuted (a ViT's position table viewed as an image, pos.reshape(1, H, W, C).permute(0, 3, 1, 2))
        run = whole.flatten()[offset:offset + math.prod(shape)].reshape(tuple(shape[d] for d in order))
        return run.permute(*(order.index(d) for d in range(len(shape))))
    rest, start = offset, []
    for s in p.stride():  # (a parameter's memory is contiguous)
        start.append(rest // s)
        rest %= s
    index, along = list(start), []
    for n, s in zip(shape, strides):
        d = max((d for d in range(p.ndim) if d not in along and s % p.stride(d) == 0 and s >= p.stride(d) and
                 start[d] + s // p.stride(d) * (n - 1) < p.shape[d]), key=p.stride, default=None) if n > 1 else None
        if n > 1 and d is None:
            along = None
            break
        if d is not None:
            step = s // p.stride(d)
            index[d] = slice(start[d], start[d] + step * (n - 1) + 1, step)
            along.append(d)
    if along is not None:
        kept = sorted(along)
        order = [kept.index(d) for d in along]
        found = np.arange(p.numel()).reshape(tuple(p.shape))[tuple(index)].transpose(order).reshape(shape)
        if np.array_equal(found, _lattice(offset, shape, strides)):
            return whole[tuple(index)].permute(*order).reshape(shape)
    fail("a trainable parameter's elements at positions that are not a part of it along its dimensions, computed "
         "on alone", "compute on the parameter itself, then index the result")


def _factored(flat):
    """(offset, shape, strides) of the lattice whose positions in C order are the 1-d array flat (a view's, or
    a view of a copy's: w.t().reshape(-1)), found from its innermost run outwards; None where there is none."""
    import numpy as np
    n = len(flat)
    step = int(flat[1] - flat[0]) if n > 1 else 0
    run = 1
    while run < n and flat[run] - flat[run - 1] == step:
        run += 1
    if n % run:
        return None
    outer = (int(flat[0]), (), ()) if run == n else _factored(flat[::run])
    if outer is None:
        return None
    found = (outer[0], (*outer[1], run), (*outer[2], step))
    return found if np.array_equal(_lattice(*found).ravel(), flat) else None


def _lattice(offset, shape, strides):
    """The flat positions offset + sum(i_k strides_k) over the index i of shape, as a NumPy array."""
    import numpy as np
    pos = np.full(shape, offset, np.int64)
    for k, (n, s) in enumerate(zip(shape, strides)):
        pos = pos + (np.arange(n) * s).reshape((1,) * k + (n,) + (1,) * (len(shape) - k - 1))
    return pos


def _as_common(x):
    """x, computed from constants and parameters alone but recorded as a value of every sample (a constant's node,
    the expand of a mask), as a common node's input: a copy of its nodes marked common, which only common nodes
    (and the expands that repeat them over the batch) read."""
    copies = {}

    def copy(n):
        if id(n) not in copies:
            c = Node(n.module, [copy(i) for i in n.inputs], n.shape, n.reduced)
            c.dtype, c.common = n.dtype, True
            copies[id(n)] = c
        return copies[id(n)]
    return Symbolic(copy(x.node))


def _to_samples(x, rank):
    """Common value x (batch-first) read by a node of every sample: repeated over the batch by an expand node, its
    leading dimensions beyond the samples' `rank` dropped first."""
    v = x if rank is None else Common(x).for_samples(rank)
    mask = v._is_mask()  # repeated as its 0 and 1, a mask again after
    if mask:
        v = v._floats()
    node = Node(_layers().Expand(v.node.shape), [v.node], v.node.shape)
    node.dtype = v.node.dtype
    return Symbolic(node) > 0.5 if mask else Symbolic(node)


class _Refusing:
    """A result that only some uses take: any other attribute fails with the subclass's _refuse."""

    def _refuse(self, *args, **kwargs):
        raise NotImplementedError

    def __getattr__(self, name):
        if name.startswith("__"):  # protocol probes see a plain object
            raise AttributeError(name)
        self._refuse()

    def _operator(self, *args):
        self._refuse()

    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __truediv__ = __rtruediv__ = __matmul__ = \
        __rmatmul__ = __neg__ = __getitem__ = _operator


class Stacked(_Refusing):
    """Values permuted with a per-sample dimension before the batch (timm's attention: qkv.reshape(B, N, 3, H,
    D).permute(2, 0, 3, 1, 4)): taken apart along that first dimension (q, k, v = qkv.unbind(0), qkv[0]), each
    part is the source at one index of it, permuted as the rest of dims says. Any other use fails."""

    def __init__(self, source, dims):
        self.source, self.dims = source, dims

    def __getitem__(self, i):
        lead = self.dims[0]
        size = self.source.node.shape[lead - 1]
        if not isinstance(i, int) or not -size <= i < size:
            self._refuse()
        part = self.source.select(lead, i % size)
        return part.permute(0, *(d if d < lead else d - 1 for d in self.dims[2:]))

    def unbind(self, dim=0):
        if dim != 0:
            self._refuse()
        return tuple(self[i] for i in range(self.source.node.shape[self.dims[0] - 1]))

    def __iter__(self):
        return iter(self.unbind(0))

    def _refuse(self, *args, **kwargs):
        fail(f"permute{self.dims} (the batch not first)", "such a permute can only be taken apart along its first "
             "dimension: q, k, v = qkv.unbind(0), or qkv[0]")


class Layered(_Refusing):
    """Traced values stacked before the batch, as RNN states are, one per layer and direction (PyTorch's h_n of
    shape (L * D, N, H)): a traced RNN's final states, or values made so (h.unsqueeze(0), repeated over the layers
    by .repeat(L, 1, 1) or .expand(L, -1, -1), or ft.stack(states) along 0). Taken apart along that first
    dimension (h_n[-1], torch.cat((h_n[-2], h_n[-1]), 1), h_n[-2:], iterating), stacked with the batch first
    (h_n.permute(1, 0, 2), h_n.transpose(0, 1)), squeezed when there is one (h_n.squeeze(0)), or passed to an RNN as
    its initial state. Any other use fails."""

    def __init__(self, states):
        self.states = list(states)

    @property
    def shape(self):
        return (len(self.states), *self.states[0].shape)

    def sum(self, dim=None, keepdim=False, *, dtype=None):
        """The values added, summed along the first dimension (WaveNet's ft.stack(skips).sum(0))."""
        if dim not in (0, -len(self.shape)) or keepdim or dtype is not None:
            self._refuse()
        return functools.reduce(operator.add, self.states)

    def mean(self, dim=None, keepdim=False, *, dtype=None):
        """The values' mean along the first dimension."""
        return self.sum(dim, keepdim, dtype=dtype) / len(self.states)

    def size(self, dim=None):
        return self.shape if dim is None else self.shape[dim]

    def __len__(self):
        return len(self.states)

    def __getitem__(self, i):
        if isinstance(i, tuple):  # h_n[-2, :, :]: the rest may take a state apart as a traced value
            first, rest = (i or (slice(None),))[0], i[1:]
            whole = all(r == slice(None) or r is Ellipsis for r in rest)
            if isinstance(first, slice) and not whole:
                self._refuse()
            return self[first] if whole else self[first][rest]
        if isinstance(i, slice):
            return Layered(self.states[i])
        if isinstance(i, bool) or not isinstance(i, numbers.Integral):
            self._refuse()
        return self.states[int(i)]

    def __iter__(self):
        return iter(self.states)

    def view(self, *sizes):
        """h_n.view(num_layers, num_directions, N, H), PyTorch's documented form: each layer's states, one per
        direction."""
        sizes = _sizes(sizes)
        if len(sizes) != 4 or sizes[0] * sizes[1] != len(self.states) or sizes[3] != self.shape[-1] or not (
                isinstance(sizes[2], BatchSize) or sizes[2] == -1):
            self._refuse()
        layers, each = sizes[:2]
        return Layered(Layered(self.states[k * each:(k + 1) * each]) for k in range(layers))

    def unbind(self, dim=0):
        if dim != 0:
            self._refuse()
        return tuple(self.states)

    def repeat(self, *sizes):
        """h.unsqueeze(0).repeat(num_layers, 1, 1): the states repeated over the first dimension."""
        sizes = _sizes(sizes)
        if len(sizes) != len(self.shape) or any(s != 1 for s in sizes[1:]) or sizes[0] < 1:
            self._refuse()
        return Layered(self.states * sizes[0])

    def expand(self, *sizes):
        """h.unsqueeze(0).expand(num_layers, -1, -1): one state repeated over the first dimension."""
        sizes = _sizes(sizes)
        if len(sizes) != len(self.shape) or len(self.states) != 1 or any(s != -1 for s in sizes[2:]) or \
                not (isinstance(sizes[1], BatchSize) or sizes[1] == -1) or sizes[0] < 1:
            self._refuse()
        return Layered(self.states * sizes[0])

    def contiguous(self, *args, **kwargs):
        return self

    def squeeze(self, dim=0):
        if dim != 0 or len(self.states) != 1:
            self._refuse()
        return self.states[0]

    def permute(self, *dims):
        dims = _sizes(dims)
        if dims != (1, 0, 2):
            self._refuse()
        from .._math import stack
        return stack(self.states, 1)

    def transpose(self, dim0, dim1):
        if {dim0, dim1} != {0, 1}:
            self._refuse()
        return self.permute(1, 0, 2)

    def _refuse(self, *args, **kwargs):
        fail("this use of values stacked before the batch (ft.stack(values) along dim 0; an RNN's states: h_n, "
             "h.unsqueeze(0))", "sum them along it (.sum(0), .mean(0)), stack them after the batch "
             "(ft.stack(values, dim=1)), take them apart (h_n[-1], h_n[-2:]), put the batch first "
             "(h_n.permute(1, 0, 2)), or pass them to an RNN as its initial states")


class AttentionWeights(_Refusing):
    """What a traced MultiheadAttention returns for its attention weights, which the fused kernel of a compiled
    program never forms: ignoring them (out, _ = attn(x, x, x)) is fine, any use fails."""

    def _refuse(self, *args, **kwargs):
        fail("the attention weights of a compiled MultiheadAttention (need_weights=True)", "the fused kernel never "
             "forms them: compute softmax(q @ k.transpose(-2, -1) * scale) from the projections yourself, or look "
             "at them eagerly, outside the compiled program")


class ZeroStates(_Refusing):
    """ft.zeros of a shape naming the batch size in a traced forward: an RNN's zero initial state (h0 =
    ft.zeros(layers, x.size(0), hidden)), which it takes as none given. Any other use fails."""

    def __init__(self, size):
        self.size = size

    def to(self, *args, **kwargs):
        """The zeros as they are: .to(device), and the tutorials' ft.zeros(...).requires_grad_() then h0.detach(),
        which no gradient reaches either way."""
        return self

    detach = requires_grad_ = to

    def _refuse(self, *args, **kwargs):
        fail(f"ft.zeros{self.size} (a size naming the batch) other than as an RNN's initial state",
             "zeros of every sample's shape are x.new_zeros(...) or ft.zeros_like(x)")


class BatchPositions(_Refusing):
    """ft.arange(N) of the batch size N while tracing: the first index of x[ft.arange(x.size(0)), y], each sample's
    entry at its label y (a hand-written cross entropy's -log(p[ft.arange(N), y])), which is
    x.gather(1, y.unsqueeze(1)).squeeze(1). Any other use fails."""

    def _refuse(self, *args, **kwargs):
        fail("ft.arange of the batch size other than as x[ft.arange(N), y] of (N, C) scores", "a compiled program "
             "computes each sample on its own; a position of every sample is a per-sample index: h[:, -1], or an "
             "RNN's final states h_n[-1]; a sequence's scores at its labels are x.gather(2, y.unsqueeze(2))")


class Blank(_Refusing):
    """New memory of a size naming the batch, made while a forward is traced: x.new_empty((N, 1, ...)), or
    ft.empty(size) with N first. An in-place draw, bernoulli_(p) of size (N, 1, ...), fills it afresh in every
    step (timm's drop path, torchvision's stochastic_depth); fill_(value) makes the constant of every sample
    (ft.ones(x.size(0), k)); any other use fails. source: a traced value of the batch (by
    default the forward's first input)."""

    def __init__(self, size, dtype=None, device=None, source=None):
        self.size, self.dtype, self.device, self.source = size, dtype, device, source

    def bernoulli_(self, p=0.5):
        """1 with probability p, else 0, for each sample: a uniform draw of the program's stream below p."""
        if not isinstance(p, numbers.Real) or not 0 <= p <= 1:
            fail(f"bernoulli_({p!r})", "a probability in [0, 1]")
        if any(n != 1 for n in self.size[1:]):
            self._refuse()
        source = self.source if self.source is not None else next(iter(_active[-1].inputs), None)
        if source is None:
            self._refuse()
        one = source[(slice(None),) + (slice(0, 1),) * (source.ndim - 1)]  # (N, 1, ...)
        from ..random import rand_like
        draw = (rand_like(one) < p).float()
        return draw if source.ndim == len(self.size) else draw.view(-1, *self.size[1:])

    def fill_(self, value):
        """value for every sample: a constant of the model (a hand-written RNN's zero state, a decoder's start
        token ids)."""
        from .. import creation
        return creation.empty((1, *self.size[1:]), dtype=self.dtype, device=self.device).fill_(value).expand(
            N, *self.size[1:])

    def _refuse(self, *args, **kwargs):
        fail(f"new memory of size {self.size} (the batch first) other than filled by bernoulli_(p) (of size (N, 1, "
             "...)) or fill_(value)", "draw per sample with ft.rand_like(x) of a traced value x")


class NoIndices(_Refusing):
    """The indices of max(dim)/min(dim) of a traced value: a compiled program computes no integer values, so
    every use fails (an unused one, as in `values, _ = x.max(1)`, is fine)."""

    def __init__(self, fn):
        self.fn = fn

    def _refuse(self, *args, **kwargs):
        fail(f"the indices of {self.fn}(dim) of a traced value", f"use the values: x.{self.fn}(dim).values, or "
             f"x.a{self.fn}(dim)")

    __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = __add__ = __radd__ = __sub__ = __mul__ = _refuse
    __getitem__ = __bool__ = __int__ = __index__ = __iter__ = __len__ = __array__ = _refuse
    __hash__ = object.__hash__


# ignore_index of the class losses that gather records: a label no batch holds, so every label is checked
_NO_LABEL = -2 ** 63


def _labels_of(index, d):
    """The targets that index holds: their labels with a dimension of size 1 inserted at per-sample dimension d
    (y.unsqueeze(1), y.view(-1, 1), y[:, None])."""
    n = index.node if isinstance(index, Symbolic) else None
    if n is not None and isinstance(n.module, _layers().Reshape) and isinstance(n.inputs[0].module, _layers().Target):
        labels = n.inputs[0].shape
        if (*labels[:d], 1, *labels[d:]) == n.shape:
            return Symbolic(n.inputs[0])
    fail("gather() with an index other than the targets' labels with a dimension of size 1 at dim",
         "pick each sample's class with logp.gather(1, y.unsqueeze(1)), or use F.nll_loss(logp, y, reduction='none')")


def _head_rows(x):
    """The (T, H * D) rows that the heads x (H, T, D) were cut from: the projection itself when x is its
    .view(N, T, H, D).transpose(1, 2), as attention layers write it; else a copy in that order."""
    H, T, D = x.node.shape
    return x.transpose(1, 2).reshape(N, T, H * D)


def _packed(rows):
    """The (T, 3E) projection whose three column thirds are rows (q, k, v), or None."""
    mods = [r.node.module for r in rows]
    Slice = _layers().Slice
    if not all(isinstance(m, Slice) and m.dim == 1 and m.step == 1 for m in mods):
        return None
    source = rows[0].node.inputs[0]
    E = rows[0].node.shape[1]
    if any(r.node.inputs[0] is not source for r in rows) or source.shape[1] != 3 * E or \
            [m.start for m in mods] != [0, E, 2 * E]:
        return None
    return Symbolic(source)


def attention(q, k, v, causal, scale, dropout_p, key_mask=None, bias=None):
    """Traced scaled dot-product attention of heads (N, H, T, D), or (N, T, D) for one: one node over the
    (T, H * D) rows of the projections, which reads q, k and v in place when they are column thirds of one
    packed projection, the key mask (a traced bool (Tk,), True where a key is masked out) after them, then the
    bias added to the scores (a tensor, traced value or gathered parameter broadcasting to (N, H, Tq, Tk), as
    (H, Tq, Tk)). Its dropout drops weights in the training step only."""
    if len({len(x.node.shape) for x in (q, k, v)}) != 1 or len(q.node.shape) not in (2, 3):
        fail("attention of values of different ranks", "give query, key and value as (N, H, T, D) or (N, T, D)")
    one = len(q.node.shape) == 2
    H = 1 if one else q.node.shape[0]
    rows = [x if one else _head_rows(x) for x in (q, k, v)]
    packed = _packed(rows)
    Tq, E = rows[0].node.shape
    Tk = rows[1].node.shape[0]
    node = _layers().Attention(H, causal, scale, keys=Tk, dropout=dropout_p, bias=bias is not None)
    extra = [] if key_mask is None else [key_mask]
    if bias is not None:
        scores = (H, Tq, Tk)[1 if one else 0:]
        b = bias if isinstance(bias, Symbolic) else bias.traced(scores) if isinstance(bias, Gathered) else \
            constant(bias, scores)
        b = b.reshape(N, *(1,) * (len(scores) - len(b.node.shape)), *b.node.shape)._floats()  # PyTorch's alignment
        if b.node.shape != scores:
            b = _layers().Expand(scores)(b)
        extra.append(b.reshape(N, H, Tq, Tk))
    out = Symbolic.record(node, ([packed] if packed is not None else rows) + extra, (Tq, E))
    return out if one else out.reshape(N, Tq, H, E // H).transpose(1, 2)


def _sample_shape(t):
    """The shape of a view of a parameter as a sample's: without the leading size-1 dimensions it has beyond the
    parameter's (minGPT's wpe(arange(T).unsqueeze(0)), whose first is the batch's broadcast)."""
    p, shape = _viewed_parameter(t), tuple(t.shape)
    while p is not None and len(shape) > p.ndim and shape[0] == 1:
        shape = shape[1:]
    return shape


_MAX_RUNS = 256  # slice nodes one gather of constant positions may take


class _Positions:
    """Constant integer positions indexing a traced value: ids, an int64 NumPy array of at least one dimension."""

    def __init__(self, ids):
        self.ids = ids


def _index_item(item, positions=False):
    """An item of an index into a traced value as __getitem__ takes it: an integer (a Python int, a NumPy one, a
    one-element tensor of no dimensions) as int; a list, NumPy array or tensor of integers as _Positions (with
    positions, any integer index); anything else as it is."""
    import numpy as np
    from .._C import TensorBase
    if isinstance(item, (list, np.ndarray, TensorBase)) or positions:
        try:
            ids = np.asarray(item.cpu().numpy() if isinstance(item, TensorBase) else item)
        except ValueError:
            ids = None
        if ids is not None and ids.dtype == np.uint8:
            fail(f"indexing with uint8 {type(item).__name__} {item!r} (PyTorch's deprecated form of a mask)",
                 "index with int64 positions, or fill by a bool mask (x.masked_fill(mask, v))")
        if ids is not None and ids.ndim == 0 and ids.dtype.kind in "iu" and not positions:
            return int(ids)
        if ids is None or ids.dtype.kind not in "iu":
            fail(f"indexing with {type(item).__name__} {item!r}", "use integers, slices, None, ... and lists or "
                 "tensors of integer positions, the same for every sample")
        if ids.size == 0:
            raise IndexError("indexing with no positions")
        return _Positions(ids.astype(np.int64).reshape(ids.shape or (1,)))
    return operator.index(item) if isinstance(item, numbers.Integral) and not isinstance(item, bool) else item


def constant(t, like_shape):
    """A tensor used as a value in forward: a node reading it (a parameter trains through it). Its leading
    size-1 dimensions beyond the per-sample rank are the batch's broadcast; it broadcasts along the sample's
    dimensions as NumPy does, with no expanded copy when it varies along the first only (a per-channel
    (C, 1, 1) scale) or, for samples that are not images, the last only (a per-feature bias)."""
    p = _viewed_parameter(t)
    if p is None and t.dtype.name == "bool":  # in arithmetic as its 0 and 1, as PyTorch promotes it: a copy, so
        _note_buffers([t])                     # a buffer's change after compile is named (and a watched read noted)
        t = t.float()
    elif p is None:
        _note_watched([t])
    rank = len(_sample_shape(t))
    while t.ndim > rank:  # leading size-1 dimensions broadcast
        t = t.squeeze(0)
    shape = tuple(t.shape)
    if p is not None and p is not t:  # a view: read as the parameter, which trains through it
        row = p.numel() // p.shape[0] * p.element_size() if p.ndim else 0
        offset = t.data_ptr() - p.data_ptr()
        if t.is_contiguous() and t.numel() == p.numel():
            t = p  # the whole parameter in another shape (self.gamma.view(1, -1, 1, 1))
        elif t.is_contiguous() and row and t.ndim == p.ndim and tuple(t.shape[1:]) == tuple(p.shape[1:]) and \
                offset % row == 0:  # rows start.. (positions 0..T-1 of a table): the parameter, sliced
            whole = Symbolic.record(_layers().Value(p, tuple(p.shape)), [], tuple(p.shape))
            return whole[:, offset // row:offset // row + t.shape[0]]
        else:
            return Gathered.of(t).traced(like_shape)
    if p is None:
        t = _dense(t)
    while len(shape) > len(like_shape) and shape[0] == 1:
        shape = shape[1:]
    if len(shape) > len(like_shape):
        fail(f"a tensor of shape {tuple(t.shape)} in a value of shape {(N, *like_shape)}",
             "a tensor used in forward must be the same for every sample")
    if shape == like_shape:
        return Symbolic.record(_layers().Value(t, shape), [], shape)
    shape = (1,) * (len(like_shape) - len(shape)) + shape
    varies = [d for d, n in enumerate(shape) if n != 1]
    into = all(a in (b, 1) for a, b in zip(shape, like_shape))
    if into and (varies == [0] or (varies == [len(shape) - 1] and len(shape) != 3)):
        return Symbolic.record(_layers().Value(t, like_shape, varies[0]), [], like_shape)
    return Symbolic.record(_layers().Value(t, shape), [], shape)  # expanded where it meets the value


class Gathered:
    """Elements of a trainable 2-d parameter (R, D) at fixed positions, while a forward is traced: a relative
    position bias (Swin's and BEiT's table[index].view(T, T, -1).permute(2, 0, 1), T5's bias(buckets)), or a part
    or a permutation of a parameter. Its views and copies move its positions (flat indices into the parameter);
    where it meets a traced value it becomes one, the same for every sample: an embedding node reading the
    parameter's rows at the positions' rows, through which the parameter trains."""

    __slots__ = ("parameter", "positions", "padding_idx")

    def __init__(self, parameter, positions, padding_idx=None):
        self.parameter, self.positions, self.padding_idx = parameter, positions, padding_idx

    @staticmethod
    def of(t):
        """The elements of t, a view of a trainable parameter."""
        from .. import creation
        p = _viewed_parameter(t)
        flat = creation.arange(p.numel())
        return Gathered(p, flat.as_strided(tuple(t.shape), tuple(t.stride()), (t.data_ptr() - p.data_ptr()) //
                                           p.element_size()).contiguous())  # positions: viewed as any tensor

    shape = property(lambda self: self.positions.shape, doc="The shape of the elements.")
    ndim = property(lambda self: self.positions.ndim, doc="The number of their dimensions.")
    dtype = property(lambda self: self.parameter.dtype, doc="The parameter's dtype.")
    device = property(lambda self: self.parameter.device, doc="The parameter's device.")
    requires_grad = property(lambda self: True, doc="True: the parameter trains through them.")

    def size(self, dim=None):
        """The shape, or the size of dimension dim."""
        return self.positions.size(dim) if dim is not None else self.positions.size()

    def dim(self):
        """The number of dimensions."""
        return self.ndim

    def numel(self):
        """The number of elements."""
        return self.positions.numel()

    def to(self, *args, **kwargs):
        """Itself, to its own dtype and device; to any other is refused (a copy would not train)."""
        from .. import creation
        converted = creation.zeros((), dtype=self.dtype, device=self.device).to(*args, **kwargs)
        if converted.dtype != self.dtype or converted.device != self.device:
            fail("a conversion of a trainable parameter's elements to another dtype or device", "the copy would not "
                 "train: keep the parameter's dtype (the program chooses what it computes in)")
        return self

    def float(self):
        """Itself, of a float32 parameter (see to)."""
        return self.to(_dtype("float32"))

    def type_as(self, other):
        """self.to(other.dtype)."""
        return self.to(other.dtype)

    @property
    def T(self):
        """The elements with their dimensions reversed."""
        return Gathered(self.parameter, self.positions.T, self.padding_idx)

    mT = T

    def traced(self, like_shape):
        """The elements as a traced value for one of per-sample shape like_shape: leading size-1 dimensions beyond
        that rank are the batch's broadcast, as a constant's (see constant)."""
        import numpy as np
        pos = self.positions
        while pos.ndim > len(like_shape) and pos.shape[0] == 1:
            pos = pos.squeeze(0)
        if pos.ndim > len(like_shape):
            fail(f"a tensor of shape {tuple(self.positions.shape)} in a value of shape {(N, *like_shape)}",
                 "a tensor used in forward must be the same for every sample")
        p = self.parameter
        if p.ndim != 2:
            fail(f"a part or a permutation of a trainable {p.ndim}-d parameter used as a value", "use the whole "
                 "parameter, a range of its rows, or a 2-d table (its elements at any positions train)")
        rows, cols = np.divmod(np.asarray(pos.contiguous()), p.shape[1])
        column, picked = self._columns(rows, cols, p.shape[1])
        from .. import creation
        from . import functional as F
        ids = rows if column is None else rows.take(0, column)
        value = F.embedding(constant(creation.tensor(np.ascontiguousarray(ids), device=p.device), ids.shape), p,
                            self.padding_idx).reshape(N, *ids.shape, p.shape[1])  # a range of rows keeps its 1s
        if picked != slice(None):
            value = value[(slice(None),) * (ids.ndim + 1) + (picked,)]
        if column is None:  # one column: its dimension goes
            return value.reshape(N, *ids.shape)
        k = ids.ndim
        return value if column == k else value.permute(0, *(1 + d for d in (*range(column), k, *range(column, k))))

    @staticmethod
    def _columns(rows, cols, D):
        """(the dimension along which the positions run through the columns of one row of D, the slice of the
        columns they take: the same at every other index), preferring one of every column; (None, that column)
        for positions all in one column. Fails for other positions."""
        import numpy as np
        found = None
        for d in reversed(range(rows.ndim)):
            along = np.moveaxis(cols, d, -1).reshape(-1, cols.shape[d])
            c = along[0] if len(along) else None
            step = int(c[1] - c[0]) if c is not None and len(c) > 1 else 1
            if c is not None and step >= 1 and (c == c[0] + step * np.arange(len(c))).all() and (along == c).all() \
                    and (rows == rows.take([0], d)).all():
                found = d, slice(int(c[0]), int(c[-1]) + 1, step)
                if c[0] == 0 and step == 1 and len(c) == D:  # every column: no slice
                    return d, slice(None)
        if found is None and cols.size and (cols == cols.flat[0]).all():
            found = None, slice(int(cols.flat[0]), int(cols.flat[0]) + 1)
        if found is None:
            fail("a trainable parameter's elements at positions that are neither rows nor evenly spaced columns "
                 "of them used as a value", "read whole rows (table[index], F.embedding(index, table)) and move "
                 "their last dimension where it goes (.permute(2, 0, 1))")
        return found

    def common(self):
        """The elements as a value of the parameters alone (Common), which computes on them: positions of a view
        or a copy of one (any part of the parameter), or a 2-d table's rows at any positions."""
        import numpy as np
        pos, p = np.asarray(self.positions), self.parameter
        found = _factored(pos.ravel()) if pos.size else None
        if found is not None and min(found[2]) >= 0:  # (rows picked backwards gather as rows do)
            return _part(p, *found, Common(_common_node(p, tuple(p.shape)))).reshape(pos.shape)
        return Common(_as_common(self.traced(tuple(pos.shape))))

    def __getattr__(self, name):
        if name.startswith("__"):  # protocol probes see a plain object, computing nothing
            raise AttributeError(name)
        return getattr(self.common(), name)

    def __neg__(self):
        return -self.common()


def _moves_positions(name):
    def method(self, *args, **kwargs):
        return Gathered(self.parameter, getattr(self.positions, name)(*args, **kwargs), self.padding_idx)
    method.__name__ = name
    method.__doc__ = f"Tensor.{name} of the elements: of their positions."
    return method


def _operator_of_traced(name):
    def method(self, other):
        if isinstance(other, Symbolic):
            return NotImplemented  # the traced value's reflected operator takes it
        return getattr(self.common(), name)(other)
    method.__name__ = name
    return method


for _name in ("view", "reshape", "permute", "transpose", "t", "contiguous", "unsqueeze", "squeeze", "flatten",
              "unflatten", "expand", "repeat", "flip", "roll", "narrow", "movedim", "swapaxes", "clone",
              "__getitem__"):
    setattr(Gathered, _name, _moves_positions(_name))
for _name in ("add", "sub", "mul", "truediv", "matmul", "pow"):
    for _side in ("", "r"):
        setattr(Gathered, f"__{_side}{_name}__", _operator_of_traced(f"__{_side}{_name}__"))
del _name, _side


def _masked(value, mask, fill):
    """The traced value where the traced bool mask is false, the number fill where it holds (a MaskedFill)."""
    if value.node.shape is None or len(mask.node.shape) != len(value.node.shape) or any(
            m not in (v, 1) for m, v in zip(mask.node.shape, value.node.shape)):
        fail(f"a mask of shape {mask.shape} for values of shape {value.shape}", "give the mask the values' "
             "dimensions, each of their size or 1 (a padding mask (N, T) of scores (N, H, T, T) is "
             "mask[:, None, None, :])")
    return Symbolic.record(_layers().MaskedFill(float(fill)), [value, mask], value.node.shape)


def _as_mask(x, what="a condition of traced values other than a bool mask"):
    """x as a bool mask: itself, or the mask whose 0/1 floats an expand of it holds (pad.unsqueeze(-1).expand(...),
    which masked fills and | and & broadcast by themselves); else fails, saying `what`."""
    if isinstance(x, Symbolic) and x._is_mask():
        return x
    n, layers = x.node if isinstance(x, Symbolic) else None, _layers()
    floats = n.inputs[0] if n is not None and isinstance(n.module, layers.Expand) else None
    if floats is not None and isinstance(floats.module, layers.Math) and floats.module.op == "mul" and \
            floats.inputs[0].dtype is _dtype("bool"):
        return Symbolic(floats.inputs[0])
    fail(what, "compare to make one: ids == pad, x > 0")


def _where_traced(condition, input, other):
    """where() of a condition computed from traced values (a padding mask of each sample): each traced operand
    kept where it is chosen and 0 elsewhere, a number filled where it is chosen. The operands broadcast against
    each other and the mask (a learned mask token (D,) over (N, T, D) values)."""
    from .._C import TensorBase
    condition = _as_mask(condition)
    operands = []
    for v in (input, other):
        if isinstance(v, TensorBase) and v.ndim == 0:
            v = v.item()
        if not isinstance(v, (Symbolic, TensorBase, numbers.Real)):
            raise TypeError(f"where: expected a tensor or a number, got {type(v).__name__}")
        operands.append(v)
    shapes = [t.node.shape for t in (condition, *operands) if isinstance(t, Symbolic)]
    shape = tuple(map(max, zip(*shapes))) if len({len(s) for s in shapes}) == 1 else condition.node.shape
    operands = [constant(v, shape) if isinstance(v, TensorBase) else v for v in operands]
    operands = [_layers().Expand(shape)(v) if isinstance(v, Symbolic) and len(v.node.shape) == len(shape) and
                v.node.shape != shape else v for v in operands]
    (a, b), keep = operands, ~condition
    if isinstance(a, Symbolic) and isinstance(b, Symbolic):
        return _masked(a, keep, 0.0) + _masked(b, condition, 0.0)
    if isinstance(a, Symbolic):
        return _masked(a, keep, b)
    if isinstance(b, Symbolic):
        return _masked(b, condition, a)
    return _masked(_masked(condition._floats(), condition, a), keep, b)


def _sample_mask(mask, shape):
    """A bool tensor the same for every sample as a mask of samples of `shape` (its sizes or 1), or None: leading
    size-1 dimensions beyond the sample's rank dropped (a causal mask (1, 1, T, T)), missing ones added."""
    sizes = tuple(mask.shape)
    while len(sizes) > len(shape) and sizes[0] == 1:
        sizes = sizes[1:]
    sizes = (1,) * (len(shape) - len(sizes)) + sizes
    if len(sizes) != len(shape) or any(m not in (s, 1) for m, s in zip(sizes, shape)):
        return None
    return mask.reshape(sizes).contiguous()


def where(condition, input, other):
    """input where condition (a bool tensor, the same for every sample, or a mask computed from traced values)
    holds, else other. With a tensor condition, a traced operand and a number are a masked fill of the number by
    the condition as a constant; otherwise each traced operand is 0 where it is not chosen (a masked fill, so that
    an infinite value there does not become NaN), each constant operand written where it is chosen and 0
    elsewhere, and the two added."""
    from .._C import TensorBase
    from .. import _math
    chosen = (condition, input, other)
    if any(isinstance(v, Common) for v in chosen):  # values of the parameters alone: with the samples' or alone
        rank = max((len(v.node.shape) for v in chosen if isinstance(v, Symbolic)), default=None)
        return common(where(*(v if not isinstance(v, Common) else v.value if rank is None else  # of the samples' rank
                              v._of_rank(rank) for v in chosen)))
    if any(isinstance(v, Symbolic) and v.dtype.name.startswith(("int", "uint")) for v in (input, other)):
        fail("ft.where (or masked_fill) of integer values (token ids, labels)", "a compiled program computes no "
             "integer values: choose between embeddings instead, ft.where(drop[:, None], self.null_embedding, "
             "self.embed(y)) (classifier-free guidance's dropped labels), or change the ids in the data"
             + _CLASS_ROWS)
    if isinstance(condition, Symbolic):
        return _where_traced(condition, input, other)
    if not isinstance(condition, TensorBase) or condition.dtype.name != "bool":
        raise TypeError(f"where: expected condition to be a bool tensor, got {type(condition).__name__}")
    fills = [v.item() if isinstance(v, TensorBase) and v.ndim == 0 else v for v in (input, other)]
    for value, fill, held in ((input, fills[1], lambda: ~condition), (other, fills[0], lambda: condition)):
        if isinstance(value, Symbolic) and value.node.shape is not None and isinstance(fill, numbers.Real):
            # a masked fill by a mask the same for every sample (a causal mask): one node reading it
            mask = _sample_mask(held(), value.node.shape)
            if mask is not None:
                return Symbolic.record(_layers().MaskedFill(float(fill), mask), [value], value.node.shape)
    parts = []
    for value, chosen in ((input, condition), (other, ~condition)):
        if not isinstance(value, Symbolic):
            parts.append(_math.where(chosen, value, 0.0))
            continue
        # 0 written where not chosen, selected (an infinite value there must not turn the sum into NaN)
        off = _sample_mask(~chosen, value.node.shape) if value.node.shape is not None else None
        parts.append(Symbolic.record(_layers().MaskedFill(0.0, off), [value], value.node.shape) if off is not None
                     else value * _math.where(chosen, 1.0, 0.0))
    return parts[1] + parts[0] if isinstance(parts[1], Symbolic) else parts[0] + parts[1]


def einsum(equation, operands):
    """Traced torch.einsum of one or two operands, spaces removed from the equation. A traced operand's first
    index is the batch, which leads the output; a tensor operand (a parameter, a constant) has none. An index only
    one operand has and the output lacks is summed first. Two operands that share an index the output lacks
    multiply as matrices (a matmul over the indices both keep, heads included: "bhqd,bhkd->bhqk"; a 2-d tensor is
    x @ W or x @ W.T); otherwise they multiply elementwise, broadcast over the output's indices, and sum."""
    from .._C import TensorBase
    inputs, arrow, out = equation.partition("->")
    subs = inputs.split(",")
    if "." in equation:
        fail("einsum with an ellipsis", "write every index out")
    if len(subs) != len(operands) or len(operands) not in (1, 2):
        fail(f"einsum of {len(operands)} operands as {equation!r}", "give one or two operands, one subscript each")
    if not arrow:  # implicit: the indices appearing once, in alphabetical order
        out = "".join(sorted(c for c in set(inputs) if c != "," and inputs.count(c) == 1))
    if not any(isinstance(x, Symbolic) for x in operands):  # values of the parameters alone: the first (Common)
        k = next(i for i, x in enumerate(operands) if isinstance(x, Common))  # as traced, of a batch index of its own
        b = next(c for c in "zyxwvutsrqponmlkjihgfedcba" if c not in equation)
        subs[k] = b + subs[k]
        return common(einsum(f"{','.join(subs)}->{b}{out}", [x.value if i == k else x for i, x in enumerate(operands)]))
    batch = {s[0] for s, x in zip(subs, operands) if isinstance(x, Symbolic) and s}
    sizes = {}
    for s, x in zip(subs, operands):
        if not isinstance(x, (Symbolic, TensorBase, Gathered, Common)):  # (a gathered table: BERT's relative_key)
            raise TypeError(f"einsum: expected tensors, got {type(x).__name__}")
        traced = isinstance(x, Symbolic)
        shape = (None, *x.node.shape) if traced else tuple(x.shape)
        if len(s) != len(shape) or len(set(s)) != len(s) or not s.isalpha():
            fail(f"einsum subscripts {s!r} for an operand of {len(shape)} dimensions", "give one distinct letter per "
                 "dimension (a repeated index, a diagonal, cannot be recorded)")
        if not traced and batch & set(s):
            fail(f"einsum with a tensor indexed by the batch's {s!r}", "a tensor in forward is every sample's")
        for c, n in zip(s[1:] if traced else s, shape[1:] if traced else shape):
            if sizes.setdefault(c, n) != n:
                raise ValueError(f"einsum: index {c!r} has sizes {sizes[c]} and {n} in {equation!r}")
    if len(batch) != 1 or out[:1] != next(iter(batch)) or len(set(out)) != len(out) or set(out) - set(inputs):
        fail(f"einsum {equation!r}", "index the batch first in every traced operand and in the output, and give "
             "the output distinct indices of the operands")

    def summed(x, s, others):  # the indices only x has, summed away
        drop = [i for i, c in enumerate(s) if c not in out and all(c not in o for o in others)]
        return (x.sum(drop), "".join(c for i, c in enumerate(s) if i not in drop)) if drop else (x, s)

    def arranged(x, s, order, shape=None):  # a traced x in the indices' order, then reshaped
        order = "".join(order)
        x = x if s == order else x.permute(0, *(s.index(c) for c in order[1:]))
        return x if shape is None else x.reshape(N, *shape)

    ops = []
    for i, (s, x) in enumerate(zip(subs, operands)):
        ops.append(summed(x, s, subs[:i] + subs[i + 1:]))
    if len(ops) == 1:
        return arranged(*ops[0], out)
    (a, sa), (b, sb) = ops if isinstance(ops[0][0], Symbolic) else ops[::-1]
    K = [c for c in sa if c in sb and c not in out]
    L = [out[0]] + [c for c in out[1:] if c in sa and c in sb]  # the batch, and the indices both keep
    M = [c for c in out[1:] if c in sa and c not in sb]
    P = [c for c in out[1:] if c in sb and c not in sa]
    prod = lambda cs: math.prod(sizes[c] for c in cs)  # noqa: E731
    if K and isinstance(b, Symbolic):
        A = arranged(a, sa, L + M + K, [sizes[c] for c in L[1:]] + [prod(M), prod(K)])
        B = arranged(b, sb, L + K + P, [sizes[c] for c in L[1:]] + [prod(K), prod(P)])
        if A.node is not B.node:  # (x @ x of one value has no node: it multiplies elementwise below)
            r = (A @ B).reshape(N, *(sizes[c] for c in L[1:] + M + P))
            return arranged(r, "".join(L + M + P), out)
    elif len(K) == 1 and len(P) == 1 and len(sb) == 2 and len(L) == 1:  # x @ W, or x @ W.T
        W = b if sb == K[0] + P[0] else b.T if _viewed_parameter(b) is not None else b.T.contiguous()
        r = arranged(a, sa, L + M + K, [prod(M), prod(K)]) @ W
        return arranged(r.reshape(N, *(sizes[c] for c in M + P)), "".join(L + M + P), out)
    U = out + "".join(K)  # broadcast to the output's indices and the summed ones, multiply, sum

    def spread(x, s):
        shape = [sizes[c] if c in s else 1 for c in U[1:]]
        if isinstance(x, Symbolic):
            return arranged(x, s, "".join(c for c in U if c in s), shape)
        if s != "".join(c for c in U if c in s):
            fail(f"einsum of a tensor indexed {s!r} in another order than {U!r}", "order the tensor's indices as "
                 "the output's, then the summed ones")
        return x.reshape(shape)
    r = spread(a, sa) * spread(b, sb)
    return r.sum(list(range(len(out), len(U)))) if K else r


def _transposed_parameter(t):
    """The 2-d trainable parameter whose transpose t is (self.weight.T, self.weight.t()), else None."""
    p = _viewed_parameter(t)
    if p is not None and p.ndim == 2 and t.ndim == 2 and p.data_ptr() == t.data_ptr() and \
            tuple(t.shape) == tuple(p.shape)[::-1] and tuple(t.stride()) == tuple(p.stride())[::-1]:
        return p
    return None


def _broadcast(a, b):
    """Traced values a and b of one shape, each expanded along its dimensions of size 1 where the other's are
    larger (NumPy's rule; both keep the batch first, so their ranks must agree)."""
    sa, sb = a.node.shape, b.node.shape
    if sa == sb or a.node.reduced or b.node.reduced:
        return a, b
    low = a if len(sa) < len(sb) else b if len(sb) < len(sa) else None
    if low is not None and low._uniform():  # a parameter's value (scale.exp()): aligned from the right, as NumPy's
        wide = low.reshape(N, *(1,) * abs(len(sa) - len(sb)), *low.node.shape)
        a, b = (wide, b) if low is a else (a, wide)
        sa, sb = a.node.shape, b.node.shape
    if len(sa) != len(sb):
        fail(f"broadcasting values of shapes {(N, *sa)} and {(N, *sb)}",
             "give both the same number of dimensions (unsqueeze the smaller)")
    if any(x != y and 1 not in (x, y) for x, y in zip(sa, sb)):
        raise ValueError(f"shapes {(N, *sa)} and {(N, *sb)} do not broadcast")
    shape = tuple(max(x, y) for x, y in zip(sa, sb))
    return tuple(x if x.node.shape == shape else _layers().Expand(shape)(x) for x in (a, b))


def _matrix(t):
    """A 2-d tensor (a parameter, or a constant) as a value node for @, the same for every sample."""
    from .._C import TensorBase
    if not isinstance(t, (TensorBase, Gathered)):
        return None
    if t.ndim != 2:
        fail(f"@ with a tensor of shape {tuple(t.shape)}", "multiply traced values by 2-d matrices")
    return t.traced(tuple(t.shape)) if isinstance(t, Gathered) else constant(t, tuple(t.shape))


def constant_like(x, value):
    from .. import creation
    t = creation.full(x.node.shape, value, device=_device_of(x))
    return constant(t, x.node.shape)


def _device_of(x):
    stack, seen = [x.node], set()
    while stack:
        n = stack.pop()
        if id(n) in seen:
            continue
        seen.add(id(n))
        m = n.module
        for p in (m.parameters() if m is not None else ()):
            return p.device
        stack.extend(n.inputs)
    return "cpu"


def target(shape=None, dtype=None):
    """The batch's targets as the loss sees them; shape (per sample) and dtype are fixed by the first loss that
    reads them unless given. Several targets (a multi-task loss's labels and boxes) when shape is a sequence of
    shapes: a tuple of them, dtype None or one for each."""
    shapes = input_shapes(shape) if shape is not None else (None,)
    if len(shapes) > 1:
        dtypes = dtype if isinstance(dtype, (tuple, list)) else (dtype,) * len(shapes)
        if len(dtypes) != len(shapes):
            raise ValueError(f"compile: target_dtype gives {len(dtypes)} dtypes for {len(shapes)} targets")
        return tuple(target(s, d) for s, d in zip(shapes, dtypes))
    if isinstance(dtype, (tuple, list)) and len(dtype) == 1:  # one target given as a tuple of one
        dtype = dtype[0]
    t = Symbolic(Node(_layers().Target(), [], None))
    if shape is not None:
        bind_target(t, shape, dtype)  # no dtype: the loss that reads them fixes it (float32 by default)
    return t


def bind_target(t, shape, dtype):
    """Fixes the per-sample shape and dtype of the targets `t` (a loss reading them as it needs them), or checks
    them against what an earlier use fixed."""
    from .._types import as_dtype
    if not isinstance(t, Symbolic) or not isinstance(t.node.module, _layers().Target):
        fail(f"a loss reading {t!r} as its targets", "pass the loss the targets as compile gives them")
    shape, dtype, m = tuple(shape), None if dtype is None else as_dtype(dtype), t.node.module
    if t.node.shape is None:
        t.node.shape, m.dtype = shape, dtype
    elif t.node.shape == shape and None in (dtype, m.dtype) or (t.node.shape, m.dtype) == (shape, dtype):
        m.dtype = m.dtype or dtype
    else:
        def read(dt, sh):
            return f"{'values' if dt is None else dt.name} of per-sample shape {sh}"
        raise TracingError(f"the targets are read as {read(dtype, shape)} at {_user_line()}, but as "
                           f"{read(m.dtype, t.node.shape)} elsewhere (a loss reading them, or compile's "
                           "target_shape= and target_dtype=): a compiled program reads its targets in one shape and "
                           "dtype, so compute other forms from them (class labels as F.one_hot(y, C).float())")
    if m.dtype is not None and not m.dtype.is_floating_point:
        m.labelled = m.labelled or _user_line()


def Input(shape, dtype=None):
    """The model's input, of per-sample shape `shape` (e.g. (1, 28, 28); () for one value per sample, as a
    class label) and dtype (float32, int64 token ids or labels, bool masks)."""
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    if any(not isinstance(n, int) or n < 1 for n in shape):
        raise ValueError(f"an input shape is a tuple of positive sizes per sample, got {shape}")
    node = Node(None, [], shape)
    node.dtype = dtype
    return Symbolic(node)


def cat(tensors, dim=1):
    """Concatenates traced values (and tensors, as constants) along a dimension other than the batch's."""
    def value(t):  # a tensor keeps its own shape (a class token), without the batch's leading 1
        shape = tuple(t.shape)
        return constant(t, shape[1:] if len(shape) == traced.ndim and shape[0] == 1 else shape)

    tensors = list(tensors)
    traced = next((t for t in tensors if isinstance(t, Symbolic)), None)  # a tensor may come first: cat([cls, x])
    if traced is None:  # values of the parameters alone (and tensors): dimensions of their own
        values = [t if isinstance(t, Common) else common_value(t) for t in tensors]
        return common(_layers().Cat(values[0]._own(dim))(*[v.value for v in values]))
    tensors = [t.for_samples(len(traced.node.shape)) if isinstance(t, Common) else t for t in tensors]
    if dim in (0, -traced.ndim):
        fail("ft.cat of traced values along the batch dimension (dim=0)", "a program computes each sample on its "
             "own, so two batches cannot be joined in it: concatenate the data before the step (np.concatenate), "
             "or join each sample's values along another dimension")
    return _layers().Cat(dim)(*[t if isinstance(t, Symbolic) else value(t) for t in tensors])


def _call(fn, what, *args):
    """fn(*args) on traced values, with a tensor-only function's failure turned into a TracingError naming the
    user's line."""
    try:
        return fn(*args)
    except TracingError:
        raise
    except (AttributeError, TypeError) as e:  # a tensor-only function met a traced value
        tb = traceback.extract_tb(sys.exc_info()[2])
        where = next((f"{f.filename}:{f.lineno}: {(f.line or '').strip()}" for f in reversed(tb)
                      if not os.path.abspath(f.filename).startswith(_PACKAGE + os.sep)), "<unknown>")
        raise TracingError(f"{what} cannot be compiled (at {where}): {e}") from e


def input_shapes(input_shape):
    """compile's input_shape as a tuple of per-sample shapes, one for each input of forward: several when it is a
    sequence of shapes ((T,), (T,)), else one."""
    many = isinstance(input_shape, (tuple, list)) and input_shape and \
        all(isinstance(s, (tuple, list)) for s in input_shape)
    return tuple(input_shape) if many else (input_shape,)


def trace(model, inputs):
    """The outputs of model's forward on `inputs` (Input values, one for each of its inputs): one Symbolic, or a
    tuple of them (the first is what predict returns) in which others may be None (nanoGPT's (logits, None) when
    no targets are given)."""
    try:
        params = list(inspect.signature(model.forward).parameters.values())
    except (TypeError, ValueError):  # a forward without a signature
        params = []
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    more = [p.name for p in positional[len(inputs):] if p.default is p.empty]
    name = type(model).__name__
    if more:
        raise TracingError(f"{name}.forward takes {', '.join(more)} besides the {len(inputs)} input(s) compile was "
                           "given shapes of: give input_shape=(shape of each input, ...) (and input_dtype=(...)) to "
                           "feed batches (x1, x2, ..., y) to all of them, or defaults (hidden=None) to those made in "
                           "forward")
    if positional and len(positional) < len(inputs) and not any(p.kind == p.VAR_POSITIONAL for p in params):
        raise TracingError(f"compile was given {len(inputs)} input shapes, but {name}.forward takes "
                           f"{len(positional)} input(s)")
    with tracing(model, inputs):
        out = _call(model, f"{name}.forward", *inputs)
        leaves = _output_leaves(out)
        for o in leaves:
            if isinstance(o, Symbolic):
                o.read()
    if isinstance(out, dict):
        raise TracingError(f"{name}.forward returned a dict: return a tuple (or a namedtuple) whose first item is "
                           "what predict returns; the loss gets it whole")
    first = out[0] if isinstance(out, (tuple, list)) and out else out
    if isinstance(first, Common):
        raise TracingError(f"{name}.forward returned a value of the parameters alone (of shape {first.shape}), "
                           "the same for every sample: compute the output from the input")
    # (an RNN's h_n goes, and a value of the parameters alone for the loss: open_clip's logit_scale.exp())
    bad = [o for o in leaves if not isinstance(o, (Symbolic, _Refusing, Common)) and o is not None]
    if not isinstance(first, Symbolic) or bad:
        bad = first if not isinstance(first, Symbolic) else bad[0]
        kind, held = (("scores merged with the batch (x.view(-1, C))" if isinstance(v, MergedRows) else
                       type(v).__name__) for v in (out, bad))
        what = kind if out is bad else f"a {kind} whose first item is {held}" if bad is first else \
            f"a {kind} holding a {held}"
        hint = "return the (N, T, C) scores and view them in the loss" if isinstance(bad, MergedRows) else \
            "return the output (a traced value of the input), or a tuple of outputs (nested tuples and None " \
            "too) whose first is what predict returns; the loss, given to compile, gets it whole"
        raise TracingError(f"{name}.forward returned {what}: {hint}")
    return out


def _output_leaves(out):
    """The values of a forward's output: itself, or those of its (nested) tuples and lists."""
    if isinstance(out, (tuple, list)):
        return [leaf for o in out for leaf in _output_leaves(o)]
    return [out]


def _reads_targets(loss):
    """Whether loss takes targets: all but a function (or a module's forward) that takes one argument (a GAN's
    loss, an energy)."""
    from .modules import Module
    try:
        params = inspect.signature(loss.forward if isinstance(loss, Module) else loss).parameters.values()
    except (TypeError, ValueError):
        return True
    return len([p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)]) != 1 \
        or any(p.kind is p.VAR_POSITIONAL for p in params)


def trace_loss(loss, outputs, targets):
    """The loss Symbolic of loss(outputs, targets), or of loss(outputs) for a loss of one parameter: reduced over
    the batch, one value."""
    name = getattr(loss, "__name__", type(loss).__name__)
    each = [t.node.module for t in (targets if isinstance(targets, tuple) else (targets,))]  # (y.div_(255) rebinds y)
    try:
        value = _call(loss, f"the loss {name}", outputs, *[targets] if _reads_targets(loss) else [])
    except (TracingError, ValueError) as e:
        if not any(m.assumed for m in each):
            raise
        raise type(e)(f"{e} (the targets were taken as one value per sample, by F.one_hot or a view, before a loss "
                      "read their shape: if each sample has more, give compile(..., target_shape=))") from e
    for m in each:
        if m.floated and m.labelled:  # a program reads its targets in one dtype
            raise TracingError(f"the targets are read as {m.dtype.name} labels at {m.labelled} and as float values "
                               f"(y.float()) at {m.floated}: a compiled program reads its targets in one dtype, so "
                               "one tensor cannot be both yet; compute the float term from the labels' one-hot rows "
                               "(F.one_hot(y, C).float()) or from the model's outputs")
    value = internal(value)  # a loss of the parameters alone
    if not isinstance(value, Symbolic):
        raise TracingError(f"the loss {name} returned {type(value).__name__}, not a traced value of the outputs")
    if value._uniform_scalar():  # a loss of the parameters alone (a penalty): the same value in every sample
        value = value._as_loss()
    if not value.node.reduced:
        raise TracingError(f"the loss {name} returned per-sample values of shape {value.shape}, not one loss: "
                           "reduce them (.mean(), .sum(), or a loss with reduction='mean')")
    return value


def topological(outputs, rank=lambda n: 0):
    """The nodes that `outputs` depend on, each after its inputs: the inputs first, then by rank(node) and in the
    order forward recorded them, where that allows (a batch norm called on a, then on b, updates its statistics in
    that order, as PyTorch's, whatever order the loss reads the outputs in)."""
    nodes, stack = {}, list(outputs)
    while stack:
        n = stack.pop()
        if id(n) not in nodes:
            nodes[id(n)] = n
            stack.extend(n.inputs)
    waiting = {k: len({id(i) for i in n.inputs}) for k, n in nodes.items()}
    readers = {k: [] for k in nodes}
    for k, n in nodes.items():
        for i in {id(i): i for i in n.inputs}:
            readers[i].append(n)
    ready = [(n.module is not None, rank(n), n.seq, k) for k, n in nodes.items() if not waiting[k]]
    heapq.heapify(ready)
    order = []
    while ready:
        n = nodes[heapq.heappop(ready)[-1]]
        order.append(n)
        for r in readers[id(n)]:
            waiting[id(r)] -= 1
            if not waiting[id(r)]:
                heapq.heappush(ready, (r.module is not None, rank(r), r.seq, id(r)))
    return order
