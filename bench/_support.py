"""Plumbing shared by the benchmarks in this folder (bench/produce.py, bench/transactions.py,
bench/fetch.py).

Not a benchmark: the scratch Postgres database (created fresh, dropped on the way out), the
service in a child process (started on a free port, waited for on /healthz, stopped), HTTP
clients and checked calls, the measured window, random record values, CPU seconds from /proc,
the common command-line options and the runner (uvloop when installed; SIGTERM unwinds like
Ctrl-C). bench/ is not a package: the scripts put this folder on sys.path and import it as
`_support`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import multiprocessing
import os
import random
import signal
import string
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlencode

import asyncpg
import httpx
import orjson

from coordinator.launcher import Launched

T = TypeVar("T")

DEFAULT_POSTGRES_URL = "postgresql://postgres@127.0.0.1:5432/test"
POSTGRES_ENV = "COORDINATOR_TEST_POSTGRES_URL"
MB = 1_000_000
JSON_HEADERS = {"content-type": "application/json"}


def log(message: str) -> None:
    print(f"[bench] {message}", file=sys.stderr, flush=True)


class BenchFailure(Exception):
    pass


# -- the database -------------------------------------------------------------------------------


def plain_url(url: str) -> str:
    """asyncpg wants postgresql://; accept the SQLAlchemy spelling too."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.split("+", 1)[0] not in ("postgresql", "postgres"):
        raise SystemExit(f"not a Postgres URL: {url!r}")
    return f"postgresql://{rest}"


def with_database(url: str, name: str) -> str:
    base, _, tail = url.partition("?")
    server = base.rpartition("/")[0] if base.count("/") > 2 else base
    return f"{server}/{name}" + (f"?{tail}" if tail else "")


async def admin(url: str, *statements: str) -> None:
    connection = await asyncpg.connect(url)
    try:
        for sql in statements:
            await connection.execute(sql)
    finally:
        await connection.close()


async def checkpoint(database_url: str) -> None:
    """Start a phase without the last one's dirty pages pending (needs superuser; else skipped)."""
    try:
        await admin(database_url, "CHECKPOINT")
    except asyncpg.PostgresError as exc:
        log(f"CHECKPOINT skipped: {exc}")


