"""torch.nn.parameter's name for nn.Parameter (torchvision's maxvit writes nn.parameter.Parameter)."""
from .modules import Parameter

__all__ = ["Parameter"]
