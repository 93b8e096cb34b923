"""ft.utils: planning helpers that answer questions from a compiled program's memory plan (docs/memory.md),
ft.utils.checkpoint (torch.utils.checkpoint's names) and ft.utils.data (torch.utils.data's)."""
import numbers

from . import checkpoint, data

__all__ = ["max_batch_size"]

# The planner places each buffer at an offset rounded up to 64 bytes, so between two batch sizes a buffer's
# place may move by up to this much more (or less) than its size grows.
_ALIGN = 64


def _mib(n):
    return f"{n / 2**20:.1f} MiB"


def max_batch_size(model, input_shape, budget_bytes, optimizer=None, loss=None, **compile_options):
    """The largest batch size whose compiled training program holds at most budget_bytes: memory_plan()["total"],
    that is the training and evaluation arenas, the flat parameters and gradients, the optimizer's state and
    bf16-mixed's bfloat16 weight copy. Nothing runs and no activation memory is touched: the answer comes from
    the plans of programs compiled at a few batch sizes.

    optimizer: the optimizer you will train with (its state counts: SGD with momentum one buffer the size of the
    parameters, AdamW two); None counts none (plain SGD). loss: as compile's (CrossEntropyLoss by default).
    compile_options: compile's other keywords (memory_format, precision, accumulate_steps, recompute, input_dtype,
    target_shape, ...), which change the plan; batch_size is what this function chooses. With
    accumulate_steps=k the answer is a multiple of k (the arenas hold one micro-batch of batch / k samples).

    The arenas grow linearly with the batch, up to the planner's 64-byte alignment. So the search compiles batch
    1, predicts from its plan (and then from the two nearest plans) the largest batch within the budget, compiles
    that, and repeats until the batch fits and the next does not. It compiles only batches whose predicted bytes
    fit the budget, except to confirm the next batch when its prediction exceeds the budget by less than the
    alignment slack (384 bytes per node, 640 with recompute). Compiling allocates a program's arenas (untouched on
    the CPU); each probe program is dropped before the next, and its blocks return to fasttrain's caching allocator
    (ft.empty_cache() gives them back to the system). As model.compile does, it moves the model's parameters
    into one flat buffer and zeroes the conv biases a batch norm cancels.

    A training step also allocates short-lived workspace outside the plan (docs/memory.md): leave headroom when
    the budget is the machine's whole memory. Raises ValueError when even the smallest batch does not fit,
    saying how many bytes it needs."""
    from ..nn import Module
    from ..optim import SGD
    if not isinstance(model, Module):
        raise TypeError(f"max_batch_size: model must be an ft.nn.Module, got {type(model).__name__}")
    if input_shape is not None:
        if isinstance(input_shape, (str, bytes)) or not hasattr(input_shape, "__iter__"):
            raise TypeError(f"max_batch_size: input_shape must be a tuple of ints (one sample's shape), got "
                            f"{input_shape!r}")
        input_shape = tuple(input_shape)
        if not all(isinstance(n, numbers.Integral) and not isinstance(n, bool) for n in input_shape):
            raise TypeError(f"max_batch_size: input_shape must be a tuple of ints, got {input_shape!r}")
        if any(n < 1 for n in input_shape):
            raise ValueError(f"max_batch_size: input_shape must have positive sizes, got {input_shape!r}")
    if isinstance(budget_bytes, bool) or not isinstance(budget_bytes, numbers.Real):
        raise TypeError(f"max_batch_size: budget_bytes must be a number of bytes, got {type(budget_bytes).__name__}")
    if not budget_bytes > 0 or budget_bytes == float("inf"):
        raise ValueError(f"max_batch_size: budget_bytes must be a positive, finite number of bytes, got "
                         f"{budget_bytes!r}")
    budget = int(budget_bytes)
    if "batch_size" in compile_options:
        raise TypeError("max_batch_size: batch_size is what max_batch_size chooses; do not pass it")
    recompute = compile_options.get("recompute")
    if isinstance(recompute, numbers.Integral) and not isinstance(recompute, bool):
        raise ValueError("max_batch_size: recompute=<budget> fixes the training arena whatever the batch; pass "
                         "recompute='auto' or a list of modules")
    steps = compile_options.get("accumulate_steps", 1)
    if isinstance(steps, bool) or not isinstance(steps, numbers.Integral) or steps < 1:
        raise ValueError(f"max_batch_size: accumulate_steps must be a positive int, got {steps!r}")
    # A fixed seed: the default draws one from fasttrain's generator, which the caller's runs should not see.
    compile_options.setdefault("seed", 0)
    if optimizer is None:
        optimizer = SGD(model.parameters(), lr=0.0)

    def plan(micro):
        """(memory_plan()["total"], the bytes of both arenas, the node count) of the program at batch
        micro * steps."""
        program = model.compile(optimizer, loss, batch_size=micro * steps, input_shape=input_shape,
                                **compile_options)
        p = program.memory_plan()
        program._c = program._eval_c = None  # its arenas go back to the allocator now, before the next probe allocates
        return p["total"], p["activations"] + p["evaluation"], len(program.entries)

    plans = {}
    plans[1], arenas, nodes = plan(1)
    if plans[1] > budget:
        what = "batch 1" if steps == 1 else f"batch {steps} (micro-batches of 1 sample)"
        raise ValueError(f"max_batch_size: {what} needs {plans[1]} bytes ({_mib(plans[1])}), more than the budget "
                         f"of {budget} bytes ({_mib(budget)})")
    # Two arenas of up to three buffers per node (five with recompute), each of which may sit up to _ALIGN bytes
    # off the line.
    slack = 2 * (5 if recompute is not None else 3) * _ALIGN * nodes
    lo, hi = 1, None  # lo fits; hi (when known) does not
    while hi != lo + 1:
        # bytes per sample: the slope between lo's plan and the nearest other one (batch 1's arenas at first)
        known = sorted(plans)
        below = [b for b in known if b < lo]
        above = [b for b in known if b > lo]
        ref = above[0] if above else below[-1] if below else None
        if ref is None:
            per_sample = max(arenas, 1)
        else:
            per_sample = max((plans[ref] - plans[lo]) / (ref - lo), 1)
        guess = lo + int((budget - plans[lo]) // per_sample)
        if hi is not None:
            guess = min(guess, hi - 1)
        if guess <= lo:
            # the prediction puts lo + 1 over the budget: trust it unless it is within the alignment slack
            if plans[lo] + per_sample - budget > slack:
                break
            guess = lo + 1
        plans[guess] = plan(guess)[0]
        if plans[guess] <= budget:
            lo = guess
        else:
            hi = guess
    return lo * steps

