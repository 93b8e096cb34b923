"""Stochastic weight averaging as torch.optim.swa_utils: AveragedModel, SWALR, update_bn and the averaging
functions, with PyTorch's arguments and formulas."""
import copy
import math

from .. import creation
from ..nn.modules import Module, _BatchNorm
from ..settings import no_grad
from .lr_scheduler import LRScheduler

__all__ = ["AveragedModel", "SWALR", "update_bn", "get_ema_avg_fn", "get_ema_multi_avg_fn", "get_swa_avg_fn",
           "get_swa_multi_avg_fn"]


def get_ema_multi_avg_fn(decay=0.999):
    """The exponential moving average of lists of tensors, in place: ema = lerp(ema, current, 1 - decay) (of
    integer tensors, a buffer's count, the average converted back, as PyTorch's)."""
    def ema_update(ema_params, current_params, num_averaged):
        for e, c in zip(ema_params, current_params):
            if e.dtype.is_floating_point:
                e.lerp_(c, 1 - decay)
            else:
                e.copy_(e * decay + c * (1 - decay))
    return ema_update


def get_swa_multi_avg_fn():
    """The equal average of lists of tensors, in place: avg += (current - avg) / (num_averaged + 1) (of integer
    tensors converted back)."""
    def swa_update(averaged_params, current_params, num_averaged):
        weight = 1 / (int(num_averaged) + 1)
        for a, c in zip(averaged_params, current_params):
            if a.dtype.is_floating_point:
                a.lerp_(c, weight)
            else:
                a.copy_(a + (c - a) * weight)
    return swa_update


def get_ema_avg_fn(decay=0.999):
    """The exponential moving average of one tensor: decay * ema + (1 - decay) * current."""
    def ema_update(ema_param, current_param, num_averaged):
        return decay * ema_param + (1 - decay) * current_param
    return ema_update


def get_swa_avg_fn():
    """The equal average of one tensor: avg + (current - avg) / (num_averaged + 1)."""
    def swa_update(averaged_param, current_param, num_averaged):
        return averaged_param + (current_param - averaged_param) / (int(num_averaged) + 1)
    return swa_update


class AveragedModel(Module):
    """A copy of model (``.module``) whose parameters average the model's over update_parameters(model) calls, as
    torch's AveragedModel: the first call copies them, later ones apply avg_fn(averaged, current, n_averaged) per
    tensor or multi_avg_fn(averaged_list, current_list, n_averaged) (the equal average by default); use_buffers
    averages the buffers too, else they are copied from the model at every update. Calling it runs the copy's
    forward."""

    def __init__(self, model, device=None, avg_fn=None, multi_avg_fn=None, use_buffers=False):
        if avg_fn is not None and multi_avg_fn is not None:
            raise ValueError("AveragedModel: give avg_fn or multi_avg_fn, not both")
        super().__init__()
        self.module = copy.deepcopy(model)
        if device is not None:
            self.module = self.module.to(device)
        self.register_buffer("n_averaged", creation.tensor(0, dtype="int64", device=device))
        self.avg_fn, self.multi_avg_fn, self.use_buffers = avg_fn, multi_avg_fn, use_buffers

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def _tensors(self, model):
        return [*model.parameters(), *(model.buffers() if self.use_buffers else ())]

    def update_parameters(self, model):
        """Averages model's parameters (and buffers with use_buffers) into the copy's; copies the rest of the
        buffers."""
        averaged, current = self._tensors(self.module), [t.detach().to(a.device) for t, a in
                                                          zip(self._tensors(model), self._tensors(self.module))]
        n = int(self.n_averaged)
        with no_grad():
            if n == 0:
                for a, c in zip(averaged, current):
                    a.copy_(c)
            elif self.avg_fn is not None:
                for a, c in zip(averaged, current):
                    a.copy_(self.avg_fn(a, c, self.n_averaged))
            else:
                (self.multi_avg_fn or get_swa_multi_avg_fn())(averaged, current, self.n_averaged)
            if not self.use_buffers:
                for a, c in zip(self.module.buffers(), model.buffers()):
                    a.copy_(c.detach().to(a.device))
            self.n_averaged.fill_(n + 1)


class SWALR(LRScheduler):
    """Anneals each group's learning rate to swa_lr over anneal_epochs steps ("cos" or "linear"), then holds it,
    as torch's SWALR (typically stepped once per epoch from the epoch SWA starts)."""

    def __init__(self, optimizer, swa_lr, anneal_epochs=10, anneal_strategy="cos", last_epoch=-1):
        swa_lrs = swa_lr if isinstance(swa_lr, (list, tuple)) else [swa_lr] * len(optimizer.param_groups)
        if len(swa_lrs) != len(optimizer.param_groups):
            raise ValueError(f"swa_lr must have one value per param group: {len(optimizer.param_groups)} groups, "
                             f"{len(swa_lrs)} values")
        for group, lr in zip(optimizer.param_groups, swa_lrs):
            group["swa_lr"] = lr
        if anneal_strategy not in ("cos", "linear"):
            raise ValueError(f"anneal_strategy must be 'cos' or 'linear', got {anneal_strategy!r}")
        if not isinstance(anneal_epochs, int) or anneal_epochs < 0:
            raise ValueError(f"anneal_epochs must be equal or greater than 0, got {anneal_epochs}")
        self.anneal_func = (lambda t: (1 - math.cos(math.pi * t)) / 2) if anneal_strategy == "cos" else \
            (lambda t: t)
        self.anneal_epochs = anneal_epochs
        super().__init__(optimizer, last_epoch)

    @staticmethod
    def _get_initial_lr(lr, swa_lr, alpha):
        return swa_lr if alpha == 1 else (lr - alpha * swa_lr) / (1 - alpha)

    def get_lr(self):
        step = self._step_count - 1
        if self.anneal_epochs == 0:
            step = max(1, step)
        prev_alpha = self.anneal_func(max(0, min(1, (step - 1) / max(1, self.anneal_epochs))))
        alpha = self.anneal_func(max(0, min(1, step / max(1, self.anneal_epochs))))
        return [g["swa_lr"] * alpha + self._get_initial_lr(g["lr"], g["swa_lr"], prev_alpha) * (1 - alpha)
                for g in self.optimizer.param_groups]


def update_bn(loader, model, device=None):
    """The running statistics of model's batch norms computed afresh over one pass of loader (batches, or (x, y)
    pairs whose x it takes), as a cumulative average, in training mode; the model's mode and the norms' momenta
    as they were. The eager forward runs, as in PyTorch (after SWA, the averaged weights' statistics)."""
    norms = {m: m.momentum for m in model.modules() if isinstance(m, _BatchNorm) and m.track_running_stats}
    if not norms:
        return
    was_training = model.training
    model.train()
    for m in norms:
        m.reset_running_stats()
        m.momentum = None
    try:
        with no_grad():
            for batch in loader:
                x = batch[0] if isinstance(batch, (list, tuple)) else batch
                model(x if device is None else x.to(device))
    finally:
        for m, momentum in norms.items():
            m.momentum = momentum
        model.train(was_training)
