"""Helpers shared by the tests: store URLs, empty databases, service processes."""

from __future__ import annotations

import asyncio
import contextlib
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import select, text

from coordinator.core.settings import Settings
from coordinator.launcher import Launched, free_port
from coordinator.models import Base
from coordinator.store import Store

POSTGRES_ENV = "COORDINATOR_TEST_POSTGRES_URL"


def postgres_base_url() -> str:
    url = os.environ.get(POSTGRES_ENV)
    if not url:
        raise RuntimeError(
            f"{POSTGRES_ENV} is not set: every store test runs on Postgres too. Point it at a "
            "server, e.g. postgresql://postgres@127.0.0.1:5432/test"
        )
    return url


def _with_database(url: str, name: str) -> str:
    base, _, _ = url.rpartition("/")
    return f"{base}/{name}"


async def _admin(url: str, sql: str) -> None:
    import asyncpg

    plain = url.replace("postgresql+asyncpg://", "postgresql://")
    connection = await asyncpg.connect(plain)
    try:
        await connection.execute(sql)
    finally:
        await connection.close()


def create_postgres_database() -> str:
    """A new empty database on the test server; returns its URL."""
    base = postgres_base_url()
    name = f"coordinator_test_{uuid.uuid4().hex[:12]}"
    asyncio.run(_admin(base, f'CREATE DATABASE "{name}"'))
    return _with_database(base, name)


