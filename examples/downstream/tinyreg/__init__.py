"""A small regression model trained with fasttrain."""
from .model import Regressor, fit

__all__ = ["Regressor", "fit"]
