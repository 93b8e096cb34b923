"""Layers with PyTorch's names, arguments, defaults, initialisation and
state_dict keys. A layer called on a tensor runs eagerly (forward only); called
on a symbolic ft.nn.Input it records a graph node, and model.compile() turns the
graph into a C program that trains with no Python per step."""
import copy
import functools
import inspect
import math
import re
import sys
from collections import OrderedDict, namedtuple

from .. import _C, creation
from .._C import TensorBase
from .._tensor import Tensor
from .._types import _BY_NAME, as_device, as_dtype, dtype as _dtype
from . import init
from .graph import (N, Common, MergedRows, Stacked, Symbolic, _active, common, internal, traced_mode,
                    uses_trainable)


class Parameter(Tensor):
    """A tensor that is a module's trainable parameter, as torch.nn.Parameter: assigned to a Module attribute it
    is registered (named_parameters, state_dict, the optimizer's parameters, compile). It shares the memory of
    the tensor it is made from. requires_grad=False freezes it: a compiled program computes no gradient for it."""

    __slots__ = ()

    def __new__(cls, data=None, requires_grad=True):
        if data is None:
            data = creation.empty(0)
        if not isinstance(data, TensorBase):
            raise TypeError(f"Parameter wraps a fasttrain Tensor, got {type(data).__name__}")
        p = data.as_strided(data.shape, data.stride(), data.storage_offset())  # a new object, the same memory
        p.__class__ = cls
        p.requires_grad = requires_grad
        return p

    def __repr__(self):
        return "Parameter containing:\n" + super().__repr__()


IncompatibleKeys = namedtuple("IncompatibleKeys", ["missing_keys", "unexpected_keys"])
IncompatibleKeys.__doc__ = """What load_state_dict(strict=False) left out: the model's names the state lacks, and
the state's names the model lacks (PyTorch's _IncompatibleKeys, a tuple)."""


def _is_counter(name):
    """Whether a state_dict key is a batch norm's count of training forwards, which PyTorch's checkpoints may lack."""
    return name == "num_batches_tracked" or name.endswith(".num_batches_tracked")


def _overrides_forward(cls):
    """Whether a class outside fasttrain defines the forward of this layer class (a user's subclass of a layer the
    compiler knows, such as timm's StdConv2d or BatchNormAct2d): traced through that forward, not as the layer."""
    owner = next(c for c in cls.__mro__ if "forward" in c.__dict__)
    return not owner.__module__.startswith("fasttrain.")


class Module:
    """Base of every layer: parameters, buffers, children, train/eval mode."""

    def __init__(self):
        object.__setattr__(self, "_parameters", OrderedDict())
        object.__setattr__(self, "_buffers", OrderedDict())
        object.__setattr__(self, "_modules", OrderedDict())
        object.__setattr__(self, "_computed", {})  # attributes computed at each access (nn.utils.weight_norm)
        object.__setattr__(self, "training", True)

    @property
    def training(self):
        """Whether the module is in training mode (train(), eval()): dropout and batch norm behave differently in the
        two. A forward compiled reading it is traced in both modes (predict and evaluate run the eval-mode one)."""
        mode = self.__dict__["_training"]
        return traced_mode(sys._getframe(1), self, mode) if _active else mode

    @training.setter
    def training(self, mode):
        self.__dict__["_training"] = mode

    def __setattr__(self, name, value):
        """As PyTorch's: a Parameter or a Module registers under name (a replaced one keeps its place in the
        order), a tensor or None assigned to a buffer's name replaces the buffer, and a parameter or child name
        takes only its own kind or None."""
        if "_modules" not in self.__dict__:
            raise AttributeError(f"cannot assign {name!r} to {type(self).__name__} before Module.__init__() has run: "
                                 "call super().__init__() first in __init__")
        if isinstance(value, Parameter):
            return self.register_parameter(name, value)
        if isinstance(value, Module):
            return self._register(name, value, "_modules")
        for table, kind in (("_parameters", "nn.Parameter"), ("_modules", "nn.Module"), ("_buffers", "Tensor")):
            if name in self.__dict__[table]:
                if value is not None and not (table == "_buffers" and isinstance(value, TensorBase)):
                    raise TypeError(f"cannot assign {type(value).__name__} as {table[1:-1].replace('module', 'child')}"
                                    f" {name!r} ({kind} or None expected)")
                return self._register(name, value, table)
        object.__setattr__(self, name, value)

    def __getattr__(self, name):
        computed = self.__dict__.get("_computed")
        if computed and name in computed:
            return computed[name](self)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __delattr__(self, name):
        for table in ("_parameters", "_buffers", "_modules"):
            self.__dict__[table].pop(name, None)
        object.__delattr__(self, name)

    def _register(self, name, value, table):
        """value under name in table, where an earlier one of the same name kept its place."""
        for other in ("_parameters", "_buffers", "_modules"):
            if other != table:
                self.__dict__[other].pop(name, None)
        self.__dict__.pop(name, None)
        self.__dict__[table][name] = value
        object.__setattr__(self, name, value)

    def register_parameter(self, name, tensor):
        """Registers tensor (made a Parameter if it is not one) under name; None keeps the name for an absent
        parameter (a layer without bias)."""
        if tensor is not None and not isinstance(tensor, Parameter):
            tensor = Parameter(tensor)
        self._register(name, tensor, "_parameters")

    def add_module(self, name, module):
        """Registers module (or None) as a child under name, as torch.nn.Module.add_module."""
        if not isinstance(name, str) or not name or "." in name:
            raise KeyError(f"module name must be a non-empty string without '.', got {name!r}")
        if module is not None and not isinstance(module, Module):
            raise TypeError(f"{type(module).__name__} is not a Module subclass")
        self._register(name, module, "_modules")

    register_module = add_module

    def apply(self, fn):
        """Calls fn(module) on every submodule, children before their parent, then on this module, and returns
        this module, as torch.nn.Module.apply (e.g. to initialise weights by layer type)."""
        for child in self.children():
            child.apply(fn)
        fn(self)
        return self

    def zero_grad(self, set_to_none=True):
        """Clears every parameter's gradient: to None (PyTorch's default; a compiled program then writes the next
        gradients anew), or to zeros in place with set_to_none=False."""
        for p in self.parameters():
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()

    def requires_grad_(self, requires_grad=True):
        """Sets requires_grad of every parameter (False freezes the module for programs compiled after)."""
        for p in self.parameters():
            p.requires_grad = requires_grad
        return self

    def register_buffer(self, name, tensor, persistent=True):
        """Registers tensor under name as a buffer: state that is moved by to(), but not a parameter (BatchNorm's
        running statistics). None keeps the name for an absent buffer. As PyTorch's, a persistent buffer is saved
        in state_dict (and checkpoints); persistent=False keeps it out (a causal mask, a RoPE cache)."""
        self._register(name, tensor, "_buffers")
        transient = self.__dict__.setdefault("_non_persistent", set())
        (transient.discard if persistent else transient.add)(name)

    # ---- traversal ----
    def named_modules(self, memo=None, prefix="", remove_duplicate=True):
        """(name, module) pairs of this module (named prefix) and every module below it, depth first, with dotted names;
        a module reachable along several paths comes once, under its first name, unless remove_duplicate=False (as
        PyTorch's; memo: the ids of modules to leave out)."""
        memo = set() if memo is None else memo
        if remove_duplicate:
            if id(self) in memo:
                return
            memo.add(id(self))
        yield prefix, self
        for name, child in self._modules.items():
            if child is not None:
                yield from child.named_modules(memo, f"{prefix}.{name}" if prefix else name, remove_duplicate)

    def modules(self):
        """This module and every module below it, depth first, each once (the modules of named_modules)."""
        return (m for _, m in self.named_modules())

    def named_children(self):
        """(name, module) of the direct child modules, in the order they were assigned; a child assigned under
        several names comes once, under its first (as PyTorch's)."""
        seen = set()
        for k, m in self._modules.items():
            if m is not None and id(m) not in seen:
                seen.add(id(m))
                yield k, m

    def children(self):
        """The direct child modules, in the order they were assigned."""
        return (m for _, m in self.named_children())

    def get_submodule(self, target):
        """The module at a dotted path of child names ("" is this module), as PyTorch's."""
        module = self
        for name in target.split(".") if target else ():
            child = module._modules.get(name)
            if child is None:
                raise AttributeError(f"{type(module).__name__} has no submodule {name!r} (in {target!r})")
            module = child
        return module

    def _named(self, table, prefix, recurse, remove_duplicate):
        seen = set()
        modules = self.named_modules(prefix=prefix, remove_duplicate=remove_duplicate) if recurse else [(prefix, self)]
        for path, module in modules:
            for name, t in getattr(module, table).items():
                if t is None or (remove_duplicate and id(t) in seen):
                    continue
                seen.add(id(t))
                yield (f"{path}.{name}" if path else name), t

    def named_parameters(self, prefix="", recurse=True, remove_duplicate=True):
        """(name, parameter) pairs, names under prefix, of this module's own parameters and (recurse) its
        children's; a parameter shared by several modules (tied weights) comes once, under its first name, unless
        remove_duplicate=False (as PyTorch)."""
        return self._named("_parameters", prefix, recurse, remove_duplicate)

    def parameters(self, recurse=True):
        """The parameters of this module and (recurse) its children, each once (see named_parameters)."""
        return (p for _, p in self.named_parameters(recurse=recurse))

    def named_buffers(self, prefix="", recurse=True, remove_duplicate=True):
        """(name, buffer) pairs of this module and (recurse) its children with dotted names under prefix; a buffer
        shared by several modules comes once (unless remove_duplicate=False), and absent (None) buffers are left
        out."""
        return self._named("_buffers", prefix, recurse, remove_duplicate)

    def buffers(self, recurse=True):
        """The buffers of this module and (recurse) its children, each once (see named_buffers)."""
        return (b for _, b in self.named_buffers(recurse=recurse))

    # ---- devices ----
    def to(self, *args, device=None, dtype=None, non_blocking=False, memory_format=None):
        """Moves every parameter and buffer to a device and/or converts the floating-point ones to a dtype in place,
        as PyTorch's Module.to(device), to(dtype), to(device, dtype) and to(tensor) (its device and dtype); returns
        self. The tensor objects stay the same, so build optimizers and compile after moving (they bind the memory
        they see then). non_blocking is taken and changes nothing. memory_format (ft.channels_last,
        ft.contiguous_format) is the layout compile gives the model's images unless told otherwise."""
        if memory_format is not None:
            from .._types import check_memory_format
            check_memory_format("to", memory_format)
        if len(args) > 2:
            raise TypeError(f"to() takes a device, a dtype, both, or a tensor, got {len(args)} arguments")
        for a in args:
            if isinstance(a, TensorBase):
                device, dtype = a.device, a.dtype
            elif isinstance(a, _dtype):
                dtype = a
            else:
                device = a
        dev = None if device is None else as_device(device)  # both checked before anything changes
        if dtype is not None:
            dtype = as_dtype(dtype)
            if not dtype.is_floating_point:
                raise TypeError(f"nn.Module.to only accepts floating point dtypes, but got desired dtype={dtype}")
        if memory_format is not None:
            object.__setattr__(self, "_memory_format", memory_format)
        return self._convert(dtype, dev)

    def _convert(self, dtype=None, device=None):
        """Converts every floating-point parameter and buffer (and gradient) to dtype and moves every one to
        device, in place, as PyTorch's Module.to: the tensor objects stay the same, integer buffers
        (num_batches_tracked) keep their dtype. Returns self."""
        for t in list(dict.fromkeys(list(self.parameters()) + list(self.buffers()))):
            to = dtype if dtype is not None and t.dtype.is_floating_point else t.dtype
            at = t.device if device is None else device
            if to is not t.dtype or at != t.device:
                t._rebind(creation.empty(max(t.numel(), 1), dtype=to, device=at), 0)
                if t.grad is not None:
                    t.grad = t.grad.to(at).to(to)
        for m in self.modules():
            m.__dict__.pop("_flat", None)  # the model's flat buffers no longer hold its parameters
        return self

    def cuda(self, device=None):
        """Moves the module to a CUDA device (default cuda:0) in place, as to(); returns self."""
        return self.to("cuda" if device is None else device)

    def cpu(self):
        """Moves the module to the CPU in place, as to(); returns self."""
        return self.to("cpu")

    # ---- dtypes ----

    def half(self):
        """Converts the floating-point parameters and buffers to float16 in place, as PyTorch's Module.half();
        returns self. For eager use: compile() refuses a model whose parameters are not float32 (a compiled
        program keeps float32 weights); to train in low precision, keep the model float32 and compile with
        precision="bf16-mixed" (docs/precision.md). Build optimizers after converting, as after to()."""
        return self._convert(_BY_NAME["float16"])

    def bfloat16(self):
        """Converts the floating-point parameters and buffers to bfloat16 in place, as PyTorch's
        Module.bfloat16(); returns self. For eager use, as half(): to train in bfloat16, keep the model float32
        and compile with precision="bf16-mixed"."""
        return self._convert(_BY_NAME["bfloat16"])

    def float(self):
        """Converts the floating-point parameters and buffers to float32 in place, as PyTorch's Module.float()
        (undoing half() or bfloat16()); returns self."""
        return self._convert(_BY_NAME["float32"])

    def double(self):
        """Converts the floating-point parameters and buffers to float64 in place, as PyTorch's Module.double();
        returns self. For eager use, as half()."""
        return self._convert(_BY_NAME["float64"])

    def _state(self):
        """(name, tensor) of every parameter and persistent buffer in PyTorch's state_dict order: each module's
        parameters, then its buffers, then its children's; shared ones under each name."""
        out = OrderedDict()
        for prefix, module in self.named_modules(remove_duplicate=False):
            transient = module.__dict__.get("_non_persistent", ())
            for table in (module._parameters, module._buffers):
                out.update(((f"{prefix}.{k}" if prefix else k), t) for k, t in table.items()
                           if t is not None and (table is module._parameters or k not in transient))
        return out

    def state_dict(self):
        """Parameters and buffers as NumPy arrays (copies), under PyTorch's key names and in its order."""
        return OrderedDict((name, t.cpu().numpy().copy()) for name, t in self._state().items())

    def load_state_dict(self, state, strict=True):
        """Copies arrays (or tensors) into the parameters and persistent buffers; checks every shape first, and a
        failure (a mismatch, a value of a dtype it cannot copy, read-only memory) changes nothing. Returns
        (missing_keys, unexpected_keys), as PyTorch's; with strict, either raises RuntimeError, as does a shape
        mismatch, with PyTorch's message. A batch norm's num_batches_tracked that the state lacks (older and
        converted PyTorch checkpoints) stays as it is, as PyTorch's loads it."""
        import numpy as np
        if isinstance(state, tuple) and len(state) == 2 and isinstance(state[0], dict):
            raise TypeError("load_state_dict got a (tensors, metadata) tuple, what ft.load(path) returns without a "
                            "model: pass ft.load(path)[0], or load into the model with ft.load(path, model)")
        own = self._state()
        missing = [k for k in own if k not in state and not _is_counter(k)]
        unexpected = [k for k in state if k not in own]
        lines = [f"{what} key(s) in state_dict: {', '.join(map(repr, keys))}."
                 for what, keys in (("Missing", missing), ("Unexpected", unexpected)) if keys and strict]
        staged = []
        for name, t in own.items():
            if name not in state:
                continue
            value = state[name]
            shape = tuple(value.shape) if hasattr(value, "shape") else None if value is None else np.shape(value)
            if shape != t.shape:
                copying = "None" if shape is None else f"a param with shape {shape}"
                lines.append(f"size mismatch for {name}: copying {copying} from checkpoint, the shape in current model "
                             f"is {t.shape}.")
            staged.append((t, value))
        if lines:  # PyTorch's message and exception
            raise RuntimeError(f"Error(s) in loading state_dict for {type(self).__name__}:\n\t" + "\n\t".join(lines))
        written = []
        try:
            for t, value in staged:
                before = t.clone()
                t.copy_(value)
                written.append((t, before))
        except Exception:
            for t, before in reversed(written):
                t.copy_(before)
            raise
        return IncompatibleKeys(missing, unexpected)

    def train(self, mode=True):
        """Sets training mode (mode=True) or evaluation mode (False) on this module and every module below it; returns
        self. Dropout and batch norm behave differently in the two."""
        for m in self.modules():
            object.__setattr__(m, "training", mode)
        return self

    def eval(self):
        """Sets evaluation mode, as train(False); returns self."""
        return self.train(False)

    # ---- calling ----
    # A layer the compiler knows (a node kind): called on traced values it records one node. Any other
    # module, a user's own included, is traced through its forward.
    _leaf = False

    def __call__(self, *inputs, **kwargs):
        if len(inputs) == 1 and isinstance(inputs[0], MergedRows) and (isinstance(self, _ROW_WISE) or
                                                                      type(self) is Dropout):
            return inputs[0].rowwise(self, **kwargs)  # GPT-2's x.view(-1, C) through its projection
        # traced values, or parts of them, or lists of them (DenseNet's layer(features))
        if uses_trainable(inputs):  # a parameter itself (Perceiver's self.norm(self.latents)): its value in the step
            from .graph import read_by_op
            inputs = tuple(read_by_op(type(self).__name__, list(inputs), True))
        given = [y for x in (*inputs, *kwargs.values()) for y in (x if isinstance(x, (list, tuple)) else (x,))]
        if self._leaf and not _overrides_forward(type(self)) and any(isinstance(x, Common) for x in given):
            return self._common_call(*inputs, **kwargs)
        if not any(isinstance(x, (Symbolic, Stacked, Common)) for x in given):
            from .graph import fail
            if uses_trainable(self.parameters()):
                view = self._parameter_view(*inputs)
                if view is not None:
                    return view
                if inputs and all(isinstance(x, TensorBase) for x in inputs):  # Swin V2's self.cpb_mlp(self.coords)
                    from .graph import common_value
                    return self(*(common_value(x) for x in inputs), **kwargs)
                fail(f"{type(self).__name__} with trainable parameters called on something neither traced nor a "
                     "tensor", "its output would be a constant through which they never train: call it on values "
                     "of the model's input, use its weight as a value (positions: self.pos(ft.arange(T)) or "
                     "self.pos.weight[:T]), or freeze it with requires_grad_(False) before compile")
            return self.forward(*inputs, **kwargs)
        if self._leaf and not _overrides_forward(type(self)):
            if kwargs:  # inputs given by name (Linear(input=x)): in forward's order
                bound = inspect.signature(self.forward).bind(*inputs, **kwargs)
                inputs, kwargs = bound.args, bound.kwargs
            return self._record(*inputs, **kwargs)
        from .graph import callers
        callers.append(self)
        try:
            return self.forward(*inputs, **kwargs)
        finally:
            callers.pop()

    def __init_subclass__(cls, **kwargs):
        # A layer's own forward called on traced values (a user's subclass calling super().forward(x)) records the
        # layer's node, as calling the layer does (one whose options the node lacks, _leaf False on the instance,
        # traces its forward).
        super().__init_subclass__(**kwargs)
        forward = cls.__dict__.get("forward")
        if forward is None or not cls._leaf or not cls.__module__.startswith("fasttrain."):
            return

        @functools.wraps(forward)
        def traced_or_eager(self, *inputs, **kwargs):
            if self._leaf and any(isinstance(x, (Symbolic, Stacked)) for x in inputs):
                return self._record(*inputs, **kwargs)
            return forward(self, *inputs, **kwargs)
        cls.forward = traced_or_eager

    def _common_call(self, *inputs, **kwargs):
        """The layer on a value of the parameters alone (graph.Common), whose dimensions are its own: recorded with
        the dimensions it takes (Softmax(dim), Flatten(start_dim)) counted past the batch's; a value (1, ...) that
        the layer takes only as a batch (a conv of a learned (1, C, H, W) image, a batch norm) as a batch of one."""
        first = next(x for x in inputs if isinstance(x, Common))
        norm = isinstance(self, _BatchNorm)  # whose statistics are over a batch: the value's first dimension
        if norm and (getattr(self, "running_mean", None) is not None or first.ndim < 2 or first.shape[0] != 1):
            from .graph import fail
            fail(f"a batch norm with running statistics, or of a batch other than 1, on a value of the parameters "
                 f"alone (of shape {first.shape})", "normalize a weight as a batch of one without running "
                 "statistics (timm's StdConv2d), F.batch_norm(w.reshape(1, K, -1), None, None, training=True)")
        if len(inputs) == 1 and first.ndim > 1 and first.shape[0] == 1 and not kwargs:
            try:  # a batch of one, as PyTorch's layers read (1, C, H, W) (a conv of a learned image)
                self.output_shape(first.shape)
                batched = norm
            except ValueError:
                batched = True
            if batched:
                one = self(first.value.reshape(N, *first.shape[1:]))
                return common(one.reshape(N, 1, *one.node.shape))
        layer = self
        dims = {k: v for k in ("dim", "start_dim", "end_dim") if isinstance(v := getattr(self, k, None), int)}
        if dims:
            layer = copy.copy(self)
            for k, v in dims.items():
                object.__setattr__(layer, k, first._own(v))
        return common(layer(*[internal(x) for x in inputs], **kwargs))

    def _record(self, *inputs, **kwargs):
        """The node of a layer the compiler knows, on traced values."""
        if kwargs:
            raise TypeError(f"{type(self).__name__} takes no keyword arguments when traced")
        from .graph import _user_line, in_place
        try:
            out = self._symbolic(*inputs)
        except ValueError as e:  # a shape the layer does not take: say where the forward called it
            raise ValueError(f"{e} (at {_user_line()})") from None
        return in_place(inputs[0], out) if getattr(self, "inplace", False) else out

    def _parameter_view(self, *inputs):
        """While a forward is traced, for untraced inputs: the output as a view of a parameter (which a traced
        value meeting it reads as the parameter, so it trains), where the layer's output is one; else None."""
        return None

    def _symbolic(self, *inputs):
        from .graph import Symbolic as S
        inputs = [x if isinstance(x, S) else inputs[0]._operand(x) for x in inputs]
        for x in inputs:
            if x.node.shape is None:  # targets of no shape yet, as a layer's input (-y)
                x._one_per_sample()
        shape = self.output_shape(*[x.node.shape for x in inputs])
        weight = getattr(self, "_computed_weight", None)  # read as the node's last input
        return Symbolic.record(self, inputs + ([weight] if weight is not None else []), shape)

    def output_shape(self, *shapes):
        """The output shape (without the batch dimension) for these input shapes. A layer keeps its input's shape
        unless it says otherwise; a module made of layers (Sequential, Model, a forward of one's own) is traced.
        Where forward returns several outputs, the shape of each (None for an output that is not a tensor)."""
        if self._leaf:
            return shapes[0]
        from .graph import Input, Symbolic, _call
        out = _call(self, f"{type(self).__name__}.forward", *[Input(s) for s in shapes])
        if isinstance(out, Symbolic):
            return tuple(out.shape[1:])
        if isinstance(out, (tuple, list)) and any(isinstance(o, Symbolic) for o in out):
            return tuple(tuple(o.shape[1:]) if isinstance(o, Symbolic) else None for o in out)
        raise TypeError(f"{type(self).__name__}.forward returned {type(out).__name__}, not traced values")

    def summary(self, input_shape=None, batch_size=1, input_dtype=None):
        """Layers, output shapes, parameter counts, FLOPs and activation memory (see ft.nn.program.summary)."""
        from .program import summary
        return summary(self, input_shape, batch_size, input_dtype)

    def compile(self, optimizer, loss=None, **options):
        """Compiles this model into a C training program (see ft.nn.program.compile)."""
        from .program import compile
        return compile(self, optimizer, loss, **options)

    def forward(self, *inputs):
        """The module's computation, run by calling the module: ``module(x)``, or ``loss(input, target)`` for a
        loss. On tensors it computes eagerly; on traced values (model.compile) a layer fasttrain knows records one
        node of the graph instead, and any other module is traced through its forward. A Module of one's own
        defines it, as in PyTorch."""
        raise NotImplementedError(f"{type(self).__name__} has no forward: a Module subclass defines forward()")

    def extra_repr(self):
        """The text inside the parentheses of the module's repr (its constructor arguments, as PyTorch's); empty by
        default."""
        return ""

    def __repr__(self):
        lines = [f"  ({name}): " + repr(child).replace("\n", "\n  ") for name, child in self._modules.items()]
        head = f"{type(self).__name__}({self.extra_repr()}"
        return head + (")" if not lines else "\n" + "\n".join(lines) + "\n)")

    def _repr_html_(self):
        # Jupyter's form: a table of the modules below this one (or of this one alone), each with its layer and the
        # parameters it holds; a parameter shared by several modules counts once in the total.
        from .._display import Column, Table
        named = list(self.named_modules())
        rows = [[name, f"{type(m).__name__}({m.extra_repr()})", f"{sum(p.numel() for p in m.parameters()):,}"]
                for name, m in (named[1:] or named)]
        params = list(self.parameters())
        trainable = sum(p.numel() for p in params if p.requires_grad)
        return Table([Column("module"), Column("layer"), Column("parameters", align=">")], rows,
                     {"parameters": ("parameters", f"{sum(p.numel() for p in params):,}")},
                     [f"trainable parameters: {trainable:,}"]).html(caption=type(self).__name__)


