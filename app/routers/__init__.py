"""The service's routers. The task table's routes register themselves when imported (app.routers.tasks)."""

from app.routers import next_location, recommend  # noqa: F401  (registration)
