"""The lossy network: an HTTP transport that loses the answers to produce requests the service
handled, so the producer retries and the service recognises each retry."""

from __future__ import annotations

import random
import threading

import httpx

# -- the lossy network ---------------------------------------------------------------------------


def is_produce(request: httpx.Request) -> bool:
    return request.method == "POST" and request.url.path.endswith("/records")


class DroppingTransport(httpx.BaseTransport):
    """Forwards every request; loses the answer to a produce request the service stored with
    probability `drop` (seeded, so a run can be replayed). Counts produce requests, answers
    lost, and answers that said `duplicate: true` (a retry the service recognised)."""

    def __init__(self, drop: float, seed: int, inner: httpx.BaseTransport | None = None) -> None:
        self.inner = inner or httpx.HTTPTransport()
        self.drop = drop
        self.rng = random.Random(seed)
        self.lock = threading.Lock()
        self.requests = 0
        self.dropped = 0
        self.duplicates = 0
        # Transport errors the producer reported for the answers lost (its error_cb).
        self.errors_reported = 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = self.inner.handle_request(request)
        if not is_produce(request):
            return response
        response.read()
        written = response.status_code == 200
        duplicate = written and bool(response.json().get("duplicate"))
        with self.lock:
            self.requests += 1
            self.duplicates += duplicate
            # Only answers to batches the service stored: each loss is then a retry the service
            # must recognise, so `duplicates` ends equal to `dropped`.
            lose = written and self.rng.random() < self.drop
            self.dropped += lose
        if lose:
            response.close()
            raise httpx.ReadError("demo: the answer was lost after the service handled it")
        return response

    def close(self) -> None:
        self.inner.close()
