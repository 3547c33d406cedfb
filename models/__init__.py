"""PyTorch modules and the conventions shared by training and serving.

Importing the package imports nothing else: the task table (models.tasks) and its models load where
they are used, so a process that only stores events, checks settings or starts workers never loads torch
(models/kinds.py, models/queries.py)."""
