"""PyTorch modules and the conventions shared by training and serving.

Importing the package imports nothing else: the program that builds or loads models imports the task
table (models.tasks), which fills the model kinds (models/kinds.py); a process that only stores events,
checks settings or starts workers never loads torch (models/queries.py)."""
