"""DescribeAcls, CreateAcls and DeleteAcls (`kafka-acls.sh`, AdminClient's ACL calls): Kafka's
ACLs kept in the store (`coordinator.core.acls`) and enforced on both doors with the tokens
file's roles and prefixes. As Kafka's broker answers them: DESCRIBE on the cluster to list, ALTER
to change; an ACL or a filter Kafka refuses is INVALID_REQUEST on its own; with auth off (no
tokens file, Kafka's broker without an authorizer) SECURITY_DISABLED."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from kio.schema.errors import ErrorCode

from coordinator.core import acls
from coordinator.core.acls import Acl, AclFilter, Operation
from coordinator.kafka.connection import Client
from coordinator.kafka.errors import FAILURES, outcome
from coordinator.kafka.wire import Reply, Request

_DISABLED = {
    "error_code": ErrorCode.security_disabled,
    "error_message": "auth is off, so no ACL is kept or enforced: start the service with "
    "COORDINATOR_AUTH_TOKENS_FILE (Kafka's broker without an authorizer)",
}


def _filter(f: Any, prefix: str = "") -> AclFilter:
    return AclFilter.of(
        getattr(f, f"resource_type{prefix}"),
        getattr(f, f"resource_name{prefix}"),
        getattr(f, f"pattern_type{prefix}"),
        f.principal_filter,
        f.host_filter,
        f.operation,
        f.permission_type,
    )


def _resources(reply: Reply, found: Iterable[Acl]) -> tuple[Any, ...]:
    """Kafka's DescribeAclsResponse.aclsResources: the ACLs grouped by resource pattern."""
    by_pattern: dict[tuple[int, str, int], list[Acl]] = {}
    for acl in found:
        key = (acl.resource_type, acl.resource_name, acl.pattern_type)
        by_pattern.setdefault(key, []).append(acl)
    return tuple(
        reply(
            "DescribeAclsResource",
            resource_type=kind,
            resource_name=name,
            pattern_type=pattern,
            acls=tuple(
                reply(
                    "AclDescription",
                    principal=a.principal,
                    host=a.host,
                    operation=a.operation,
                    permission_type=a.permission,
                )
                for a in listed
            ),
        )
        for (kind, name, pattern), listed in by_pattern.items()
    )


async def describe_acls(client: Client, request: Request) -> Any:
    reply, body = request.reply, request.body
    assert client.access is not None
    if client.authenticator is None:
        return reply.body(**_DISABLED, resources=())
    try:
        client.access.cluster(Operation.DESCRIBE)
        asked = _filter(body, "_filter")
        asked.check()
    except FAILURES as failure:
        return reply.body(**outcome(failure), resources=())
    held = client.authenticator.acls
    return reply.body(
        **outcome(), resources=_resources(reply, (a for a in held.all if asked.matches(a)))
    )


async def create_acls(client: Client, request: Request) -> Any:
    reply, body = request.reply, request.body
    assert client.access is not None
    if client.authenticator is None:
        answers = [_DISABLED] * len(body.creations)
    else:
        answers, valid = [], []
        for c in body.creations:
            try:
                client.access.cluster(Operation.ALTER)
                acl = Acl.of(
                    c.resource_type,
                    c.resource_name,
                    c.resource_pattern_type,
                    c.principal,
                    c.host,
                    c.operation,
                    c.permission_type,
                )
                acls.check_new(acl)
                valid.append(acl)
                answers.append(outcome())
            except FAILURES as failure:
                answers.append(outcome(failure))
        if valid:
            await acls.create(client.db, valid)
            await acls.refresh(client.db, client.authenticator.acls)
    return reply.body(results=tuple(reply("AclCreationResult", **a) for a in answers))


async def delete_acls(client: Client, request: Request) -> Any:
    reply, body = request.reply, request.body
    assert client.access is not None
    if client.authenticator is None:
        return reply.body(
            filter_results=tuple(
                reply("DeleteAclsFilterResult", **_DISABLED, matching_acls=()) for _ in body.filters
            )
        )
    checked: list[AclFilter | None] = []
    refusals: list[dict[str, Any]] = []
    for f in body.filters:
        try:
            client.access.cluster(Operation.ALTER)
            asked = _filter(f, "_filter")
            asked.check()
            checked.append(asked)
            refusals.append(outcome())
        except FAILURES as failure:
            checked.append(None)
            refusals.append(outcome(failure))
    valid = [f for f in checked if f is not None]
    matched = iter(await acls.delete_matching(client.db, valid) if valid else [])
    if valid:
        await acls.refresh(client.db, client.authenticator.acls)
    results = []
    for each, refusal in zip(checked, refusals, strict=True):
        removed = next(matched) if each is not None else []
        results.append(
            reply(
                "DeleteAclsFilterResult",
                **refusal,
                matching_acls=tuple(
                    reply(
                        "DeleteAclsMatchingAcl",
                        **outcome(),
                        resource_type=a.resource_type,
                        resource_name=a.resource_name,
                        pattern_type=a.pattern_type,
                        principal=a.principal,
                        host=a.host,
                        operation=a.operation,
                        permission_type=a.permission,
                    )
                    for a in removed
                ),
            )
        )
    return reply.body(filter_results=tuple(results))
