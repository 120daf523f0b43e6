"""What the SDK tests share: the real service on a real port (uvicorn in a thread), a handle to
check what it stored, and a fault-injecting httpx transport. The fixtures live in
`tests/conftest.py` (`service`, `start_service`) and `tests/sdk/conftest.py` (the group-tuned one).
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import httpx
import uvicorn
from sqlalchemy import text

from coordinator.app import create_app
from sdk import (
    Producer,
)
from tests.support.services import Backend, empty_tables, free_port, make_settings


class LiveService:
    """The coordinator app served by uvicorn on 127.0.0.1 in a background thread, lifespan (and
    so the timeout sweeper) included."""

    def __init__(self, store: Backend, **settings: Any) -> None:
        self.store = store
        self.app = create_app(make_settings(store, **settings))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(
            self.app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="on"
        )
        self.server = uvicorn.Server(config)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._serve, name=f"uvicorn-{store.backend}")

    def _serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(self.server.serve())

    def start(self) -> LiveService:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.01)
        return self

    def run(self, coro: Any) -> Any:
        """Run a coroutine on the server's loop (its database engine lives there)."""
        future: Future[Any] = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return future.result(timeout=60)

    def empty(self) -> None:
        self.run(empty_tables(self.app.state.db))

    def execute(self, sql: str) -> None:
        """Change the store behind the service's back (to simulate expiry, say)."""

        async def go() -> None:
            async with self.app.state.db.write() as session:
                await session.execute(text(sql))

        self.run(go())

    def stop(self) -> None:
        self.server.should_exit = True  # the lifespan's shutdown disposes of the engine
        self.thread.join(timeout=30)
        self.loop.close()


class Coordinator:
    """A test's handle on the live service: plain HTTP calls that check their answers."""

    def __init__(self, live: LiveService) -> None:
        self.live = live
        self.url = live.url
        self.backend = live.store.backend
        self.http = httpx.Client(base_url=live.url, timeout=30)

    def __enter__(self) -> Coordinator:
        return self

    def __exit__(self, *_: object) -> None:
        self.http.close()

    def create_topic(self, name: str, partitions: int = 1) -> None:
        response = self.http.post("/v1/topics", json={"name": name, "partitions": partitions})
        assert response.status_code == 201, response.text

    def high_watermark(self, topic: str, partition: int = 0) -> int:
        response = self.http.get(f"/v1/topics/{topic}")
        hw: int = response.json()["partitions"][partition]["high_watermark"]
        return hw

    def read(
        self, topic: str, partition: int = 0, isolation_level: str = "read_committed"
    ) -> list[dict[str, Any]]:
        """Every record of a partition, as the API returns them (utf8 text)."""
        records: list[dict[str, Any]] = []
        offset = 0
        while True:
            response = self.http.get(
                f"/v1/topics/{topic}/partitions/{partition}/records",
                params={
                    "offset": offset,
                    "max_records": 10_000,
                    "isolation_level": isolation_level,
                },
            )
            assert response.status_code == 200, response.text
            page = response.json()
            records.extend(page["records"])
            if page["next_offset"] == offset:
                return records
            offset = page["next_offset"]

    def values(self, topic: str, partitions: int = 1, **kw: str) -> dict[int, list[str]]:
        return {p: [r["value"] for r in self.read(topic, p, **kw)] for p in range(partitions)}

    def all_values(self, topic: str, partitions: int = 1, **kw: str) -> list[str]:
        return [v for values in self.values(topic, partitions, **kw).values() for v in values]


# -- faults ----------------------------------------------------------------------------------------


@dataclass
class Faults:
    """Probabilities (0..1) of each fault per request, and which requests they may hit."""

    drop_response: float = 0.0  # forward, let the service handle it, then lose the answer
    delay: float = 0.0  # hold the request 1..20 ms before forwarding it
    duplicate: float = 0.0  # send the same request twice
    reorder: float = 0.0  # hold the request until the next one overtakes it (or 30 ms pass)
    refuse: float = 0.0  # fail to connect: the request never reaches the service
    hold: float = 0.0  # seconds every request waits before it is forwarded
    only: Callable[[httpx.Request], bool] = field(default=lambda request: True)
    # Faults that surely hit the first request `certain_on` accepts (besides the random ones), so
    # a test that asserts a fault happened does not depend on how many requests timing made.
    certain: tuple[str, ...] = ()
    certain_on: Callable[[httpx.Request], bool] = field(default=lambda request: True)