def drop_postgres_database(url: str) -> None:
    base = postgres_base_url()
    name = url.rpartition("/")[2]
    asyncio.run(_admin(base, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


def terminate_backends(database: str) -> None:
    """End every server process of the test server's `database` but ours, as a primary's fast
    shutdown does (its clients read SQLSTATE 57P01)."""
    asyncio.run(
        _admin(
            postgres_base_url(),
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            f"WHERE datname = '{database}' AND pid <> pg_backend_pid()",
        )
    )


class ServiceProcess(Launched):
    """`coordinator serve` in a child process, as an operator would run it (the project's one
    launcher, `coordinator.launcher`), with `env` over the tests' environment."""

    def __init__(
        self, database_url: str, workdir: Path, *, ca: Path | None = None, **env: str
    ) -> None:
        """`ca`: the service serves HTTPS (its env names the certificate), verified with this
        CA; `client_cert` in `verify` below adds the client's certificate where mTLS asks."""
        super().__init__(workdir, database_url=database_url, env=env)
        self.ca = ca
        self.client_cert: tuple[str, str] | None = None

    @property
    def url(self) -> str:
        scheme = "https" if self.ca is not None else "http"
        return f"{scheme}://127.0.0.1:{self.port}"

    def client(self, **kwargs: Any) -> httpx.Client:
        """An HTTP client for this service (trusting its CA, with the client certificate)."""
        if self.ca is None:
            return super().client(**kwargs)
        import ssl

        context = ssl.create_default_context(cafile=str(self.ca))
        if self.client_cert is not None:
            context.load_cert_chain(*self.client_cert)
        return httpx.Client(base_url=self.url, verify=context, **kwargs)

    def start(self, timeout: float = 60.0) -> ServiceProcess:
        super().start(timeout)
        return self

    def __enter__(self) -> ServiceProcess:
        return self.start()


def serve_on_fresh_store(
    backend: str, root: Path, name: str, **env: str
) -> Iterator[ServiceProcess]:
    """A `coordinator serve` on a fresh store (`backend` "sqlite" or "postgres"), for a module's
    tests to share; stopped, and its database dropped, afterwards; its log must hold no
    traceback."""
    postgres = backend == "postgres"
    url = create_postgres_database() if postgres else f"sqlite:///{root / f'{name}.db'}"
    running = ServiceProcess(url, root, **env)
    try:
        yield running.start()
    finally:
        running.stop()
        if postgres:
            drop_postgres_database(url)
    assert "Traceback" not in running.log.read_text(errors="replace")


class TcpProxy:
    """A TCP forwarder in a thread of its own, between a service and its store, that a test
    can cut (every connection closed, new ones refused) and restore: a store outage without
    restarting the store the other tests share. With `delay_s`, every byte arrives that much
    later in each direction, in order (a link to another zone: a standby's replication)."""

    def __init__(self, upstream_host: str, upstream_port: int, delay_s: float = 0.0) -> None:
        import threading

        self.upstream = (upstream_host, upstream_port)
        self.delay_s = delay_s
        self.port = free_port()
        self._up = True
        self._loop = asyncio.new_event_loop()
        self._writers: set[asyncio.StreamWriter] = set()
        self._server: asyncio.Server | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="tcp-proxy")

    def start(self) -> TcpProxy:
        self._thread.start()
        self._ready.wait(10)
        return self

    def cut(self) -> None:
        asyncio.run_coroutine_threadsafe(self._set(False), self._loop).result(10)

    def restore(self) -> None:
        asyncio.run_coroutine_threadsafe(self._set(True), self._loop).result(10)

    def stop(self) -> None:
        """Close every connection and the listening socket, then the loop: nothing is left for
        the garbage collector to find unclosed (a ResourceWarning in some later test)."""
        asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    async def _shutdown(self) -> None:
        self._up = False
        if self._server is not None:
            self._server.close()
        writers = list(self._writers)
        self._writers.clear()
        for writer in writers:
            writer.close()
        for writer in writers:
            with contextlib.suppress(ConnectionError, OSError):
                await writer.wait_closed()
        if self._server is not None:
            await self._server.wait_closed()
        # Let the pipes see their ends and finish.
        pending = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        if pending:
            await asyncio.wait(pending, timeout=5)

    async def _set(self, up: bool) -> None:
        self._up = up
        if not up:
            for writer in list(self._writers):
                writer.close()
            self._writers.clear()

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)

        async def serve() -> None:
            self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)
            self._ready.set()

        self._loop.run_until_complete(serve())
        self._loop.run_forever()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if not self._up:
            writer.close()
            with contextlib.suppress(ConnectionError, OSError):
                await writer.wait_closed()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            writer.close()
            with contextlib.suppress(ConnectionError, OSError):
                await writer.wait_closed()
            return
        if not self._up:
            # Cut while the store's side was being opened: a connection accepted before the cut
            # must not slip past it (the cut closed only the connections it found).
            for each in (writer, up_writer):
                each.close()
                with contextlib.suppress(ConnectionError, OSError):
                    await each.wait_closed()
            return
        self._writers |= {writer, up_writer}

        async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            try:
                while data := await source.read(65536):
                    sink.write(data)
                    await sink.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                sink.close()
                with contextlib.suppress(ConnectionError, OSError):
                    await sink.wait_closed()

        async def delayed(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            """As `pipe`, each chunk written `delay_s` after it was read."""
            loop = asyncio.get_running_loop()
            queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

            async def read() -> None:
                with contextlib.suppress(ConnectionError, OSError):
                    while data := await source.read(65536):
                        queue.put_nowait((loop.time() + self.delay_s, data))
                queue.put_nowait((loop.time() + self.delay_s, b""))

            reading = asyncio.create_task(read())
            try:
                while True:
                    due, data = await queue.get()
                    await asyncio.sleep(max(0.0, due - loop.time()))
                    if not data:
                        break
                    sink.write(data)
                    await sink.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                reading.cancel()
                sink.close()
                with contextlib.suppress(ConnectionError, OSError):
                    await sink.wait_closed()

        forward = delayed if self.delay_s > 0 else pipe
        await asyncio.gather(forward(reader, up_writer), forward(up_reader, writer))
        self._writers -= {writer, up_writer}


@dataclass
class Backend:
    """A test store: its backend ("sqlite" or "postgres") and URL."""

    backend: str
    url: str


# The sequences of the store's schema (Postgres), as `empty_tables` and `store_rows` read them.
_OUR_SEQUENCES = "FROM pg_sequences WHERE schemaname = current_schema()"


async def empty_tables(db: Store) -> None:
    """Empty every table: on SQLite a DELETE each, on Postgres one statement that also restarts
    the sequences.

    On Postgres, DELETE rather than TRUNCATE: TRUNCATE makes new files for every table and index
    (a quarter of a second for the 17 tables, at every test), and takes an ACCESS EXCLUSIVE lock
    that deadlocks with a live service's sweep reading two tables in the other order. DELETE
    locks rows only; a sweep holding rows the emptying wants and then wanting one the emptying
    holds is a deadlock too, so the emptying waits longer than the sweep before it looks for one,
    and the sweep is the one cancelled (its round fails, is logged, and runs again next interval).
    """
    tables = [t.name for t in reversed(Base.metadata.sorted_tables)]
    async with db.write() as session:
        if not db.remote:
            for table in tables:
                await session.execute(text(f"DELETE FROM {table}"))
        else:
            await session.execute(text("SET LOCAL deadlock_timeout = '10s'"))
            deletes = " ".join(f"DELETE FROM {table};" for table in tables)
            restarts = (
                "PERFORM setval(format('%I.%I', schemaname, sequencename), start_value, false)"
                f" {_OUR_SEQUENCES};"
            )
            await session.execute(text(f"DO $$ BEGIN {deletes} {restarts} END $$"))


async def store_rows(db: Store) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table in primary-key order and, on Postgres, where each sequence
    stands: a request that must change nothing leaves this exactly as it was."""
    rows: dict[str, list[tuple[Any, ...]]] = {}
    async with db.read() as session:
        for table in Base.metadata.sorted_tables:
            ordered = select(table).order_by(*table.primary_key.columns)
            rows[table.name] = [tuple(row) for row in await session.execute(ordered)]
        if db.remote:
            sequences = text(f"SELECT sequencename, last_value {_OUR_SEQUENCES} ORDER BY 1")
            rows["sequences"] = [tuple(row) for row in await session.execute(sequences)]
    return rows


def make_settings(store: Backend, **overrides: Any) -> Settings:
    return Settings(database_url=store.url, **overrides)
