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
from coordinator.core.acls import Operation
from coordinator.kafka.connection import Client
from coordinator.kafka.errors import FAILURES, error_code, message, outcome
from coordinator.kafka.wire import Request


async def describe_client_quotas(client: Client, request: Request) -> Any:
    reply, body = request.reply, request.body
    assert client.access is not None
    try:
        client.access.cluster(Operation.DESCRIBE_CONFIGS)
        found = await quotas.describe_quotas(
            client.db,
            float(client.settings.controller_mutation_rate),
            [(c.entity_type, c.match_type, c.match) for c in body.components],
            body.strict,
        )
    except FAILURES as failure:
        return reply.body(
            error_code=error_code(failure), error_message=message(failure), entries=None
        )
    entries = tuple(
        reply(
            "EntryData",
            entity=(reply("EntityData", entity_type=quotas.USER, entity_name=user),),
            values=tuple(reply("ValueData", key=k, value=v) for k, v in sorted(values.items())),
        )
        for user, values in found.items()
    )
    return reply.body(error_code=ErrorCode.none, error_message=None, entries=entries)


async def alter_client_quotas(client: Client, request: Request) -> Any:
    """Each entry on its own, all of its changes or none, answered with its entity."""
    reply, body = request.reply, request.body
    assert client.access is not None
    answers = []
    for entry in body.entries:
        try:
            client.access.cluster(Operation.ALTER_CONFIGS)
            user = quotas.user_of([(e.entity_type, e.entity_name) for e in entry.entity])
            ops = [(op.key, None if op.remove else op.value) for op in entry.ops]
            await quotas.alter_quotas(client.db, user, ops, validate_only=body.validate_only)
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
