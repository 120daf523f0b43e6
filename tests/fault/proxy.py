"""An HTTP fault proxy between the SDK and the service processes: it forwards each request to a
live service and, with seeded probabilities, drops it, delays it, sends it twice or loses the
answer.

HTTP/1.1 with keep-alive, enough for httpx clients (Content-Length bodies, no chunking). It runs
its own asyncio loop in a thread of the runner. A request is never cancelled because its client
gave up: a delayed request still reaches the service after the client timed out and retried,
which is the late, stale request that epochs and sequence numbers must neutralise.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from http import HTTPStatus

import httpx

from tests.support.services import free_port

FAULT_KINDS = ("drop-request", "drop-response", "delay", "duplicate-request")

# Headers that describe one connection, not the message; never forwarded either way.
_HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "proxy-connection",
    "transfer-encoding",
    "te",
    "trailer",
    "upgrade",
    "content-length",
    "host",
    # httpx decodes compressed answers; the client gets them plain, so neither side may claim one.
    "accept-encoding",
    "content-encoding",
}
_MAX_LINE = 64 * 1024
_MAX_BODY = 16 * 1024 * 1024


@dataclass(frozen=True)
class ProxyFaults:
    """The probability (0..1) of each fault per request, and how long a delay lasts (seconds)."""

    drop_request: float = 0.0  # close the connection before forwarding: the service never sees it
    drop_response: float = 0.0  # forward, let the service handle it, then close without answering
    delay: float = 0.0  # hold the request before forwarding it
    duplicate_request: float = 0.0  # forward it twice, answer with one of the two answers
    delay_min: float = 0.05
    delay_max: float = 2.0

    def probability(self, kind: str) -> float:
        value: float = getattr(self, kind.replace("-", "_"))
        return value


@dataclass
class _Request:
    method: str
    target: str
    headers: list[tuple[str, str]]
    body: bytes


class _Dropped(Exception):
    """The connection is to be closed without an answer."""


class FaultProxy:
    """Listens on 127.0.0.1:`port` and forwards to `upstreams` (base URLs), skipping those marked
    down and, when a connection is refused, trying another. `counts` says how many faults of
    each kind (FAULT_KINDS) were injected."""

    def __init__(self, upstreams: Sequence[str], faults: ProxyFaults, seed: int) -> None:
        self.port = free_port()
        self.faults = faults
        self.counts = dict.fromkeys(FAULT_KINDS, 0)
        self.forwarded = 0
        self._upstreams = list(upstreams)
        self._up = [True] * len(upstreams)
        self._enabled = True
        self._lock = threading.Lock()
        self._rng = random.Random(seed)  # used on the loop's thread only
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="fault-proxy", daemon=True)
        self._started = threading.Event()
        self._startup_error: BaseException | None = None
        self._server: asyncio.Server | None = None
        self._client: httpx.AsyncClient | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._inflight = 0
        self._idle: asyncio.Event | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # -- control, from other threads ---------------------------------------------------------------

    def start(self) -> FaultProxy:
        self._thread.start()
        if not self._started.wait(30):
            raise RuntimeError("the fault proxy did not start")
        if self._startup_error is not None:
            raise RuntimeError("the fault proxy did not start") from self._startup_error
        return self

    def set_up(self, index: int, up: bool) -> None:
        """Mark a service down (killed) or up again (restarted)."""
        with self._lock:
            self._up[index] = up

    def is_up(self, index: int) -> bool:
        with self._lock:
            return self._up[index]

    def set_upstream(self, index: int, url: str) -> None:
        with self._lock:
            self._upstreams[index] = url

    def disable_faults(self) -> None:
        with self._lock:
            self._enabled = False

    def stop(self, timeout: float = 60.0) -> None:
        """Stop accepting, let every request under way finish (a delayed one still reaches its
        service), then close every connection. After this no request of this proxy is in flight."""
        if not self._thread.is_alive():
            return
        future = asyncio.run_coroutine_threadsafe(self._shutdown(timeout), self._loop)
        try:
            future.result(timeout + 10)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(30)
            if not self._thread.is_alive():
                self._loop.close()

    # -- the loop ----------------------------------------------------------------------------------

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._open())
        except BaseException as exc:
            self._startup_error = exc
            self._started.set()
            return
        self._started.set()
        self._loop.run_forever()

    async def _open(self) -> None:
        self._idle = asyncio.Event()
        self._idle.set()
        self._client = httpx.AsyncClient(
            timeout=httpx.Timeout(30.0, connect=5.0),
            limits=httpx.Limits(max_connections=64, max_keepalive_connections=32),
        )
        self._server = await asyncio.start_server(
            self._serve, "127.0.0.1", self.port, limit=_MAX_LINE
        )

    async def _shutdown(self, wait_s: float) -> None:
        assert self._server is not None and self._idle is not None and self._client is not None
        self.disable_faults()
        self._server.close()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), wait_s)
        for writer in list(self._writers):
            writer.close()
        await self._server.wait_closed()
        await self._client.aclose()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            while True:
                request = await _read_request(reader)
                if request is None:
                    return
                self._begin()
                try:
                    answer = await self._handle(request)
                except _Dropped:
                    return
                finally:
                    self._end()
                writer.write(answer)
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            return
        except ValueError:  # not a request this proxy understands
            return
        finally:
            self._writers.discard(writer)
            writer.close()

    def _begin(self) -> None:
        assert self._idle is not None
        self._inflight += 1
        self._idle.clear()

    def _end(self) -> None:
        assert self._idle is not None
        self._inflight -= 1
        if not self._inflight:
            self._idle.set()

    def _roll(self, kind: str) -> bool:
        with self._lock:
            if not self._enabled:
                return False
            hit = self._rng.random() < self.faults.probability(kind)
            if hit:
                self.counts[kind] += 1
            return hit

    async def _handle(self, request: _Request) -> bytes:
        if self._roll("drop-request"):
            raise _Dropped
        if self._roll("delay"):
            with self._lock:
                pause = self._rng.uniform(self.faults.delay_min, self.faults.delay_max)
            await asyncio.sleep(pause)
        answer = await self._forward(request)
        if self._roll("duplicate-request"):
            again = await self._forward(request)
            with self._lock:
                take_second = self._rng.random() < 0.5
            if take_second:
                answer = again
        if self._roll("drop-response"):
            raise _Dropped
        return answer

    def _choose(self, tried: set[int]) -> int | None:
        with self._lock:
            live = [i for i, up in enumerate(self._up) if up and i not in tried]
            if not live:
                live = [i for i in range(len(self._up)) if i not in tried]
            return self._rng.choice(live) if live else None

    async def _forward(self, request: _Request) -> bytes:
        """One attempt at the service; a refused connection (nothing sent) tries another one.
        Any other failure is a 502 without a problem document: the client cannot know whether
        the service applied the request."""
        assert self._client is not None
        tried: set[int] = set()
        while (index := self._choose(tried)) is not None:
            tried.add(index)
            with self._lock:
                base = self._upstreams[index]
            headers = [(n, v) for n, v in request.headers if n.lower() not in _HOP_BY_HOP]
            try:
                response = await self._client.request(
                    request.method, base + request.target, headers=headers, content=request.body
                )
            except httpx.ConnectError:
                continue
            except httpx.HTTPError as exc:
                return _answer(502, f"fault proxy: {type(exc).__name__}".encode())
            self.forwarded += 1
            return _answer(
                response.status_code,
                response.content,
                [(n, v) for n, v in response.headers.items() if n.lower() not in _HOP_BY_HOP],
            )
        return _answer(502, b"fault proxy: no service answers")


async def _read_request(reader: asyncio.StreamReader) -> _Request | None:
    """The next request on a connection, or None at its end."""
    line = await reader.readline()
    if not line.strip():
        return None
    method, target, _ = line.decode("latin-1").rstrip("\r\n").split(" ", 2)
    headers: list[tuple[str, str]] = []
    while True:
        raw = await reader.readline()
        if raw in (b"\r\n", b"\n", b""):
            break
        name, _, value = raw.decode("latin-1").partition(":")
        headers.append((name.strip(), value.strip()))
    fields = {n.lower(): v for n, v in headers}
    if "transfer-encoding" in fields:
        raise ValueError("chunked requests are not supported")
    length = int(fields.get("content-length", "0"))
    if not 0 <= length <= _MAX_BODY:
        raise ValueError(f"content-length {length}")
    body = await reader.readexactly(length) if length else b""
    return _Request(method, target, headers, body)


def _answer(status: int, body: bytes, headers: Sequence[tuple[str, str]] = ()) -> bytes:
    try:
        reason = HTTPStatus(status).phrase
    except ValueError:
        reason = ""
    lines = [f"HTTP/1.1 {status} {reason}"]
    lines.extend(f"{name}: {value}" for name, value in headers)
    if not any(name.lower() == "content-type" for name, _ in headers):
        lines.append("content-type: text/plain")
    lines.append(f"content-length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body
