"""fasttrain.nn: functional ops (``ft.nn.functional``, PyTorch's names) and the layers built on them."""
from . import functional
