"""OpenAPI pieces the routers share: the request body of a route parsed by a dependency, and the
documented error responses."""

from __future__ import annotations

from typing import Any

from app.schemas import ErrorResponse


def body_doc(schema: str) -> dict[str, Any]:
    """openapi_extra for a route whose JSON body a dependency parses (see app.deps.parse_body)."""
    return {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{schema}"}}},
        }
    }


def errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    return {s: {"model": ErrorResponse} for s in statuses}
