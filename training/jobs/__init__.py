"""Training jobs, one module per task (models.tasks.TASKS names each by its module path)."""

from __future__ import annotations

import importlib
from typing import Any

from models.tasks import TASKS, Task, task_of_kind
from training.job import Job


def job_class(task: Task) -> type[Job[Any, Any, Any]]:
    """The training job of a task, from the task table's module path."""
    cls = importlib.import_module(task.job).JOB
    if not (isinstance(cls, type) and issubclass(cls, Job)) or cls.task != task.name:
        raise TypeError(f"{task.job}.JOB is not the training job of task {task.name!r}")
    return cls


def job_for_kind(kind: str) -> type[Job[Any, Any, Any]]:
    return job_class(task_of_kind(kind))


__all__ = ["TASKS", "job_class", "job_for_kind"]