@asynccontextmanager
async def scratch_database(server_url: str, prefix: str) -> AsyncIterator[tuple[str, str]]:
    """A new database `<prefix><random>` on the server, as (name, URL); dropped on the way out,
    also on failure, Ctrl-C or SIGTERM (see `cancel_on_sigterm`)."""
    name = f"{prefix}{uuid.uuid4().hex[:12]}"
    await admin(server_url, f'CREATE DATABASE "{name}"')
    log(f"created database {name}")
    try:
        yield name, with_database(server_url, name)
    finally:
        await admin(server_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        log(f"dropped database {name}")


# -- the service --------------------------------------------------------------------------------


class Service(Launched):
    """The service in a child process: `python <launch> --port P <options>` on `database_url`
    (it migrates the store itself), with `env` over this process's environment, its output in
    `workdir/service.log`."""

    def __init__(
        self,
        database_url: str,
        workdir: Path,
        launch: Sequence[str],
        options: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(
            workdir,
            database_url=database_url,
            env=env,
            command=launch,
            args=options,
            log=workdir / "service.log",
        )

    def spawn(self) -> None:
        super().spawn()
        log(f"service pid {self.pid} on {self.url} (log: {self.log})")


@asynccontextmanager
async def serving(
    database_url: str,
    workdir_prefix: str,
    launch: Sequence[str],
    options: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
) -> AsyncIterator[Service]:
    """A healthy `Service` in a temporary working directory, stopped on the way out; on failure
    (or Ctrl-C, SIGTERM) the tail of its log goes to stderr first."""
    with tempfile.TemporaryDirectory(prefix=workdir_prefix) as workdir:
        service = Service(database_url, Path(workdir), launch, options, env)
        try:
            service.spawn()
            await asyncio.to_thread(service.wait_healthy, 90.0)
            yield service
        except BaseException:
            tail = service.log_tail()
            if tail:
                log(f"service log tail:\n{tail}")
            raise
        finally:
            service.stop()


# -- calling it ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class LeanResponse:
    status_code: int
    headers: dict[str, str]  # names in lowercase
    content: bytes

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")

    def json(self) -> Any:
        return orjson.loads(self.content)


class LeanHttp:
    """The load generator's HTTP client: the part of httpx.AsyncClient's interface the benchmarks
    use, over one HTTP/1.1 keep-alive connection on a bare asyncio stream (one request in flight;
    the answer read by its Content-Length). httpx spent about as much CPU per request as the
    service did, and client, service and Postgres share the machine's cores: the client's CPU was
    the service's loss. Only what the service answers is read: no chunked bodies, no redirects,
    no TLS."""

    def __init__(self, base_url: str) -> None:
        url = httpx.URL(base_url)
        self._host, self._port = url.host, url.port or 80
        self._authority = f"{self._host}:{self._port}".encode()
        self._stream: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None

    async def request(
        self,
        method: str,
        path: str,
        *,
        content: bytes = b"",
        json: Any = None,
        params: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> LeanResponse:
        if self._stream is None:
            self._stream = await asyncio.open_connection(self._host, self._port)
        reader, writer = self._stream
        fields = dict(headers or {})
        if json is not None:
            content = orjson.dumps(json)
            fields.setdefault("content-type", "application/json")
        target = f"{path}?{urlencode(params)}" if params else path
        head = [f"{method} {target} HTTP/1.1".encode(), b"host: " + self._authority]
        head += [f"{name}: {value}".encode() for name, value in fields.items()]
        if content or method in ("POST", "PUT", "PATCH"):
            head.append(b"content-length: %d" % len(content))
        writer.write(b"\r\n".join(head) + b"\r\n\r\n" + content)
        answer = await reader.readuntil(b"\r\n\r\n")
        status_line, *lines = answer[:-4].decode("latin-1").split("\r\n")
        answer_headers = {}
        for line in lines:
            name, _, value = line.partition(":")
            answer_headers[name.strip().lower()] = value.strip()
        if "content-length" not in answer_headers:
            raise BenchFailure(f"{method} {target}: an answer without content-length: {answer!r}")
        body = await reader.readexactly(int(answer_headers["content-length"]))
        return LeanResponse(int(status_line.split(" ", 2)[1]), answer_headers, body)

    async def post(self, path: str, **kwargs: Any) -> LeanResponse:
        return await self.request("POST", path, **kwargs)

    async def get(self, path: str, **kwargs: Any) -> LeanResponse:
        return await self.request("GET", path, **kwargs)

    async def aclose(self) -> None:
        if self._stream is not None:
            writer = self._stream[1]
            self._stream = None
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()


def checked(response: httpx.Response | LeanResponse, what: str) -> Any:
    if response.status_code not in (200, 201):
        raise BenchFailure(f"{what}: {response.status_code} {response.text[:500]}")
    return orjson.loads(response.content)


Client = httpx.AsyncClient | LeanHttp


async def call(client: Client, path: str, body: Any) -> Any:
    return checked(await client.post(path, json=body), f"POST {path}")


def make_clients(url: str, count: int, lean: bool = True) -> list[Client]:
    """One client (one connection, one request in flight) per producer: the lean one, or httpx
    (the SDK's HTTP client)."""
    if lean:
        return [LeanHttp(url) for _ in range(count)]
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    return [
        httpx.AsyncClient(base_url=url, limits=limits, timeout=httpx.Timeout(60.0))
        for _ in range(count)
    ]


async def close_all(clients: Sequence[Client]) -> None:
    for client in clients:
        await client.aclose()


# -- measuring ----------------------------------------------------------------------------------


@dataclass
class Window:
    """Warm-up, then `seconds` measured; work answered inside [start, end] counts."""

    start: float
    end: float

    @classmethod
    def after(cls, warmup: float, seconds: float) -> Window:
        start = time.perf_counter() + warmup
        return cls(start, start + seconds)

    @property
    def seconds(self) -> float:
        return self.end - self.start

    def counts(self, at: float) -> bool:
        return self.start <= at <= self.end


def percentile_ms(ordered: list[float], p: float) -> float:
    """The `p` quantile of sorted latencies (s) in ms; NaN when there are none."""
    return ordered[min(len(ordered) - 1, int(p * len(ordered)))] * 1000 if ordered else float("nan")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a local process so far (Linux /proc), else NaN."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return float("nan")
    fields = stat.rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def tree_cpu_seconds(pid: int) -> float:
    """`cpu_seconds` of a local process and of every process under it (a service's workers)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    total, todo = 0.0, [pid]
    while todo:
        each = todo.pop()
        total += cpu_seconds(each)
        todo.extend(children.get(each, ()))
    return total


async def cpus_in_window(window: Window, *pids: int) -> list[float]:
    """CPU seconds each process used inside the window (call it before the window starts)."""
    await asyncio.sleep(max(0.0, window.start - time.perf_counter()))
    before = [cpu_seconds(pid) for pid in pids]
    await asyncio.sleep(max(0.0, window.end - time.perf_counter()))
    return [cpu_seconds(pid) - b for pid, b in zip(pids, before, strict=True)]


async def cpu_in_window(pid: int, window: Window) -> float:
    """CPU seconds process `pid` used inside the window (call it before the window starts)."""
    return (await cpus_in_window(window, pid))[0]


class CpuMeter:
    """CPU used by the service and by the Postgres backends serving its database, sampled at a
    window's start and end. Backends are found in pg_stat_activity; their CPU is only readable
    when Postgres runs on this machine (and as a user allowed to read its /proc entries)."""

    def __init__(self, server_url: str, database: str, service_pid: int) -> None:
        self.server_url = server_url
        self.database = database
        self.service_pid = service_pid

    async def backends(self) -> list[int]:
        connection = await asyncpg.connect(self.server_url)
        try:
            rows = await connection.fetch(
                "SELECT pid FROM pg_stat_activity WHERE datname = $1", self.database
            )
        finally:
            await connection.close()
        return [row["pid"] for row in rows]

    async def sample(self) -> tuple[float, dict[int, float]]:
        return cpu_seconds(self.service_pid), {
            pid: cpu_seconds(pid) for pid in await self.backends()
        }

    async def sample_tree(self) -> tuple[float, dict[int, float]]:
        """`sample`, with the CPU of the service's workers (its child processes) too."""
        return tree_cpu_seconds(self.service_pid), {
            pid: cpu_seconds(pid) for pid in await self.backends()
        }


# -- the payloads -------------------------------------------------------------------------------


def random_values(count: int, size: int, seed: int) -> list[str]:
    """`count` random values of `size` printable ASCII characters (letters and digits: no JSON
    escaping, so exactly `size` bytes each on the wire; random, so nothing compresses them for
    free). The same seed gives the same values."""
    rng = random.Random(seed)
    alphabet = string.ascii_letters + string.digits
    return ["".join(rng.choices(alphabet, k=size)) for _ in range(count)]


class BatchTemplate:
    """A Kafka record batch of these values (keys null, no headers), built once; `at()` sets its
    producer id, epoch and base sequence and recomputes its CRC-32C, as cheaply as the JSON
    bodies splice in a number."""

    def __init__(self, values: list[bytes], transactional: bool = False) -> None:
        from sdk import recordbatch

        now = time.time_ns() // 1_000_000
        self.body = bytearray(
            recordbatch.build(
                [(now, None, v, ()) for v in values],
                producer_id=0,
                producer_epoch=0,
                base_sequence=0,
                transactional=transactional,
            )
        )

    def at(self, producer_id: int, epoch: int, sequence: int) -> bytes:
        from crc32c import crc32c

        body = self.body
        body[43:51] = producer_id.to_bytes(8, "big", signed=True)
        body[51:53] = epoch.to_bytes(2, "big", signed=True)
        body[53:57] = sequence.to_bytes(4, "big", signed=True)
        body[17:21] = crc32c(memoryview(body)[21:]).to_bytes(4, "big")
        return bytes(body)


BATCH_HEADERS = {"content-type": "application/vnd.kafka.record-batch"}


def records_json(values: list[str]) -> bytes:
    """`"records":[...]` with these values (keys null, no headers), as the service receives it."""
    return b'"records":' + orjson.dumps([{"key": None, "value": v} for v in values])


# -- the command line and the run ---------------------------------------------------------------


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError("must be positive")
    return value


def add_postgres_url(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--postgres-url",
        default=os.environ.get(POSTGRES_ENV, DEFAULT_POSTGRES_URL),
        help=f"Postgres server to create the benchmark database on (${POSTGRES_ENV})",
    )


def cancel_on_sigterm() -> None:
    """SIGTERM unwinds like Ctrl-C (the current task is cancelled), so the service is stopped
    and the database dropped on the way out."""
    task = asyncio.current_task()
    assert task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)


def run_bench(bench: Coroutine[Any, Any, None]) -> int:
    """Run the benchmark (on uvloop when installed); the process's exit status."""
    try:
        import uvloop

        runner: Any = uvloop.run
    except ImportError:
        runner = asyncio.run
    try:
        runner(bench)
    except BenchFailure as exc:
        log(f"FAILED: {exc}")
        return 1
    except (KeyboardInterrupt, asyncio.CancelledError):
        log("interrupted")
        return 130
    return 0


def in_processes(calls: list[tuple[Callable[..., T], tuple[Any, ...]]]) -> list[T]:
    """Each `function(*args)` in a process of its own (spawned: a fresh interpreter, so one
    load generator's GIL is not the load); their results in order."""
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(len(calls), mp_context=context) as pool:
        futures = [pool.submit(function, *args) for function, args in calls]
        return [f.result() for f in futures]
