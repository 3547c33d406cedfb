"""PyTorch modules and the conventions shared by training and serving."""

from models.registry import REGISTRY, build

__all__ = ["REGISTRY", "build"]
