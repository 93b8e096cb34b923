"""torch.utils.checkpoint's names (Hugging Face's and timm's gradient checkpointing call them in forward): the
function runs as it is, and in a traced forward a module run so (a transformer block: checkpoint(block, x), or
checkpoint(block.__call__, x)) becomes a segment the compiled training step recomputes in its backward, as
compile(..., recompute=[...]) lists them (docs/memory.md). A plain function's nodes are kept, not recomputed:
name its modules in compile's recompute= instead."""
from ..nn.graph import checkpointed
from ..nn.modules import Module

__all__ = ["checkpoint", "checkpoint_sequential"]


def _module_of(function):
    """The module that function is (or whose bound method it is), else None."""
    owner = getattr(function, "__self__", function)
    return owner if isinstance(owner, Module) else None


def checkpoint(function, *args, use_reentrant=None, context_fn=None, determinism_check=None, debug=None,
               preserve_rng_state=True, **kwargs):
    """function(*args, **kwargs); traced, its module is a segment recomputed in the backward (see the module's
    doc). The other arguments are torch's, which fasttrain's recomputation does not need (its dropout masks are
    drawn again from the same place of the program's stream, so a recomputed segment sees the same ones)."""
    module = _module_of(function)
    if module is not None:
        checkpointed(module)
    return function(*args, **kwargs)


def checkpoint_sequential(functions, segments, input, use_reentrant=None, **kwargs):
    """The functions (a Sequential, or a list of modules) applied in order to input; traced, cut into `segments`
    runs of layers, each a segment recomputed in the backward, as torch's."""
    layers = list(functions.children()) if isinstance(functions, Module) else list(functions)
    if segments < 1:
        raise ValueError(f"checkpoint_sequential: segments must be at least 1, got {segments}")
    size = -(-len(layers) // segments)
    for start in range(0, len(layers), size):
        part = layers[start:start + size]
        if all(isinstance(m, Module) for m in part):
            checkpointed(part)
        for layer in part:
            input = layer(input)
    return input