def _init_weight_bias(weight, bias, fan_in):
    # PyTorch's default: kaiming_uniform_(a=sqrt(5)) and U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for the bias.
    init.kaiming_uniform_(weight, a=math.sqrt(5))
    if bias is not None:
        bound = 1 / math.sqrt(fan_in) if fan_in > 0 else 0
        init.uniform_(bias, -bound, bound)


def _reset_affine(module):
    """A norm's weight to ones and its bias to zeros, where it has them."""
    if module.weight is not None:
        module.weight.fill_(1)
    if getattr(module, "bias", None) is not None:
        module.bias.zero_()


def _init_table(module):
    """An embedding table drawn from PyTorch's N(0, 1), its padding row zero."""
    init.normal_(module.weight)
    if module.padding_idx is not None:
        module.weight[module.padding_idx].fill_(0)


def _tuple(v, n):
    """A size per spatial dimension: v itself when it gives one for each, else v repeated."""
    return tuple(v) if isinstance(v, (tuple, list)) else (v,) * n


class _ConvNd(Module):
    """Conv1d and Conv2d: a 1-d convolution runs as the 2-d one over (C, 1, L)."""

    _leaf = True
    _dims = 2
    _transposed = False  # weight (C_in, C_out / groups, k...) rather than (C_out, C_in / groups, k...)
    _padding_given = None  # 'same' or 'valid' as given, for the repr

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1, groups=1, bias=True,
                 padding_mode="zeros"):
        super().__init__()
        name, n = type(self).__name__, self._dims
        if padding_mode not in ("zeros", "reflect", "replicate", "circular"):
            raise ValueError(f"{name}: padding_mode must be one of 'zeros', 'reflect', 'replicate' or 'circular', "
                             f"got {padding_mode!r}")
        if padding_mode != "zeros" and self._transposed:
            raise ValueError(f"{name}: only padding_mode='zeros' is supported, as in PyTorch")
        if isinstance(padding, str) and self._transposed:
            raise ValueError(f"{name}: padding must be a number of elements, not {padding!r}")
        if in_channels % groups or out_channels % groups:
            raise ValueError("in_channels and out_channels must be divisible by groups")
        self.in_channels, self.out_channels, self.groups = in_channels, out_channels, groups
        self.kernel_size, self.stride = _tuple(kernel_size, n), _tuple(stride, n)
        from .functional import string_padding
        self.dilation = _tuple(dilation, n)
        self.padding, self._extra = (_tuple(padding, n), (0,) * n) if not isinstance(padding, str) else \
            string_padding(padding, self.kernel_size, self.stride, self.dilation, name)
        self._padding_given, self.padding_mode = padding, padding_mode
        if padding_mode != "zeros" or any(self._extra):  # traced through forward: F.pad, then the convolution
            self._leaf = False
        lead = (in_channels, out_channels // groups) if self._transposed else (out_channels, in_channels // groups)
        self.register_parameter("weight", creation.empty(*lead, *self.kernel_size))
        self.register_parameter("bias", creation.empty(out_channels) if bias else None)
        self.reset_parameters()

    def reset_parameters(self):
        """The weight and bias drawn afresh, as PyTorch initialises them."""
        _init_weight_bias(self.weight, self.bias, math.prod(self.weight.shape[1:]))  # PyTorch's fan-in

    def output_shape(self, shape):
        name = type(self).__name__
        if len(shape) != self._dims + 1:
            raise ValueError(f"{name} takes samples of {self._dims + 1} dimensions, got {shape}")
        if shape[0] != self.in_channels:
            raise ValueError(f"{name} expects {self.in_channels} input channels, got {shape[0]}")
        size = []
        for i, n in enumerate(shape[1:]):
            eff = self.dilation[i] * (self.kernel_size[i] - 1) + 1
            size.append((n + 2 * self.padding[i] - eff) // self.stride[i] + 1)
        if min(size) < 1:
            raise ValueError(f"{name}: input {shape[1:]} is too small for the kernel")
        return (self.out_channels, *size)

    def forward(self, input):
        from . import functional as F
        conv = F.conv2d if self._dims == 2 else F.conv1d
        if not self._leaf:  # a padding mode, or the extra element of an odd 'same' padding on the right
            pads = tuple(q for p, e in zip(reversed(self.padding), reversed(self._extra)) for q in (p, p + e))
            mode = "constant" if self.padding_mode == "zeros" else self.padding_mode
            return conv(F.pad(input, pads, mode), self.weight, self.bias, self.stride, 0, self.dilation, self.groups)
        return conv(input, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups)

    def extra_repr(self):
        return (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}"
                + (f", padding={self._padding_given}" if isinstance(self._padding_given, str)
                   else f", padding={self.padding}" if any(self.padding) else "")
                + (f", dilation={self.dilation}" if any(d != 1 for d in self.dilation) else "")
                + (f", groups={self.groups}" if self.groups != 1 else "")
                + ("" if self.bias is not None else ", bias=False")
                + (f", padding_mode={self.padding_mode!r}" if self.padding_mode != "zeros" else ""))


class _ConvTransposeNd(_ConvNd):
    """ConvTranspose1d and ConvTranspose2d: the adjoint of the convolution with the same arguments, weight (C_in,
    C_out / groups, k...); a 1-d one runs as the 2-d one over (C, 1, L)."""

    _transposed = True

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, output_padding=0, groups=1,
                 bias=True, dilation=1, padding_mode="zeros"):
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation, groups, bias, padding_mode)
        n = self._dims
        self.output_padding = _tuple(output_padding, n)
        if any(not (0 <= o < max(s, d)) for o, s, d in zip(self.output_padding, self.stride, self.dilation)):
            raise ValueError(f"{type(self).__name__}: output_padding {self.output_padding} must be smaller than "
                             "either stride or dilation")
        if any(o >= s for o, s in zip(self.output_padding, self.stride)):
            raise NotImplementedError(f"{type(self).__name__}: output_padding {self.output_padding} of at least the "
                                      f"stride {self.stride} (PyTorch allows it below the dilation) is not supported")

    def output_shape(self, shape):
        name = type(self).__name__
        if len(shape) != self._dims + 1:
            raise ValueError(f"{name} takes samples of {self._dims + 1} dimensions, got {shape}")
        if shape[0] != self.in_channels:
            raise ValueError(f"{name} expects {self.in_channels} input channels, got {shape[0]}")
        size = tuple((n - 1) * s - 2 * p + d * (k - 1) + o + 1 for n, s, p, d, k, o in zip(
            shape[1:], self.stride, self.padding, self.dilation, self.kernel_size, self.output_padding))
        if min(size) < 1:
            raise ValueError(f"{name}: input {shape[1:]} gives an output size {size}, which is too small")
        return (self.out_channels, *size)

    def input_size(self, size):
        """The spatial size of the input that gives an output of spatial size `size`."""
        return tuple((n - 1 - o + 2 * p - d * (k - 1)) // s + 1 for n, s, p, d, k, o in zip(
            size, self.stride, self.padding, self.dilation, self.kernel_size, self.output_padding))

    def forward(self, input, output_size=None):
        return self._convolve(input, output_size)

    def _record(self, input, output_size=None):
        # an output size records the functional form: a node of its own output padding
        return super()._record(input) if output_size is None else self._convolve(input, output_size)

    def _convolve(self, input, output_size):
        from . import functional as F
        conv = F.conv_transpose2d if self._dims == 2 else F.conv_transpose1d
        padding = self.output_padding if output_size is None else self._output_padding(input, output_size)
        return conv(input, self.weight, self.bias, self.stride, self.padding, padding, self.groups, self.dilation)

    def _output_padding(self, input, output_size):
        """The output padding that gives the spatial size `output_size` (its last dims), as PyTorch's forward
        computes it: the same transposed convolution maps several input sizes to one output size."""
        size = tuple(output_size)[-self._dims:]
        if len(size) != self._dims:
            raise ValueError(f"{type(self).__name__}: output_size {tuple(output_size)} needs {self._dims} spatial "
                             f"size(s)")
        least = tuple((n - 1) * s - 2 * p + d * (k - 1) + 1 for n, s, p, d, k in zip(
            tuple(input.shape)[-self._dims:], self.stride, self.padding, self.dilation, self.kernel_size))
        padding = tuple(int(o) - n for o, n in zip(size, least))
        if any(not 0 <= o < s for o, s in zip(padding, self.stride)):
            largest = tuple(n + s - 1 for n, s in zip(least, self.stride))
            raise ValueError(f"{type(self).__name__}: requested an output size of {size}, but valid sizes for this "
                             f"input range from {least} to {largest}")
        return padding

    def extra_repr(self):
        return super().extra_repr() + (f", output_padding={self.output_padding}" if any(self.output_padding) else "")


class ConvTranspose1d(_ConvTransposeNd):
    """Transposed 1-d convolution of (N, C_in, L) sequences, as torch.nn.ConvTranspose1d; it runs as the 2-d one over
    (C_in, 1, L)."""

    _dims = 1


class ConvTranspose2d(_ConvTransposeNd):
    """Transposed 2-d convolution of (N, C_in, H, W) images, as torch.nn.ConvTranspose2d (a U-Net's, a GAN's or a
    VAE's upsampling), with weight (C_in, C_out / groups, kH, kW) initialised as PyTorch does."""


class Conv1d(_ConvNd):
    """1-d convolution of (N, C_in, L) sequences (or unbatched (C_in, L)), as torch.nn.Conv1d; it runs as the 2-d
    convolution over (C_in, 1, L). Numeric padding only (not 'same' or 'valid'), in any padding_mode."""

    _dims = 1


class Conv2d(_ConvNd):
    """2-d convolution of (N, C_in, H, W) images (or unbatched (C_in, H, W)), as torch.nn.Conv2d, with weight (C_out,
    C_in / groups, kH, kW) initialised as PyTorch does. Numeric padding only (not 'same' or 'valid'), in any
    padding_mode."""

    _dims = 2


class Linear(Module):
    """y = x W^T + b over the last dimension, as torch.nn.Linear: input (..., in_features), output (..., out_features);
    weight (out_features, in_features) and bias (out_features,), initialised as PyTorch does."""

    _leaf = True

    def __init__(self, in_features, out_features, bias=True):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.register_parameter("weight", creation.empty(out_features, in_features))
        self.register_parameter("bias", creation.empty(out_features) if bias else None)
        self.reset_parameters()

    def reset_parameters(self):
        """The weight and bias drawn afresh, as PyTorch initialises them."""
        _init_weight_bias(self.weight, self.bias, self.in_features)

    def output_shape(self, shape):
        if shape[-1] != self.in_features:
            raise ValueError(f"Linear expects {self.in_features} input features, got {shape[-1]}")
        return (*shape[:-1], self.out_features)

    def forward(self, input):
        from . import functional as F
        return F.linear(input, self.weight, self.bias)

    def extra_repr(self):
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


class Bilinear(Module):
    """y_k = x1^T A_k x2 + b_k, as torch.nn.Bilinear: weight (out_features, in1_features, in2_features) and bias
    (out_features,), both uniform in +-1/sqrt(in1_features) as PyTorch initialises them."""

    def __init__(self, in1_features, in2_features, out_features, bias=True):
        super().__init__()
        self.in1_features, self.in2_features, self.out_features = in1_features, in2_features, out_features
        self.register_parameter("weight", creation.empty(out_features, in1_features, in2_features))
        self.register_parameter("bias", creation.empty(out_features) if bias else None)
        self.reset_parameters()

    def reset_parameters(self):
        """The weight and bias drawn afresh from U(-1/sqrt(in1_features), 1/sqrt(in1_features))."""
        bound = 1 / math.sqrt(self.in1_features)
        init.uniform_(self.weight, -bound, bound)
        if self.bias is not None:
            init.uniform_(self.bias, -bound, bound)

    def forward(self, input1, input2):
        from . import functional as F
        return F.bilinear(input1, input2, self.weight, self.bias)

    def extra_repr(self):
        return (f"in1_features={self.in1_features}, in2_features={self.in2_features}, "
                f"out_features={self.out_features}, bias={self.bias is not None}")


class _BatchNorm(Module):
    """BatchNorm1d over (C,) features or (C, L) sequences, BatchNorm2d over (C, H, W) images."""

    _leaf = True
    _ranks = (3,)

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True, track_running_stats=True):
        super().__init__()
        self.num_features, self.eps, self.momentum = num_features, eps, momentum
        self.affine, self.track_running_stats = affine, track_running_stats
        self.register_parameter("weight", creation.empty(num_features) if affine else None)
        self.register_parameter("bias", creation.empty(num_features) if affine else None)
        if track_running_stats:
            self.register_buffer("running_mean", creation.empty(num_features))
            self.register_buffer("running_var", creation.empty(num_features))
            self.register_buffer("num_batches_tracked", creation.empty((), dtype="int64"))
        self.reset_parameters()

    def reset_running_stats(self):
        """The running statistics as at construction: mean 0, variance 1, no batches counted."""
        if self.track_running_stats:
            self.running_mean.zero_()
            self.running_var.fill_(1)
            self.num_batches_tracked.zero_()

    def reset_parameters(self):
        """The running statistics, weight (1) and bias (0) as at construction."""
        self.reset_running_stats()
        _reset_affine(self)

    def output_shape(self, shape):
        if len(shape) not in self._ranks:
            raise ValueError(f"{type(self).__name__} takes samples of {' or '.join(map(str, self._ranks))} "
                             f"dimensions, got {shape}")
        if self.num_features is not None and shape[0] != self.num_features:  # (None: F.batch_norm's, of any)
            raise ValueError(f"{type(self).__name__} expects {self.num_features} channels, got {shape[0]}")
        return shape

    def forward(self, input):
        from . import functional as F
        use_batch, momentum = self.training or not self.track_running_stats, self.momentum
        if self.training and self.track_running_stats:
            self.num_batches_tracked.fill_(self.num_batches_tracked.item() + 1)
            if momentum is None:  # a cumulative average, as PyTorch's: batch k weighs 1 / k
                momentum = 1.0 / self.num_batches_tracked.item()
        return F.batch_norm(input, getattr(self, "running_mean", None), getattr(self, "running_var", None),
                            self._scale(), self.bias, use_batch, 0.0 if momentum is None else momentum, self.eps)

    def _scale(self):
        """The per-channel scale of the normalized values."""
        return self.weight

    def extra_repr(self):
        return (f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, affine={self.affine}, "
                f"track_running_stats={self.track_running_stats}")


