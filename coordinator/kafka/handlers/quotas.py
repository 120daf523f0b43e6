"""DescribeClientQuotas and AlterClientQuotas over the one quota this service keeps and enforces:
KIP-599's controller mutation rate, per user (`core.quotas`). Kafka's tools see the setting
(`COORDINATOR_CONTROLLER_MUTATION_RATE`) as the default user's `controller_mutation_rate` until
a default is stored. Quotas for client ids or IPs, and byte-rate or request quotas, are refused
(INVALID_REQUEST, saying why), since nothing here would enforce them. The cluster's rights, as
on Kafka."""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from coordinator.core import quotas
from coordinator.core.errors import InvalidRequest
from coordinator.kafka.connection import Client
from coordinator.kafka.errors import FAILURES, error_code, outcome
from coordinator.kafka.wire import Request

_EXACT, _DEFAULT, _ANY = 0, 1, 2
_USER, _ENTITY_TYPES = "user", ("user", "client-id", "ip")


async def describe_client_quotas(client: Client, request: Request) -> Any:
    reply, body = request.reply, request.body
    assert client.access is not None
    try:
        client.access.cluster()
    except FAILURES as failure:
        return reply.body(error_code=error_code(failure), error_message=str(failure), entries=None)
    for component in body.components:
        if component.entity_type not in _ENTITY_TYPES or component.match_type not in (
            _EXACT,
            _DEFAULT,
            _ANY,
        ):
            return reply.body(
                error_code=ErrorCode.invalid_request,
                error_message=f"no such filter: {component.entity_type} {component.match_type}",
                entries=None,
            )
    by_user: dict[str | None, dict[str, float]] = {
        None: {quotas.CONTROLLER_MUTATION_RATE: float(client.settings.controller_mutation_rate)}
    }
    for stored in await quotas.stored_quotas(client.db):
        by_user.setdefault(stored.user, {})[stored.key] = stored.value
    # Every entry is one user's (or the default user's): it matches user components only, and
    # a strict filter also wants every type it names.
    types = {c.entity_type for c in body.components}

    def matches(user: str | None) -> bool:
        return all(
            c.entity_type == _USER
            and (
                c.match_type == _ANY
                or (c.match_type == _DEFAULT and user is None)
                or (c.match_type == _EXACT and user is not None and c.match == user)
            )
            for c in body.components
        ) and (not body.strict or types == {_USER})

    entries = tuple(
        reply(
            "EntryData",
            entity=(reply("EntityData", entity_type=_USER, entity_name=user),),
            values=tuple(reply("ValueData", key=k, value=v) for k, v in sorted(values.items())),
        )
        for user, values in by_user.items()
        if matches(user)
    )
    return reply.body(error_code=ErrorCode.none, error_message=None, entries=entries)


async def alter_client_quotas(client: Client, request: Request) -> Any:
    """Each entry on its own, all of its changes or none, answered with its entity."""
    reply, body = request.reply, request.body
    assert client.access is not None
    answers = []
    for entry in body.entries:
        try:
            client.access.cluster()
            user = _user_of(entry.entity)
            changes: dict[str, float | None] = {}
            for op in entry.ops:
                if op.key in changes:
                    raise InvalidRequest(f"Duplicate quota key {op.key}")
                changes[op.key] = None if op.remove else op.value
            await quotas.alter_quotas(client.db, user, changes, validate_only=body.validate_only)
            result = outcome()
        except FAILURES as failure:
            result = outcome(failure)
        answers.append(
            reply(
                "EntryData",
                **result,
                entity=tuple(
                    reply("EntityData", entity_type=e.entity_type, entity_name=e.entity_name)
                    for e in entry.entity
                ),
            )
        )
    return reply.body(entries=tuple(answers))


def _user_of(entity: Any) -> str | None:
    """The user an entity names (None: the default user), after Kafka's checks of an entity."""
    if not entity:
        raise InvalidRequest("Invalid empty client quota entity")
    seen: set[str] = set()
    for e in entity:
        if e.entity_type in seen:
            raise InvalidRequest(
                f"Invalid client quota entity, duplicate entity entry {e.entity_type}"
            )
        seen.add(e.entity_type)
        if e.entity_type not in _ENTITY_TYPES:
            raise InvalidRequest(f"Unhandled client quota entity type: {e.entity_type}")
        if e.entity_name is not None and not e.entity_name:
            raise InvalidRequest(f"Empty {e.entity_type} not supported")
    if "ip" in seen and len(seen) > 1:
        raise InvalidRequest("Invalid quota entity combination, IP entity should not be combined")
    if seen != {_USER}:
        raise InvalidRequest(
            "this coordinator keeps quotas per user only (its one quota, "
            f"{quotas.CONTROLLER_MUTATION_RATE}, is per principal); "
            f"a {' and '.join(sorted(seen))} quota would not be enforced"
        )
    (only,) = entity
    name: str | None = only.entity_name
    return name
