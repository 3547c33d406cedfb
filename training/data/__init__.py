"""Loaders that turn interaction logs into chronological per-user sequences."""

from training.data.interactions import DataFormatError, Interactions, load_interactions
from training.data.sources import locate_ml100k

__all__ = ["DataFormatError", "Interactions", "load_interactions", "locate_ml100k"]