class BatchNorm1d(_BatchNorm):
    """Batch normalization of (N, C) features or (N, C, L) sequences, as torch.nn.BatchNorm1d: batch statistics in
    training (updating running_mean and running_var with momentum, or with momentum=None by a cumulative average),
    the running ones in eval mode."""

    _ranks = (1, 2)


class BatchNorm2d(_BatchNorm):
    """Batch normalization of (N, C, H, W) images over N, H and W per channel, as torch.nn.BatchNorm2d: batch statistics
    in training (updating running_mean and running_var with momentum, or with momentum=None by a cumulative
    average), the running ones in eval mode."""

    _ranks = (3,)


class InPlaceABN(_BatchNorm):
    """Batch normalization and its activation in one layer that keeps only its output for the backward
    (in-place activated batch norm, Rota Bulo et al. 2018; mapillary/inplace_abn's InPlaceABN, same arguments):
    y = act((x - mean) / sqrt(var + eps) * (|weight| + eps) + bias), act a leaky ReLU of negative slope
    activation_param (> 0) or the identity. The backward takes x back from y by inverting act and the affine
    map, so a compiled program frees the layer's input after its forward. ReLU has no inverse: recompute instead
    (compile(recompute=...), docs/memory.md). Samples of (C,), (C, L) or (C, H, W); CPU programs."""

    _ranks = (1, 2, 3)

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True, track_running_stats=True,
                 activation="leaky_relu", activation_param=0.01):
        if activation not in ("leaky_relu", "identity"):
            raise ValueError(f"InPlaceABN: activation must be 'leaky_relu' or 'identity' (invertible), got "
                             f"{activation!r}; for ReLU use BatchNorm2d and ReLU with compile(recompute=...)")
        if activation == "leaky_relu" and not activation_param > 0:
            raise ValueError(f"InPlaceABN: a leaky ReLU needs a positive activation_param (it is inverted), got "
                             f"{activation_param}")
        if not eps > 0:
            raise ValueError(f"InPlaceABN: eps must be > 0 (the scale |weight| + eps is divided by), got {eps}")
        super().__init__(num_features, eps, momentum, affine, track_running_stats)
        self.activation, self.activation_param = activation, float(activation_param)

    def _scale(self):
        return None if self.weight is None else self.weight.abs() + self.eps

    def forward(self, input):
        from . import functional as F
        y = super().forward(input)
        return F.leaky_relu(y, self.activation_param) if self.activation == "leaky_relu" else y

    def extra_repr(self):
        return f"{super().extra_repr()}, activation={self.activation}, activation_param={self.activation_param}"


class SyncBatchNorm(_BatchNorm):
    """Batch normalization whose batch statistics are those of every rank's batch together, as
    torch.nn.SyncBatchNorm, in a program compiled with distributed=True (docs/distributed.md); without
    ft.distributed (or in eager use) it is a plain batch norm. Samples of (C,), (C, L) or (C, H, W)."""

    _ranks = (1, 2, 3)

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True, track_running_stats=True,
                 process_group=None):
        if process_group is not None:
            raise NotImplementedError("SyncBatchNorm: process groups are not supported; statistics span every rank")
        super().__init__(num_features, eps, momentum, affine, track_running_stats)

    @classmethod
    def convert_sync_batchnorm(cls, module, process_group=None):
        """module with every BatchNorm1d/2d replaced by a SyncBatchNorm holding the same parameters and
        buffers (the module itself when it is one), as torch.nn.SyncBatchNorm.convert_sync_batchnorm."""
        if isinstance(module, _BatchNorm) and not isinstance(module, cls):
            sync = cls(module.num_features, module.eps, module.momentum, module.affine, module.track_running_stats,
                       process_group)
            for name, t in module._parameters.items():
                sync.register_parameter(name, t)
            for name, t in module._buffers.items():
                sync.register_buffer(name, t)
            sync.train(module.training)
            return sync
        for name, child in list(module.named_children()):
            setattr(module, name, cls.convert_sync_batchnorm(child, process_group))
        return module


class LayerNorm(Module):
    """Layer normalization over the trailing dimensions normalized_shape, with an elementwise weight and bias of that
    shape, as torch.nn.LayerNorm."""

    _leaf = True

    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True, bias=True):
        super().__init__()
        self.normalized_shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
        self.eps = eps
        self.register_parameter("weight", creation.empty(self.normalized_shape) if elementwise_affine else None)
        self.register_parameter("bias", creation.empty(self.normalized_shape) if elementwise_affine and bias
                                else None)
        self.reset_parameters()

    def reset_parameters(self):
        """The weight (1) and bias (0) as at construction."""
        _reset_affine(self)

    def output_shape(self, shape):
        if tuple(shape[-len(self.normalized_shape):]) != self.normalized_shape:
            raise ValueError(f"LayerNorm expects trailing shape {self.normalized_shape}, got {shape}")
        return shape

    def forward(self, input):
        from . import functional as F
        return F.layer_norm(input, self.normalized_shape, self.weight, self.bias, self.eps)

    def extra_repr(self):
        return (f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.weight is not None}"
                + (", bias=False" if self.weight is not None and self.bias is None else ""))


class Unflatten(Module):
    """Dimension dim viewed as sizes, as torch.nn.Unflatten (dim is not the batch in a compiled model)."""

    def __init__(self, dim, unflattened_size):
        super().__init__()
        self.dim, self.unflattened_size = dim, tuple(unflattened_size)

    def forward(self, input):
        d = self.dim % input.ndim
        return input.reshape(*input.shape[:d], *self.unflattened_size, *input.shape[d + 1:])

    def extra_repr(self):
        return f"dim={self.dim}, unflattened_size={self.unflattened_size}"


class GroupNorm(Module):
    """Group normalization of (N, C, ...) inputs: the C channels in num_groups groups, each normalized over its channels
    and the spatial dimensions, then a per-channel weight and bias, as torch.nn.GroupNorm."""

    _leaf = True

    def __init__(self, num_groups, num_channels, eps=1e-5, affine=True):
        super().__init__()
        if num_groups < 1 or num_channels % num_groups:
            raise ValueError(f"GroupNorm: num_channels {num_channels} must be divisible by num_groups {num_groups}")
        self.num_groups, self.num_channels, self.eps, self.affine = num_groups, num_channels, eps, affine
        self.register_parameter("weight", creation.empty(num_channels) if affine else None)
        self.register_parameter("bias", creation.empty(num_channels) if affine else None)
        self.reset_parameters()

    def reset_parameters(self):
        """The weight (1) and bias (0) as at construction."""
        _reset_affine(self)

    def output_shape(self, shape):
        if not shape or shape[0] % self.num_groups or self.num_channels not in (None, shape[0]):
            raise ValueError(f"GroupNorm of {self.num_groups} groups over {self.num_channels} channels, got samples "
                             f"of shape {shape}")
        return shape

    def forward(self, input):
        from . import functional as F
        return F.group_norm(input, self.num_groups, self.weight, self.bias, self.eps)

    def extra_repr(self):
        return f"{self.num_groups}, {self.num_channels}, eps={self.eps}, affine={self.affine}"


class _InstanceNorm(GroupNorm):
    """Each sample's channels normalized over their own positions (group norm with a group per channel), as
    PyTorch's InstanceNorm; its default affine=False and track_running_stats=False."""

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=False, track_running_stats=False):
        if track_running_stats:
            raise NotImplementedError(f"{type(self).__name__}: track_running_stats=True is not supported (each "
                                      "sample is normalized by its own statistics, in training and in eval)")
        super().__init__(num_features, num_features, eps, affine)
        self.num_features, self.momentum = num_features, momentum

    def extra_repr(self):
        return f"{self.num_features}, eps={self.eps}, affine={self.affine}"


class InstanceNorm1d(_InstanceNorm):
    """Instance normalization of (N, C, L) sequences, as torch.nn.InstanceNorm1d."""


class InstanceNorm2d(_InstanceNorm):
    """Instance normalization of (N, C, H, W) images, as torch.nn.InstanceNorm2d."""


class _Lazy(Module):
    """A layer whose input size its first input gives, as PyTorch's lazy modules: that call (an eager forward, the
    dry run PyTorch asks for before the optimizer is made, as d2l's apply_init) turns it into cls_to_become(size,
    *args), initialised as that layer's constructor does (which checks the other arguments then), keeping its
    training mode; compile refuses an optimizer made before it (program._check_lazy)."""

    cls_to_become = None
    _in_size = None  # the size of an input of this shape

    def __init__(self, *args, **kwargs):
        super().__init__()
        self._lazy_args = args, kwargs

    def forward(self, input, *args, **kwargs):
        """Becomes the sized layer, then its forward (ConvTranspose's output_size passed on)."""
        from .graph import Symbolic, fail
        if isinstance(input, Symbolic):
            fail(f"{type(self).__name__} before its first call", "run the model once on a batch (model(x)) before "
                 "making the optimizer, as PyTorch's lazy modules ask: that call gives the layer its size and "
                 "parameters")
        given, options = self._lazy_args
        layer = self.cls_to_become(int(self._in_size(tuple(input.shape))), *given, **options)
        training, state = self.training, {k: v for k, v in layer.__dict__.items() if k != "_training"}
        self.__dict__.pop("_lazy_args")
        self.__dict__.update(state, _made_lazily=True)
        self.__class__ = layer.__class__
        self.train(training)
        return self(input, *args, **kwargs)


def _lazy(layer, in_size):
    return type(f"Lazy{layer.__name__}", (_Lazy,), {
        "cls_to_become": layer, "_in_size": staticmethod(in_size),
        "__doc__": f"{layer.__name__} whose first argument its first input gives, as torch.nn.Lazy{layer.__name__} "
                   "(see _Lazy).", "__module__": __name__})


def _channels(batched_rank):
    """The channels of an input of a convolution or instance norm: dimension 1 of a batch, 0 of one sample."""
    return lambda shape: shape[1] if len(shape) == batched_rank else shape[0]


LazyLinear = _lazy(Linear, lambda shape: shape[-1])
LazyConv1d, LazyConvTranspose1d, LazyInstanceNorm1d = (_lazy(c, _channels(3))
                                                       for c in (Conv1d, ConvTranspose1d, InstanceNorm1d))
LazyConv2d, LazyConvTranspose2d, LazyInstanceNorm2d = (_lazy(c, _channels(4))
                                                       for c in (Conv2d, ConvTranspose2d, InstanceNorm2d))
LazyBatchNorm1d, LazyBatchNorm2d = (_lazy(c, lambda shape: shape[1]) for c in (BatchNorm1d, BatchNorm2d))


def _table_options(name, rows, padding_idx, max_norm, scale_grad_by_freq, sparse):
    """An embedding table's padding_idx, counted from 0, with the options it does not support refused."""
    from .functional import _embedding_options
    _embedding_options(max_norm, scale_grad_by_freq, sparse)
    if padding_idx is not None and not -rows <= padding_idx < rows:
        raise ValueError(f"{name}: padding_idx {padding_idx} is outside the {rows} rows")
    return None if padding_idx is None else padding_idx % rows


class Embedding(Module):
    """Rows of a (num_embeddings, embedding_dim) table for int64 ids: compile with input_dtype=ft.int64."""

    _leaf = True

    def __init__(self, num_embeddings, embedding_dim, padding_idx=None, max_norm=None, norm_type=2.0,
                 scale_grad_by_freq=False, sparse=False):
        super().__init__()
        padding_idx = _table_options("Embedding", num_embeddings, padding_idx, max_norm, scale_grad_by_freq, sparse)
        self.num_embeddings, self.embedding_dim, self.padding_idx = num_embeddings, embedding_dim, padding_idx
        self.register_parameter("weight", creation.empty(num_embeddings, embedding_dim))
        self.reset_parameters()

    def reset_parameters(self):
        """The table drawn afresh from PyTorch's N(0, 1), the padding row zero."""
        _init_table(self)

    @classmethod
    def from_pretrained(cls, embeddings, freeze=True, padding_idx=None, max_norm=None, norm_type=2.0,
                        scale_grad_by_freq=False, sparse=False):
        """An Embedding whose table is a copy of embeddings (2-d: rows, dim), frozen unless freeze=False, as
        torch.nn.Embedding.from_pretrained (the padding row keeps its given values)."""
        if not isinstance(embeddings, TensorBase) or embeddings.ndim != 2:
            raise ValueError("Embedding.from_pretrained: embeddings must be a 2-d tensor (rows, embedding_dim)")
        m = cls(*embeddings.shape, padding_idx, max_norm, norm_type, scale_grad_by_freq, sparse)
        m.weight.copy_(embeddings)
        m.weight.requires_grad = not freeze
        return m

    def output_shape(self, shape):
        return (*shape, self.embedding_dim)

    def forward(self, input):
        from . import functional as F
        return F.embedding(input, self.weight, self.padding_idx)

    def _symbolic(self, ids):
        """Positions expanded over the batch (ft.arange(T).unsqueeze(0).expand(B, T)) are a tensor's value, the
        same for every sample: their rows of the weight, as for the positions themselves (see _rows)."""
        m = ids.node.module
        if isinstance(m, Value) and not m.tensor.dtype.is_floating_point:
            rows = self._rows(m.tensor.reshape(m.shape))
            if rows is not None:
                from .graph import constant
                return constant(rows, tuple(rows.shape))
        return super()._symbolic(ids)

    def _parameter_view(self, ids):
        """The weight's rows at fixed ids (positions, T5's relative position buckets) while a forward is traced: a
        view for a range of positions (see _rows), else gathered (graph.Gathered); None for ids that are not."""
        if not isinstance(ids, TensorBase) or ids.dtype.is_floating_point:
            return None
        rows = self._rows(ids)
        from . import functional as F
        return rows if rows is not None else F.embedding(ids, self.weight, self.padding_idx)

    def _rows(self, ids):
        """For positions ids = a, a + 1, ..., b - 1 (ft.arange(T), or with leading dimensions of size 1 as
        minGPT's ft.arange(T).unsqueeze(0)): the rows a..b-1 of the weight, in ids' shape."""
        if ids.ndim < 1 or not ids.numel() or math.prod(ids.shape[:-1]) != 1:
            return None
        positions = ids.reshape(-1).tolist()
        first, end = positions[0], positions[0] + len(positions)
        if positions != list(range(first, end)):
            return None
        if first < 0 or end > self.num_embeddings:  # as the eager lookup says it (positions past a block size)
            bad = first if first < 0 or first >= self.num_embeddings else self.num_embeddings
            raise IndexError(f"embedding: ids[{bad - first}] = {bad} is out of range for a weight of "
                             f"{self.num_embeddings} rows (ids must be in [0, {self.num_embeddings}))")
        return self.weight[first:end].reshape(*ids.shape, self.embedding_dim)

    def extra_repr(self):
        return f"{self.num_embeddings}, {self.embedding_dim}" + (
            f", padding_idx={self.padding_idx}" if self.padding_idx is not None else "")


class EmbeddingBag(Module):
    """The sum, mean or max of each bag's rows of a (num_embeddings, embedding_dim) table, as torch.nn.EmbeddingBag
    (see F.embedding_bag): bags of one length as a 2-d input (B, L), padding_idx's ids left out, or eagerly 1-d ids
    cut at offsets (the text classification tutorial's form). Initialised N(0, 1) as PyTorch's, the padding row
    zero."""

    def __init__(self, num_embeddings, embedding_dim, max_norm=None, norm_type=2.0, scale_grad_by_freq=False,
                 mode="mean", sparse=False, _weight=None, include_last_offset=False, padding_idx=None):
        super().__init__()
        padding_idx = _table_options("EmbeddingBag", num_embeddings, padding_idx, max_norm, scale_grad_by_freq, sparse)
        if mode not in ("sum", "mean", "max"):
            raise ValueError(f"EmbeddingBag: mode must be 'sum', 'mean' or 'max', got {mode!r}")
        self.num_embeddings, self.embedding_dim, self.mode = num_embeddings, embedding_dim, mode
        self.include_last_offset, self.padding_idx = include_last_offset, padding_idx
        self.register_parameter("weight", creation.empty(num_embeddings, embedding_dim))
        if _weight is None:
            self.reset_parameters()
        else:
            self.weight.copy_(_weight)

    def reset_parameters(self):
        """The table drawn afresh from PyTorch's N(0, 1), the padding row zero."""
        _init_table(self)

    def forward(self, input, offsets=None, per_sample_weights=None):
        from . import functional as F
        return F.embedding_bag(input, self.weight, offsets, mode=self.mode, per_sample_weights=per_sample_weights,
                               include_last_offset=self.include_last_offset, padding_idx=self.padding_idx)

    def extra_repr(self):
        return f"{self.num_embeddings}, {self.embedding_dim}, mode={self.mode!r}" + \
            (f", padding_idx={self.padding_idx}" if self.padding_idx is not None else "")


class UpsamplingNearest2d(Module):
    """Upsample(size, scale_factor, mode='nearest') of images, as torch.nn.UpsamplingNearest2d."""

    def __init__(self, size=None, scale_factor=None):
        super().__init__()
        self.up = Upsample(size, scale_factor, "nearest")

    def forward(self, input):
        return self.up(input)


class UpsamplingBilinear2d(Module):
    """Upsample(size, scale_factor, mode='bilinear', align_corners=True) of images, as
    torch.nn.UpsamplingBilinear2d."""

    def __init__(self, size=None, scale_factor=None):
        super().__init__()
        self.up = Upsample(size, scale_factor, "bilinear", align_corners=True)

    def forward(self, input):
        return self.up(input)


