"""The service's OpenAPI schema, made true to what it answers.

FastAPI documents a 422 with its own validation body; this service answers every error, on every
path, as an RFC 9457 problem document (`coordinator.core.errors`). The schema says so: each
operation keeps its success answer and gets a `default` problem-document answer.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from coordinator.core.errors import PROBLEM_JSON

PROBLEM_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["type", "title", "status", "detail", "code", "retriable"],
    "properties": {
        "type": {"type": "string"},
        "title": {"type": "string"},
        "status": {"type": "integer", "minimum": 400, "maximum": 599},
        "detail": {"type": "string"},
        "code": {"type": "string"},
        "retriable": {"type": "boolean"},
    },
}


def install_openapi(app: FastAPI) -> None:
    """Declare every route's problem-document answers in the schema."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        schema = get_openapi(
            title=app.title, version=app.version, description=app.description, routes=app.routes
        )
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        components["Problem"] = PROBLEM_SCHEMA
        for name in ("HTTPValidationError", "ValidationError"):
            components.pop(name, None)
        problem = {
            "description": "An error, as an RFC 9457 problem document with the API's `code`.",
            "content": {PROBLEM_JSON: {"schema": {"$ref": "#/components/schemas/Problem"}}},
        }
        for operations in schema.get("paths", {}).values():
            for operation in operations.values():
                responses = operation.setdefault("responses", {})
                responses.pop("422", None)
                responses["default"] = problem
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]
