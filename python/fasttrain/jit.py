"""torch.jit's names that model code calls around its own code (torchvision's @torch.jit.unused and
torch.jit.is_scripting()), so that such code runs as written. TorchScript has no part in fasttrain, whose compiled
training step is model.compile's: script and trace are refused."""

__all__ = ["annotate", "export", "ignore", "is_scripting", "is_tracing", "script", "trace", "unused"]


def is_scripting():
    """False: no code runs under TorchScript."""
    return False


def is_tracing():
    """False: torch.jit's tracer does not run (model.compile's traces the forward, as the code is written)."""
    return False


def unused(fn):
    """fn itself (a decorator marking code TorchScript leaves out)."""
    return fn


def export(fn):
    """fn itself (a decorator marking a method TorchScript compiles)."""
    return fn


def ignore(drop=False, **kwargs):
    """The function itself, as @ignore or @ignore(drop=...) decorates it."""
    return drop if callable(drop) else lambda fn: fn


def _overload_method(fn):
    return fn


def annotate(the_type, the_value):
    """the_value itself (a type hint for TorchScript)."""
    return the_value


def script(obj, *args, **kwargs):
    """Refused: a model's training step is compiled by model.compile(optimizer, loss, batch_size=...)."""
    raise NotImplementedError("ft.jit.script: TorchScript is not part of fasttrain; model.compile(optimizer, loss, "
                              "batch_size=...) compiles a model's training step (docs/models.md)")


trace = script
