"""Optimizers with PyTorch's interface whose update is one fused C pass over
every parameter (csrc/optim/optim.h has the exact formulas), on the CPU or on
the CUDA device that holds the parameters."""
import collections
import math
import operator
import types

import numpy as np

from .. import _C, creation
from .._C import TensorBase
from .._types import _BY_NAME

_FLOAT32 = _BY_NAME["float32"]
_STATES = _C.OPTIM_STATES  # {state buffer name: code}
_KINDS = _C.OPTIM_KINDS  # {optimizer name: code}


_UNORDERED = ("optimizer parameters must be an ordered collection: the order of a set changes between runs "
              "(and state_dict indices with it); use a list")


class _Required:
    def __repr__(self):
        return "<required parameter>"


required = _Required()


def _check_param(p, what):
    if not isinstance(p, TensorBase):
        raise TypeError(f"{what} must be a fasttrain Tensor, not {type(p).__name__}")
    if p.dtype is not _FLOAT32:
        raise TypeError(f"{what} must be float32, got {p.dtype.name}: the optimizers update float32 master weights "
                        "(call model.float() first; to train in bfloat16, compile the float32 model with "
                        "precision='bf16-mixed')")
    if not p.is_contiguous():
        raise ValueError(f"{what} must be contiguous")


def _implementation(foreach, fused, capturable=False, differentiable=False):
    """Checks torch.optim's choice of implementation (foreach=, fused=, capturable=), which code written for it
    passes: every fasttrain step is one fused pass over the flat buffers, whatever it says. differentiable=True
    (autograd through the step) is refused."""
    for name, value in (("foreach", foreach), ("fused", fused)):
        if value is not None and not isinstance(value, bool):
            raise TypeError(f"{name} must be None or a bool, got {value!r}")
    for name, value in (("capturable", capturable), ("differentiable", differentiable)):
        if not isinstance(value, bool):
            raise TypeError(f"{name} must be a bool, got {value!r}")
    if foreach and fused:
        raise RuntimeError("`fused` and `foreach` cannot be `True` together.")
    if differentiable:
        raise NotImplementedError("differentiable=True: a fasttrain optimizer step records no graph to "
                                  "differentiate through")


def _flag(value, key, index):
    if not isinstance(value, (bool, np.bool_, int, np.integer)):  # "yes" would read as a choice; 0 and 1 as PyTorch
        raise TypeError(f"param group {index}: {key} must be a bool, got {value!r}")
    return bool(value)


def _number(group, key, index):
    value = group[key]
    try:
        if isinstance(value, (str, bytes)):  # "0.5" would read as a number
            raise TypeError
        return float(value)
    except (TypeError, ValueError):
        raise TypeError(f"param group {index}: {key} must be a number, got {type(value).__name__}") from None


class _State(collections.abc.Mapping):
    """optimizer.state: each param's entry made when asked for (one param's, not every param's)."""

    def __init__(self, optimizer):
        self._optimizer = optimizer

    def __getitem__(self, param):
        opt = self._optimizer
        index = next((i for i, p in enumerate(opt._params if opt._c is not None else ()) if p is param), None)
        if index is None and not any(p is param for g in opt.param_groups for p in g["params"]):
            raise KeyError(param)
        entry = None if index is None else opt._entry(index)
        if entry is None:
            return types.MappingProxyType({})
        off, steps, mu_product, keys = entry
        return types.MappingProxyType({
            key: creation.tensor(float(steps)) if key == "step" else creation.tensor(mu_product)
            if key == "mu_product" else opt._c.state_buffer(_STATES[key])[off:off + param.numel()].view(param.shape)
            for key in keys})

    def __iter__(self):
        return (p for _, p, *_ in self._optimizer._stateful())

    def __len__(self):
        return sum(1 for _ in self._optimizer._stateful())


