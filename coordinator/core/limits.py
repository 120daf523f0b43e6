"""A cap on request body size, enforced before the body is parsed.

Pure ASGI so an oversized body is refused without being read whole: a declared Content-Length
over the cap is refused at once; a chunked body is buffered only up to the cap.
"""

from __future__ import annotations

import re

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from coordinator.core.errors import CoordinatorError, RequestTooLarge, problem_response
from coordinator.core.metrics import set_error_code
from coordinator.log.errors import RecordListTooLarge

_PRODUCE_PATH = re.compile(r"^/v1/topics/[^/]+/partitions/[^/]+/records/?$")


class BodySizeLimit:
    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    def _refusal(self, scope: Scope) -> CoordinatorError:
        detail = f"the request body is larger than {self.max_bytes} bytes"
        error: CoordinatorError
        if scope["method"] == "POST" and _PRODUCE_PATH.match(scope["path"]):
            error = RecordListTooLarge(detail + "; send fewer records per batch")
        else:
            error = RequestTooLarge(detail)
        set_error_code(scope, error.code)
        return error

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_bytes:
            await problem_response(self._refusal(scope))(scope, receive, send)
            return
        chunks: list[bytes] = []
        total = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                # The client went away; let the app see the disconnect.
                await self.app(scope, _replay([message]), send)
                return
            chunk = message.get("body", b"")
            total += len(chunk)
            if total > self.max_bytes:
                await problem_response(self._refusal(scope))(scope, receive, send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        await self.app(scope, _replay([{"type": "http.request", "body": body}]), send)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


def _replay(messages: list[Message]) -> Receive:
    pending = list(messages)

    async def receive() -> Message:
        if pending:
            return pending.pop(0)
        # After the body, the app may wait for a disconnect (streaming responses); never comes.
        return {"type": "http.disconnect"}

    return receive
