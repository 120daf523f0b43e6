"""The service's OpenAPI schema, made true to what it answers (to be built)."""

from __future__ import annotations

from fastapi import FastAPI


def install_openapi(app: FastAPI) -> None:
    """Declare every route's problem-document answers in the schema."""