class Optimizer:
    """PyTorch's ``torch.optim.Optimizer`` interface over one C optimizer.

    ``param_groups`` is a list of dicts as in PyTorch: changing a value (a
    scheduler changing ``lr``) takes effect at the next ``step()``. The C
    optimizer is built at the first step (or state_dict use) over every
    param; a param whose ``.grad`` is None is skipped by that step.

    ``step(closure=None, *, grad_scale=1.0, max_grad_norm=None, check_finite=True)``
    goes beyond PyTorch: ``grad_scale`` multiplies the grads first (1 / the
    loss scale), ``max_grad_norm`` clips by the global norm inside the same
    pass (``torch.nn.utils.clip_grad_norm_``'s coefficient), and with
    ``check_finite`` a non-finite grad norm raises ValueError before anything
    is written. The norm is then in ``optimizer.grad_norm`` (None when it was
    not computed: ``check_finite=False`` without clipping skips one read of
    the grads)."""

    _kind = None  # a value of _C.OPTIM_KINDS

    def __init__(self, params, defaults):
        self.defaults = defaults
        self.param_groups = []
        self.grad_norm = None
        self._c = None
        self._params = []
        self._pushed = []
        if isinstance(params, TensorBase):
            raise TypeError("params must be an iterable of Tensors or dicts, but got a Tensor")
        if isinstance(params, (set, frozenset)):
            raise TypeError(_UNORDERED)
        groups = list(params)
        if not groups:
            raise ValueError("optimizer got an empty parameter list")
        if not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        for group in groups:
            self.add_param_group(group)

    def __getstate__(self):
        """For copy.deepcopy and pickle, as PyTorch's: the groups (their params copied with them) and the state in
        PyTorch's layout, from which the copy builds its own C optimizer."""
        state = {k: v for k, v in self.__dict__.items() if k not in ("_c", "_params", "_group_of", "_pushed", "_built")}
        state["_state"] = self._export_state()
        return state

    def __setstate__(self, state):
        kept = state.pop("_state")
        self.__dict__.update(state, _c=None, _params=[], _pushed=[])
        if kept:
            self._build(self._checked_state(kept, self.param_groups))

    def __repr__(self):
        lines = [type(self).__name__ + " ("]
        for i, group in enumerate(self.param_groups):
            lines.append(f"Parameter Group {i}")
            lines += [f"    {k}: {v}" for k, v in sorted(group.items()) if k != "params"]
        return "\n".join(lines + [")"])

    # ---- groups ----
    def _group_tuple(self, group, index):
        """The C group: (lr, weight_decay, momentum, dampening, nesterov, maximize, beta1, beta2, eps,
        amsgrad, trust_coefficient, lars_exclude, alpha, centered, lr_decay, initial_accumulator_value,
        momentum_decay, decoupled_weight_decay)."""
        raise NotImplementedError

    def _tuple(self, group, index, momentum=0.0, dampening=0.0, nesterov=False, betas=(0.0, 0.0), eps=0.0,
               amsgrad=False, trust_coefficient=0.0, lars_exclude=False, alpha=0.0, centered=False, lr_decay=0.0,
               initial_accumulator_value=0.0, momentum_decay=0.0, decoupled_weight_decay=False):
        try:
            beta1, beta2 = (float(b) for b in betas)
        except (TypeError, ValueError):
            raise TypeError(f"param group {index}: betas must be a pair of numbers, got {betas!r}") from None
        return (_number(group, "lr", index), _number(group, "weight_decay", index), float(momentum),
                float(dampening), _flag(nesterov, "nesterov", index), _flag(group["maximize"], "maximize", index),
                beta1, beta2, float(eps), _flag(amsgrad, "amsgrad", index), float(trust_coefficient),
                _flag(lars_exclude, "lars_exclude", index), float(alpha), _flag(centered, "centered", index),
                float(lr_decay), float(initial_accumulator_value), float(momentum_decay),
                _flag(decoupled_weight_decay, "decoupled_weight_decay", index))

    def add_param_group(self, param_group):
        """Adds a group (a dict with "params" and optional overrides of the defaults)."""
        if not isinstance(param_group, dict):
            raise TypeError(f"a param group must be a dict, not {type(param_group).__name__}")
        group = dict(param_group)
        params = group.get("params")
        if isinstance(params, TensorBase):
            params = [params]
        elif isinstance(params, (set, frozenset)):
            raise TypeError(_UNORDERED)
        elif params is None:
            raise ValueError("a param group needs a 'params' entry")
        else:
            params = list(params)
        index = len(self.param_groups)
        first = sum(len(g["params"]) for g in self.param_groups)
        for i, p in enumerate(params):
            _check_param(p, f"param {first + i}")
        if len({id(p) for p in params}) != len(params):
            raise ValueError(f"param group {index} holds a parameter more than once: list each once")
        seen = {id(p) for g in self.param_groups for p in g["params"]}
        if any(id(p) in seen for p in params):
            raise ValueError("some parameters appear in more than one parameter group")
        for key, value in self.defaults.items():
            if value is required and key not in group:
                raise ValueError(f"param group {index} does not specify the required value of {key!r}")
            group.setdefault(key, value)
        group["params"] = params
        _C.optim_check_group(self._kind, index, self._group_tuple(group, index))
        state = self._export_state() if self._c is not None else None
        self.param_groups.append(group)
        if state is not None:  # the new params change the layout: rebuild, keeping the state
            self._build(self._checked_state(state, self.param_groups))

    # ---- the C optimizer ----
    def _build(self, state):
        """A new C optimizer over every param, given state in _checked_state's form."""
        params = [p for g in self.param_groups for p in g["params"]]
        group_of = [i for i, g in enumerate(self.param_groups) for _ in g["params"]]
        groups = [self._group_tuple(g, i) for i, g in enumerate(self.param_groups)]
        self._c = _C.Optimizer(self._kind, groups, params, group_of)
        # the groups it was built from: _export_state reads their settings after one is taken out of param_groups
        self._params, self._group_of, self._pushed, self._built = params, group_of, groups, list(self.param_groups)
        if state:
            self._import_state(state)

    def _sync(self):
        """The C optimizer, (re)built for the current params (moved, or put in or taken out of the groups since,
        each keeping its state) and given the current hyperparameters."""
        if self._c is None:
            self._build(None)
        elif self._c.params_moved() or [(id(p), i) for i, g in enumerate(self.param_groups) for p in g["params"]] \
                != [(id(p), i) for p, i in zip(self._params, self._group_of)]:
            old = {id(self._params[k]): s for k, s in self._export_state().items()}
            params = [p for g in self.param_groups for p in g["params"]]
            for k, p in enumerate(params):
                _check_param(p, f"param {k}")
            if len({id(p) for p in params}) != len(params):
                raise ValueError("some parameters appear in more than one parameter group")
            state = {k: old[id(p)] for k, p in enumerate(params) if id(p) in old}
            self._build(self._checked_state(state, self.param_groups))
        for i, group in enumerate(self.param_groups):
            t = self._group_tuple(group, i)
            if t != self._pushed[i]:
                self._c.set_group(i, t)
                self._pushed[i] = t
        return self._c

    def step(self, closure=None, *, grad_scale=1.0, max_grad_norm=None, check_finite=True):
        """One update of every param that has a .grad; returns closure() when given."""
        loss = closure() if closure is not None else None
        c = self._sync()
        clip = 0.0 if max_grad_norm is None else float(max_grad_norm)
        self.grad_norm = c.step([p.grad for p in self._params], float(grad_scale), clip,
                                bool(check_finite) or clip > 0)
        return loss

    def zero_grad(self, set_to_none=True):
        """Clears the gradients of every parameter: sets them to None (set_to_none=True, the default, as PyTorch), or
        fills them with zeros."""
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    if set_to_none:
                        p.grad = None
                    else:
                        p.grad.zero_()

    # ---- state ----
    def _state_keys(self, group):
        """The state entries of a param of this group that has taken a step, "step" first if any."""
        raise NotImplementedError

    def _buffers_of(self, group):
        """The state buffers the C optimizer keeps over every param while a group like this one is present."""
        return [key for key in self._state_keys(group) if key in _STATES]

    def _state_nbytes(self):
        """Bytes of the state buffers: those the C optimizer holds, and those its first step will allocate (one
        float32 buffer over every param per kind of state that some group needs)."""
        names = {key for g in self.param_groups for key in self._buffers_of(g)}
        if self._c is not None:
            names |= {name for name, k in _STATES.items() if self._c.state_buffer(k) is not None}
        return 4 * len(names) * sum(p.numel() for g in self.param_groups for p in g["params"])

    def _entry(self, i):
        """(offset in the flat buffers, steps taken, NAdam's mu_product, state keys) of the param of index i, None
        while it has no state."""
        steps, momentum_valid, mu_product = self._c.segment_state(i)
        # torch's SGD keeps no state without momentum
        if steps and (self._kind != _KINDS["SGD"] or momentum_valid):
            return self._c.offsets[i], steps, mu_product, self._state_keys(self._built[self._group_of[i]])
        return None

    def _stateful(self):
        """(index, param, offset in the flat buffers, steps taken, mu_product, state keys) of each param that has
        state."""
        for i, p in enumerate(self._params if self._c is not None else ()):
            if (entry := self._entry(i)) is not None:
                yield i, p, *entry

    def _export_state(self):
        """{param index: {key: value}} in PyTorch's layout, NumPy copies, for params that have state."""
        if self._c is None:
            return {}
        # .cpu(): one copy of each buffer when the state is on a device, none on the CPU
        flats = {name: f.cpu().numpy() for name, k in _STATES.items() if (f := self._c.state_buffer(k)) is not None}
        return {i: {key: np.array(steps, dtype=np.float32) if key == "step" else
                     np.array(mu_product, dtype=np.float32) if key == "mu_product" else
                     flats[key][off:off + p.numel()].reshape(p.shape).copy() for key in keys}
                for i, p, off, steps, mu_product, keys in self._stateful()}

    @property
    def state(self):
        """Each param's state, as PyTorch's optimizer.state: state[p] (empty for a param without state yet) maps
        "step" to a float32 tensor of the steps taken (a copy) and each buffer (exp_avg, momentum_buffer, ...) to a
        view of the optimizer's flat state, so that a change in place is the optimizer's; iterating it gives the
        params that have state. It is read-only, as the optimizer's state lives in its flat buffers."""
        return _State(self)

    def _checked_state(self, state, groups):
        """state with every value converted and checked against the params and groups; raises ValueError."""
        out = {}
        n = sum(len(g["params"]) for g in self.param_groups)
        index_group = [i for i, g in enumerate(self.param_groups) for _ in g["params"]]
        params = [p for g in self.param_groups for p in g["params"]]
        for key, entry in state.items():
            try:
                i = operator.index(key)
            except TypeError:
                raise ValueError(f"optimizer state keys must be param indices, got {key!r}") from None
            if not 0 <= i < n:
                raise ValueError(f"optimizer state for param {i}, but the optimizer has {n} params")
            if not isinstance(entry, dict):
                raise ValueError(f"the state of param {i} must be a dict, got {type(entry).__name__}")
            p, checked = params[i], {}
            for name in self._state_keys(groups[index_group[i]]):
                if name not in entry and not (name == "momentum_buffer" and self._kind == _KINDS["SGD"]):
                    raise ValueError(f"the state of param {i} has no {name!r}")
                value = entry.get(name)
                if name == "step":
                    step = float(np.asarray(value))
                    if not (math.isfinite(step) and step >= 0 and step == math.floor(step) and step < 2 ** 62):
                        raise ValueError(f"the state of param {i}: step must be a whole number >= 0, got {step}")
                    checked[name] = int(step)
                elif name == "mu_product":
                    mu_product = float(np.asarray(value))
                    if not 0 <= mu_product < 1:
                        raise ValueError(f"the state of param {i}: mu_product must be in [0, 1), got {mu_product}")
                    checked[name] = mu_product
                elif value is None:
                    if self._kind != _KINDS["SGD"]:
                        raise ValueError(f"the state of param {i}: {name} is None")
                    checked[name] = None
                else:
                    arr = np.asarray(value, dtype=np.float32)
                    if arr.shape != tuple(p.shape):
                        raise ValueError(f"the state of param {i}: {name} has shape {arr.shape}, but the param "
                                         f"has shape {tuple(p.shape)}")
                    checked[name] = arr
            out[i] = checked
        return out

    def _import_state(self, state):
        """Writes checked state into the C buffers; params missing from it start afresh."""
        c = self._c
        buffers = {name: c.state_buffer(k) for name, k in _STATES.items()}
        # Every param's span is written below, so a device buffer is filled on the host and copied in one go.
        flats = {name: np.empty(f.numel(), np.float32) if f.is_cuda else f.numpy()
                 for name, f in buffers.items() if f is not None}
        for i, (p, off) in enumerate(zip(self._params, c.offsets)):
            entry = state.get(i)
            span = slice(off, off + p.numel())
            for name, flat in flats.items():
                value = entry.get(name) if entry else None
                if value is None:
                    flat[span] = 0
                else:
                    flat[span] = np.asarray(value, dtype=np.float32).reshape(-1)
            if entry is None:
                c.set_segment_state(i, 0, False, 1.0)
            else:
                momentum = entry.get("momentum_buffer") is not None
                c.set_segment_state(i, entry.get("step", 1), momentum, entry.get("mu_product", 1.0))
        for name, flat in flats.items():
            if buffers[name].is_cuda:
                buffers[name].copy_(flat)

    def state_dict(self):
        """PyTorch's layout: {"state": {index: {...}}, "param_groups": [{..., "params": [indices]}]};
        state values are NumPy copies ("step" a float32 scalar array, as PyTorch's step tensor)."""
        groups, first = [], 0
        for g in self.param_groups:
            entry = {k: v for k, v in g.items() if k != "params"}
            entry["params"] = list(range(first, first + len(g["params"])))
            first += len(g["params"])
            groups.append(entry)
        return {"state": self._export_state(), "param_groups": groups}

    def load_state_dict(self, state_dict):
        """Loads a state_dict of this optimizer (or of torch.optim's same class for the same params). Everything
        is checked before anything changes; a mismatch raises ValueError naming the param and both shapes."""
        try:
            saved_groups, saved_state = state_dict["param_groups"], state_dict["state"]
        except (TypeError, KeyError):
            raise ValueError("an optimizer state_dict has 'state' and 'param_groups' entries") from None
        if len(saved_groups) != len(self.param_groups):
            raise ValueError(f"the state_dict has {len(saved_groups)} parameter group(s), the optimizer "
                             f"{len(self.param_groups)}")
        groups = []
        for i, (saved, group) in enumerate(zip(saved_groups, self.param_groups)):
            if len(saved["params"]) != len(group["params"]):
                raise ValueError(f"parameter group {i} has {len(saved['params'])} params in the state_dict and "
                                 f"{len(group['params'])} in the optimizer")
            new = {k: v for k, v in saved.items() if k != "params"}
            new["params"] = group["params"]
            try:
                _C.optim_check_group(self._kind, i, self._group_tuple(new, i))
            except KeyError as e:
                raise ValueError(f"parameter group {i} of the state_dict has no {e.args[0]!r}") from None
            groups.append(new)
        # The saved indices name the params in group order, as ours do.
        order = {old: i for i, old in enumerate(p for g in saved_groups for p in g["params"])}
        remapped = {}
        for key, entry in saved_state.items():
            if key not in order:
                raise ValueError(f"the state_dict has state for param {key!r}, which is in none of its groups")
            remapped[order[key]] = entry
        state = self._checked_state(remapped, groups)
        self.param_groups = groups
        if self._c is None:
            self._build(state)
        else:
            self._sync()
            self._import_state(state)