class Upsample(Module):
    """Upsampling of (C, H, W) images or (C, L) sequences, as torch.nn.Upsample: mode 'nearest' by integer factors,
    'bilinear' (images) and 'linear' (sequences) to any size, with PyTorch's align_corners and
    recompute_scale_factor."""

    _leaf = True
    _ranks = {"bilinear": 3, "linear": 2}  # the per-sample ranks of the interpolating modes

    def __init__(self, size=None, scale_factor=None, mode="nearest", align_corners=None, recompute_scale_factor=None):
        super().__init__()
        if mode != "nearest" and mode not in self._ranks:
            raise NotImplementedError(f"Upsample: mode={mode!r} is not supported; 'nearest', 'bilinear' and "
                                      "'linear' are")
        if mode == "nearest" and align_corners is not None:
            raise ValueError("Upsample: align_corners can only be set with the interpolating modes (linear, "
                             "bilinear)")
        if (size is None) == (scale_factor is None):
            raise ValueError("Upsample: give exactly one of size and scale_factor")
        self.size, self.scale_factor, self.mode = size, scale_factor, mode
        self.align_corners, self.recompute_scale_factor = bool(align_corners), bool(recompute_scale_factor)

    def factors(self, shape):
        """The integer factors along each spatial dimension of per-sample `shape` (mode 'nearest')."""
        spatial = shape[1:]
        if self.size is not None:
            size = _tuple(self.size, len(spatial))
            if any(s % n or s < n for s, n in zip(size, spatial)):
                raise NotImplementedError(f"Upsample: size {size} is not an integer multiple of {spatial}")
            return tuple(s // n for s, n in zip(size, spatial))
        f = _tuple(self.scale_factor, len(spatial))
        if not all(float(v) >= 1 and float(v).is_integer() for v in f):
            raise NotImplementedError(f"Upsample: scale_factor {self.scale_factor} is not an integer factor")
        return tuple(int(v) for v in f)

    def lerp(self, shape):
        """The interpolating modes' output size (P, Q) for per-sample `shape` (C, H, W), or (C, L) as (C, 1, L), and
        the scale factors that place its samples (0: the sizes' ratio), as PyTorch's: the output is
        floor(size * scale_factor), and the factor itself places the samples unless recompute_scale_factor."""
        spatial = shape[1:]
        if len(shape) != self._ranks[self.mode]:
            takes = "(C, H, W) images" if self.mode == "bilinear" else "(C, L) sequences"
            raise ValueError(f"Upsample: mode={self.mode!r} takes {takes}, got samples of shape {shape}")
        if self.size is not None:
            size, scales = tuple(int(v) for v in _tuple(self.size, len(spatial))), (0.0,) * len(spatial)
        else:
            scales = tuple(float(v) for v in _tuple(self.scale_factor, len(spatial)))
            if len(scales) != len(spatial) or not all(v > 0 and math.isfinite(v) for v in scales):
                raise ValueError(f"Upsample: scale_factor {self.scale_factor} must be positive, one per spatial "
                                 f"dimension of {shape}")
            size = tuple(math.floor(n * v) for n, v in zip(spatial, scales))
            scales = (0.0,) * len(spatial) if self.recompute_scale_factor else scales
        if len(size) != len(spatial) or min(size) < 1:
            raise ValueError(f"Upsample: the output size {size} of samples {shape} must be positive, one per "
                             "spatial dimension")
        return ((1, *size), (0.0, *scales)) if len(size) == 1 else (size, scales)

    def output_shape(self, shape):
        if len(shape) not in (2, 3):
            raise ValueError(f"Upsample takes (C, L) or (C, H, W) samples, got {shape}")
        if self.mode != "nearest":
            size = self.lerp(shape)[0]
            return (shape[0], *size[3 - len(shape):])
        return (shape[0], *(n * f for n, f in zip(shape[1:], self.factors(shape))))

    def forward(self, input):
        from . import functional as F
        align = self.align_corners if self.mode != "nearest" else None
        return F.interpolate(input, self.size, self.scale_factor, self.mode, align, self.recompute_scale_factor)

    def extra_repr(self):
        if self.size is not None:
            where = f"size={self.size}"
        else:
            factor = self.scale_factor
            factor = float(factor) if isinstance(factor, (int, float)) else tuple(float(f) for f in factor)
            where = f"scale_factor={factor}"
        return f"{where}, mode={self.mode!r}" + (", align_corners=True" if self.align_corners else "")


class _Activation(Module):
    """An activation layer. inplace=True overwrites the input, as PyTorch's: eagerly its memory; while traced, what
    every name bound to the input reads (a compiled program plans its memory itself, and fuses the activation
    where it can)."""

    _leaf = True
    act = None

    def __init__(self, inplace=False):
        super().__init__()
        self.inplace = inplace

    def forward(self, input):
        from . import functional as F
        return F._act(input, self.act, getattr(self, "alpha", 0.0), self.inplace, self.act)

    def extra_repr(self):
        return "inplace=True" if self.inplace else ""


class ReLU(_Activation):
    """max(0, x) elementwise, as torch.nn.ReLU."""

    act = "relu"


class Hardtanh(Module):
    """x limited to [min_val, max_val], as torch.nn.Hardtanh."""

    def __init__(self, min_val=-1.0, max_val=1.0, inplace=False):
        super().__init__()
        self.min_val, self.max_val, self.inplace = float(min_val), float(max_val), inplace

    def forward(self, input):
        from . import functional as F
        return F.hardtanh(input, self.min_val, self.max_val, self.inplace)


class ReLU6(Hardtanh):
    """x limited to [0, 6], as torch.nn.ReLU6."""

    def __init__(self, inplace=False):
        super().__init__(0.0, 6.0, inplace)


class ELU(Module):
    """x where positive, alpha (exp(x) - 1) elsewhere, as torch.nn.ELU."""

    def __init__(self, alpha=1.0, inplace=False):
        super().__init__()
        self.alpha, self.inplace = float(alpha), inplace

    def forward(self, input):
        from . import functional as F
        return F.elu(input, self.alpha, self.inplace)


class SiLU(_Activation):
    """x * sigmoid(x) elementwise, as torch.nn.SiLU."""

    act = "silu"


class Sigmoid(_Activation):
    """1 / (1 + exp(-x)) elementwise, as torch.nn.Sigmoid."""

    act = "sigmoid"

    def __init__(self):
        super().__init__()


class Tanh(_Activation):
    """tanh(x) elementwise, as torch.nn.Tanh."""

    act = "tanh"

    def __init__(self):
        super().__init__()


class GELU(_Activation):
    """x * Phi(x) elementwise (Phi the standard normal CDF), or its tanh approximation with approximate='tanh', as
    torch.nn.GELU (which has no inplace argument either)."""

    act = "gelu"

    def __init__(self, approximate="none"):
        super().__init__()
        if approximate not in ("none", "tanh"):
            raise ValueError("GELU approximate must be 'none' or 'tanh'")
        self.approximate = approximate

    def forward(self, input):
        from . import functional as F
        return F.gelu(input, approximate=self.approximate)

    def extra_repr(self):
        return f"approximate={self.approximate!r}"


class Hardswish(_Activation):
    """x * relu6(x + 3) / 6 elementwise, as torch.nn.Hardswish."""

    act = "hardswish"


class _Written(Module):
    """An activation written with other ops: the F function _fn names, with inplace as PyTorch's."""

    _fn = None

    def __init__(self, inplace=False):
        super().__init__()
        self.inplace = inplace

    def forward(self, input):
        from . import functional as F
        return getattr(F, self._fn)(input, self.inplace)


class Hardsigmoid(_Written):
    """relu6(x + 3) / 6, as torch.nn.Hardsigmoid."""

    _fn = "hardsigmoid"


class Mish(_Written):
    """x tanh(softplus(x)), as torch.nn.Mish."""

    _fn = "mish"


class PReLU(Module):
    """max(0, x) + a min(0, x) with a learned slope a, one or one per channel, as torch.nn.PReLU."""

    def __init__(self, num_parameters=1, init=0.25):
        super().__init__()
        self.num_parameters, self.init = num_parameters, float(init)
        self.weight = Parameter(creation.empty(num_parameters))
        self.reset_parameters()

    def reset_parameters(self):
        """The slopes as at construction (init)."""
        self.weight.fill_(self.init)

    def forward(self, input):
        from . import functional as F
        return F.prelu(input, self.weight)

    def extra_repr(self):
        return f"num_parameters={self.num_parameters}"


class GLU(Module):
    """a sigmoid(b) of the input's halves along dim, as torch.nn.GLU."""

    def __init__(self, dim=-1):
        super().__init__()
        self.dim = dim

    def forward(self, input):
        from . import functional as F
        return F.glu(input, self.dim)


class RMSNorm(Module):
    """Root-mean-square normalization over the trailing normalized_shape with a learned scale, as torch.nn.RMSNorm
    (eps=None: float32's machine epsilon)."""

    def __init__(self, normalized_shape, eps=None, elementwise_affine=True):
        super().__init__()
        self.normalized_shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
        self.eps, self.elementwise_affine = eps, elementwise_affine
        self.register_parameter("weight", creation.empty(*self.normalized_shape) if elementwise_affine else None)
        self.reset_parameters()

    def reset_parameters(self):
        """The weight (1) as at construction."""
        _reset_affine(self)

    def forward(self, x):
        from . import functional as F
        return F.rms_norm(x, self.normalized_shape, self.weight, self.eps)

    def extra_repr(self):
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"


class _PixelShuffle(Module):
    def __init__(self, factor):
        super().__init__()
        self.factor = factor

    def forward(self, input):
        from . import functional as F
        return getattr(F, self._fn)(input, self.factor)

    def extra_repr(self):
        return f"{self._arg}={self.factor}"


class PixelShuffle(_PixelShuffle):
    """(N, C r^2, H, W) to (N, C, H r, W r), as torch.nn.PixelShuffle."""

    _fn, _arg = "pixel_shuffle", "upscale_factor"


class PixelUnshuffle(_PixelShuffle):
    """(N, C, H r, W r) to (N, C r^2, H, W), as torch.nn.PixelUnshuffle."""

    _fn, _arg = "pixel_unshuffle", "downscale_factor"


class _Pad(Module):
    """F.pad with a fixed mode and padding: an int pads every side, a tuple gives (left, right[, top, bottom])."""

    _mode, _dims = "constant", 2

    def __init__(self, padding, value=None):
        super().__init__()
        self.padding = (padding,) * 2 * self._dims if isinstance(padding, int) else tuple(padding)
        if len(self.padding) != 2 * self._dims:
            raise ValueError(f"{type(self).__name__}: padding takes {2 * self._dims} values, got {padding}")
        self.value = value

    def forward(self, input):
        from . import functional as F
        return F.pad(input, self.padding, self._mode, self.value)

    def extra_repr(self):
        return f"{self.padding}" + (f", value={self.value}" if self._mode == "constant" else "")


class ConstantPad1d(_Pad):
    """Pads the last dimension with value, as torch.nn.ConstantPad1d."""

    _dims = 1

    def __init__(self, padding, value):
        super().__init__(padding, value)


class ConstantPad2d(_Pad):
    """Pads the last two dimensions with value, as torch.nn.ConstantPad2d."""

    def __init__(self, padding, value):
        super().__init__(padding, value)


class ZeroPad1d(_Pad):
    """Pads the last dimension with zeros, as torch.nn.ZeroPad1d."""

    _dims = 1

    def __init__(self, padding):
        super().__init__(padding, 0.0)


class ZeroPad2d(_Pad):
    """Pads the last two dimensions with zeros, as torch.nn.ZeroPad2d."""

    def __init__(self, padding):
        super().__init__(padding, 0.0)


class ReflectionPad1d(_Pad):
    """Pads the last dimension with its values mirrored at the edges, as torch.nn.ReflectionPad1d."""

    _mode, _dims = "reflect", 1


class ReflectionPad2d(_Pad):
    """Pads the last two dimensions with their values mirrored at the edges, as torch.nn.ReflectionPad2d (style
    transfer and CycleGAN generators)."""

    _mode = "reflect"


class ReplicationPad1d(_Pad):
    """Pads the last dimension by repeating its edge values, as torch.nn.ReplicationPad1d."""

    _mode, _dims = "replicate", 1


class ReplicationPad2d(_Pad):
    """Pads the last two dimensions by repeating their edge values, as torch.nn.ReplicationPad2d."""

    _mode = "replicate"


class CircularPad1d(_Pad):
    """Pads the last dimension with the values of its other end, as torch.nn.CircularPad1d."""

    _mode, _dims = "circular", 1


class CircularPad2d(_Pad):
    """Pads the last two dimensions with the values of their other ends, as torch.nn.CircularPad2d."""

    _mode = "circular"


class Softplus(_Activation):
    """log(1 + exp(beta x)) / beta elementwise, and x where beta x > threshold, as torch.nn.Softplus. Compiled, the
    logarithm is exact everywhere: x itself to float32's precision for beta x above 15, so a threshold of 15 or
    more changes nothing there, and a lower one is refused."""

    act = "softplus"
    _EXACT = 15.0  # log1p(exp(-z)) / z < 2**-24 beyond it

    def __init__(self, beta=1.0, threshold=20.0):
        super().__init__()
        if beta == 0:
            raise ValueError("Softplus: beta must not be 0")
        self.beta, self.threshold = beta, threshold
        if beta != 1.0 or threshold < self._EXACT:  # traced through forward: the node between two scales
            self._leaf = False

    def forward(self, input):
        from . import functional as F
        if not isinstance(input, Symbolic):
            return F.softplus(input, self.beta, self.threshold)
        if self.threshold < self._EXACT:
            from .graph import fail
            fail(f"Softplus(threshold={self.threshold}) in a compiled model", "a threshold of 15 or more: beyond it "
                 "the exact logarithm is beta x to float32's precision")
        return F.softplus(input * self.beta) * (1.0 / self.beta)

    def extra_repr(self):
        return f"beta={self.beta}, threshold={self.threshold}"


class _Function(Module):
    """A layer computing the F function _fn names, written with other ops (no arguments)."""

    _fn = None

    def forward(self, input):
        from . import functional as F
        return getattr(F, self._fn)(input)


class LogSigmoid(_Function):
    """log(sigmoid(x)) = -softplus(-x), as torch.nn.LogSigmoid."""

    _fn = "logsigmoid"


class Softsign(_Function):
    """x / (1 + |x|), as torch.nn.Softsign."""

    _fn = "softsign"


class Tanhshrink(_Function):
    """x - tanh(x), as torch.nn.Tanhshrink."""

    _fn = "tanhshrink"


class SELU(_Written):
    """scale * elu(x, alpha) with PyTorch's constants, as torch.nn.SELU."""

    _fn = "selu"


class CELU(Module):
    """max(0, x) + min(0, alpha (exp(x / alpha) - 1)), as torch.nn.CELU."""

    def __init__(self, alpha=1.0, inplace=False):
        super().__init__()
        if alpha == 0:
            raise ValueError("CELU: alpha must not be 0")
        self.alpha, self.inplace = float(alpha), inplace

    def forward(self, input):
        from . import functional as F
        return F.celu(input, self.alpha, self.inplace)

    def extra_repr(self):
        return f"alpha={self.alpha}"


class _Elementwise(_Activation):
    """An activation named by its C op (abs, huber with alpha = delta, xlogx): the pieces of losses."""

    def __init__(self, act, alpha=0.0):
        super().__init__()
        self.act, self.alpha = act, float(alpha)

    def forward(self, input):
        from . import functional as F
        return F._act(input, self.act, self.alpha)

    def extra_repr(self):
        return f"{self.act}" + (f", {self.alpha}" if self.alpha else "")


class LeakyReLU(_Activation):
    """x where x >= 0, negative_slope * x elsewhere, as torch.nn.LeakyReLU."""

    act = "leaky_relu"

    def __init__(self, negative_slope=0.01, inplace=False):
        super().__init__(inplace)
        self.negative_slope = negative_slope

    def forward(self, input):
        from . import functional as F
        return F.leaky_relu(input, self.negative_slope, self.inplace)

    def extra_repr(self):
        return f"negative_slope={self.negative_slope}" + (", inplace=True" if self.inplace else "")


class _Pool(Module):
    """Max and average pooling over (C, H, W) images, or (C, L) sequences in the 1-d layers."""

    _leaf = True
    _dims = 2

    def __init__(self, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, count_include_pad=True):
        super().__init__()
        n = self._dims
        self.kernel_size = _tuple(kernel_size, n)
        self.stride = self.kernel_size if stride is None else _tuple(stride, n)
        self.padding, self.dilation = _tuple(padding, n), _tuple(dilation, n)
        self.ceil_mode, self.count_include_pad = ceil_mode, count_include_pad
        # the arguments as given, for the repr (PyTorch's shows kernel_size=2, not (2, 2))
        self._given = (kernel_size, kernel_size if stride is None else stride, padding, dilation)

    def output_shape(self, shape):
        if len(shape) != self._dims + 1:
            raise ValueError(f"{type(self).__name__} takes samples of {self._dims + 1} dimensions, got {shape}")
        size = []
        for i, n in enumerate(shape[1:]):
            eff = self.dilation[i] * (self.kernel_size[i] - 1) + 1
            span = n + 2 * self.padding[i] - eff
            out = (-(-span // self.stride[i]) if self.ceil_mode else span // self.stride[i]) + 1
            # PyTorch: the last window must start inside the input or left padding
            if self.ceil_mode and (out - 1) * self.stride[i] >= n + self.padding[i]:
                out -= 1
            size.append(out)
        if min(size) < 1:
            raise ValueError(f"{type(self).__name__}: input {shape[1:]} is too small")
        return (shape[0], *size)

    def extra_repr(self):
        k, s, p, _ = self._given
        return f"kernel_size={k}, stride={s}, padding={p}"


class _MaxPool(_Pool):
    def __init__(self, kernel_size, stride=None, padding=0, dilation=1, return_indices=False, ceil_mode=False):
        super().__init__(kernel_size, stride, padding, dilation, ceil_mode)
        if return_indices and self._dims == 1:
            raise NotImplementedError("MaxPool1d: return_indices=True is not supported (MaxPool2d gives the indices "
                                      "eagerly)")
        self.return_indices = bool(return_indices)

    def forward(self, input):
        from . import functional as F
        if self._dims == 1:
            return F.max_pool1d(input, self.kernel_size, self.stride, self.padding, self.dilation, self.ceil_mode)
        return F.max_pool2d(input, self.kernel_size, self.stride, self.padding, self.dilation, self.ceil_mode,
                            self.return_indices)

    def _record(self, *inputs, **kwargs):
        if self.return_indices:
            from .graph import fail
            fail("MaxPool2d(return_indices=True) in a compiled forward", "a compiled program computes no integer "
                 "indices: pool without them (eagerly, the layer returns (output, indices))")
        return super()._record(*inputs, **kwargs)

    def extra_repr(self):
        return f"{super().extra_repr()}, dilation={self._given[3]}, ceil_mode={self.ceil_mode}"


class _AvgPool(_Pool):
    def __init__(self, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True):
        super().__init__(kernel_size, stride, padding, 1, ceil_mode, count_include_pad)

    def forward(self, input):
        from . import functional as F
        if self._dims == 1:
            return F.avg_pool1d(input, self.kernel_size, self.stride, self.padding, self.ceil_mode,
                                self.count_include_pad)
        return F.avg_pool2d(input, self.kernel_size, self.stride, self.padding, self.ceil_mode, self.count_include_pad,
                            self.divisor_override)


class MaxPool1d(_MaxPool):
    """Max pooling of (N, C, L) sequences, as torch.nn.MaxPool1d without return_indices (stride defaults to
    kernel_size; PyTorch's argument order); it runs as the 2-d pooling over (C, 1, L)."""

    _dims = 1


class MaxPool2d(_MaxPool):
    """Max pooling of (N, C, H, W) images, as torch.nn.MaxPool2d (stride defaults to kernel_size; PyTorch's argument
    order). With return_indices=True it returns (output, indices) eagerly; a compiled forward refuses it."""

    _dims = 2


class AvgPool1d(_AvgPool):
    """Average pooling of (N, C, L) sequences, as torch.nn.AvgPool1d (stride defaults to kernel_size); it runs as the
    2-d pooling over (C, 1, L)."""

    _dims = 1


class AvgPool2d(_AvgPool):
    """Average pooling of (N, C, H, W) images, as torch.nn.AvgPool2d (stride defaults to kernel_size); each window's sum
    divided by divisor_override when given."""

    _dims = 2

    def __init__(self, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
                 divisor_override=None):
        super().__init__(kernel_size, stride, padding, ceil_mode, count_include_pad)
        if divisor_override is not None and (isinstance(divisor_override, bool) or
                                             not isinstance(divisor_override, int) or divisor_override < 1):
            raise ValueError(f"AvgPool2d: divisor_override must be a positive int, got {divisor_override!r}")
        self.divisor_override = divisor_override


class _AdaptivePool(Module):
    _leaf = True
    _dims = 2

    def __init__(self, output_size):
        super().__init__()
        self.output_size = _tuple(output_size, self._dims)

    def output_shape(self, shape):
        if len(shape) != self._dims + 1:
            raise ValueError(f"{type(self).__name__} takes samples of {self._dims + 1} dimensions, got {shape}")
        return (shape[0], *(s if o is None else o for o, s in zip(self.output_size, shape[1:])))

    def forward(self, input):
        from . import functional as F
        return getattr(F, f"adaptive_{self._kind}_pool{self._dims}d")(input, self.output_size)

    def extra_repr(self):
        return f"output_size={self.output_size}"


class AdaptiveAvgPool1d(_AdaptivePool):
    """Average pooling of (N, C, L) sequences to output_size steps, as torch.nn.AdaptiveAvgPool1d."""

    _kind, _dims = "avg", 1


class AdaptiveAvgPool2d(_AdaptivePool):
    """Average pooling of (N, C, H, W) images to output_size (an int, or a pair whose None entries keep the input's
    size), as torch.nn.AdaptiveAvgPool2d."""

    _kind, _dims = "avg", 2


class AdaptiveMaxPool1d(_AdaptivePool):
    """Max pooling of (N, C, L) sequences to output_size steps, as torch.nn.AdaptiveMaxPool1d without return_indices."""

    _kind, _dims = "max", 1


class AdaptiveMaxPool2d(_AdaptivePool):
    """Max pooling of (N, C, H, W) images to output_size (an int, or a pair whose None entries keep the input's size),
    as torch.nn.AdaptiveMaxPool2d without return_indices."""

    _kind, _dims = "max", 2


class Softmax(Module):
    """softmax along dim (PyTorch's nn.Softmax; dim names a dimension of the batch-first input)."""

    _leaf = True

    def __init__(self, dim=None):
        super().__init__()
        if dim is None:
            raise ValueError(f"{type(self).__name__}: give dim (the implicit choice is deprecated in PyTorch)")
        self.dim = dim

    def output_shape(self, shape):
        from .graph import _dim
        _dim(self.dim, len(shape))  # a dimension of the sample, not the batch
        return shape

    def forward(self, input):
        from . import functional as F
        return F.softmax(input, self.dim)

    def extra_repr(self):
        return f"dim={self.dim}"


class Softmin(Module):
    """softmax(-x) along dim, as torch.nn.Softmin."""

    def __init__(self, dim=None):
        super().__init__()
        self.dim = dim

    def forward(self, input):
        from . import functional as F
        return F.softmin(input, self.dim)

    def extra_repr(self):
        return f"dim={self.dim}"


class Threshold(Module):
    """x where x > threshold, value elsewhere, as torch.nn.Threshold."""

    def __init__(self, threshold, value, inplace=False):
        super().__init__()
        self.threshold, self.value, self.inplace = threshold, value, inplace

    def forward(self, input):
        from . import functional as F
        return F.threshold(input, self.threshold, self.value, self.inplace)

    def extra_repr(self):
        return f"threshold={self.threshold}, value={self.value}" + (", inplace=True" if self.inplace else "")


class _Shrink(Module):
    def __init__(self, lambd=0.5):
        super().__init__()
        self.lambd = lambd

    def extra_repr(self):
        return f"{self.lambd}"


class Hardshrink(_Shrink):
    """x where |x| > lambd, 0 elsewhere, as torch.nn.Hardshrink."""

    def forward(self, input):
        from . import functional as F
        return F.hardshrink(input, self.lambd)


class Softshrink(_Shrink):
    """x moved towards 0 by lambd, 0 within [-lambd, lambd], as torch.nn.Softshrink."""

    def forward(self, input):
        from . import functional as F
        return F.softshrink(input, self.lambd)


class ChannelShuffle(Module):
    """The channels regrouped as F.channel_shuffle does (ShuffleNet), as torch.nn.ChannelShuffle."""

    def __init__(self, groups):
        super().__init__()
        self.groups = groups

    def forward(self, input):
        from . import functional as F
        return F.channel_shuffle(input, self.groups)

    def extra_repr(self):
        return f"groups={self.groups}"


class Softmax2d(Softmax):
    """softmax over the channels of (N, C, H, W) or (C, H, W) images, as torch.nn.Softmax2d."""

    def __init__(self):
        super().__init__(-3)

    def extra_repr(self):
        return ""


class LogSoftmax(Softmax):
    """log(softmax(x)) along dim, as torch.nn.LogSoftmax; dim must be given."""

    def forward(self, input):
        from . import functional as F
        return F.log_softmax(input, self.dim)


class Dropout(Module):
    """Zeroes each element with probability p in training and scales the rest by 1 / (1 - p); the identity in eval mode.
    The mask comes from fasttrain's Philox generator (see F.dropout); p = 1 zeroes everything, as PyTorch's."""

    _leaf = True
    _fn, _dims = "dropout", 0  # channel dropout: the spatial dimensions a channel's single draw covers

    def __init__(self, p=0.5, inplace=False):
        super().__init__()
        if not 0 <= p <= 1:
            raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
        self.p, self.inplace = p, inplace  # inplace: eager calls only, as for the activations

    def forward(self, input):
        from . import functional as F
        return getattr(F, self._fn)(input, self.p, self.training, self.inplace)

    def output_shape(self, shape):
        if self._dims and len(shape) not in (2, self._dims + 1):  # Dropout2d reads (C, L) samples as PyTorch does
            raise ValueError(f"{type(self).__name__} takes samples of {self._dims + 1} dimensions (C, ...), got "
                             f"{shape}")
        return shape

    def extra_repr(self):
        return f"p={self.p}, inplace={self.inplace}"


class Dropout1d(Dropout):
    """Zeroes each channel of (N, C, L) samples whole with probability p in training, as torch.nn.Dropout1d."""

    _fn, _dims = "dropout1d", 1


class Dropout2d(Dropout):
    """Zeroes each channel of (N, C, H, W) images whole with probability p in training, as torch.nn.Dropout2d (which
    reads (N, C, L) as sequences, and warns)."""

    _fn, _dims = "dropout2d", 2


class Flatten(Module):
    """Merges dimensions start_dim..end_dim into one (default: everything after the batch), as torch.nn.Flatten. In a
    compiled model start_dim must be at least 1: the batch stays its own dimension."""

    _leaf = True

    def __init__(self, start_dim=1, end_dim=-1):
        super().__init__()
        self.start_dim, self.end_dim = start_dim, end_dim

    def output_shape(self, shape):
        full = (None, *shape)
        s = self.start_dim % len(full)
        e = self.end_dim % len(full)
        if s == 0:
            raise ValueError("Flatten in a model keeps the batch dimension: start_dim must be >= 1")
        return (*shape[:s - 1], math.prod(shape[s - 1:e]), *shape[e:])

    def forward(self, input):
        return input.flatten(self.start_dim, self.end_dim)


class Identity(Module):
    """Returns its input unchanged, as torch.nn.Identity (a placeholder layer), whose arguments it takes and ignores
    (nn.Identity(54, unused=...) stands in for a layer of those arguments)."""

    _leaf = True

    def __init__(self, *args, **kwargs):
        super().__init__()

    def forward(self, input):
        return input


# The layers of each row alone, which rows merged from the batch go through (see Module.__call__).
_ROW_WISE = (Linear, LayerNorm, _Activation, Identity)


def _volumetric(name):
    """A 3-d layer's name, so that code naming it (a default argument: torchvision's Conv3dNormActivation) imports;
    building one raises NotImplementedError."""
    def __init__(self, *args, **kwargs):
        from .graph import _VOLUMETRIC
        raise NotImplementedError(f"nn.{name}: {_VOLUMETRIC}")
    return type(name, (Module,), {"__init__": __init__, "__module__": __name__,
                                  "__doc__": f"torch.nn.{name}'s name: building one raises NotImplementedError (3-d "
                                             "layers are not supported)."})


Conv3d, ConvTranspose3d, MaxPool3d, AvgPool3d, AdaptiveAvgPool3d, AdaptiveMaxPool3d, BatchNorm3d, InstanceNorm3d, \
    Dropout3d = map(_volumetric, ("Conv3d", "ConvTranspose3d", "MaxPool3d", "AvgPool3d", "AdaptiveAvgPool3d",
                                  "AdaptiveMaxPool3d", "BatchNorm3d", "InstanceNorm3d", "Dropout3d"))


def _sequential_part(module):
    if not isinstance(module, Module):
        raise TypeError(f"Sequential takes Modules, got {type(module).__name__}")
    return module


class Sequential(Module):
    """Modules applied in order, each to the previous one's output, as torch.nn.Sequential: given as arguments (children
    named 0, 1, ...) or as one OrderedDict of names to modules. Indexing gives the i-th module, a slice a Sequential
    of those (under their names); append, extend, insert, pop, item assignment and deletion change it in place,
    an insertion or deletion naming the children 0, 1, ... again."""

    def __init__(self, *modules):
        super().__init__()
        if len(modules) == 1 and isinstance(modules[0], OrderedDict):
            modules = modules[0].items()
        else:
            modules = ((str(i), m) for i, m in enumerate(modules))
        for name, m in modules:
            setattr(self, name, _sequential_part(m))

    def __getitem__(self, i):
        items = list(self._modules.items())
        return Sequential(OrderedDict(items[i])) if isinstance(i, slice) else items[i][1]

    def __setitem__(self, i, module):
        setattr(self, list(self._modules)[i], _sequential_part(module))

    def __delitem__(self, i):
        held = list(self._modules.values())
        del held[i]
        self._renumbered(held)

    def _renumbered(self, held):
        for name in list(self._modules):
            delattr(self, name)
        for k, m in enumerate(held):
            setattr(self, str(k), m)

    def __len__(self):
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules.values())

    def append(self, module):
        """Adds module at the end (named by its position); returns self."""
        setattr(self, str(len(self._modules)), _sequential_part(module))
        return self

    def extend(self, modules):
        """Appends each module of an iterable; returns self."""
        for m in modules:
            self.append(m)
        return self

    def insert(self, index, module):
        """Puts module at position index (-len(self) <= index <= len(self)); returns self."""
        held = list(self._modules.values())
        if not -len(held) <= index <= len(held):
            raise IndexError(f"Sequential.insert: index {index} out of range for {len(held)} modules")
        held.insert(index, _sequential_part(module))
        self._renumbered(held)
        return self

    def pop(self, index=-1):
        """Removes the module at index and returns it."""
        module = self[index]
        del self[index]
        return module

    def forward(self, input):
        for m in self._modules.values():
            input = m(input)
        return input


class _Held(Module):
    """The read side of ModuleList/Dict and ParameterList/Dict: what they hold is the table _held names."""

    _held = "_modules"

    def _table(self):
        return getattr(self, self._held)

    def __len__(self):
        return len(self._table())

    def __contains__(self, key):
        return key in self._table()

    def keys(self):
        """The names, in the order they were set."""
        return self._table().keys()

    def values(self):
        """What is held, in the order it was set."""
        return self._table().values()

    def items(self):
        """(name, value) pairs, in the order they were set."""
        return self._table().items()

    def forward(self, *args):
        """Not callable: raises TypeError. Index or iterate over the container in the owner's forward."""
        raise TypeError(f"{type(self).__name__} is not callable: index it or iterate over it in forward")


class _List(_Held):
    def __init__(self, values=()):
        super().__init__()
        self.extend(values)

    def extend(self, values):
        """Appends each value of an iterable; returns self (also as list += values)."""
        for v in values:
            self.append(v)
        return self

    __iadd__ = extend

    def __add__(self, other):
        """A new list of this one's values, then other's."""
        return type(self)([*self, *other])

    def __getitem__(self, i):
        items = list(self._table().values())
        return type(self)(items[i]) if isinstance(i, slice) else items[i]

    def __iter__(self):
        return iter(self._table().values())


class _Dict(_Held):
    def __init__(self, values=None):
        super().__init__()
        for name, v in (values.items() if isinstance(values, dict) else values or ()):
            self[name] = v

    def __getitem__(self, name):
        return self._table()[name]

    def __iter__(self):
        return iter(self._table())


class ModuleList(_List):
    """Holds modules in a list, registered as children named 0, 1, ... (PyTorch's state_dict keys)."""

    def append(self, module):
        """Adds module as the next child (named by its position); returns self."""
        if not isinstance(module, Module):
            raise TypeError(f"ModuleList holds Modules, got {type(module).__name__}")
        setattr(self, str(len(self._modules)), module)
        return self

    def insert(self, index, module):
        """Puts module at index (the ones from there on move up one, renamed by their positions)."""
        held = list(self)
        held.insert(index, module)
        for name in list(self._modules):
            delattr(self, name)
        self.extend(held)


class ParameterList(_List):
    """Holds parameters in a list, registered as 0, 1, ... (PyTorch's state_dict keys)."""

    _held = "_parameters"

    def append(self, value):
        """Registers value (made a Parameter if it is not one) as the next parameter; returns self."""
        self.register_parameter(str(len(self._parameters)), value)
        return self


class ModuleDict(_Dict):
    """Holds modules by name, registered as children under those names."""

    def __setitem__(self, name, module):
        if not isinstance(module, Module):
            raise TypeError(f"ModuleDict holds Modules, got {type(module).__name__}")
        setattr(self, name, module)


class ParameterDict(_Dict):
    """Holds parameters by name, registered under those names."""

    _held = "_parameters"

    def __setitem__(self, name, value):
        self.register_parameter(name, value)


_REDUCTIONS = ("none", "mean", "sum")


def _reduction(name, reduction, allowed=_REDUCTIONS):
    if reduction not in allowed:
        raise ValueError(f"{name}: reduction must be one of {', '.join(map(repr, allowed))}, got {reduction!r}")
    return reduction


class _Loss(Module):
    """A loss: forward(input, target) as PyTorch's. Called on traced values (model.compile) it records the loss
    as part of the graph, differentiated with the model."""

    def __init__(self, reduction="mean"):
        super().__init__()
        self.reduction = _reduction(type(self).__name__, reduction, self._reductions)

    _reductions = _REDUCTIONS

    def extra_repr(self):
        return f"reduction={self.reduction!r}" if self.reduction != "mean" else ""


class _ClassLoss(_Loss):
    """A loss of (C,) scores per sample and int64 class targets: one node of the compiled program."""

    _leaf = True
    _classes_dim = 0  # compiled: the classes' dimension in the scores the node reads (see _symbolic)

    def __init__(self, weight=None, ignore_index=-100, reduction="mean"):
        super().__init__(reduction)
        if weight is not None and (not isinstance(weight, TensorBase) or weight.ndim != 1):
            raise TypeError(f"{type(self).__name__}: weight must be a 1-d fasttrain Tensor of class weights")
        self.register_buffer("weight", weight)
        self.ignore_index = int(ignore_index)

    def _symbolic(self, scores, target):
        from .graph import bind_target
        name, shape = type(self).__name__, scores.node.shape
        kdim = isinstance(self, CrossEntropyLoss)  # PyTorch's K-dimensional form: classes first
        if not shape or (len(shape) > 1 and not kdim):
            raise ValueError(f"{name}: compiled, it takes (N, C) scores" + (" or (N, C, d...)" if kdim else "")
                             + f", got {scores.shape}")
        if self.weight is not None and self.weight.shape[0] != shape[0]:
            raise ValueError(f"{name}: {self.weight.shape[0]} class weights for {shape[0]} classes")
        bind_target(target, shape[1:], "int64")
        loss, node = self, scores.node
        if kdim and isinstance(node.module, Permute) and node.module.perm == (len(shape) - 1, *range(len(shape) - 1)):
            # classes moved first from last (logits.transpose(1, 2), logits.view(-1, V)): the node reads the
            # scores as they are, with no copy of them or of their gradient
            loss, scores = copy.copy(self), Symbolic(node.inputs[0])
            loss._classes_dim = len(shape) - 1
        if self.reduction == "none":  # each sample's loss, or each position's (d...) as PyTorch gives them
            return Symbolic.record(loss, [scores, target], tuple(shape[1:]), reduced=False)
        return Symbolic.record(loss, [scores, target], (), reduced=True)


class CrossEntropyLoss(_ClassLoss):
    """Cross entropy of unnormalized scores (N, C), or (N, C, d...), and class-index targets (N) or (N, d...), with
    PyTorch's weight, ignore_index, reduction and label_smoothing (see F.cross_entropy). Compiled, it is one node of the
    program."""

    def __init__(self, weight=None, size_average=None, ignore_index=-100, reduce=None, reduction="mean",
                 label_smoothing=0.0):
        from .functional import _legacy_reduction
        super().__init__(weight, ignore_index, _legacy_reduction(size_average, reduce, reduction))
        if not 0.0 <= label_smoothing <= 1.0:
            raise ValueError(f"label_smoothing must be in [0, 1], got {label_smoothing}")
        self.label_smoothing = float(label_smoothing)

    def forward(self, input, target):
        from . import functional as F
        return F.cross_entropy(input, target, self.weight, ignore_index=self.ignore_index, reduction=self.reduction,
                               label_smoothing=self.label_smoothing)

    def _symbolic(self, scores, target):
        t = target.node
        if isinstance(t.module, Target) and (t.shape is None or not getattr(t.module.dtype, "is_floating_point", 0)):
            return super()._symbolic(scores, target)
        # class probabilities (mixup's targets given with target_dtype=ft.float32, a teacher's softmax), as
        # PyTorch: -sum_c w_c t_c log_softmax(x)_c per position, smoothed first; the mean is over positions
        shape = scores.node.shape
        if t.shape != shape:
            from .graph import fail, topological
            if any(n.module is None and not n.dtype.is_floating_point for n in topological([t])):
                fail("class labels taken as an input of forward (nanoGPT's forward(idx, targets)) in a class loss",
                     "the loss reads the batch's targets: return the logits from forward and give the loss to "
                     "compile (model.compile(opt, loss, ...) with batches (idx, targets))")
            if any(isinstance(n.module, Target) and not getattr(n.module.dtype, "is_floating_point", 0)
                   for n in topological([t])):
                fail("class labels computed from the targets (a slice y[:, 1:] or y[:, -1], y.clamp(...)) in a "
                     "class loss", "a class loss reads the labels as given, or viewed (y.view(-1)): shift or pick "
                     "them in the data (x, y = ids[:, :-1], ids[:, 1:]), and compile with target_shape= theirs")
            raise ValueError(f"CrossEntropyLoss: class probabilities must have the scores' shape {scores.shape}, got "
                             f"{target.shape}")
        C = shape[0]
        if self.label_smoothing:
            target = target * (1.0 - self.label_smoothing) + self.label_smoothing / C
        products = target * scores.log_softmax(1)
        if self.weight is not None:
            products = products * self.weight.reshape(C, *(1,) * (len(shape) - 1))
        return (-products.sum(1)).reduce(self.reduction)


class NLLLoss(_ClassLoss):
    """The negative log-likelihood of log-probabilities (log_softmax outputs) and class targets."""

    def __init__(self, weight=None, size_average=None, ignore_index=-100, reduce=None, reduction="mean"):
        from .functional import _legacy_reduction
        super().__init__(weight, ignore_index, _legacy_reduction(size_average, reduce, reduction))

    def forward(self, input, target):
        from . import functional as F
        return F.nll_loss(input, target, self.weight, ignore_index=self.ignore_index, reduction=self.reduction)


class MSELoss(_Loss):
    """The squared error (input - target)^2 of equally shaped tensors, reduced as reduction says.

    A target of shape (N,) for an output of shape (N, 1) is taken as (N, 1), eagerly and in a compiled program:
    each sample's one value against its one target. (PyTorch broadcasts the two to (N, N) with a warning, which
    trains on every pair of samples: almost never what was meant.) The other regression losses do the same."""

    def forward(self, input, target):
        from . import functional as F
        return F.mse_loss(input, target, reduction=self.reduction)


class L1Loss(_Loss):
    """The absolute error |input - target| of equally shaped tensors, reduced as reduction says. Called eagerly it
    computes in float64 NumPy and returns a float32 tensor (see F.l1_loss)."""

    def forward(self, input, target):
        from . import functional as F
        return F.l1_loss(input, target, reduction=self.reduction)


class SmoothL1Loss(_Loss):
    """PyTorch's smooth L1 loss: 0.5 d^2 / beta where |d| < beta, else |d| - 0.5 beta, for d = input - target (see
    F.smooth_l1_loss)."""

    def __init__(self, size_average=None, reduce=None, reduction="mean", beta=1.0):
        from .functional import _legacy_reduction
        super().__init__(_legacy_reduction(size_average, reduce, reduction))
        if beta < 0:
            raise ValueError(f"SmoothL1Loss: beta must be >= 0, got {beta}")
        self.beta = float(beta)

    def forward(self, input, target):
        from . import functional as F
        return F.smooth_l1_loss(input, target, reduction=self.reduction, beta=self.beta)


class HuberLoss(_Loss):
    """PyTorch's Huber loss: 0.5 d^2 where |d| < delta, else delta (|d| - 0.5 delta), for d = input - target (see
    F.huber_loss)."""

    def __init__(self, reduction="mean", delta=1.0):
        super().__init__(reduction)
        if not delta > 0:
            raise ValueError(f"HuberLoss: delta must be > 0, got {delta}")
        self.delta = float(delta)

    def forward(self, input, target):
        from . import functional as F
        return F.huber_loss(input, target, reduction=self.reduction, delta=self.delta)


class BCEWithLogitsLoss(_Loss):
    """Binary cross entropy of logits and targets in [0, 1] of the same shape, computed through softplus for stability,
    with PyTorch's weight and pos_weight (see F.binary_cross_entropy_with_logits)."""

    def __init__(self, weight=None, size_average=None, reduce=None, reduction="mean", pos_weight=None):
        from .functional import _legacy_reduction
        super().__init__(_legacy_reduction(size_average, reduce, reduction))
        self.register_buffer("weight", weight)
        self.register_buffer("pos_weight", pos_weight)

    def forward(self, input, target):
        from . import functional as F
        return F.binary_cross_entropy_with_logits(input, target, self.weight, reduction=self.reduction,
                                                  pos_weight=self.pos_weight)


class BCELoss(_Loss):
    """Binary cross entropy of probabilities and targets in [0, 1] of the same shape (see F.binary_cross_entropy;
    BCEWithLogitsLoss on the logits is the stabler form)."""

    def __init__(self, weight=None, size_average=None, reduce=None, reduction="mean"):
        from .functional import _legacy_reduction
        super().__init__(_legacy_reduction(size_average, reduce, reduction))
        self.register_buffer("weight", weight)

    def forward(self, input, target):
        from . import functional as F
        return F.binary_cross_entropy(input, target, self.weight, reduction=self.reduction)


class TripletMarginLoss(_Loss):
    """max(d(anchor, positive) - d(anchor, negative) + margin, 0), d the p-norm distance (see
    F.triplet_margin_loss), as torch.nn.TripletMarginLoss."""

    def __init__(self, margin=1.0, p=2.0, eps=1e-6, swap=False, size_average=None, reduce=None, reduction="mean"):
        from .functional import _legacy_reduction
        super().__init__(_legacy_reduction(size_average, reduce, reduction))
        self.margin, self.p, self.eps, self.swap = margin, p, eps, swap

    def forward(self, anchor, positive, negative):
        from . import functional as F
        return F.triplet_margin_loss(anchor, positive, negative, self.margin, self.p, self.eps, self.swap,
                                     reduction=self.reduction)


class SoftMarginLoss(_Loss):
    """log(1 + exp(-y x)) for targets 1 or -1, as torch.nn.SoftMarginLoss."""

    def __init__(self, size_average=None, reduce=None, reduction="mean"):
        from .functional import _legacy_reduction
        super().__init__(_legacy_reduction(size_average, reduce, reduction))

    def forward(self, input, target):
        from . import functional as F
        return F.soft_margin_loss(input, target, reduction=self.reduction)


class MultiLabelSoftMarginLoss(_Loss):
    """Binary cross entropy of each of C classes from its score, averaged over the classes, as
    torch.nn.MultiLabelSoftMarginLoss (weight: one per class)."""

    def __init__(self, weight=None, size_average=None, reduce=None, reduction="mean"):
        from .functional import _legacy_reduction
        super().__init__(_legacy_reduction(size_average, reduce, reduction))
        self.register_buffer("weight", weight)

    def forward(self, input, target):
        from . import functional as F
        return F.multilabel_soft_margin_loss(input, target, self.weight, reduction=self.reduction)


class GaussianNLLLoss(_Loss):
    """The negative log likelihood of targets under Gaussians of the input's means and the variances var, as
    torch.nn.GaussianNLLLoss; call it as loss(input, target, var)."""

    def __init__(self, *, full=False, eps=1e-6, reduction="mean"):
        super().__init__(reduction)
        self.full, self.eps = full, eps

    def forward(self, input, target, var):
        from . import functional as F
        return F.gaussian_nll_loss(input, target, var, self.full, self.eps, self.reduction)


class PoissonNLLLoss(_Loss):
    """The negative log likelihood of targets under Poisson distributions of the input's rates (log rates with
    log_input), as torch.nn.PoissonNLLLoss without full."""

    def __init__(self, log_input=True, full=False, size_average=None, eps=1e-8, reduce=None, reduction="mean"):
        from .functional import _legacy_reduction
        super().__init__(_legacy_reduction(size_average, reduce, reduction))
        if full:
            raise NotImplementedError("PoissonNLLLoss: full=True (Stirling's approximation term) is not supported")
        self.log_input, self.eps = log_input, eps

    def forward(self, log_input, target):
        from . import functional as F
        return F.poisson_nll_loss(log_input, target, self.log_input, eps=self.eps, reduction=self.reduction)


class _PairLoss(_Loss):
    """A loss of two inputs and targets 1 or -1 with a margin: the F function _fn names."""

    _fn = None

    def __init__(self, margin=0.0, size_average=None, reduce=None, reduction="mean"):
        from .functional import _legacy_reduction
        super().__init__(_legacy_reduction(size_average, reduce, reduction))
        self.margin = margin

    def forward(self, input1, input2, target):
        from . import functional as F
        return getattr(F, self._fn)(input1, input2, target, self.margin, reduction=self.reduction)


class MarginRankingLoss(_PairLoss):
    """max(0, -y (x1 - x2) + margin), as torch.nn.MarginRankingLoss."""

    _fn = "margin_ranking_loss"


class CosineEmbeddingLoss(_PairLoss):
    """1 - cos(x1, x2) for y = 1, max(0, cos(x1, x2) - margin) for y = -1, as torch.nn.CosineEmbeddingLoss."""

    _fn = "cosine_embedding_loss"


class CosineSimilarity(Module):
    """F.cosine_similarity along dim, as torch.nn.CosineSimilarity."""

    def __init__(self, dim=1, eps=1e-8):
        super().__init__()
        self.dim, self.eps = dim, eps

    def forward(self, x1, x2):
        from . import functional as F
        return F.cosine_similarity(x1, x2, self.dim, self.eps)


class PairwiseDistance(Module):
    """F.pairwise_distance over the last dimension, as torch.nn.PairwiseDistance."""

    def __init__(self, p=2.0, eps=1e-6, keepdim=False):
        super().__init__()
        self.norm, self.eps, self.keepdim = p, eps, keepdim

    def forward(self, x1, x2):
        from . import functional as F
        return F.pairwise_distance(x1, x2, self.norm, self.eps, self.keepdim)


class KLDivLoss(_Loss):
    """Kullback-Leibler divergence of log-probabilities input from target (probabilities, or log-probabilities with
    log_target=True), as torch.nn.KLDivLoss; reduction='batchmean' gives the true KL divergence (see F.kl_div)."""

    _reductions = _REDUCTIONS + ("batchmean",)

    def __init__(self, size_average=None, reduce=None, reduction="mean", log_target=False):
        from .functional import _legacy_reduction
        super().__init__(_legacy_reduction(size_average, reduce, reduction))
        self.log_target = log_target

    def forward(self, input, target):
        from . import functional as F
        return F.kl_div(input, target, reduction=self.reduction, log_target=self.log_target)


class Attention(Module):
    """Scaled dot-product attention of `heads` heads over (T, E) rows (recorded by
    F.scaled_dot_product_attention)."""

    _leaf = True

    def __init__(self, heads, causal=False, scale=None, keys=None, dropout=0.0, bias=False):
        super().__init__()
        if scale is not None and not scale > 0:
            raise ValueError(f"attention: scale must be positive (or None for 1/sqrt(D)), got {scale}")
        self.heads, self.causal, self.scale, self.keys, self.dropout = heads, bool(causal), scale, keys, dropout
        self.bias = bias  # the last input is added to the scores

    def extra_repr(self):
        return f"heads={self.heads}" + (", causal" if self.causal else "") + \
            (f", dropout={self.dropout}" if self.dropout else "") + (", score bias" if self.bias else "")


def _rnn_cell(mode, gi, state, w_hh, b_hh):
    """The next state ((h,) or (h, c)) of an RNN ('RNN_TANH', 'RNN_RELU'), LSTM or GRU cell from the input's
    projection gi = x W_ih^T + b_ih (N, gates * hidden) and state (None: zeros), as PyTorch computes it."""
    from . import functional as F
    gh = F.linear(state[0], w_hh, b_hh) if state is not None else b_hh  # the hidden term of h = 0: its bias
    if mode == "GRU":
        (i_r, i_z, i_n), h_r, h_z, h_n = gi.chunk(3, -1), *(gh.chunk(3, -1) if gh is not None else (0.0,) * 3)
        r, z = F.sigmoid(i_r + h_r), F.sigmoid(i_z + h_z)
        n = F.tanh(i_n + r * h_n)
        return ((1.0 - z) * n + (z * state[0] if state is not None else 0.0),)
    gates = gi + gh if gh is not None else gi
    if mode == "LSTM":
        c = _lstm_step(LSTMState, _C.lstm_cell_forward, gates, None if state is None else state[1])
        return _lstm_step(LSTMOutput, _C.lstm_hidden_forward, gates, c), c
    return (F.tanh(gates) if mode == "RNN_TANH" else F.relu(gates),)


def _lstm_step(layer, op, gates, state):
    """An LSTM step's cell state (layer LSTMState, op lstm_cell_forward) or output (LSTMOutput,
    lstm_hidden_forward) from its gates (N, 4H), or (4H,) unbatched, and a state (N, H) (the last cell state, or
    the new one; None: none): one fused pass, traced or eager."""
    if isinstance(gates, Symbolic) or isinstance(state, Symbolic):
        return layer()(*[x for x in (gates, state) if x is not None])
    one = gates.ndim == 1
    out = op(None, gates.unsqueeze(0) if one else gates, state.unsqueeze(0) if one and state is not None else state)
    return out[0] if one else out


class LSTMState(Module):
    """An LSTM step's cell state sigmoid(f) c + sigmoid(i) tanh(g) from its gates (4H,) in PyTorch's order (i, f,
    g, o) and the last cell state (H,), if any (recorded by the LSTM layers and cells)."""

    _leaf = True

    def output_shape(self, gates, *state):
        return (gates[0] // 4,)


class _RecurrentLayer(Module):
    """A whole recurrent layer's steps in one node, over the steps from the last to the first with reverse (recorded
    by the RNN layers); weight and bias are the layer's W_hh and b_hh."""

    _leaf = True

    def __init__(self, weight, bias, reverse):
        super().__init__()
        object.__setattr__(self, "weight", weight)  # the RNN's own parameters, read where it keeps them
        object.__setattr__(self, "bias", bias)
        self.reverse = reverse


class LSTMLayer(_RecurrentLayer):
    """An LSTM layer's node: every step's input projection (T, 4H), and optionally the initial h and c (H,), to
    each step's h and c side by side (T, 2H)."""

    def output_shape(self, gates, *state):
        return (gates[0], gates[1] // 2)


class GRULayer(_RecurrentLayer):
    """A GRU layer's node (on the CPU): every step's input projection (T, 3H), and optionally the initial h (H,),
    to each step's h (T, H)."""

    def output_shape(self, gates, *state):
        return (gates[0], gates[1] // 3)


class LSTMOutput(Module):
    """An LSTM step's output sigmoid(o) tanh(c) from its gates (4H,) and its cell state (H,) (recorded by the LSTM
    layers and cells)."""

    _leaf = True

    def output_shape(self, gates, state):
        return state


def _rnn_weights(module, suffix, input_size, hidden_size, gates, bias):
    """Registers weight_ih, weight_hh (and bias_ih, bias_hh) + suffix for `gates` gates, as PyTorch shapes and
    initialises them: U(-1/sqrt(hidden_size), 1/sqrt(hidden_size))."""
    G = gates * hidden_size
    shapes = {"weight_ih": (G, input_size), "weight_hh": (G, hidden_size), **({"bias_ih": (G,), "bias_hh": (G,)}
                                                                             if bias else {})}
    for kind, shape in shapes.items():
        module.register_parameter(kind + suffix, creation.empty(*shape))


def _reset_rnn(module):
    """Every weight and bias of an RNN (or cell) drawn afresh from U(-1/sqrt(hidden_size), 1/sqrt(hidden_size)),
    in the order of its parameters, as PyTorch's reset_parameters."""
    k = 1.0 / math.sqrt(module.hidden_size)
    for p in module.parameters():
        init.uniform_(p, -k, k)


class _RNNBase(Module):
    """RNN, LSTM and GRU as PyTorch's (its parameter names, shapes, initialisation and gate order), written with
    linear layers and activations over the steps, so that they run eagerly and compile alike: every step's input
    projection is one product; a compiled program runs an LSTM layer's recurrence as one node (LSTMLayer), a GRU
    layer's as one node on the CPU (GRULayer), and unrolls an RNN's steps and a GRU's on a GPU (a node per gate and
    step). Traced, the input is batch first (batch_first=True)."""

    _gates = 1
    _mode = None

    def __init__(self, input_size, hidden_size, num_layers=1, bias=True, batch_first=False, dropout=0.0,
                 bidirectional=False, proj_size=0):
        super().__init__()
        name = type(self).__name__
        if proj_size:
            raise NotImplementedError(f"{name}: proj_size is not supported")
        if not 0 <= dropout <= 1:
            raise ValueError(f"{name}: dropout must be in [0, 1], got {dropout}")
        if min(input_size, hidden_size, num_layers) < 1:
            raise ValueError(f"{name}: input_size, hidden_size and num_layers must be positive")
        self.input_size, self.hidden_size, self.num_layers = input_size, hidden_size, num_layers
        self.bias, self.batch_first, self.dropout, self.bidirectional = bias, batch_first, float(dropout), bidirectional
        for layer in range(num_layers):
            for suffix in ("", "_reverse")[:1 + bidirectional]:
                fan_in = input_size if layer == 0 else hidden_size * (1 + bidirectional)
                _rnn_weights(self, f"_l{layer}{suffix}", fan_in, hidden_size, self._gates, bias)
        self.reset_parameters()

    reset_parameters = _reset_rnn

    def _weights(self, layer, direction):
        suffix = "_reverse" if direction else ""
        return [getattr(self, f"{kind}_l{layer}{suffix}", None) for kind in ("weight_ih", "weight_hh", "bias_ih",
                                                                           "bias_hh")]

    def flatten_parameters(self):
        """Does nothing: PyTorch's packs the weights for cuDNN, which the compiled program reads where they are
        (its flat buffer holds every parameter already)."""

    def forward(self, input, hx=None):
        from . import functional as F
        from .. import _math
        from .graph import Layered, fail
        traced, name = isinstance(input, Symbolic), type(self).__name__
        if isinstance(input, Stacked):
            fail(f"{name} of a traced value moved sequence first (x.transpose(0, 1))", f"keep the batch first: "
                 f"construct the {name} with batch_first=True and pass it the value as it was")
        if traced and not self.batch_first:
            fail(f"{name}(batch_first=False) on a traced value", f"traced values are batch first: construct the "
                 f"{name} with batch_first=True")
        x, unbatched = input, not traced and input.ndim == 2
        if not traced and input.ndim not in (2, 3):
            raise ValueError(f"{name}: expected a 2-d (unbatched) or 3-d input, got shape {tuple(input.shape)}")
        if unbatched:
            x = x.unsqueeze(0)
        elif not traced and not self.batch_first:
            x = x.transpose(0, 1)  # (N, T, features) within
        if x.shape[-1] != self.input_size:
            raise ValueError(f"{name}: input has {x.shape[-1]} features, expected input_size={self.input_size}")
        first = self._states(hx, traced, unbatched)
        D, T = 1 + self.bidirectional, x.shape[1]
        last = []
        for layer in range(self.num_layers):
            outs = []
            for d in range(D):
                w_ih, w_hh, b_ih, b_hh = self._weights(layer, d)
                gi = F.linear(x, w_ih, b_ih)  # every step's input projection in one product, as cuDNN's
                state, steps = first[layer * D + d], [None] * T
                end = 0 if d else T - 1
                if traced and self._mode == "LSTM":  # the recurrence in one node
                    H = self.hidden_size
                    seq = LSTMLayer(w_hh, b_hh, bool(d))(gi, *(state or ()))
                    outs.append(seq[..., :H])
                    last.append((seq[:, end, :H], seq[:, end, H:]))
                    continue
                if traced and self._mode == "GRU" and w_hh.device.type == "cpu":
                    seq = GRULayer(w_hh, b_hh, bool(d))(gi, *(state or ()))
                    outs.append(seq)
                    last.append((seq[:, end],))
                    continue
                for t in (reversed(range(T)) if d else range(T)):
                    state = _rnn_cell(self._mode, gi[:, t], state, w_hh, b_hh)
                    steps[t] = state[0]
                outs.append(_math.stack(steps, 1))
                last.append(state)
            x = outs[0] if D == 1 else _math.cat(outs, 2)
            if self.dropout and self.training and layer + 1 < self.num_layers:
                x = F.dropout(x, self.dropout)
        out = x.squeeze(0) if unbatched else x if traced or self.batch_first else x.transpose(0, 1)
        finals = [[s[k] for s in last] for k in range(len(last[0]))]  # h (and c) of each layer and direction
        finals = [Layered(f) if traced else _math.stack(f, 0)[:, 0] if unbatched else _math.stack(f, 0)
                  for f in finals]
        return out, tuple(finals) if len(finals) > 1 else finals[0]

    def _states(self, hx, traced, unbatched):
        """Each layer and direction's initial state: a tuple of its parts ((h,) or (h, c)), None for zeros."""
        from .graph import ZeroStates
        n = self.num_layers * (1 + self.bidirectional)
        parts = hx if isinstance(hx, tuple) else (hx,)
        if hx is None or all(isinstance(p, ZeroStates) for p in parts):
            return [None] * n
        if len(parts) != (2 if self._mode == "LSTM" else 1):
            raise ValueError(f"{type(self).__name__}: hx must be {'(h_0, c_0)' if self._mode == 'LSTM' else 'h_0'}")
        if traced and not all(type(p).__name__ == "Layered" for p in parts):
            from .graph import fail
            fail("an initial state of tensors for a traced RNN", "pass hx=None (zeros, PyTorch's default) or the "
                 "final states another RNN returned")
        if not traced:
            parts = tuple(p.unsqueeze(1) if unbatched else p for p in parts)
        if len(parts[0]) != n:
            raise ValueError(f"{type(self).__name__}: hx has {len(parts[0])} states, expected num_layers * "
                             f"directions = {n}")
        return [tuple(p[k] for p in parts) for k in range(n)]

    def extra_repr(self):
        return (f"{self.input_size}, {self.hidden_size}" + (f", num_layers={self.num_layers}" if self.num_layers > 1
                                                            else "")
                + ("" if self.bias else ", bias=False") + (", batch_first=True" if self.batch_first else "")
                + (f", dropout={self.dropout}" if self.dropout else "")
                + (", bidirectional=True" if self.bidirectional else ""))


class RNN(_RNNBase):
    """An Elman RNN, h = tanh (or relu) of x W_ih^T + b_ih + h W_hh^T + b_hh, as torch.nn.RNN."""

    def __init__(self, input_size, hidden_size, num_layers=1, nonlinearity="tanh", bias=True, batch_first=False,
                 dropout=0.0, bidirectional=False):
        if nonlinearity not in ("tanh", "relu"):
            raise ValueError(f"RNN: unknown nonlinearity {nonlinearity!r}; use 'tanh' or 'relu'")
        super().__init__(input_size, hidden_size, num_layers, bias, batch_first, dropout, bidirectional)
        self._mode = "RNN_TANH" if nonlinearity == "tanh" else "RNN_RELU"

    def extra_repr(self):
        return super().extra_repr() + (", nonlinearity='relu'" if self._mode == "RNN_RELU" else "")


class LSTM(_RNNBase):
    """Long short-term memory, gates (input, forget, cell, output) in PyTorch's order, as torch.nn.LSTM; returns
    output, (h_n, c_n)."""

    _gates, _mode = 4, "LSTM"


class GRU(_RNNBase):
    """Gated recurrent units, gates (reset, update, new) in PyTorch's order and formulas, as torch.nn.GRU."""

    _gates, _mode = 3, "GRU"


class _CellBase(Module):
    """One step of RNN, LSTM or GRU (RNNCell, LSTMCell, GRUCell): PyTorch's parameter names, shapes,
    initialisation and formulas, written with linear layers and activations (the cell of _RNNBase)."""

    _gates, _mode = 1, None

    def __init__(self, input_size, hidden_size, bias=True):
        super().__init__()
        self.input_size, self.hidden_size, self.bias = input_size, hidden_size, bias
        _rnn_weights(self, "", input_size, hidden_size, self._gates, bias)
        self.reset_parameters()

    reset_parameters = _reset_rnn

    def forward(self, input, hx=None):
        """The next state for input (N, input_size) (or one unbatched (input_size,)) from hx (None: zeros)."""
        from . import functional as F
        from .graph import ZeroStates
        traced = isinstance(input, Symbolic)
        if (len(input.node.shape) != 1) if traced else input.ndim not in (1, 2):
            raise ValueError(f"{type(self).__name__}: expected an input of (batch, input_size) or (input_size,)")
        unbatched = not traced and input.ndim == 1
        parts = hx if isinstance(hx, tuple) else (hx,)
        state = None if all(h is None or isinstance(h, ZeroStates) for h in parts) else parts
        if unbatched:
            input, state = input.unsqueeze(0), None if state is None else tuple(h.unsqueeze(0) for h in state)
        out = _rnn_cell(self._mode, F.linear(input, self.weight_ih, getattr(self, "bias_ih", None)), state,
                        self.weight_hh, getattr(self, "bias_hh", None))
        out = tuple(h[0] for h in out) if unbatched else out
        return out if self._mode == "LSTM" else out[0]

    def extra_repr(self):
        return f"{self.input_size}, {self.hidden_size}" + ("" if self.bias else ", bias=False")


class RNNCell(_CellBase):
    """h' = tanh (or relu) of x W_ih^T + b_ih + h W_hh^T + b_hh, as torch.nn.RNNCell."""

    def __init__(self, input_size, hidden_size, bias=True, nonlinearity="tanh"):
        if nonlinearity not in ("tanh", "relu"):
            raise ValueError(f"RNNCell: unknown nonlinearity {nonlinearity!r}; use 'tanh' or 'relu'")
        super().__init__(input_size, hidden_size, bias)
        self._mode = "RNN_TANH" if nonlinearity == "tanh" else "RNN_RELU"


class LSTMCell(_CellBase):
    """One LSTM step, (h', c') from x and (h, c), as torch.nn.LSTMCell."""

    _gates, _mode = 4, "LSTM"


class GRUCell(_CellBase):
    """One GRU step, h' from x and h, as torch.nn.GRUCell."""

    _gates, _mode = 3, "GRU"


def _is_causal(a, T, keeps):
    """Whether the mask's values a (NumPy) are the causal mask for T positions, as PyTorch writes it: -inf above
    the diagonal and 0 elsewhere (nn.Transformer.generate_square_subsequent_mask), or a bool one True above the
    diagonal (the positions masked out) or, with keeps, on and below it (those attended, as
    F.scaled_dot_product_attention reads a bool mask); leading dimensions of size 1 broadcast."""
    import numpy as np
    a = a.reshape(a.shape[-2:]) if a.ndim >= 2 and math.prod(a.shape[:-2]) == 1 else a
    above = np.triu(np.ones((T, T), bool), 1)
    return a.shape == (T, T) and (np.array_equal(a, ~above if keeps else above) if a.dtype == bool else
                                  bool(np.all(np.isneginf(a[above])) and np.all(a[~above] == 0)))


def _masked_keys(a, Tk, keeps, batched):
    """The keys masked out ((B, Tk) bool, B the batch or 1) by mask values a (NumPy) that are the same for every
    query and head, or None: a bool mask (True where attention is allowed with keeps, else where it is not), or an
    additive one of 0 and -inf (or float32's lowest, as Hugging Face writes it). With batched, a's first dimension
    is the batch's."""
    import numpy as np
    if a.ndim == 0 or a.shape[-1] != Tk or math.prod(a.shape[1 if batched else 0:-1]) != 1:
        return None
    rows = a.reshape(a.shape[0] if batched else 1, Tk)
    if rows.dtype == bool:
        return ~rows if keeps else rows
    masked = np.isneginf(rows) | (rows <= np.finfo(np.float32).min)
    return masked if np.all(rows[~masked] == 0) else None


def _attention_mask(mask, Tq, Tk, name, keeps=False, batched=False):
    """(is_causal, key_mask, scores_mask) of an attention mask as PyTorch's layers take it (keeps and batched: see
    _masked_keys; None: no mask). The fused kernel takes the causal mask (Tq None: not looked for, as in a padding
    mask) and a mask of keys such as a padding mask, as key_mask: True where a key is masked out, (B, Tk) eagerly,
    or a traced bool value (Tk,) per sample when the mask is traced ((ids == pad), the usual padding mask). Any other
    mask is scores_mask, for attention written out (F._written_attention): bool True where a score is masked out,
    or a float one added to the scores."""
    if mask is None:
        return False, None, None
    from .graph import Gathered
    if isinstance(mask, Gathered):  # a learned relative position bias
        return False, None, mask
    if not isinstance(mask, (Symbolic, TensorBase)):
        raise TypeError(f"{name}: a mask must be a tensor, got {type(mask).__name__}")
    bool_mask = mask.dtype is _BY_NAME["bool"]
    if isinstance(mask, Symbolic):
        if not batched:  # PyTorch would broadcast the batch against the queries or heads
            from .graph import fail
            fail(f"{name}: a mask computed from traced values without the dimensions of the scores "
                 f"({mask.dtype.name}, shape {mask.shape})", "give a padding mask as bool values, such as "
                 "(ids == pad): (N, S) as a key_padding_mask, (N, 1, 1, S) True where attention is allowed as "
                 "F.scaled_dot_product_attention's attn_mask (PyTorch broadcasts an (N, S) one over the queries)")
        if bool_mask and mask.shape[-1] == Tk and math.prod(mask.shape[1:-1]) == 1:
            rows = mask.reshape(mask.shape[0], Tk) if mask.ndim != 2 else mask
            return False, ~rows if keeps else rows, None
    elif isinstance(mask, TensorBase) and not mask.requires_grad and not uses_trainable([mask]):  # a learned bias
        # (a parameter, or a view of one while traced) is added to the scores
        import numpy as np
        a = np.asarray(mask.cpu() if bool_mask else mask.float().cpu())
        if Tq == Tk and _is_causal(a, Tq, keeps):
            return True, None, None
        rows = _masked_keys(a, Tk, keeps, batched and a.ndim >= 2)
        if rows is not None:
            return False, creation.tensor(rows, device=mask.device), None
    return False, None, ~mask if bool_mask and keeps else mask


def _attention_weights(q, k, causal, masked, average, dropout_p, draw):
    """softmax(q k^T / sqrt(D)) of heads (N, H, T, D) and (N, H, S, D) under the causal mask and keys masked out
    ((B, S) True), through the dropout the fused kernel applied (p and its generator's (seed, offset) draw), as
    (N, T, S) averaged over the heads or (N, H, T, S), as PyTorch returns them; 0 for a query that sees no key, as
    the fused kernel's output."""
    from . import functional as F
    p = F._attention_probs(q, k, causal, None, [] if masked is None else [masked.to(q.device)[:, None, None, :]])
    if dropout_p:
        p = _C.dropout_forward(None, p, dropout_p, *draw)
    return p.mean(1) if average else p


def _need_batch_first(name, batch_first):
    if not batch_first:
        raise ValueError(f"{name}: pass batch_first=True (fasttrain's values are batch first: (N, T, E), where "
                         "PyTorch's default is (T, N, E))")


class MultiheadAttention(Module):
    """PyTorch's nn.MultiheadAttention (batch_first=True) over fused attention: the packed input projection
    (in_proj_weight, in_proj_bias), the heads, out_proj, and dropout on the attention weights in training mode.
    The fused kernel never forms the weights; forward computes them besides only eagerly, with need_weights."""

    def __init__(self, embed_dim, num_heads, dropout=0.0, bias=True, add_bias_kv=False, add_zero_attn=False,
                 kdim=None, vdim=None, batch_first=False):
        super().__init__()
        _need_batch_first("MultiheadAttention", batch_first)
        if not 0.0 <= dropout <= 1.0:
            raise ValueError(f"MultiheadAttention: dropout must be in [0, 1], got {dropout}")
        if add_bias_kv or add_zero_attn or kdim not in (None, embed_dim) or vdim not in (None, embed_dim):
            raise NotImplementedError("MultiheadAttention: add_bias_kv, add_zero_attn, kdim and vdim are not "
                                      "supported")
        if embed_dim % num_heads:
            raise ValueError(f"MultiheadAttention: embed_dim {embed_dim} must be divisible by num_heads {num_heads}")
        self.embed_dim, self.num_heads, self.batch_first, self.dropout = embed_dim, num_heads, batch_first, dropout
        self.register_parameter("in_proj_weight", creation.empty(3 * embed_dim, embed_dim))
        self.register_parameter("in_proj_bias", creation.empty(3 * embed_dim) if bias else None)
        self.out_proj = Linear(embed_dim, embed_dim, bias=bias)
        self._reset_parameters()

    def _reset_parameters(self):
        """PyTorch's (private) initialisation: the input projection Xavier-uniform, both biases zero."""
        init.xavier_uniform_(self.in_proj_weight)
        if self.in_proj_bias is not None:
            init.zeros_(self.in_proj_bias)
            init.zeros_(self.out_proj.bias)

    def forward(self, query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
                average_attn_weights=True, is_causal=False):
        """Attention of query (N, T, E) to key and value (N, S, E), batch first; returns (output (N, T, E), weights).
        When query, key and value are one tensor, the packed projection runs once. Masks as PyTorch's: attn_mask
        (T, S) or (N * num_heads, T, S), key_padding_mask (N, S), each bool (True where masked out) or added to the
        scores. The causal one and a padding mask go to the fused kernel (see _attention_mask); with need_weights,
        eagerly, the weights are computed besides it as PyTorch returns them ((N, T, S) averaged over the heads, or
        (N, H, T, S)), through the dropout the output saw; a compiled program never forms them (see
        graph.AttentionWeights). Other masks, or two masks of keys, run the attention written out (its weights are
        those it formed)."""
        from . import functional as F
        name, T, S, N = "MultiheadAttention", query.shape[1], key.shape[1], query.shape[0]
        E, H = self.embed_dim, self.num_heads
        causal, keys, scores = _attention_mask(attn_mask, T, S, name)
        _, padding, pad_scores = _attention_mask(key_padding_mask, None, S, name, batched=True)
        def projected(x):
            return F.linear(x, self.in_proj_weight, self.in_proj_bias).chunk(3, dim=-1)

        if query is key and key is value:  # self-attention: one packed projection
            q, k, v = projected(query)
        elif key is value:  # cross-attention over one memory: its projection gives both keys and values
            q, (k, v) = projected(query)[0], projected(key)[1:]
        else:  # each input through the whole projection, its third kept
            q, k, v = (projected(x)[i] for i, x in enumerate((query, key, value)))
        heads = [x.view(N, n, H, E // H).transpose(1, 2) for x, n in ((q, T), (k, S), (v, S))]
        p = self.dropout if self.training else 0.0
        if scores is not None or pad_scores is not None or (keys is not None and padding is not None):
            masks = [m.reshape(m.shape[0], 1, 1, S) for m in (keys, padding, pad_scores) if m is not None]
            if scores is not None and scores.ndim == 3:  # PyTorch's (N * num_heads, T, S): each sample's heads
                if isinstance(scores.shape[0], int) and scores.shape[0] != N * H:
                    raise ValueError(f"{name}: a 3-d attn_mask should be (N * num_heads, T, S) = {(N * H, T, S)}, "
                                     f"got {tuple(scores.shape)}")
                scores = scores.reshape(-1, H, T, S)
            if scores is not None:
                masks.append(scores)
            out, weights = F._written_attention(*heads, causal or is_causal, None, p, masks, name)
            weights = (weights.mean(1) if average_attn_weights else weights) if need_weights else None
            return self.out_proj(out.transpose(1, 2).reshape(N, T, E)), weights
        masked = keys if keys is not None else padding
        from ..random import default_generator
        draw = (default_generator._seed, default_generator._offset)  # where the kernel's dropout mask comes from
        out = F._attention(*heads, causal or is_causal, None, p, masked, name)
        weights = None
        if need_weights:
            from .graph import AttentionWeights
            weights = AttentionWeights() if isinstance(out, Symbolic) else \
                _attention_weights(*heads[:2], causal or is_causal, masked, average_attn_weights, p, draw)
        return self.out_proj(out.transpose(1, 2).reshape(N, T, E)), weights

    def extra_repr(self):
        return f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, batch_first=True" + \
            (f", dropout={self.dropout}" if self.dropout else "")


def _transformer_activation(name, activation):
    """A transformer layer's feed-forward activation as PyTorch's takes it: 'relu', 'gelu' or a callable."""
    if activation not in ("relu", "gelu") and not callable(activation):
        raise ValueError(f"{name}: activation must be 'relu', 'gelu' or a callable, got {activation!r}")
    return activation


class TransformerEncoderLayer(Module):
    """PyTorch's nn.TransformerEncoderLayer (batch_first=True): self-attention and a feed-forward block, each
    with a residual and a layer norm (after it, or before with norm_first=True), and PyTorch's four dropouts
    (attention weights, feed-forward, each residual branch)."""

    def __init__(self, d_model, nhead, dim_feedforward=2048, dropout=0.1, activation="relu", layer_norm_eps=1e-5,
                 batch_first=False, norm_first=False, bias=True):
        _need_batch_first("TransformerEncoderLayer", batch_first)
        super().__init__()
        self.self_attn = MultiheadAttention(d_model, nhead, dropout=dropout, bias=bias, batch_first=batch_first)
        self.linear1 = Linear(d_model, dim_feedforward, bias=bias)
        self.dropout = Dropout(dropout)
        self.linear2 = Linear(dim_feedforward, d_model, bias=bias)
        self.norm_first = norm_first
        self.norm1 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias)
        self.norm2 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias)
        self.dropout1, self.dropout2 = Dropout(dropout), Dropout(dropout)
        self.activation = _transformer_activation("TransformerEncoderLayer", activation)

    def _act(self, x):
        from . import functional as F
        return getattr(F, self.activation)(x) if isinstance(self.activation, str) else self.activation(x)

    def _sa(self, x, masks):
        return self.dropout1(self.self_attn(x, x, x, need_weights=False, **masks)[0])

    def _ff(self, x):
        return self.dropout2(self.linear2(self.dropout(self._act(self.linear1(x)))))

    def forward(self, src, src_mask=None, src_key_padding_mask=None, is_causal=False):
        """The layer applied to src (N, T, d_model), batch first. src_mask may be the causal mask (or is_causal=True)
        and src_key_padding_mask (N, T) a padding mask (True, or -inf, where a position is padding), as
        MultiheadAttention takes them."""
        x, masks = src, dict(attn_mask=src_mask, key_padding_mask=src_key_padding_mask, is_causal=is_causal)
        if self.norm_first:
            x = x + self._sa(self.norm1(x), masks)
            return x + self._ff(self.norm2(x))
        x = self.norm1(x + self._sa(x, masks))
        return self.norm2(x + self._ff(x))


class TransformerEncoder(Module):
    """num_layers copies of encoder_layer (each with its own parameters, copied from it), then an optional norm,
    as torch.nn.TransformerEncoder."""

    def __init__(self, encoder_layer, num_layers, norm=None, enable_nested_tensor=True, mask_check=True):
        super().__init__()
        if not isinstance(encoder_layer, TransformerEncoderLayer) or num_layers < 1:
            raise ValueError("TransformerEncoder: takes a TransformerEncoderLayer and num_layers >= 1")
        self.layers = ModuleList([copy.deepcopy(encoder_layer) for _ in range(num_layers)])
        self.num_layers, self.norm = num_layers, norm

    def forward(self, src, mask=None, src_key_padding_mask=None, is_causal=False):
        """The layers applied to src (N, T, d_model) in turn, then the norm; masks as TransformerEncoderLayer takes
        them (padded positions are computed as the others, as PyTorch's layers do in training mode)."""
        for layer in self.layers:
            src = layer(src, mask, src_key_padding_mask, is_causal)
        return src if self.norm is None else self.norm(src)


class TransformerDecoderLayer(Module):
    """PyTorch's nn.TransformerDecoderLayer (batch_first=True): self-attention over the targets, attention over
    the encoder's output (the memory), and a feed-forward block, each with a residual and a layer norm (after it,
    or before with norm_first=True), and PyTorch's dropouts (the attention weights', the feed-forward's, each
    residual branch's)."""

    def __init__(self, d_model, nhead, dim_feedforward=2048, dropout=0.1, activation="relu", layer_norm_eps=1e-5,
                 batch_first=False, norm_first=False, bias=True):
        _need_batch_first("TransformerDecoderLayer", batch_first)
        super().__init__()
        self.self_attn = MultiheadAttention(d_model, nhead, dropout=dropout, bias=bias, batch_first=batch_first)
        self.multihead_attn = MultiheadAttention(d_model, nhead, dropout=dropout, bias=bias, batch_first=batch_first)
        self.linear1 = Linear(d_model, dim_feedforward, bias=bias)
        self.dropout = Dropout(dropout)
        self.linear2 = Linear(dim_feedforward, d_model, bias=bias)
        self.norm_first = norm_first
        self.norm1, self.norm2, self.norm3 = (LayerNorm(d_model, eps=layer_norm_eps, bias=bias) for _ in range(3))
        self.dropout1, self.dropout2, self.dropout3 = Dropout(dropout), Dropout(dropout), Dropout(dropout)
        self.activation = _transformer_activation("TransformerDecoderLayer", activation)

    _act, _sa = TransformerEncoderLayer._act, TransformerEncoderLayer._sa

    def _mha(self, x, memory, masks):
        return self.dropout2(self.multihead_attn(x, memory, memory, need_weights=False, **masks)[0])

    def _ff(self, x):
        return self.dropout3(self.linear2(self.dropout(self._act(self.linear1(x)))))

    def forward(self, tgt, memory, tgt_mask=None, memory_mask=None, tgt_key_padding_mask=None,
                memory_key_padding_mask=None, tgt_is_causal=False, memory_is_causal=False):
        """The layer applied to tgt (N, T, d_model) and memory (N, S, d_model), batch first. tgt_mask may be the
        causal mask (or tgt_is_causal=True); the key padding masks (N, T) and (N, S) are True (or -inf) at padding;
        memory_mask a mask of the memory's positions, as MultiheadAttention takes masks."""
        own = dict(attn_mask=tgt_mask, key_padding_mask=tgt_key_padding_mask, is_causal=bool(tgt_is_causal))
        cross = dict(attn_mask=memory_mask, key_padding_mask=memory_key_padding_mask, is_causal=memory_is_causal)
        x = tgt
        if self.norm_first:
            x = x + self._sa(self.norm1(x), own)
            x = x + self._mha(self.norm2(x), memory, cross)
            return x + self._ff(self.norm3(x))
        x = self.norm1(x + self._sa(x, own))
        x = self.norm2(x + self._mha(x, memory, cross))
        return self.norm3(x + self._ff(x))


class TransformerDecoder(Module):
    """num_layers copies of decoder_layer (each with its own parameters, copied from it), then an optional norm,
    as torch.nn.TransformerDecoder."""

    def __init__(self, decoder_layer, num_layers, norm=None):
        super().__init__()
        if not isinstance(decoder_layer, TransformerDecoderLayer) or num_layers < 1:
            raise ValueError("TransformerDecoder: takes a TransformerDecoderLayer and num_layers >= 1")
        self.layers = ModuleList([copy.deepcopy(decoder_layer) for _ in range(num_layers)])
        self.num_layers, self.norm = num_layers, norm

    def forward(self, tgt, memory, tgt_mask=None, memory_mask=None, tgt_key_padding_mask=None,
                memory_key_padding_mask=None, tgt_is_causal=None, memory_is_causal=False):
        """The layers applied to tgt (N, T, d_model) over memory (N, S, d_model) in turn, then the norm; masks as
        TransformerDecoderLayer takes them."""
        for layer in self.layers:
            tgt = layer(tgt, memory, tgt_mask, memory_mask, tgt_key_padding_mask, memory_key_padding_mask,
                        tgt_is_causal, memory_is_causal)
        return tgt if self.norm is None else self.norm(tgt)


class Transformer(Module):
    """PyTorch's nn.Transformer (batch_first=True): a TransformerEncoder and a TransformerDecoder, each ending in a
    LayerNorm, their matrices initialized as PyTorch's (xavier_uniform_). A compiled model calling it takes the
    source and the target sequences as two inputs (compile(input_shape=((S,), (T,)), ...))."""

    def __init__(self, d_model=512, nhead=8, num_encoder_layers=6, num_decoder_layers=6, dim_feedforward=2048,
                 dropout=0.1, activation="relu", custom_encoder=None, custom_decoder=None, layer_norm_eps=1e-5,
                 batch_first=False, norm_first=False, bias=True):
        _need_batch_first("Transformer", batch_first)
        super().__init__()
        options = dict(dim_feedforward=dim_feedforward, dropout=dropout, activation=activation,
                       layer_norm_eps=layer_norm_eps, batch_first=batch_first, norm_first=norm_first, bias=bias)
        self.encoder = custom_encoder if custom_encoder is not None else TransformerEncoder(
            TransformerEncoderLayer(d_model, nhead, **options), num_encoder_layers,
            LayerNorm(d_model, eps=layer_norm_eps, bias=bias))
        self.decoder = custom_decoder if custom_decoder is not None else TransformerDecoder(
            TransformerDecoderLayer(d_model, nhead, **options), num_decoder_layers,
            LayerNorm(d_model, eps=layer_norm_eps, bias=bias))
        self.d_model, self.nhead, self.batch_first = d_model, nhead, batch_first
        from .init import xavier_uniform_
        for p in self.parameters():
            if p.dim() > 1:
                xavier_uniform_(p)

    def forward(self, src, tgt, src_mask=None, tgt_mask=None, memory_mask=None, src_key_padding_mask=None,
                tgt_key_padding_mask=None, memory_key_padding_mask=None, src_is_causal=None, tgt_is_causal=None,
                memory_is_causal=False):
        """The decoder's output (N, T, d_model) for the target tgt (N, T, d_model) over the encoded source src
        (N, S, d_model), batch first; masks as the encoder and decoder take them."""
        memory = self.encoder(src, mask=src_mask, src_key_padding_mask=src_key_padding_mask,
                              is_causal=bool(src_is_causal))
        return self.decoder(tgt, memory, tgt_mask, memory_mask, tgt_key_padding_mask, memory_key_padding_mask,
                            tgt_is_causal, memory_is_causal)

    @staticmethod
    def generate_square_subsequent_mask(sz, device=None, dtype=None):
        """The causal mask of sz positions: -inf above the diagonal, 0 elsewhere, as PyTorch makes it."""
        import numpy as np
        from ..creation import tensor
        mask = np.triu(np.full((sz, sz), -np.inf, np.float32), 1)
        return tensor(mask, dtype=dtype or "float32", device=device)


class Target(Module):
    """The batch's targets in a traced loss: shape and dtype fixed by the loss that reads them."""

    _leaf = True
    dtype = None
    index = 0  # its place in a tuple of several targets
    assumed = False  # the shape was taken as one value per sample before a loss read it
    floated = labelled = None  # where y.float() and where a loss reading labels read them


class Sum(Module):
    """The batch's loss from per-sample values (recorded by .mean(), .sum() and the losses' reductions); a ratio's
    normalizer is max(its second input's batch sum + offset, floor)."""

    _leaf = True

    def __init__(self, reduction, offset=0.0, floor=-math.inf):
        super().__init__()
        self.reduction = _reduction("reduce", reduction, ("mean", "sum", "batchmean", "ratio"))
        self.offset, self.floor = float(offset), float(floor)

    def extra_repr(self):
        return repr(self.reduction)


class CountFloor(Module):
    """A batch sum clamped from below (mask.sum().clamp(min=1)) at the user's line `where`: only the denominator
    of a ratio reads it."""

    _leaf = True

    def __init__(self, floor, where):
        super().__init__()
        self.floor, self.where = float(floor), where


class Add(Module):
    """a + b, the residual sum (fused with a following activation when compiled)."""

    _leaf = True

    def output_shape(self, a, b):
        if a != b:
            raise ValueError(f"Add: shapes {a} and {b} differ")
        return a

    def forward(self, a, b):
        from . import functional as F
        return F.add(a, b)


class Cat(Module):
    """Concatenation along a dimension other than the batch's (by default 1: channels, or a sequence's steps)."""

    _leaf = True

    def __init__(self, dim=1):
        super().__init__()
        if dim == 0:
            raise ValueError("cat joins samples' dimensions, not the batch (dim=0)")
        self.dim = dim

    def sample_dim(self, ndim):
        """The per-sample dimension joined, for samples of ndim dimensions."""
        from .graph import _dim
        return _dim(self.dim, ndim)

    def output_shape(self, *shapes):
        d = self.sample_dim(len(shapes[0]))
        if any(len(s) != len(shapes[0]) or s[:d] + s[d + 1:] != shapes[0][:d] + shapes[0][d + 1:] for s in shapes):
            raise ValueError(f"cat: shapes {shapes} differ outside dimension {self.dim}")
        return (*shapes[0][:d], sum(s[d] for s in shapes), *shapes[0][d + 1:])

    def _symbolic(self, *inputs):
        from .._C import NODE_MAX_INPUTS as most
        if len(inputs) <= most:
            return super()._symbolic(*inputs)
        # a node reads at most `most` inputs: more are joined in groups first (a DenseNet block's features)
        return self(*[Cat(self.dim)(*inputs[k:k + most]) if len(inputs[k:k + most]) > 1 else inputs[k]
                      for k in range(0, len(inputs), most)])

    def forward(self, *xs):
        from . import functional as F
        return F.cat(xs, self.dim)


class Mul(Module):
    """a * b of one shape (recorded by the * of traced values)."""

    _leaf = True

    def output_shape(self, a, b):
        if a != b:
            raise ValueError(f"Mul: shapes {a} and {b} differ")
        return a


class Expand(Module):
    """The values repeated along the per-sample dimensions of size 1 to `shape` (recorded by broadcasting)."""

    _leaf = True

    def __init__(self, shape):
        super().__init__()
        self.shape = tuple(shape)

    def output_shape(self, shape):
        if len(shape) != len(self.shape) or any(a not in (b, 1) for a, b in zip(shape, self.shape)):
            raise ValueError(f"Expand: {shape} does not broadcast to {self.shape}")
        return self.shape

    def extra_repr(self):
        return f"{self.shape}"


class Noise(Module):
    """Samples of N(0, 1), or of U[0, 1) when uniform, in its input's shape, drawn afresh in every step (recorded by
    ft.randn_like and ft.rand_like of a traced value)."""

    _leaf = True

    def __init__(self, uniform=False):
        super().__init__()
        self.uniform = uniform

    def forward(self, input):
        from .. import random
        return (random.rand_like if self.uniform else random.randn_like)(input)

    def extra_repr(self):
        return "uniform" if self.uniform else "normal"


class Math(Module):
    """An elementwise op of fasttrain's tensor math (ft.ops.math_pointwise's names) on a traced value and a number
    (recorded by comparisons with a number, ~ of a mask and a mask's .float()): a comparison or logical_not gives a
    bool mask, any other op floats. No gradient passes."""

    _leaf = True

    def __init__(self, op, number=0.0):
        super().__init__()
        self.op, self.number = op, number

    def extra_repr(self):
        return f"{self.op}, {self.number:g}"


class MaskedFill(Module):
    """Its first input where a bool mask (its second input, of the input's sizes or 1: a padding mask of each
    sample; or `mask`, a bool tensor the same for every sample: a causal mask) is false, the number value where it
    holds (recorded by masked_fill and ft.where). The value is selected, not multiplied in, so -inf fills exactly;
    the gradient passes where the mask is false."""

    _leaf = True

    def __init__(self, value, mask=None):
        super().__init__()
        self.value = value
        object.__setattr__(self, "mask", mask)  # a constant, not a buffer of the model

    def extra_repr(self):
        return f"{self.value:g}"


class Detach(Module):
    """Its input's values, through which no gradient passes (recorded by x.detach())."""

    _leaf = True


class OneHot(Module):
    """Class indices as rows of an identity of num_classes columns (recorded by F.one_hot on the targets)."""

    _leaf = True

    def __init__(self, num_classes):
        super().__init__()
        self.num_classes = num_classes

    def _symbolic(self, target):
        from .graph import _CLASS_ROWS, bind_target, fail
        if not isinstance(target.node.module, Target):
            fail("F.one_hot of labels computed from the targets", "map labels in the data (leave some out by the "
                 "loss's ignore_index)" + _CLASS_ROWS)
        if target.node.shape is None:  # one label per sample unless a loss (or compile's target_shape) said otherwise
            bind_target(target, (), "int64")
            target.node.module.assumed = True
        bind_target(target, target.node.shape, "int64")
        return Symbolic.record(self, [target], (*target.node.shape, self.num_classes))

    def extra_repr(self):
        return f"{self.num_classes}"


class SumDims(Module):
    """scale * the sum over the per-sample dimensions `dims`, kept with size 1 (recorded by x.sum(dims) and
    x.mean(dims))."""

    _leaf = True

    def __init__(self, dims, scale=1.0):
        super().__init__()
        self.dims, self.scale = tuple(dims), float(scale)

    def output_shape(self, shape):
        return tuple(1 if d in self.dims else n for d, n in enumerate(shape))

    def extra_repr(self):
        return f"dims={self.dims}" + (f", scale={self.scale}" if self.scale != 1.0 else "")


class Matmul(Module):
    """a @ b of each sample's matrices, or of each of its heads' (recorded by the @ of traced values)."""

    _leaf = True

    def output_shape(self, a, b):
        if len(a) < 2 or len(b) != len(a) or a[:-2] != b[:-2] or a[-1] != b[-2]:
            raise ValueError(f"@: samples of shapes {a} and {b} are not (..., M, K) and (..., K, P) with the same "
                             f"leading sizes (a head's, as x @ k.transpose(-2, -1) of (N, H, T, D) values)")
        self.inner = a[-1]  # for the FLOP count
        return (*a[:-1], b[-1])


class Scale(Module):
    """x * factor for a constant factor (recorded by x * c, x / c, -x)."""

    _leaf = True

    def __init__(self, factor):
        super().__init__()
        self.factor = float(factor)

    def extra_repr(self):
        return f"{self.factor}"


class Reshape(Module):
    """The values of a sample in a new per-sample shape (recorded by view, reshape, flatten, squeeze)."""

    _leaf = True

    def __init__(self, shape):
        super().__init__()
        self.shape = tuple(shape)

    def output_shape(self, shape):
        if math.prod(shape) != math.prod(self.shape):
            raise ValueError(f"Reshape: {shape} cannot become {self.shape}")
        return self.shape

    def extra_repr(self):
        return f"{self.shape}"


class Permute(Module):
    """The per-sample dimensions in the order perm gives (recorded by permute, transpose)."""

    _leaf = True

    def __init__(self, perm):
        super().__init__()
        self.perm = tuple(perm)

    def output_shape(self, shape):
        return tuple(shape[d] for d in self.perm)

    def extra_repr(self):
        return f"{self.perm}"


class Slice(Module):
    """`length` elements start, start + step, ... of per-sample dimension `dim` (recorded by x[:, a:b])."""

    _leaf = True

    def __init__(self, dim, start, step, length):
        super().__init__()
        self.dim, self.start, self.step, self.length = dim, start, step, length

    def output_shape(self, shape):
        if self.start + (self.length - 1) * self.step >= shape[self.dim]:
            raise IndexError(f"Slice reaches past size {shape[self.dim]}")
        return (*shape[:self.dim], self.length, *shape[self.dim + 1:])

    def extra_repr(self):
        return f"dim={self.dim}, start={self.start}, step={self.step}, length={self.length}"


class Value(Module):
    """A tensor used as a value in forward, the same for every sample: a parameter (which trains through it)
    or a constant."""

    _leaf = True

    def __init__(self, tensor, shape, dim=-1):
        super().__init__()
        object.__setattr__(self, "tensor", tensor)  # the model registers it, if it is a parameter
        self.shape, self.dim = tuple(shape), dim  # dim: the one dimension it varies along (-1: all)

    def extra_repr(self):
        return f"{self.shape}" + (f", varying along {self.dim}" if self.dim >= 0 else "")


class Model(Module):
    """A model from symbolic inputs to one output, as Keras's functional models: Model(x, out) of one nn.Input,
    or Model([x1, x2], out) of several, which forward takes in that order."""

    def __init__(self, inputs, outputs):
        super().__init__()
        from .graph import topological
        many = isinstance(inputs, (tuple, list))
        ins = list(inputs) if many else [inputs]
        if not ins or not all(isinstance(i, Symbolic) and i.node.module is None for i in ins) or \
                not isinstance(outputs, Symbolic):
            raise TypeError("Model takes a symbolic input (nn.Input), or a list of them, and one symbolic output")
        nodes = topological([outputs.node])
        reached = {id(n) for n in nodes if n.module is None}
        given = [i.node for i in ins]
        if len({id(n) for n in given}) != len(given):
            raise ValueError("Model: an input is given twice")
        if reached - {id(n) for n in given}:
            raise ValueError("the output depends on an nn.Input that is not among the model's inputs")
        lost = [k for k, n in enumerate(given) if id(n) not in reached]
        if lost:
            raise ValueError(f"the output does not depend on input {lost[0]} of the model's inputs")
        object.__setattr__(self, "_nodes", nodes)
        object.__setattr__(self, "_inputs", (given, many))
        # Each layer (or block of layers called as one module) is named after its class as Keras does
        # (conv2d, conv2d_1, ...), so state_dict keys read as the model: "block_1.conv1.weight".
        counts = {}
        for n in nodes:
            owner = n.owner
            if owner is None or isinstance(owner, Value) or owner in self._modules.values():
                continue
            base = re.sub(r"(?<=[a-z0-9])(?=[A-Z][a-z])", "_", type(owner).__name__).lower().lstrip("_")
            k = counts[base] = counts.get(base, -1) + 1
            setattr(self, base if k == 0 else f"{base}_{k}", owner)

    @property
    def input_shape(self):
        """The per-sample shape of the model's input (without the batch dimension); of several inputs, a tuple of
        their shapes."""
        given, many = self._inputs
        return tuple(n.shape for n in given) if many else given[0].shape

    @property
    def input_dtype(self):
        """The dtype of the model's input as nn.Input gave it (None: float32); of several inputs, a tuple."""
        given, many = self._inputs
        return tuple(n.dtype for n in given) if many else given[0].dtype

    def forward(self, *xs):
        """Runs the recorded layers in order on the inputs: eagerly on tensors, or recording them again on traced
        values (a Model used inside another model)."""
        from .graph import within
        given, _ = self._inputs
        if len(xs) != len(given):
            raise TypeError(f"{type(self).__name__} takes {len(given)} input(s), got {len(xs)}")
        values = {id(n): x for n, x in zip(given, xs)}
        traced = any(isinstance(x, Symbolic) for x in xs)
        for n in self._nodes:
            if n.module is None:
                continue
            if not n.inputs and traced:  # a Value node, traced again
                values[id(n)] = Symbolic(n)
            else:
                with within(n.scope if traced else ()):
                    values[id(n)] = n.module(*[values[id(i)] for i in n.inputs])
        return values[id(self._nodes[-1])]
