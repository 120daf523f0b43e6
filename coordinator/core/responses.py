"""Fast JSON responses: handlers return these directly, so FastAPI neither re-validates nor
re-encodes what the service already built (fetch answers can hold thousands of records)."""

from __future__ import annotations

from typing import Any

import orjson
from pydantic import BaseModel
from starlette.responses import Response


def json_response(content: BaseModel | dict[str, Any], status_code: int = 200) -> Response:
    body = (
        content.model_dump_json().encode()
        if isinstance(content, BaseModel)
        else orjson.dumps(content)
    )
    return Response(body, status_code, media_type="application/json")