class SGD(Optimizer):
    """torch.optim.SGD: momentum, dampening, nesterov, (L2) weight_decay, maximize."""

    _kind = _KINDS["SGD"]

    def __init__(self, params, lr=1e-3, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False, *,
                 maximize=False, foreach=None, differentiable=False, fused=None):
        _implementation(foreach, fused, differentiable=differentiable)
        super().__init__(params, dict(lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay,
                                      nesterov=nesterov, maximize=maximize))

    def _group_tuple(self, g, i):
        return self._tuple(g, i, momentum=_number(g, "momentum", i), dampening=_number(g, "dampening", i),
                           nesterov=g["nesterov"])

    def _state_keys(self, group):
        return ("momentum_buffer",)

    def _buffers_of(self, group):
        return ("momentum_buffer",) if float(group["momentum"]) != 0 else ()


class AdamW(Optimizer):
    """torch.optim.AdamW: decoupled weight decay, bias correction, amsgrad, maximize."""

    _kind = _KINDS["AdamW"]

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, amsgrad=False, *,
                 maximize=False, foreach=None, capturable=False, differentiable=False, fused=None):
        _implementation(foreach, fused, capturable, differentiable)
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad,
                                      maximize=maximize))

    def _group_tuple(self, g, i):
        return self._tuple(g, i, betas=g["betas"], eps=_number(g, "eps", i), amsgrad=g["amsgrad"])

    def _state_keys(self, group):
        return ("step", "exp_avg", "exp_avg_sq") + (("max_exp_avg_sq",) if group["amsgrad"] else ())


