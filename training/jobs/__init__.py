"""Training jobs, one module per task, each registering its row here (`register_job`): the job, a CLI
command of its own and the runs that train its default models. The task table (models.tasks) knows
nothing of them; a served or trained task without a job here fails loudly when it is asked for."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from models.tasks import TASKS, Task, task_of_kind
from training.job import Job


@dataclass(frozen=True)
class DefaultRun:
    """A model trained when the artifacts folder is empty (`python -m training defaults`)."""

    config: str  # run config, relative to the repository
    data_env: str  # environment variable naming the data; unset: the config's own data.path
    overrides: tuple[str, ...] = ()  # SECTION.KEY=VALUE, as --set takes them
    what: str = ""  # one line for the log


@dataclass(frozen=True)
class TaskJob:
    """A task's training side."""

    job: type[Job[Any, Any, Any]]
    command: str | None = None  # a CLI command of its own (`python -m training <command>`), run with `config`
    config: str | None = None  # that command's default run config, relative to the repository
    defaults: tuple[DefaultRun, ...] = ()

    @property
    def task(self) -> str:
        return self.job.task


JOBS: dict[str, TaskJob] = {}


def register_job(row: TaskJob) -> TaskJob:
    """Add a task's training side; its task must be in the task table."""
    if row.task not in TASKS:
        raise ValueError(f"job {row.job.__name__}: no task {row.task!r} in the task table")
    if row.task in JOBS:
        raise ValueError(f"task {row.task!r} has a job already")
    JOBS[row.task] = row
    return row


def job_row(task: Task) -> TaskJob:
    row = JOBS.get(task.name)
    if row is None:
        raise LookupError(f"task {task.name!r} has no registered training job")
    return row


def job_class(task: Task) -> type[Job[Any, Any, Any]]:
    """The training job of a task."""
    return job_row(task).job


def job_for_kind(kind: str) -> type[Job[Any, Any, Any]]:
    return job_class(task_of_kind(kind))


# The project's own jobs; each module registers itself when imported.
from training.jobs import copy, next_location, recommend, social  # noqa: E402,F401  (registration)

__all__ = ["JOBS", "DefaultRun", "TaskJob", "job_class", "job_for_kind", "job_row", "register_job"]
