"""The FastAPI service: loads artifacts and answers /recommend."""