class Adam(AdamW):
    """torch.optim.Adam: AdamW's update with the weight decay added to the gradient (L2), bias correction, amsgrad,
    maximize; one fused pass, as AdamW's. decoupled_weight_decay=True is AdamW's update, as PyTorch's."""

    _kind = _KINDS["Adam"]

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, amsgrad=False, *,
                 maximize=False, foreach=None, capturable=False, differentiable=False, fused=None,
                 decoupled_weight_decay=False):
        if not isinstance(decoupled_weight_decay, bool):
            raise TypeError(f"decoupled_weight_decay must be a bool, got {decoupled_weight_decay!r}")
        if decoupled_weight_decay:
            self._kind = _KINDS["AdamW"]
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, maximize=maximize, foreach=foreach,
                         capturable=capturable, differentiable=differentiable, fused=fused)


class RMSprop(Optimizer):
    """torch.optim.RMSprop: a running mean of squared gradients (alpha) divides each gradient, with (L2)
    weight_decay, momentum, centered (the variance's estimate instead) and maximize; one fused pass."""

    _kind = _KINDS["RMSprop"]

    def __init__(self, params, lr=1e-2, alpha=0.99, eps=1e-8, weight_decay=0.0, momentum=0.0, centered=False, *,
                 maximize=False, foreach=None, capturable=False, differentiable=False, fused=None):
        _implementation(foreach, fused, capturable, differentiable)
        super().__init__(params, dict(lr=lr, alpha=alpha, eps=eps, weight_decay=weight_decay, momentum=momentum,
                                      centered=centered, maximize=maximize))

    def _group_tuple(self, g, i):
        return self._tuple(g, i, momentum=_number(g, "momentum", i), eps=_number(g, "eps", i),
                           alpha=_number(g, "alpha", i), centered=g["centered"])

    def _state_keys(self, group):
        return (("step", "square_avg") + (("momentum_buffer",) if float(group["momentum"]) != 0 else ())
                + (("grad_avg",) if group["centered"] else ()))


