"""The HTTP layer: one pooled `httpx.Client` per SDK client, bounded timeouts, the bearer token,
problem documents turned into typed errors, and retries with jittered backoff that only ever
repeat retriable answers and transport failures.
"""

from __future__ import annotations

import functools
import random
import ssl
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar
from urllib.parse import quote

import httpx
import orjson

from sdk import __version__
from sdk._config import ClientConfig
from sdk._errors import (
    IllegalStateError,
    KafkaError,
    KafkaException,
    KafkaTimeoutError,
    ServiceError,
    TransportError,
    error_for,
)

__all__ = ["RECORD_BATCH", "VERSION", "HttpClient", "api_path"]

VERSION = __version__  # the User-Agent's
# The HTTP API's media type of Kafka record batches, produced and fetched.
RECORD_BATCH = "application/vnd.kafka.record-batch"
T = TypeVar("T")


def api_path(*segments: str | int) -> str:
    """The path of an API call, `/v1/` and its segments, each quoted whole: transactional ids,
    group ids and effect keys may hold any character, `/` and `%` included. Every path the SDK
    (and the CLI, through `AdminClient.call_api`) sends is made here."""
    return "/v1/" + "/".join(quote(str(segment), safe="") for segment in segments)


def _retriable(error: KafkaException) -> bool:
    return error.retriable


