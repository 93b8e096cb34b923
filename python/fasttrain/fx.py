"""torch.fx's names that model code calls at import (torchvision's torch.fx.wrap("stochastic_depth")), so that such
code loads as written: fasttrain's tracer (model.compile) reaches functions through their calls."""

__all__ = ["wrap"]


def wrap(fn_or_name):
    """fn_or_name itself (torch.fx's mark of a function its tracer keeps whole)."""
    return fn_or_name
