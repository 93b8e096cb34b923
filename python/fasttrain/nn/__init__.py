"""fasttrain.nn: functional ops (``ft.nn.functional``, PyTorch's names) and the layers built on them."""
from . import functional, init
from .graph import Input, Symbolic, TracingError, cat
from .modules import (AdaptiveAvgPool2d, AdaptiveMaxPool2d, Add, AvgPool2d, BatchNorm2d, Cat, Conv2d,
                      CrossEntropyLoss, Dropout, Flatten, GELU, Identity, LayerNorm, LeakyReLU, Linear, MaxPool2d,
                      Model, Module, ModuleDict, ModuleList, MSELoss, Parameter, ReLU, Sequential, Sigmoid, SiLU,
                      Tanh)
from .program import Program, compile