class HttpClient:
    """Requests to the coordinator: `send` makes one attempt, `call` retries until a deadline."""

    def __init__(self, config: ClientConfig, *, max_connections: int = 4) -> None:
        self._request_timeout = config.request_timeout_ms / 1000
        self._api_timeout = config.default_api_timeout_ms / 1000
        self._backoff = config.retry_backoff_ms / 1000
        self._backoff_max = max(config.retry_backoff_max_ms, config.retry_backoff_ms) / 1000
        self._rng = random.Random()
        self._rng_lock = threading.Lock()
        headers = {
            "User-Agent": f"txn-coordinator-sdk/{VERSION} ({config.client_id})",
            "Accept": "application/json",
        }
        if config.coordinator_token:
            headers["Authorization"] = f"Bearer {config.coordinator_token}"
        https = config.coordinator_url.startswith("https://")
        self._client = httpx.Client(
            base_url=config.coordinator_url.rstrip("/"),
            headers=headers,
            timeout=httpx.Timeout(self._request_timeout, connect=min(self._request_timeout, 10.0)),
            limits=httpx.Limits(
                max_connections=max_connections, max_keepalive_connections=max_connections
            ),
            transport=config.transport,
            # Loading the CA bundle costs ~0.2 s per client: once per process, and only for https.
            verify=_tls_context() if https else False,
        )

    @property
    def closed(self) -> bool:
        return self._client.is_closed

    def close(self) -> None:
        self._client.close()

    def deadline(self, timeout: float | None) -> float:
        """The monotonic instant a call given `timeout` seconds (None: the default) must end."""
        return time.monotonic() + (self._api_timeout if timeout is None else max(timeout, 0.0))

    def backoff(self, attempt: int) -> float:
        """Seconds to wait before retry number `attempt` (0-based): exponential, ±20% jitter."""
        base = min(self._backoff_max, self._backoff * float(1 << min(attempt, 30)))
        with self._rng_lock:
            return base * self._rng.uniform(0.8, 1.2)

    def send(
        self,
        method: str,
        path: str,
        *,
        body: Mapping[str, Any] | bytes | None = None,
        params: Mapping[str, str | int] | None = None,
        timeout: float | None = None,
        content_type: str | None = None,
    ) -> Any:
        """One attempt. Returns the parsed JSON answer; raises `TransportError` when no answer
        came back (the request may have been applied), or the typed error of a problem document.
        `body` bytes go as they are, as `content_type` (default JSON)."""
        content = body if isinstance(body, bytes) or body is None else orjson.dumps(body)
        headers = None
        if content is not None:
            headers = {"Content-Type": content_type or "application/json"}
        response = self._exchange(method, path, content, params, headers, timeout)
        return orjson.loads(response.content) if response.content else None

    def call_binary(
        self,
        path: str,
        params: Mapping[str, str | int],
        accept: str,
        deadline: float | None = None,
    ) -> tuple[bytes, httpx.Headers]:
        """`fetch_binary`, retried as `call` retries."""
        return self._retrying(
            lambda remaining: self._binary(path, params, accept, remaining), "GET", path, deadline
        )

    def _binary(
        self, path: str, params: Mapping[str, str | int], accept: str, timeout: float | None
    ) -> tuple[bytes, httpx.Headers]:
        response = self._exchange("GET", path, None, params, {"Accept": accept}, timeout)
        return response.content, response.headers

    def fetch_binary(
        self, path: str, params: Mapping[str, str | int], accept: str
    ) -> tuple[bytes, httpx.Headers]:
        """One GET answered in `accept` (not JSON): its body and headers; raises as `send`."""
        return self._binary(path, params, accept, None)

    def _exchange(
        self,
        method: str,
        path: str,
        content: bytes | None,
        params: Mapping[str, str | int] | None,
        headers: dict[str, str] | None,
        timeout: float | None,
    ) -> httpx.Response:
        try:
            response = self._client.request(
                method,
                path,
                content=content,
                params=params,
                headers=headers,
                timeout=self._request_timeout if timeout is None else timeout,
            )
        except httpx.RequestError as exc:
            raise TransportError(f"{method} {path}: {type(exc).__name__}: {exc}") from exc
        except RuntimeError as exc:
            if self._client.is_closed:
                raise IllegalStateError("the client is closed") from exc
            raise TransportError(f"{method} {path}: {exc!r}") from exc
        if response.is_success:
            return response
        raise _problem(method, path, response)

    def call(
        self,
        method: str,
        path: str,
        *,
        body: Mapping[str, Any] | None = None,
        params: Mapping[str, str | int] | None = None,
        deadline: float | None = None,
        retry_if: Callable[[KafkaException], bool] = _retriable,
    ) -> Any:
        """`send`, repeated after retriable errors and transport failures (those `retry_if`
        says) until `deadline` (monotonic; None: `default.api.timeout.ms` from now), then
        `KafkaTimeoutError`."""
        content = orjson.dumps(body) if body is not None else None
        return self._retrying(
            lambda timeout: self.send(method, path, body=content, params=params, timeout=timeout),
            method,
            path,
            deadline,
            retry_if,
        )

    def _retrying(
        self,
        attempt_once: Callable[[float], T],
        method: str,
        path: str,
        deadline: float | None,
        retry_if: Callable[[KafkaException], bool] = _retriable,
    ) -> T:
        """`attempt_once(timeout)`, repeated after the errors `retry_if` says until `deadline`."""
        if deadline is None:
            deadline = self.deadline(None)
        attempt = 0
        while True:
            remaining = deadline - time.monotonic()
            try:
                return attempt_once(max(0.001, min(self._request_timeout, remaining)))
            except KafkaException as exc:
                if not retry_if(exc):
                    raise
                pause = self.backoff(attempt)
                attempt += 1
                if time.monotonic() + pause >= deadline:
                    raise KafkaTimeoutError(
                        f"{method} {path}: no success after {attempt} attempt(s); last: {exc}"
                    ) from exc
                time.sleep(pause)


@functools.cache
def _tls_context() -> ssl.SSLContext:
    return httpx.create_ssl_context()


def _problem(method: str, path: str, response: httpx.Response) -> KafkaException:
    try:
        doc = orjson.loads(response.content)
    except orjson.JSONDecodeError:
        doc = None
    if isinstance(doc, dict) and isinstance(doc.get("code"), str):
        retriable = doc.get("retriable")
        return error_for(
            doc["code"],
            str(doc.get("detail") or doc.get("title") or doc["code"]),
            response.status_code,
            **({"retriable": retriable} if isinstance(retriable, bool) else {}),
        )
    text = response.text[:200]
    if response.status_code >= 500:
        # Not the service's own answer (a proxy's 502, say): the request may have been applied.
        return TransportError(f"{method} {path}: HTTP {response.status_code}: {text}")
    return ServiceError(
        f"{method} {path}: HTTP {response.status_code} without a problem document: {text}",
        code=KafkaError._BAD_MSG,
        status=response.status_code,
    )
