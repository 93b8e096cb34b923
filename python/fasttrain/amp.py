"""ft.autocast, PyTorch's torch.autocast(device_type, dtype=torch.bfloat16) for eager ops, and ft.amp.GradScaler.

Inside ``with ft.autocast():`` (the CPU's ops) or ``with ft.autocast("cuda"):`` (the GPU's) the products (conv1d/
conv2d, linear, scaled_dot_product_attention, matmul/@, mm, bmm, an einsum that contracts, and the layers built on
them) on that device take float32
operands in the autocast dtype (each call converts its input and weight, as torch.autocast does) and return
it; the losses take 16-bit inputs as float32 and return a float32 loss, as torch.autocast's; every other op
runs in its inputs' dtype (they all read 16-bit floats). The dtype defaults to torch's:
bfloat16 on the CPU, float16 on CUDA (which also takes bfloat16).
It is for eager inference and evaluation code: a compiled program chooses its precision once, at
``compile(precision=...)``, and autocast does not change it."""
import contextvars
import numbers
import operator

from ._types import _BY_NAME, as_dtype

# ({device type: the dtype its products take}, the enclosing block's value) of the innermost autocast block around
# the caller: each thread and context has its own, and a block's exit restores the value its entry found, so one
# autocast object may serve blocks in several threads at once
_blocks = contextvars.ContextVar("fasttrain_autocast", default=({}, None))


class autocast:
    """Context manager (and decorator) turning autocast on (enabled=True) or off within its block for one device
    type ("cpu" or "cuda"); nests, and blocks for the two device types combine, as torch.autocast's."""

    def __init__(self, device_type="cpu", dtype=None, enabled=True, cache_enabled=None):
        """device_type is a device's type, "cpu" or "cuda" (a device, or "cuda:1", stands for its type);
        cache_enabled is taken, as torch's: no cast is kept between ops to cache."""
        kind = str(getattr(device_type, "type", device_type)).split(":")[0]
        if kind not in ("cpu", "cuda"):
            raise ValueError(f"ft.autocast: device_type must be 'cpu' or 'cuda', got {device_type!r}")
        dtype = as_dtype(dtype or ("float16" if kind == "cuda" else "bfloat16"))
        allowed = ("bfloat16", "float16") if kind == "cuda" else ("bfloat16",)
        if not isinstance(enabled, bool):
            raise TypeError(f"ft.autocast: enabled must be a bool, got {type(enabled).__name__}")
        if enabled and dtype.name not in allowed:
            raise ValueError(f"ft.autocast: dtype must be {' or '.join(allowed)} on {kind} (the CPU has no "
                             f"float16 arithmetic), got {dtype.name}")
        self.device_type, self.dtype, self.enabled = kind, dtype, enabled

    def __enter__(self):
        outer = _blocks.get()
        _blocks.set(({**outer[0], self.device_type: self.dtype if self.enabled else None}, outer))
        return self

    def __exit__(self, *exc):
        _blocks.set(_blocks.get()[1])
        return False

    def __call__(self, fn):
        import functools

        @functools.wraps(fn)
        def wrapped(*args, **kwargs):
            with autocast(self.device_type, self.dtype, self.enabled):
                return fn(*args, **kwargs)
        return wrapped


def cast(*tensors):
    """The tensors as a product under autocast takes them: float32 ones on a device type autocast is on for
    converted to its dtype (None stays None); unchanged outside autocast."""
    on = _blocks.get()[0]
    if not any(on.values()):
        return tensors
    return tuple(t.to(on[t.device.type]) if t is not None and t.dtype is _BY_NAME["float32"] and
                 on.get(t.device.type) else t for t in tensors)


def widen(*tensors):
    """The tensors as a loss under autocast takes them (torch.autocast's float32 ops): 16-bit floats on a device
    type autocast is on for converted to float32 (None stays None); unchanged outside autocast."""
    on = _blocks.get()[0]
    if not any(on.values()):
        return tensors
    return tuple(t.float() if t is not None and t.dtype.name in ("bfloat16", "float16") and on.get(t.device.type)
                 else t for t in tensors)


