"""ft.nn.utils: torch.nn.utils' helpers for loops written by hand (a compiled program clips in its fused step:
compile(clip_grad_norm=...))."""
import math

import numpy as np

from ... import creation
from .. import modules as M
from . import parametrizations, rnn  # noqa: F401 (ft.nn.utils.rnn, as torch.nn.utils.rnn)
from .parametrizations import _computed_from, _norm_except, _weighed, spectral_norm  # noqa: F401 (PyTorch's name)


def clip_grad_norm_(parameters, max_norm, norm_type=2.0, error_if_nonfinite=False):
    """Scales the gradients of parameters (a tensor or an iterable of them; those without .grad are skipped) in
    place so that their total norm (the norm of the vector of every gradient's norm) is at most max_norm, as
    torch.nn.utils.clip_grad_norm_ (the factor max_norm / (norm + 1e-6), when below 1). norm_type may be
    float("inf"). Returns the total norm before clipping, as a 0-d float32 tensor. CPU gradients."""
    params = [parameters] if hasattr(parameters, "grad") else list(parameters)
    grads = [p.grad for p in params if p.grad is not None]
    if any(g.device.type != "cpu" for g in grads):
        raise ValueError("clip_grad_norm_: the gradients must be CPU tensors (a compiled program on CUDA clips "
                         "in its step: compile(clip_grad_norm=...))")
    norm_type = float(norm_type)
    if not (norm_type > 0):
        raise ValueError(f"clip_grad_norm_: norm_type must be positive or inf, got {norm_type}")
    views = [g.numpy() for g in grads]  # share the gradients' memory
    norms = [np.abs(v).max() if norm_type == math.inf else np.linalg.norm(v.ravel().astype(np.float64), norm_type)
             for v in views if v.size]
    total = 0.0 if not norms else float(max(norms) if norm_type == math.inf else
                                        np.linalg.norm(np.asarray(norms, np.float64), norm_type))
    if error_if_nonfinite and not math.isfinite(total):
        raise RuntimeError(f"clip_grad_norm_: the total norm of order {norm_type} of the gradients is {total}")
    coef = float(max_norm) / (total + 1e-6)
    if coef < 1:
        for v in views:
            v *= np.float32(coef)
    return creation.tensor(np.float32(total))


def clip_grad_value_(parameters, clip_value):
    """Clamps the gradients of parameters (a tensor or an iterable of them; those without .grad are skipped) to
    [-clip_value, clip_value] in place, as torch.nn.utils.clip_grad_value_."""
    params = [parameters] if hasattr(parameters, "grad") else list(parameters)
    clip_value = float(clip_value)
    for p in params:
        if p.grad is not None:
            p.grad.clamp_(-clip_value, clip_value)


def parameters_to_vector(parameters):
    """The parameters flattened and joined into one 1-d tensor (a copy), as torch.nn.utils.parameters_to_vector."""
    from ..._math import cat
    return cat([p.reshape(-1) for p in parameters])


def vector_to_parameters(vec, parameters):
    """Copies consecutive slices of the 1-d vec into the parameters in place, as
    torch.nn.utils.vector_to_parameters."""
    params = list(parameters)
    total = sum(p.numel() for p in params)
    if vec.ndim != 1 or vec.numel() != total:
        raise ValueError(f"vector_to_parameters: vec must be 1-d with {total} elements, got shape {tuple(vec.shape)}")
    at = 0
    for p in params:
        p.copy_(vec[at:at + p.numel()].reshape(p.shape))
        at += p.numel()


def weight_norm(module, name="weight", dim=0):
    """Reparametrizes module's parameter `name` as g * v / |v|, the norm over every dimension but dim (over all of
    them for dim None or -1), as torch.nn.utils.weight_norm: parameters name_g and name_v, initialized so that the
    weight is unchanged; the weight is computed from them at each access, in a compiled forward too, where they
    train through it. Returns module."""
    weight = getattr(module, name)
    module.register_parameter(f"{name}_g", M.Parameter(_norm_except(weight, dim).clone()))
    module.register_parameter(f"{name}_v", M.Parameter(weight.detach().clone()))
    return _computed_from(module, name, lambda m: _weighed(getattr(m, f"{name}_v"), getattr(m, f"{name}_g"), dim))


def remove_weight_norm(module, name="weight"):
    """The weight as a parameter again, its value now (torch.nn.utils.remove_weight_norm); returns module."""
    if name not in module._computed:
        raise ValueError(f"weight_norm of {name!r} not found in {type(module).__name__}")
    weight = getattr(module, name).detach().clone()
    del module._computed[name]
    for part in (f"{name}_g", f"{name}_v"):
        delattr(module, part)
    if not module._computed:
        object.__delattr__(module, "_leaf")
    module.register_parameter(name, M.Parameter(weight))
    return module

