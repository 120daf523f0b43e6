"""record batches: every batch row holds a Kafka record batch; markers are control batches;
topic configs

Revision ID: 5d1c0a7e1b11
Revises: 108d015ce4d8
Create Date: 2026-11-24 11:00:00

Rows of the earlier format (the service's own record encoding, below as `decode_v1`, and marker
rows with an empty payload) are rewritten, partition by partition in offset order, as record
batches (magic 2, uncompressed, CreateTime timestamps equal to the old append time, so every
record reads back as before) and control batches. A marker row also gets the first offset of the
transaction it ends on its partition.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence

import sqlalchemy as sa
from alembic import op

from sdk import recordbatch

revision: str = "5d1c0a7e1b11"
down_revision: str | None = "108d015ce4d8"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The earlier encoding, little-endian, per record: key length (i32, -1 null), value length (i32),
# header count (u16), key, value, then per header: name length (u16), value length (i32), name
# (UTF-8), value.
_RECORD = struct.Struct("<iiH")
_HEADER = struct.Struct("<Hi")
V1Record = tuple[bytes | None, bytes | None, list[tuple[str, bytes]]]

CHUNK = 500
CONTROL_ABORT = 0


def decode_v1(payload: bytes) -> Iterator[V1Record]:
    pos = 0
    while pos < len(payload):
        key_len, value_len, header_count = _RECORD.unpack_from(payload, pos)
        pos += _RECORD.size
        key = None
        if key_len >= 0:
            key = payload[pos : pos + key_len]
            pos += key_len
        value = None
        if value_len >= 0:
            value = payload[pos : pos + value_len]
            pos += value_len
        headers = []
        for _ in range(header_count):
            name_len, hvalue_len = _HEADER.unpack_from(payload, pos)
            pos += _HEADER.size
            name = payload[pos : pos + name_len].decode()
            pos += name_len
            headers.append((name, payload[pos : pos + hvalue_len]))
            pos += hvalue_len
        yield key, value, headers


def encode_v1(records: Sequence[V1Record]) -> bytes:
    out = bytearray()
    for key, value, headers in records:
        out += _RECORD.pack(
            -1 if key is None else len(key), -1 if value is None else len(value), len(headers)
        )
        out += key or b""
        out += value or b""
        for name, hvalue in headers:
            raw = name.encode()
            out += _HEADER.pack(len(raw), len(hvalue))
            out += raw + hvalue
    return bytes(out)


batches = sa.table(
    "batches",
    sa.column("topic", sa.String),
    sa.column("partition", sa.Integer),
    sa.column("base_offset", sa.BigInteger),
    sa.column("producer_id", sa.BigInteger),
    sa.column("producer_epoch", sa.Integer),
    sa.column("base_sequence", sa.Integer),
    sa.column("timestamp", sa.BigInteger),
    sa.column("is_transactional", sa.Boolean),
    sa.column("control", sa.SmallInteger),
    sa.column("payload", sa.LargeBinary),
    sa.column("max_timestamp", sa.BigInteger),
    sa.column("size", sa.Integer),
    sa.column("first_offset", sa.BigInteger),
)


def _rows(connection: sa.Connection) -> Iterator[sa.Row[tuple[object, ...]]]:
    """Every batch row in (topic, partition, offset) order, a chunk at a time."""
    after: tuple[str, int, int] | None = None
    while True:
        query = sa.select(batches).order_by(
            batches.c.topic, batches.c.partition, batches.c.base_offset
        )
        if after is not None:
            query = query.where(
                sa.tuple_(batches.c.topic, batches.c.partition, batches.c.base_offset)
                > sa.tuple_(*after)
            )
        rows = connection.execute(query.limit(CHUNK)).all()
        yield from rows
        if len(rows) < CHUNK:
            return
        last = rows[-1]
        after = (last.topic, last.partition, last.base_offset)


_UPDATE = (
    sa.update(batches)
    .where(
        batches.c.topic == sa.bindparam("t"),
        batches.c.partition == sa.bindparam("p"),
        batches.c.base_offset == sa.bindparam("o"),
    )
    .values(
        payload=sa.bindparam("new_payload"),
        max_timestamp=sa.bindparam("new_max_timestamp"),
        size=sa.bindparam("new_size"),
        first_offset=sa.bindparam("new_first_offset"),
    )
)


def upgrade() -> None:
    op.add_column("topics", sa.Column("configs", sa.Text(), server_default="{}", nullable=False))
    # Added NOT NULL with a default, filled below: no table rebuild on SQLite (which would
    # have to re-create the partial indexes).
    op.add_column(
        "batches", sa.Column("max_timestamp", sa.BigInteger(), server_default="0", nullable=False)
    )
    op.add_column("batches", sa.Column("size", sa.Integer(), server_default="0", nullable=False))
    op.add_column("batches", sa.Column("first_offset", sa.BigInteger(), nullable=True))

    connection = op.get_bind()
    pending: list[dict[str, object]] = []
    # (topic, partition, producer id) -> first offset of its open transaction there.
    open_txns: dict[tuple[str, int, int], int] = {}
    for row in _rows(connection):
        where = (row.topic, row.partition, row.producer_id)
        first_offset = None
        if row.control is None:
            payload = recordbatch.build(
                [(row.timestamp, k, v, h) for k, v, h in decode_v1(row.payload)],
                base_offset=row.base_offset,
                producer_id=row.producer_id,
                producer_epoch=row.producer_epoch,
                base_sequence=row.base_sequence,
                transactional=row.is_transactional,
            )
            if row.is_transactional:
                open_txns.setdefault(where, row.base_offset)
        else:
            payload = recordbatch.build_control(
                row.control != CONTROL_ABORT,
                row.producer_id,
                row.producer_epoch,
                row.timestamp,
                base_offset=row.base_offset,
            )
            first_offset = open_txns.pop(where, None)
        pending.append(
            {
                "t": row.topic,
                "p": row.partition,
                "o": row.base_offset,
                "new_payload": payload,
                "new_max_timestamp": row.timestamp,
                "new_size": len(payload),
                "new_first_offset": first_offset,
            }
        )
        if len(pending) >= CHUNK:
            connection.execute(_UPDATE, pending)
            pending = []
    if pending:
        connection.execute(_UPDATE, pending)

    op.create_index(
        "ix_batches_abort_markers",
        "batches",
        ["topic", "partition", "base_offset"],
        unique=False,
        sqlite_where=sa.text("control = 0"),
        postgresql_where=sa.text("control = 0"),
    )


def downgrade() -> None:
    op.drop_index(
        "ix_batches_abort_markers",
        table_name="batches",
        sqlite_where=sa.text("control = 0"),
        postgresql_where=sa.text("control = 0"),
    )
    connection = op.get_bind()
    pending: list[dict[str, object]] = []
    for row in _rows(connection):
        if row.control is None:
            payload = encode_v1(
                [
                    (r.key, r.value, [(n, v or b"") for n, v in r.headers])
                    for r in recordbatch.records(row.payload)
                ]
            )
        else:
            payload = b""
        pending.append(
            {
                "t": row.topic,
                "p": row.partition,
                "o": row.base_offset,
                "new_payload": payload,
                "new_max_timestamp": row.max_timestamp,
                "new_size": len(payload),
                "new_first_offset": None,
            }
        )
        if len(pending) >= CHUNK:
            connection.execute(_UPDATE, pending)
            pending = []
    if pending:
        connection.execute(_UPDATE, pending)
    with op.batch_alter_table("batches") as batch_op:
        batch_op.drop_column("first_offset")
        batch_op.drop_column("size")
        batch_op.drop_column("max_timestamp")
    with op.batch_alter_table("topics") as batch_op:
        batch_op.drop_column("configs")
