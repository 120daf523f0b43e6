"""Field types shared by every domain's request and response models (docs/pages/http-api.md,
Conventions)."""

from __future__ import annotations

import re
from typing import Annotated

from fastapi import Path
from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field

from coordinator.core.names import ID_MAX, TOPIC_PATTERN, id_problem, not_dots, printable

INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
EPOCH_MAX = 32766


def digits(value: object) -> object:
    """Numbers in paths and queries are written in digits: not `1.0`, ` 1`, `1_0` or `+1`."""
    if isinstance(value, str) and not _DIGITS.fullmatch(value):
        raise ValueError("must be a whole number written in digits")
    return value


_DIGITS = re.compile(r"-?[0-9]+")

TopicName = Annotated[
    str, Field(pattern=TOPIC_PATTERN, examples=["payments"]), AfterValidator(not_dots)
]
TopicNameParam = AfterValidator(not_dots)
Digits = BeforeValidator(digits)
PartitionNumber = Annotated[int, Field(ge=0, le=INT32_MAX)]
Offset = Annotated[int, Field(ge=0, le=INT64_MAX)]
TransactionalId = Annotated[str, Field(min_length=1, max_length=ID_MAX), AfterValidator(printable)]
GroupId = TransactionalId
ProducerIdField = Annotated[int, Field(ge=-1, le=INT64_MAX)]
ProducerEpochField = Annotated[int, Field(ge=-1, le=EPOCH_MAX)]
SequenceField = Annotated[int, Field(ge=-1, le=INT32_MAX)]


class RequestModel(BaseModel):
    """A request body: strict types (no "1" for 1, no 1.0, no true), unknown fields refused."""

    model_config = ConfigDict(strict=True, extra="forbid")


def transactional_id_path(value: str) -> str:
    """Validate a transactional or group id taken from a URL path, as its body twin is."""
    problem = id_problem(value)
    if problem is not None:
        raise ValueError(problem)
    return value


# Routes take these with the `:path` converter: an id may hold any printable character, "/" too
# (sent percent-encoded, which the server decodes before routing).
IdPath = Annotated[
    str,
    Path(description="a transactional or group id: 1 to 255 printable characters"),
    AfterValidator(transactional_id_path),
]


class TopicPartitionIn(RequestModel):
    topic: TopicName
    partition: PartitionNumber
