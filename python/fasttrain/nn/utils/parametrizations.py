"""ft.nn.utils.parametrizations, as torch.nn.utils.parametrizations: a layer's weight computed from parameters of
its own in every forward (compiled too, where it trains through them)."""
from .. import modules as M


def _norm_except(v, dim):
    """The 2-norm of v over every dimension but dim, keeping them (over all of them for dim None or -1)."""
    if dim is None or dim == -1:
        return v.norm()
    d = dim % v.ndim
    return v.norm(dim=[k for k in range(v.ndim) if k != d], keepdim=True)


def _weighed(v, g, dim):
    """The weight-normalized weight, v * (g / |v|)."""
    return v * (g / _norm_except(v, dim))


def _computed_from(module, name, compute):
    """module with its parameter `name` gone, computed by compute(module) at each access instead; its forward then
    traced (not recorded as its layer's node with the parameter), reading the computed weight."""
    module._parameters.pop(name, None)
    module.__dict__.pop(name, None)
    module._computed[name] = compute
    object.__setattr__(module, "_leaf", False)
    return module


class _WeightNorm(M.Module):
    """The parameters a weight is computed from, original0 (g) and original1 (v), under PyTorch's names
    (parametrizations.weight.original0)."""

    def __init__(self, weight, dim):
        super().__init__()
        self.dim = dim
        self.original0 = M.Parameter(_norm_except(weight, dim).clone())
        self.original1 = M.Parameter(weight.detach().clone())

    def forward(self):
        """The weight, original0 * original1 / |original1|."""
        return _weighed(self.original1, self.original0, self.dim)


def weight_norm(module, name="weight", dim=0):
    """Reparametrizes module's parameter `name` as g * v / |v|, the norm over every dimension but dim (over all of
    them for dim None or -1), as torch.nn.utils.parametrizations.weight_norm: g and v are
    module.parametrizations.<name>.original0 and original1, initialized so that the weight is unchanged; the
    weight is computed from them at each access. Returns module."""
    weight = getattr(module, name)
    if "parametrizations" not in module._modules:
        module.parametrizations = M.ModuleDict()
    module.parametrizations[name] = _WeightNorm(weight, dim)
    return _computed_from(module, name, lambda m: m.parametrizations[name].forward())


def spectral_norm(module, name="weight", n_power_iterations=1, eps=1e-12, dim=None):
    """Not supported: raises NotImplementedError. PyTorch's spectral norm moves its power iteration's u and v
    buffers in every training forward, which a compiled step does not do; a weight divided by a norm computed
    from parameters alone (weight_norm, or w / w.norm()) compiles."""
    raise NotImplementedError(f"spectral_norm of {type(module).__name__}.{name} is not supported: its power "
                              "iteration updates buffers in every training forward, which a compiled step does not; "
                              "use weight_norm, or divide the weight by a norm of it in forward")
