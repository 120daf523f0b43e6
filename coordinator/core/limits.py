"""Caps and framing rules an HTTP request meets before any route sees it.

Pure ASGI so an oversized body is refused without being read whole: a declared Content-Length
over the cap is refused at once; a chunked body is buffered only up to the cap. A transfer coding
other than chunked is 501 (RFC 9112), and a path or query whose percent-escapes are not UTF-8 is
400 (decoded leniently, two different ids would become one). The header block is capped in the
HTTP parser itself (`BoundedHttpToolsProtocol`), before the headers are held in memory.
"""

from __future__ import annotations

import asyncio
import collections
import re
from typing import Any
from urllib.parse import unquote_to_bytes

import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from coordinator.core.errors import (
    CoordinatorError,
    NotImplementedCoding,
    NotUtf8,
    RecordListTooLarge,
    RequestTooLarge,
    problem_response,
)
from coordinator.core.memory import Overloaded, request_memory
from coordinator.core.metrics import record_refusal, set_error_code

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
        refusal = _framing_refusal(scope)
        if refusal is not None:
            set_error_code(scope, refusal.code)
            await problem_response(refusal)(scope, receive, send)
            return
        declared, held = _body_size(scope, self.max_bytes)
        if declared is not None and declared > self.max_bytes:
            await problem_response(self._refusal(scope))(scope, receive, send)
            return
        try:
            async with request_memory().reserve(held):
                await self._buffered(scope, receive, send)
        except Overloaded as exc:
            set_error_code(scope, exc.code)
            await problem_response(exc)(scope, receive, send)

    async def _buffered(self, scope: Scope, receive: Receive, send: Send) -> None:
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


def _framing_refusal(scope: Scope) -> CoordinatorError | None:
    for name, value in scope["headers"]:
        if name == b"transfer-encoding":
            codings = [c.strip() for c in value.lower().split(b",") if c.strip()]
            if codings != [b"chunked"]:
                return NotImplementedCoding(
                    f"transfer coding {value.decode('latin-1')!r} is not implemented; "
                    "send the body as is or chunked"
                )
    raw_path: bytes = scope.get("raw_path") or b""
    query: bytes = scope.get("query_string", b"")
    for part, what in ((raw_path, "path"), (query.replace(b"+", b" "), "query")):
        try:
            unquote_to_bytes(part).decode("utf-8")
        except UnicodeDecodeError:
            shown = part[:200].decode("ascii", "backslashreplace")
            return NotUtf8(f"the {what} {shown} is not UTF-8 once percent-decoded")
    return None


# What a JSON body holds once decoded (dicts, strings, the request's models), per byte of it:
# measured 11 for a produce of 75,000 small records (8.1 MB decoded to about 90 MB).
JSON_DECODED_PER_BYTE = 12


_BINARY_MEDIA = {b"application/vnd.kafka.record-batch", b"application/octet-stream"}


def _body_size(scope: Scope, max_bytes: int) -> tuple[int | None, int]:
    """(the declared Content-Length, what the body will hold in memory), from one look at the
    headers. The body is held from its first byte until the request is answered, so it is
    reserved first (all of the cap for a chunked body, whose length is not told); a body other
    than record batches is JSON (or refused), held decoded too, as Python objects many times
    its size."""
    declared: int | None = None
    chunked = binary = False
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                declared = int(value)
            except ValueError:
                declared = None
        elif name == b"transfer-encoding":
            chunked = True
        elif name == b"content-type":
            binary = value.split(b";", 1)[0].strip().lower() in _BINARY_MEDIA
    size = declared if declared is not None else (max_bytes if chunked else 0)
    return declared, size if binary else size * JSON_DECODED_PER_BYTE


def _replay(messages: list[Message]) -> Receive:
    pending = list(messages)

    async def receive() -> Message:
        if pending:
            return pending.pop(0)
        # After the body, the app may wait for a disconnect (streaming responses); never comes.
        return {"type": "http.disconnect"}

    return receive


# Open HTTP connections of this process by client address (COORDINATOR_MAX_CONNECTIONS_PER_IP).
_HTTP_CONNECTIONS: collections.Counter[str] = collections.Counter()


