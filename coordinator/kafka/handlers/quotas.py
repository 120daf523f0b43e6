"""DescribeClientQuotas over the one quota this service keeps: KIP-599's controller mutation rate
(`COORDINATOR_CONTROLLER_MUTATION_RATE`), which applies to every user, so Kafka's tools see it
as the default user's `controller_mutation_rate`. The cluster's rights, as on Kafka."""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from coordinator.kafka.connection import Client
from coordinator.kafka.errors import FAILURES, error_code
from coordinator.kafka.wire import Request

_EXACT, _DEFAULT, _ANY = 0, 1, 2
_ENTITY_TYPES = ("user", "client-id", "ip")


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
    # The one entry, {user: default}: it matches a user component that asks for the default
    # or any user, and no other component; a strict filter also wants every type it names.
    types = {c.entity_type for c in body.components}
    matches = all(
        c.entity_type == "user" and c.match_type in (_DEFAULT, _ANY) for c in body.components
    ) and (not body.strict or types == {"user"})
    entries: tuple[Any, ...] = ()
    if matches:
        entries = (
            reply(
                "EntryData",
                entity=(reply("EntityData", entity_type="user", entity_name=None),),
                values=(
                    reply(
                        "ValueData",
                        key="controller_mutation_rate",
                        value=float(client.settings.controller_mutation_rate),
                    ),
                ),
            ),
        )
    return reply.body(error_code=ErrorCode.none, error_message=None, entries=entries)