class FaultyTransport(httpx.BaseTransport):
    """An httpx transport over a real one that injects faults, with seeded randomness so a
    failing run can be replayed. Counts what it did, per kind of fault."""

    def __init__(self, faults: Faults, seed: int) -> None:
        self.inner = httpx.HTTPTransport()
        self.faults = faults
        self.rng = random.Random(seed)
        self.lock = threading.Lock()
        self.held: threading.Event | None = None
        self.injected = dict.fromkeys(("drop_response", "delay", "duplicate", "reorder"), 0)
        self.injected["refuse"] = 0
        self.sent: list[httpx.Request] = []
        self.certain_claimed = False
        self.concurrent: dict[str, int] = {}  # requests under way now, per path
        self.most_concurrent: dict[str, int] = {}  # the most ever under way at once, per path

    def _roll(self, name: str, forced: frozenset[str] = frozenset()) -> bool:
        with self.lock:
            hit = self.rng.random() < getattr(self.faults, name) or name in forced
            if hit:
                self.injected[name] += 1
            return hit

    def _forward(self, request: httpx.Request) -> httpx.Response:
        copy = httpx.Request(
            request.method, request.url, headers=request.headers, content=request.content
        )
        with self.lock:
            self.sent.append(copy)
        response = self.inner.handle_request(copy)
        response.read()
        return response

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        request.read()
        if not self.faults.only(request):
            return self._forward(request)
        path = request.url.path
        with self.lock:
            self.concurrent[path] = now = self.concurrent.get(path, 0) + 1
            self.most_concurrent[path] = max(now, self.most_concurrent.get(path, 0))
        try:
            return self._faulty(request)
        finally:
            with self.lock:
                self.concurrent[path] -= 1

    def _certain_for(self, request: httpx.Request) -> frozenset[str]:
        """The faults this request must suffer: `Faults.certain`, for the first request that
        `certain_on` accepts."""
        if not self.faults.certain or not self.faults.certain_on(request):
            return frozenset()
        with self.lock:
            if self.certain_claimed:
                return frozenset()
            self.certain_claimed = True
        return frozenset(self.faults.certain)

    def _faulty(self, request: httpx.Request) -> httpx.Response:
        forced = self._certain_for(request)
        if self._roll("refuse", forced):
            raise httpx.ConnectError("injected: connection refused")
        if self.faults.hold:
            time.sleep(self.faults.hold)
        # Let a request held back for reordering go after this one.
        with self.lock:
            overtaken, self.held = self.held, None
        if self._roll("reorder", forced):
            gate = threading.Event()
            with self.lock:
                if self.held is None:
                    self.held = gate
                    gate_owned = True
                else:
                    gate_owned = False
            if gate_owned:
                gate.wait(0.03)
                with self.lock:
                    if self.held is gate:
                        self.held = None
        if self._roll("delay", forced):
            with self.lock:
                pause = self.rng.uniform(0.001, 0.02)
            time.sleep(pause)
        response = self._forward(request)
        if overtaken is not None:
            overtaken.set()
        if self._roll("duplicate", forced):
            response = self._forward(request)
        if self._roll("drop_response", forced):
            raise httpx.ReadError("injected: the answer was lost after the service handled it")
        return response

    def close(self) -> None:
        self.inner.close()


class GatedTransport(httpx.BaseTransport):
    """An httpx transport that holds every request `held` accepts at a gate until `release()`
    (`arrived` says one is waiting there); other requests go straight through."""

    def __init__(self, held: Callable[[httpx.Request], bool]) -> None:
        self.inner = httpx.HTTPTransport()
        self.held = held
        self.arrived = threading.Event()
        self._gate = threading.Event()

    def release(self) -> None:
        self._gate.set()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if self.held(request):
            self.arrived.set()
            if not self._gate.wait(30):
                raise AssertionError("the test never released its gate")
        response = self.inner.handle_request(request)
        response.read()
        return response

    def close(self) -> None:
        self._gate.set()
        self.inner.close()


def is_produce(request: httpx.Request) -> bool:
    return request.method == "POST" and request.url.path.endswith("/records")


def is_end_txn(request: httpx.Request) -> bool:
    return request.method == "POST" and request.url.path.endswith("/end")


def wait_for(predicate: Callable[[], bool], timeout: float = 10.0, what: str = "") -> None:
    """Poll `predicate` until it holds (no fixed sleeps), failing after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or predicate}")
        time.sleep(0.005)


def once(predicate: Callable[[httpx.Request], bool]) -> Callable[[httpx.Request], bool]:
    """True for the first request `predicate` accepts, false for every other."""
    seen = threading.Event()

    def first(request: httpx.Request) -> bool:
        if seen.is_set() or not predicate(request):
            return False
        seen.set()
        return True

    return first


class Reports:
    """Delivery reports, collected as `on_delivery` callbacks."""

    def __init__(self) -> None:
        self.items: list[tuple[Any, Any]] = []

    def __call__(self, err: Any, msg: Any) -> None:
        self.items.append((err, msg))

    def errors(self) -> list[Any]:
        return [err for err, _ in self.items if err is not None]


def transactional(service: Coordinator, tid: str = "etl-0", **options: Any) -> Producer:
    producer = Producer(
        {"coordinator.url": service.url, "transactional.id": tid}, **{"linger_ms": 1, **options}
    )
    producer.init_transactions()
    return producer


def describe(service: Coordinator, tid: str) -> dict[str, Any]:
    response = service.http.get(f"/v1/transactions/{tid}")
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body
