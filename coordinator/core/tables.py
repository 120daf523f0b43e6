"""The declarative base every domain's tables derive from, and the column types they share.

The tables are the store's schema, written by Alembic's migrations; the engines that read and
write them are `coordinator.store`'s."""

from __future__ import annotations

from typing import Any

from sqlalchemy import BigInteger, Integer, LargeBinary, MetaData
from sqlalchemy.orm import DeclarativeBase
from sqlalchemy.types import TypeDecorator

# A 64-bit key that SQLite still treats as its rowid alias (so it autoincrements).
BigIntKey = BigInteger().with_variant(Integer(), "sqlite")


class FreeText(TypeDecorator[str]):
    """Text a client may fill with anything, a NUL included (Kafka's offset-commit metadata):
    kept as its UTF-8 bytes, since Postgres text cannot hold a NUL. Rows written as text before
    the column held bytes read back as they are."""

    impl = LargeBinary
    cache_ok = True

    def process_bind_param(self, value: str | None, dialect: Any) -> bytes | None:
        return None if value is None else value.encode("utf-8")

    def process_result_value(self, value: bytes | str | None, dialect: Any) -> str | None:
        if value is None or isinstance(value, str):
            return value
        return bytes(value).decode("utf-8")


NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)
