"""The Kafka listener of one test, in process, on the test's store, and connections to it."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from kio.schema.errors import ErrorCode

from coordinator.app import wire_domains
from coordinator.core.auth import Authenticator
from coordinator.core.settings import Settings
from coordinator.kafka.server import KafkaListener
from coordinator.store.engines import open_store
from tests.support.kafka_wire import Connection
from tests.support.services import Backend, empty_tables, free_port

TOKENS = [
    {"token": "admin-token-1", "principal": "ops", "roles": ["admin"]},
    {
        "token": "reader-token-1",
        "principal": "reader",
        "roles": ["consumer"],
        "topic_prefixes": ["pay"],
        "group_prefixes": ["g-"],
    },
]


@pytest.fixture
async def listener(
    store: Backend, tmp_path: Path, request: pytest.FixtureRequest
) -> AsyncIterator[KafkaListener]:
    # The parameter: True for a tokens file, or a dict of settings (with "auth" among them).
    param = getattr(request, "param", False)
    overrides = dict(param) if isinstance(param, dict) else {"auth": param}
    auth = overrides.pop("auth", False)
    tokens = tmp_path / "tokens.json"
    tokens.write_text(json.dumps({"tokens": TOKENS}))
    settings = Settings(
        database_url=store.url,
        kafka_listener=f"127.0.0.1:{free_port()}",
        auth_tokens_file=tokens if auth else None,
        **overrides,
    )
    db = open_store(settings)
    # The store is shared with every other test of this backend: start from an empty one.
    await empty_tables(db)
    wire_domains()  # what create_app does: the listener is composed here without the app
    running = KafkaListener(db, settings, Authenticator.from_file(tokens) if auth else None)
    await running.start()
    try:
        yield running
    finally:
        for connection in _opened:
            connection.writer.close()
            with contextlib.suppress(ConnectionError):
                await connection.writer.wait_closed()
        _opened.clear()
        await running.close()
        await db.dispose()


_opened: list[Connection] = []


async def connect(listener: KafkaListener) -> Connection:
    connection = Connection(*await asyncio.open_connection(listener.host, listener.port))
    _opened.append(connection)
    return connection


def plain_auth(user: str, password: str) -> bytes:
    return b"\0" + user.encode() + b"\0" + password.encode()


async def authenticated(listener: KafkaListener, user: str, token: str) -> tuple[Connection, Any]:
    connection = await connect(listener)
    handshake = await connection.call(17, 1, mechanism="PLAIN")
    assert handshake.error_code == ErrorCode.none
    answer = await connection.call(36, 2, auth_bytes=plain_auth(user, token))
    return connection, answer
