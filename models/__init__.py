"""PyTorch modules and the conventions shared by training and serving."""

import models.tasks  # noqa: F401  (its rows fill MODEL_KINDS)
from models.kinds import MODEL_KINDS, build

__all__ = ["MODEL_KINDS", "build"]
