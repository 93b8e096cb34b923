"""fasttrain.nn: functional ops (``ft.nn.functional``, PyTorch's names) and the layers built on them."""
from . import functional, init, parameter, utils
from .graph import Input, Symbolic, TracingError, cat
from .modules import (AdaptiveAvgPool1d, AdaptiveAvgPool2d, AdaptiveAvgPool3d, AdaptiveMaxPool1d, AdaptiveMaxPool2d,
                      AdaptiveMaxPool3d, Add, AvgPool1d, AvgPool2d, AvgPool3d, BatchNorm1d, BatchNorm2d, BatchNorm3d,
                      BCELoss, BCEWithLogitsLoss, Bilinear, Cat, CELU, ChannelShuffle, CircularPad1d, CircularPad2d,
                      ConstantPad1d, ConstantPad2d, Conv1d, Conv2d, Conv3d, ConvTranspose1d, ConvTranspose2d,
                      ConvTranspose3d, CosineEmbeddingLoss, CosineSimilarity, CrossEntropyLoss, Dropout, Dropout1d,
                      Dropout2d, Dropout3d, ELU, Embedding, EmbeddingBag, Flatten, GaussianNLLLoss, GELU, GLU,
                      GroupNorm, GRU, GRUCell, Hardshrink, Hardsigmoid, Hardswish, Hardtanh, HuberLoss, Identity,
                      InPlaceABN, InstanceNorm1d, InstanceNorm2d, InstanceNorm3d, KLDivLoss, L1Loss, LayerNorm,
                      LazyBatchNorm1d, LazyBatchNorm2d, LazyConv1d, LazyConv2d, LazyConvTranspose1d,
                      LazyConvTranspose2d, LazyInstanceNorm1d, LazyInstanceNorm2d, LazyLinear, LeakyReLU, Linear,
                      LogSigmoid, LogSoftmax, LSTM, LSTMCell, MarginRankingLoss, MaxPool1d, MaxPool2d, MaxPool3d, Mish,
                      Model, Module, ModuleDict, ModuleList, MSELoss, MultiheadAttention, MultiLabelSoftMarginLoss,
                      NLLLoss, PairwiseDistance, Parameter, ParameterDict, ParameterList, PixelShuffle, PixelUnshuffle,
                      PoissonNLLLoss, PReLU, ReflectionPad1d, ReflectionPad2d, ReLU, ReLU6, ReplicationPad1d,
                      ReplicationPad2d, RMSNorm, RNN, RNNCell, SELU, Sequential, Sigmoid, SiLU, SmoothL1Loss,
                      SoftMarginLoss, Softmax, Softmax2d, Softmin, Softplus, Softshrink, Softsign, SyncBatchNorm, Tanh,
                      Tanhshrink, Threshold, Transformer, TransformerDecoder, TransformerDecoderLayer,
                      TransformerEncoder, TransformerEncoderLayer, TripletMarginLoss, Unflatten, Upsample,
                      UpsamplingBilinear2d, UpsamplingNearest2d, ZeroPad1d, ZeroPad2d)
from .program import Program, compile


def __getattr__(name):
    from .graph import missing
    raise missing(__name__, name)
