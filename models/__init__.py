"""PyTorch modules and the conventions shared by training and serving."""

import models.tasks  # noqa: F401  (its rows fill the model registry)
from models.registry import REGISTRY, build

__all__ = ["REGISTRY", "build"]
