"""Offline training jobs: data loading, splits, the training loop, evaluation, export."""
