"""fasttrain.nn: functional ops (``ft.nn.functional``, PyTorch's names) and the layers built on them."""
from . import functional, init, utils
from .graph import Input, Symbolic, TracingError, cat
from .modules import (AdaptiveAvgPool1d, AdaptiveAvgPool2d, AdaptiveMaxPool1d, AdaptiveMaxPool2d, Add, AvgPool1d,
                      AvgPool2d, BatchNorm1d, BatchNorm2d, BCELoss, BCEWithLogitsLoss, Cat, CELU, CircularPad1d,
                      CircularPad2d, ConstantPad1d, ConstantPad2d, Conv1d, Conv2d, ConvTranspose1d, ConvTranspose2d,
                      CosineEmbeddingLoss, CosineSimilarity, CrossEntropyLoss, Dropout, Dropout1d, Dropout2d, ELU,
                      Embedding, Flatten, GELU, GLU, GroupNorm, GRU, Hardsigmoid, Hardswish, Hardtanh, HuberLoss,
                      Identity, InPlaceABN, InstanceNorm1d, InstanceNorm2d, KLDivLoss, L1Loss, LayerNorm, LeakyReLU,
                      Linear, LogSigmoid, LogSoftmax, LSTM, MarginRankingLoss, MaxPool1d, MaxPool2d, Mish, Model,
                      Module, ModuleDict, ModuleList, MSELoss, MultiheadAttention, NLLLoss, PairwiseDistance,
                      Parameter, ParameterDict, ParameterList, PixelShuffle, PixelUnshuffle, PReLU, ReflectionPad1d,
                      ReflectionPad2d, ReLU, ReLU6, ReplicationPad1d, ReplicationPad2d, RMSNorm, RNN, SELU, Sequential,
                      Sigmoid, SiLU, SmoothL1Loss, Softmax, Softmax2d, Softplus, Softsign, SyncBatchNorm, Tanh,
                      Tanhshrink, TransformerEncoder, TransformerEncoderLayer, TripletMarginLoss, Unflatten, Upsample,
                      ZeroPad1d, ZeroPad2d)
from .program import Program, compile