def _problem_bytes(status: int, reason: str, title: str, code: str, detail: str) -> bytes:
    body = orjson.dumps(
        {
            "type": f"urn:coordinator:error:{code.lower()}",
            "title": title,
            "status": status,
            "detail": detail,
            "code": code,
            "retriable": status == 429,
        }
    )
    return (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/problem+json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    ).encode() + body


class BoundedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the limits a connection meets before the app sees it:
    - the URL and header block are capped at `max_header_bytes` (431, and closed) before the
      headers are held (uvicorn's own parser keeps every header it is sent);
    - one client address holds at most `max_connections_per_ip` connections (429, and closed);
    - a connection silent for `connections_max_idle_ms` while no request is being answered is
      closed (uvicorn closes idle keep-alive connections, not ones that never finish a request).
    The limits come from the settings of the process, so `serve --workers N` applies them in
    every worker; each refusal is counted in `coordinator_connection_refusals`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        from coordinator.core.settings import get_settings

        super().__init__(*args, **kwargs)
        settings = get_settings()
        self._max_header_bytes = settings.max_header_bytes
        self._max_connections = settings.max_connections_per_ip
        self._idle_s = settings.connections_max_idle_ms / 1000
        self._header_bytes = 0
        self._headers_too_large = False
        # Bytes received since the current request began, while its headers are not complete.
        self._head_received = 0
        self._in_head = True
        self._address = ""
        self._idle: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._address = self.client[0] if self.client else ""
        _HTTP_CONNECTIONS[self._address] += 1
        if _HTTP_CONNECTIONS[self._address] > self._max_connections:
            record_refusal("http", "connection_limit")
            transport.write(
                _problem_bytes(
                    429,
                    "Too Many Requests",
                    "Too many connections",
                    "THROTTLING_QUOTA_EXCEEDED",
                    f"{self._max_connections} connections from this address already "
                    "(COORDINATOR_MAX_CONNECTIONS_PER_IP)",
                )
            )
            transport.close()
            return
        self._arm_idle()

    def connection_lost(self, exc: Exception | None) -> None:
        _HTTP_CONNECTIONS[self._address] -= 1
        if _HTTP_CONNECTIONS[self._address] <= 0:
            del _HTTP_CONNECTIONS[self._address]
        if self._idle is not None:
            self._idle.cancel()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        self._arm_idle()
        if self._in_head:
            # httptools holds a header name or value whole before `on_header` can count it, so
            # a peer sending one endless header would be held until it stops. Refused instead
            # once the bytes received before the headers end pass the cap (checked before this
            # read is added: a read that completes the headers may carry body bytes too), so
            # what is held is the cap plus one read.
            if self._head_received > self._max_header_bytes:
                self._headers_too_large = True
                self.send_400_response("header block too large")
                return
            self._head_received += len(data)
        super().data_received(data)

    def _arm_idle(self) -> None:
        if self._idle is not None:
            self._idle.cancel()
        self._idle = asyncio.get_running_loop().call_later(self._idle_s, self._idle_out)

    def _idle_out(self) -> None:
        if self.cycle is not None and not self.cycle.response_complete:
            self._arm_idle()  # an answer is being made (a long poll): not idle
            return
        record_refusal("http", "idle")
        self.transport.close()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._header_bytes = 0
        self._head_received = 0
        self._in_head = True

    def on_headers_complete(self) -> None:
        self._in_head = False
        super().on_headers_complete()

    def on_url(self, url: bytes) -> None:
        self._count(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count(len(name) + len(value) + 4)
        super().on_header(name, value)

    def _count(self, size: int) -> None:
        self._header_bytes += size
        if self._header_bytes > self._max_header_bytes:
            self._headers_too_large = True
            # The parser stops at a callback's error; uvicorn then answers through
            # send_400_response, which says 431 here.
            raise ValueError("header block too large")

    def send_400_response(self, msg: str) -> None:
        if not self._headers_too_large:
            super().send_400_response(msg)
            return
        record_refusal("http", "headers_too_large")
        self.transport.write(
            _problem_bytes(
                431,
                "Request Header Fields Too Large",
                "Request header fields too large",
                "INVALID_REQUEST",
                f"the request line and headers exceed {self._max_header_bytes} bytes "
                "(COORDINATOR_MAX_HEADER_BYTES)",
            )
        )
        self.transport.close()
