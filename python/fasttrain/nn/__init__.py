"""fasttrain.nn: functional ops (``ft.nn.functional``, PyTorch's names) and the layers built on them."""
from . import functional, init
from .graph import Input, Symbolic, TracingError, cat
from .modules import (AdaptiveAvgPool2d, AdaptiveMaxPool2d, Add, AvgPool2d, BatchNorm2d, BCEWithLogitsLoss, Cat,
                      Conv2d, CrossEntropyLoss, Dropout, Flatten, GELU, Hardswish, HuberLoss, Identity, KLDivLoss,
                      L1Loss, LayerNorm, LeakyReLU, Linear, MaxPool2d, Model, Module, ModuleDict, ModuleList, MSELoss,
                      NLLLoss, Parameter, ReLU, Sequential, Sigmoid, SiLU, SmoothL1Loss, Softplus, Tanh)
from .program import Program, compile
