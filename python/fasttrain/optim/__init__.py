"""ft.optim: SGD, Adam, AdamW, RMSprop, Adadelta, LAMB and LARS with PyTorch's interface, each step one fused C pass over every
parameter (with optional gradient scaling and global-norm clipping inside it), an EMA of weights, and
ft.optim.lr_scheduler."""
from . import lr_scheduler
from .ema import EMA
from .optimizer import LAMB, LARS, SGD, Adadelta, Adam, AdamW, Optimizer, RMSprop

__all__ = ["Optimizer", "SGD", "Adam", "AdamW", "RMSprop", "Adadelta", "LAMB", "LARS", "EMA", "lr_scheduler"]
