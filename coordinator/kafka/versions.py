"""Error codes a request's API or version does not use, answered as Kafka's broker answers them.

A client decodes only the codes of the versions it speaks: KafkaJS and aiokafka, which speak
EndTxn 0-1 and InitProducerId 0-3, report PRODUCER_FENCED (added in Kafka 2.7) as "unknown error
90" instead of fencing themselves. Kafka's broker rewrites such codes in its answers (KafkaApis:
PRODUCER_FENCED is INVALID_PRODUCER_EPOCH to InitProducerId below 4 and to EndTxn,
AddPartitionsToTxn and AddOffsetsToTxn below 2; a produce with a stale epoch is always
INVALID_PRODUCER_EPOCH, ProducerAppendInfo). One table holds every such rule by API and version;
the listener applies it to every answer, so no handler has to remember it. The same table
gives the data APIs Kafka's code for a store outage: the domain says COORDINATOR_NOT_AVAILABLE,
which a produce or fetch client does not expect. A read, a listing of offsets or a deletion of
records is answered KAFKA_STORAGE_ERROR, the retriable code Kafka's partition leader answers
when its log cannot be read. A Produce is answered REQUEST_TIMED_OUT, what Kafka's leader
answers when it appended but could not confirm the append in time: an outage met while a unit
of work commits leaves unknown whether its appends were written, and clients read the two codes
differently. librdkafka takes KAFKA_STORAGE_ERROR as "not persisted", so a message it then gives
up on (its transaction aborted) has its sequence number reused by the next transaction at the
same epoch, which, if the append was written after all, is taken for its duplicate and never
stored: a committed record lost. REQUEST_TIMED_OUT is "possibly persisted": the client retries
the same batch, and raises its epoch before going on without it (KIP-360).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from kio.schema.errors import ErrorCode

# Every version (no served version of the API knows the code).
ALWAYS = 1 << 15

_FENCED = ErrorCode.producer_fenced
_MEMBER_EPOCH = ErrorCode.fenced_member_epoch
_STORE_OUT = {ErrorCode.coordinator_not_available: (ALWAYS, ErrorCode.kafka_storage_error)}
_APPEND_IN_DOUBT = {ErrorCode.coordinator_not_available: (ALWAYS, ErrorCode.request_timed_out)}

# api key -> the domain's code -> Kafka's, at every version: where Kafka's broker names an outcome
# otherwise than docs/pages/http-api.md. AddPartitionsToTxn, AddOffsetsToTxn and EndTxn: Kafka's
# transaction coordinator answers any epoch but the current one PRODUCER_FENCED (the HTTP API's
# newer epoch is INVALID_PRODUCER_EPOCH) and a transactional id it does not know
# INVALID_PRODUCER_ID_MAPPING (TRANSACTIONAL_ID_NOT_FOUND is DescribeTransactions' code).
_TXN_CALL = {
    ErrorCode.invalid_producer_epoch: _FENCED,
    ErrorCode.transactional_id_not_found: ErrorCode.invalid_producer_id_mapping,
}
RENAMED: Mapping[int, Mapping[ErrorCode, ErrorCode]] = {24: _TXN_CALL, 25: _TXN_CALL, 26: _TXN_CALL}

# api key -> code -> (the first version that knows it, what older versions are answered),
# applied after RENAMED.
TABLE: Mapping[int, Mapping[ErrorCode, tuple[int, ErrorCode]]] = {
    # Produce: a stale epoch is INVALID_PRODUCER_EPOCH at every version (since Kafka 2.7, so the
    # client may abort and go on), a transaction timed out included; an outage leaves the
    # append in doubt.
    0: {_FENCED: (ALWAYS, ErrorCode.invalid_producer_epoch), **_APPEND_IN_DOUBT},
    1: _STORE_OUT,  # Fetch
    2: _STORE_OUT,  # ListOffsets
    21: _STORE_OUT,  # DeleteRecords
    # OffsetCommit: KIP-848's member epoch (9+) is a classic member's generation below.
    8: {_MEMBER_EPOCH: (9, ErrorCode.illegal_generation)},
    9: {_MEMBER_EPOCH: (9, ErrorCode.illegal_generation)},  # OffsetFetch: the same
    # The classic group protocol knows generations, not member epochs.
    11: {_MEMBER_EPOCH: (ALWAYS, ErrorCode.illegal_generation)},
    12: {_MEMBER_EPOCH: (ALWAYS, ErrorCode.illegal_generation)},
    13: {_MEMBER_EPOCH: (ALWAYS, ErrorCode.illegal_generation)},
    14: {_MEMBER_EPOCH: (ALWAYS, ErrorCode.illegal_generation)},
    # CreateTopics: THROTTLING_QUOTA_EXCEEDED arrived with version 6 (KIP-599); Kafka accepts
    # and throttles an older client instead, this service refuses it as a policy.
    19: {ErrorCode.throttling_quota_exceeded: (6, ErrorCode.policy_violation)},
    37: {ErrorCode.throttling_quota_exceeded: (3, ErrorCode.policy_violation)},  # KIP-599
    22: {_FENCED: (4, ErrorCode.invalid_producer_epoch)},
    24: {_FENCED: (2, ErrorCode.invalid_producer_epoch)},
    25: {_FENCED: (2, ErrorCode.invalid_producer_epoch)},
    26: {_FENCED: (2, ErrorCode.invalid_producer_epoch)},
    # TxnOffsetCommit: fenced by the producer's epoch as a produce is; a stale generation.
    28: {
        _FENCED: (ALWAYS, ErrorCode.invalid_producer_epoch),
        _MEMBER_EPOCH: (ALWAYS, ErrorCode.illegal_generation),
    },
}


def code_for(api_key: int, version: int, code: ErrorCode) -> ErrorCode:
    """`code` as a client of that API version is answered it."""
    code = RENAMED.get(api_key, {}).get(code, code)
    rule = TABLE.get(api_key, {}).get(code)
    if rule is not None and version < rule[0]:
        return rule[1]
    return code


def for_version(api_key: int, version: int, response: Any) -> Any:
    """`response` with every error code its version does not know rewritten (the response
    itself when nothing needs it)."""
    rules = TABLE.get(api_key, {})
    if api_key not in RENAMED and not any(version < first for first, _ in rules.values()):
        return response
    return _rewrite(response, api_key, version)


def _rewrite(entity: Any, api_key: int, version: int) -> Any:
    changes: dict[str, Any] = {}
    for name, kind in _shape(type(entity)):
        value = getattr(entity, name)
        if kind == "code":
            new = code_for(api_key, version, value)
            if new is not value:
                changes[name] = new
        elif kind == "entity" and value is not None:
            new = _rewrite(value, api_key, version)
            if new is not value:
                changes[name] = new
        elif kind == "entities" and value:
            items = tuple(_rewrite(item, api_key, version) for item in value)
            if any(a is not b for a, b in zip(items, value, strict=True)):
                changes[name] = items
    return dataclasses.replace(entity, **changes) if changes else entity


def _shape(entity: type) -> tuple[tuple[str, str], ...]:
    """The fields of a response entity that hold error codes or nested entities (once per
    entity type)."""
    cached = _SHAPES.get(entity)
    if cached is None:
        cached = _SHAPES[entity] = _fields_of(entity)
    return cached


_SHAPES: dict[type, tuple[tuple[str, str], ...]] = {}


def _fields_of(entity: type) -> tuple[tuple[str, str], ...]:
    found = []
    for field in dataclasses.fields(entity):
        if field.metadata.get("kafka_type") == "error_code":
            found.append((field.name, "code"))
            continue
        annotation = field.type
        args = getattr(annotation, "__args__", ())
        nested = [a for a in (annotation, *args) if dataclasses.is_dataclass(a)]
        tuples = [
            a
            for a in args
            if getattr(a, "__origin__", None) is tuple
            and any(dataclasses.is_dataclass(x) for x in getattr(a, "__args__", ()))
        ]
        if (
            getattr(annotation, "__origin__", None) is tuple
            and any(dataclasses.is_dataclass(x) for x in args)
        ) or tuples:
            found.append((field.name, "entities"))
        elif nested:
            found.append((field.name, "entity"))
    return tuple(found)
