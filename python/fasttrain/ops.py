"""The C ops as pairs: ``ft.ops.<op>_forward`` / ``ft.ops.<op>_backward``.

Each is the C entry point ``ft_<op>_forward`` / ``ft_<op>_backward`` of
csrc/ops/ exposed directly (the functions live in fasttrain._C; the rule is
written at the top of csrc/bind/ops.c):

- positional arguments follow the C order: outputs first, then inputs and
  saved tensors, then parameters (also by keyword);
- an output is a Tensor to write into (it may be an input itself where the op
  allows in-place use, or an existing gradient with ``accumulate=True``),
  ``None`` to have it allocated (same dtype and memory format as the op's
  reference input), or ``False`` to skip an optional output;
- the outputs are returned: one tensor, or a tuple in C order.

Gradient outputs are written (=) unless their ``accumulate`` flag is set
(+=). Example::

    y = ft.ops.activation_forward(None, x, "gelu")
    dx = ft.ops.activation_backward(None, dy, x, None, "gelu")
    loss, dlogits = ft.ops.cross_entropy_forward(None, None, logits, target)   # fused softmax + CE + gradient
"""
from . import _C

# Read from the extension, so that an op bound in C is here without a second list.
__all__ = sorted(n for n in dir(_C) if n.endswith(("_forward", "_backward"))) + ["dropout_blocks"]

for _name in __all__:
    globals()[_name] = getattr(_C, _name)
del _name
