"""Loaders that turn logs into chronological per-user sequences."""

from training.data.interactions import Columns, Interactions, Share, load_interactions, with_items
from training.data.sources import locate_ml100k
from training.data.tables import DataFormatError

__all__ = ["Columns", "DataFormatError", "Interactions", "Share", "load_interactions", "locate_ml100k", "with_items"]
