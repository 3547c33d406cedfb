"""Framework-free serving engine: loaded models, id mapping, ranking."""
