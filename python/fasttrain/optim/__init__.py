"""ft.optim: SGD, Adam, AdamW, RMSprop, Adadelta, Adagrad, Adamax, NAdam, RAdam, LAMB and LARS with PyTorch's
interface, each step one fused C pass over every parameter (with optional gradient scaling and global-norm clipping
inside it), an EMA of weights, ft.optim.lr_scheduler and ft.optim.swa_utils."""
from . import lr_scheduler, swa_utils
from .ema import EMA
from .optimizer import LAMB, LARS, SGD, Adadelta, Adagrad, Adam, Adamax, AdamW, NAdam, Optimizer, RAdam, RMSprop

__all__ = ["Optimizer", "SGD", "Adam", "AdamW", "RMSprop", "Adadelta", "Adagrad", "Adamax", "NAdam", "RAdam", "LAMB",
           "LARS", "EMA", "lr_scheduler", "swa_utils"]