class Adadelta(Optimizer):
    """torch.optim.Adadelta: running means of squared gradients and of squared updates (rho) scale each
    gradient, with (L2) weight_decay and maximize; lr multiplies the update (1.0, PyTorch's default)."""

    _kind = _KINDS["Adadelta"]

    def __init__(self, params, lr=1.0, rho=0.9, eps=1e-6, weight_decay=0.0, *, maximize=False, foreach=None,
                 capturable=False, differentiable=False, fused=None):
        _implementation(foreach, fused, capturable, differentiable)
        super().__init__(params, dict(lr=lr, rho=rho, eps=eps, weight_decay=weight_decay, maximize=maximize))

    def _group_tuple(self, g, i):
        return self._tuple(g, i, eps=_number(g, "eps", i), alpha=_number(g, "rho", i))

    def _state_keys(self, group):
        return ("step", "square_avg", "acc_delta")


class Adagrad(Optimizer):
    """torch.optim.Adagrad: each gradient divided by the root of the sum of its squares so far (starting at
    initial_accumulator_value), with (L2) weight_decay, lr_decay (lr / (1 + (t - 1) lr_decay)) and maximize."""

    _kind = _KINDS["Adagrad"]

    def __init__(self, params, lr=1e-2, lr_decay=0.0, weight_decay=0.0, initial_accumulator_value=0.0, eps=1e-10,
                 foreach=None, *, maximize=False, differentiable=False, fused=None):
        _implementation(foreach, fused, differentiable=differentiable)
        super().__init__(params, dict(lr=lr, lr_decay=lr_decay, weight_decay=weight_decay,
                                      initial_accumulator_value=initial_accumulator_value, eps=eps,
                                      maximize=maximize))

    def _group_tuple(self, g, i):
        return self._tuple(g, i, eps=_number(g, "eps", i), lr_decay=_number(g, "lr_decay", i),
                           initial_accumulator_value=_number(g, "initial_accumulator_value", i))

    def _state_keys(self, group):
        return ("step", "sum")


