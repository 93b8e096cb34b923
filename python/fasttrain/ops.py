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

__all__ = [
    "conv2d_forward", "conv2d_backward", "linear_forward", "linear_backward",
    "batch_norm_forward", "batch_norm_backward", "layer_norm_forward", "layer_norm_backward",
    "activation_forward", "activation_backward",
    "add_forward", "add_backward", "mul_forward", "mul_backward", "concat_forward", "concat_backward",
    "dropout_forward", "dropout_backward", "dropout_blocks",
    "max_pool2d_forward", "max_pool2d_backward", "avg_pool2d_forward", "avg_pool2d_backward",
    "adaptive_avg_pool2d_forward", "adaptive_avg_pool2d_backward",
    "adaptive_max_pool2d_forward", "adaptive_max_pool2d_backward",
    "softmax_forward", "softmax_backward", "log_softmax_forward", "log_softmax_backward",
    "cross_entropy_forward", "cross_entropy_backward", "mse_loss_forward", "mse_loss_backward",
    "sdpa_forward", "sdpa_backward",
]


def __getattr__(name):
    # ops registered by other families later (conv2d, linear, ...) are found too
    if not name.startswith("_") and hasattr(_C, name) and (name.endswith("_forward") or name.endswith("_backward")):
        return getattr(_C, name)
    raise AttributeError(f"module 'fasttrain.ops' has no attribute '{name}'")


for _name in __all__:
    globals()[_name] = getattr(_C, _name)
del _name