class GradScaler:
    """Dynamic loss scaling for a compiled program, as torch.amp.GradScaler (same arguments and defaults):
    ``compile(..., grad_scaler=ft.amp.GradScaler())``. Each train_step (and each step of ft.fit, in C) starts its
    backward from the scale instead of 1, so that small gradients stay representable in a 16-bit format; the
    fused optimizer pass multiplies the gradients by 1 / scale (clipping and the gradient norm see the unscaled
    ones) and finds overflow through the norm it computes. A step whose loss or gradients are not finite is
    skipped (no update, batch-norm statistics put back, counted in program.skipped_steps) and the scale is
    multiplied by backoff_factor; growth_interval steps in a row without overflow multiply it by growth_factor.
    A power-of-two scale changes no bit of float32 or bfloat16 training (its range is float32's) unless a
    gradient overflows. The live scale is in the program: get_scale(), state_dict() and checkpoints read it."""

    def __init__(self, device="cpu", init_scale=2.0 ** 16, growth_factor=2.0, backoff_factor=0.5,
                 growth_interval=2000, enabled=True):
        if device not in ("cpu", "cuda"):
            raise ValueError(f"GradScaler: device must be 'cpu' or 'cuda', got {device!r}")
        self._state = _checked(init_scale, growth_factor, backoff_factor, growth_interval, 0)
        self._enabled, self._program = bool(enabled), None

    def _attach(self, program):
        """Hands the scaler's state to a compiled program's C step, which owns it from then on."""
        if self._program is not None:
            raise ValueError("GradScaler: this scaler already serves another program; give each its own")
        self._program = program
        if self._enabled:
            program.loss_scaler = self._state

    def _live(self):
        return self._program.loss_scaler if self._program is not None else self._state

    def is_enabled(self):
        return self._enabled

    def get_scale(self):
        """The current scale (1.0 when disabled)."""
        return self._live()[0] if self._enabled else 1.0

    def get_growth_tracker(self):
        """Steps in a row without overflow since the scale last changed."""
        return self._live()[4] if self._enabled else 0

    def state_dict(self):
        """torch.amp.GradScaler's keys: scale, growth_factor, backoff_factor, growth_interval, _growth_tracker."""
        if not self._enabled:
            return {}
        scale, growth, backoff, interval, good = self._live()
        return {"scale": scale, "growth_factor": growth, "backoff_factor": backoff, "growth_interval": interval,
                "_growth_tracker": good}

    def load_state_dict(self, state):
        """Restores a state_dict (from this class or torch.amp.GradScaler)."""
        if not self._enabled:
            if state:
                raise RuntimeError("GradScaler: a disabled scaler cannot load a state")
            return
        try:
            # counts stay exact: a float interval is refused as the constructor refuses it, not cut
            new = _checked(float(state["scale"]), float(state["growth_factor"]), float(state["backoff_factor"]),
                           _count(state["growth_interval"]), _count(state["_growth_tracker"]))
        except (KeyError, TypeError) as e:
            raise ValueError(f"GradScaler: not a GradScaler state_dict ({e})") from None
        if self._program is not None:
            self._program.loss_scaler = new
        else:
            self._state = new

    def __getattr__(self, name):
        if name in ("scale", "step", "update", "unscale_"):  # torch's loop: scaler.scale(loss).backward() ...
            raise AttributeError(f"GradScaler.{name}: a compiled program scales its own backward and steps its "
                                 "optimizer, so the loop has nothing to scale: compile(..., grad_scaler=scaler), then "
                                 "train_step or ft.fit (docs/precision.md)")
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")


def _count(value):
    """An integer count of a state_dict: an int (or an integral tensor or NumPy value) as it is."""
    if isinstance(value, float) or not hasattr(value, "__index__"):
        raise TypeError(f"a count must be an integer, got {value!r}")
    return operator.index(value)


def _checked(scale, growth, backoff, interval, good):
    """A GradScaler's state (scale, growth, backoff, interval, good steps) as the C step takes it, or a
    ValueError saying which part is out of range."""
    for name, value in (("init_scale", scale), ("growth_factor", growth), ("backoff_factor", backoff)):
        if not isinstance(value, numbers.Real) or isinstance(value, bool):
            raise TypeError(f"GradScaler: {name} must be a number, got {type(value).__name__}")
    if not 2.0 ** -126 <= scale <= 2.0 ** 127:
        raise ValueError(f"GradScaler: the scale (init_scale) must be in [2**-126, 2**127], got {scale}")
    if not (1.0 < growth < float("inf")) or not 0.0 < backoff < 1.0:
        raise ValueError(f"GradScaler: growth_factor must be > 1 and backoff_factor in (0, 1), got {growth} and "
                         f"{backoff}")
    if not isinstance(interval, int) or isinstance(interval, bool) or interval < 1:
        raise ValueError(f"GradScaler: growth_interval must be a positive int, got {interval!r}")
    if not 0 <= good < interval:
        raise ValueError(f"GradScaler: _growth_tracker must be in [0, growth_interval), got {good}")
    return float(scale), float(growth), float(backoff), interval, good