class Adamax(Optimizer):
    """torch.optim.Adamax: Adam's first moment over an exponentially weighted infinity norm of the gradients
    (max(beta2 u, |g| + eps)), bias-corrected, with (L2) weight_decay and maximize."""

    _kind = _KINDS["Adamax"]

    def __init__(self, params, lr=2e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, foreach=None, *,
                 maximize=False, differentiable=False, capturable=False):
        _implementation(foreach, None, capturable, differentiable)
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, maximize=maximize))

    def _group_tuple(self, g, i):
        return self._tuple(g, i, betas=g["betas"], eps=_number(g, "eps", i))

    def _state_keys(self, group):
        return ("step", "exp_avg", "exp_inf")


class NAdam(Optimizer):
    """torch.optim.NAdam: Adam with Nesterov momentum (Dozat 2016), the momentum coefficient warmed up by
    momentum_decay, with weight_decay added to the gradient (L2) or, with decoupled_weight_decay, shrinking the
    params as AdamW's; maximize."""

    _kind = _KINDS["NAdam"]

    def __init__(self, params, lr=2e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, momentum_decay=4e-3,
                 decoupled_weight_decay=False, *, foreach=None, maximize=False, capturable=False,
                 differentiable=False):
        _implementation(foreach, None, capturable, differentiable)
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                                      momentum_decay=momentum_decay, decoupled_weight_decay=decoupled_weight_decay,
                                      maximize=maximize))

    def _group_tuple(self, g, i):
        return self._tuple(g, i, betas=g["betas"], eps=_number(g, "eps", i),
                           momentum_decay=_number(g, "momentum_decay", i),
                           decoupled_weight_decay=g["decoupled_weight_decay"])

    def _state_keys(self, group):
        return ("step", "mu_product", "exp_avg", "exp_avg_sq")


class RAdam(Optimizer):
    """torch.optim.RAdam: Adam with the variance of its adaptive rate rectified (Liu et al. 2019), plain
    bias-corrected momentum for the first steps (while the variance's length is <= 5), with weight_decay added to
    the gradient (L2) or, with decoupled_weight_decay, shrinking the params as AdamW's; maximize."""

    _kind = _KINDS["RAdam"]

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, decoupled_weight_decay=False,
                 *, foreach=None, maximize=False, capturable=False, differentiable=False):
        _implementation(foreach, None, capturable, differentiable)
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                                      decoupled_weight_decay=decoupled_weight_decay, maximize=maximize))

    def _group_tuple(self, g, i):
        return self._tuple(g, i, betas=g["betas"], eps=_number(g, "eps", i),
                           decoupled_weight_decay=g["decoupled_weight_decay"])

    def _state_keys(self, group):
        return ("step", "exp_avg", "exp_avg_sq")


class LAMB(Optimizer):
    """LAMB (You et al. 2019, Algorithm 2): Adam moments with bias correction, decoupled weight decay in the
    update, scaled per param tensor by the trust ratio ||p|| / ||update||. A group with lars_exclude=True (BN,
    bias) keeps a ratio of 1."""

    _kind = _KINDS["LAMB"]

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-6, weight_decay=1e-2, *, maximize=False,
                 lars_exclude=False):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, maximize=maximize,
                                      lars_exclude=lars_exclude))

    def _group_tuple(self, g, i):
        return self._tuple(g, i, betas=g["betas"], eps=_number(g, "eps", i), lars_exclude=g["lars_exclude"])

    def _state_keys(self, group):
        return ("step", "exp_avg", "exp_avg_sq")


class LARS(Optimizer):
    """LARS (You, Gitman, Ginsburg 2017, Algorithm 1): per param tensor the local lr
    trust_coefficient * ||p|| / (||g|| + weight_decay * ||p|| + eps); v = momentum * v + lr * local_lr *
    (g + weight_decay * p); p -= v. A group with lars_exclude=True (BN, bias) uses a local lr of 1."""

    _kind = _KINDS["LARS"]

    def __init__(self, params, lr=required, momentum=0.9, weight_decay=0.0, trust_coefficient=1e-3, eps=0.0, *,
                 maximize=False, lars_exclude=False):
        super().__init__(params, dict(lr=lr, momentum=momentum, weight_decay=weight_decay,
                                      trust_coefficient=trust_coefficient, eps=eps, maximize=maximize,
                                      lars_exclude=lars_exclude))

    def _group_tuple(self, g, i):
        return self._tuple(g, i, momentum=_number(g, "momentum", i), eps=_number(g, "eps", i),
                           trust_coefficient=_number(g, "trust_coefficient", i), lars_exclude=g["lars_exclude"])

    def _state_keys(self, group):
        return ("step", "momentum_buffer")
