"""Kafka's ACL rules without I/O (coordinator.core.acls) and `Access` reading the tokens file's
roles and prefixes and the ACLs as one model: DENY first, then any grant, then nothing; the
admin role as Kafka's super user; DESCRIBE implied by READ, WRITE, DELETE and ALTER; filters as
Kafka's AclBindingFilter matches them; Kafka's refusals of a new ACL."""

from __future__ import annotations

import pytest

from coordinator.core.acls import (
    Acl,
    AclFilter,
    Acls,
    InvalidAcl,
    Operation,
    PatternType,
    Permission,
    ResourceType,
    Verdict,
    check_new,
)
from coordinator.core.auth import Access, Principal
from coordinator.core.errors import (
    ClusterAuthorizationFailed,
    GroupAuthorizationFailed,
    TopicAuthorizationFailed,
    TransactionalIdAuthorizationFailed,
)

T, G, C, X = (
    ResourceType.TOPIC,
    ResourceType.GROUP,
    ResourceType.CLUSTER,
    ResourceType.TRANSACTIONAL_ID,
)
LIT, PRE = PatternType.LITERAL, PatternType.PREFIXED
ALLOW, DENY = Permission.ALLOW, Permission.DENY


def acl(
    kind: ResourceType,
    name: str,
    op: Operation,
    permission: Permission = ALLOW,
    pattern: PatternType = LIT,
    principal: str = "User:alice",
    host: str = "*",
) -> Acl:
    return Acl(kind, name, pattern, principal, host, op, permission)


def access(*given: Acl, roles: tuple[str, ...] = (), host: str = "10.0.0.1") -> Access:
    principal = Principal("alice", frozenset(roles), ("own-",), ("own-",), ("own-",))
    return Access(principal, Acls(given), host)


def test_nothing_matching_refuses_and_an_allow_allows() -> None:
    bare = access()
    assert not bare.may(T, "pay", Operation.READ)
    held = access(acl(T, "pay", Operation.READ))
    assert held.may(T, "pay", Operation.READ)
    assert not held.may(T, "pay", Operation.WRITE)
    assert not held.may(T, "payroll", Operation.READ)  # literal: that name only


def test_prefixed_and_wildcard_patterns_take_in_what_they_cover() -> None:
    held = access(acl(T, "pay.", Operation.WRITE, pattern=PRE), acl(G, "*", Operation.READ))
    assert held.may(T, "pay.eu", Operation.WRITE)
    assert not held.may(T, "pa", Operation.WRITE)
    assert held.may(G, "any-group", Operation.READ)


def test_a_deny_wins_over_every_allow_and_over_the_tokens_file() -> None:
    held = access(
        acl(T, "pay", Operation.ALL, pattern=PRE),
        acl(T, "pay.secret", Operation.READ, DENY),
        acl(T, "own-hidden", Operation.ALL, DENY),
        roles=("consumer",),
    )
    assert held.may(T, "pay.public", Operation.READ)
    assert not held.may(T, "pay.secret", Operation.READ)
    assert held.may(T, "own-other", Operation.READ)  # the consumer role, under its prefix
    assert not held.may(T, "own-hidden", Operation.READ)
    with pytest.raises(TopicAuthorizationFailed, match="may not READ topic 'own-hidden'"):
        held.fetch("own-hidden")


def test_the_admin_role_is_a_super_user_no_deny_stops() -> None:
    admin = Access(
        Principal("alice", frozenset({"admin"}), (), (), ()),
        Acls([acl(T, "*", Operation.ALL, DENY)]),
        "10.0.0.1",
    )
    admin.fetch("anything")
    admin.cluster()


def test_describe_is_implied_by_allows_only() -> None:
    for op in (Operation.READ, Operation.WRITE, Operation.DELETE, Operation.ALTER):
        assert access(acl(T, "t", op)).may(T, "t", Operation.DESCRIBE)
    assert not access(acl(T, "t", Operation.CREATE)).may(T, "t", Operation.DESCRIBE)
    assert access(acl(T, "t", Operation.ALTER_CONFIGS)).may(T, "t", Operation.DESCRIBE_CONFIGS)
    # A DENY of READ does not deny DESCRIBE (Kafka's findResult).
    held = access(acl(T, "t", Operation.ALL), acl(T, "t", Operation.READ, DENY))
    assert held.may(T, "t", Operation.DESCRIBE)
    assert not held.may(T, "t", Operation.READ)


def test_principal_and_host_must_match_and_the_wildcards_do() -> None:
    assert not access(acl(T, "t", Operation.READ, principal="User:bob")).may(T, "t", Operation.READ)
    assert access(acl(T, "t", Operation.READ, principal="User:*")).may(T, "t", Operation.READ)
    assert access(acl(T, "t", Operation.READ, host="10.0.0.1")).may(T, "t", Operation.READ)
    assert not access(acl(T, "t", Operation.READ, host="10.0.0.2")).may(T, "t", Operation.READ)


def test_the_tokens_file_roles_are_read_as_allows_under_the_prefixes() -> None:
    producer = access(roles=("producer",))
    producer.produce("own-t", "own-tx")
    with pytest.raises(TopicAuthorizationFailed):
        producer.fetch("own-t")
    with pytest.raises(TransactionalIdAuthorizationFailed):
        producer.init_pid("their-tx")
    consumer = access(roles=("consumer",))
    consumer.offsets("own-g", ["own-t"])
    with pytest.raises(GroupAuthorizationFailed, match="DELETE group"):
        consumer.delete_group("own-g")
    with pytest.raises(ClusterAuthorizationFailed):
        consumer.cluster()


def test_acls_grant_what_no_role_does() -> None:
    held = access(
        acl(C, "kafka-cluster", Operation.CREATE),
        acl(G, "own-g", Operation.DELETE),
        acl(X, "etl-", Operation.WRITE, pattern=PRE),
    )
    held.topic_or_cluster("new-topic", Operation.CREATE)
    held.delete_group("own-g")
    held.init_pid("etl-1")
    held.transactional_prefix("etl-1")
    with pytest.raises(ClusterAuthorizationFailed):
        held.cluster(Operation.ALTER)


def test_a_prefix_of_ids_needs_a_pattern_covering_all_of_them() -> None:
    literal = access(acl(X, "etl", Operation.WRITE))
    literal.transactional_id("etl")
    with pytest.raises(TransactionalIdAuthorizationFailed):
        literal.transactional_prefix("etl")


def test_an_idempotent_producer_needs_idempotent_write_or_write_on_some_topic() -> None:
    with pytest.raises(ClusterAuthorizationFailed):
        access().init_pid(None)
    access(roles=("producer",)).init_pid(None)
    access(acl(C, "kafka-cluster", Operation.IDEMPOTENT_WRITE)).init_pid(None)
    access(acl(T, "pay.", Operation.WRITE, pattern=PRE)).init_pid(None)
    with pytest.raises(ClusterAuthorizationFailed):
        access(
            acl(T, "pay.", Operation.WRITE, pattern=PRE), acl(T, "pay", Operation.ALL, DENY, PRE)
        ).init_pid(None)


def test_authorized_operations_come_from_the_same_checks() -> None:
    held = access(acl(T, "t", Operation.ALTER_CONFIGS), acl(T, "t", Operation.READ))
    bits = held.topic_operations("t")
    assert bits == (1 << 3) | (1 << 8) | (1 << 10) | (1 << 11)
    assert access(acl(G, "g", Operation.DELETE)).group_operations("g") == (1 << 6) | (1 << 8)


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (Acl(ResourceType.ANY, "t", LIT, "User:a", "*", Operation.READ, ALLOW), "resourceType"),
        (Acl(T, "t", PatternType.MATCH, "User:a", "*", Operation.READ, ALLOW), "patternType"),
        (Acl(T, "t", LIT, "User:a", "*", Operation.ANY, ALLOW), "operation"),
        (Acl(T, "t", LIT, "User:a", "*", Operation.READ, Permission.ANY), "permissionType"),
        (Acl(C, "other", LIT, "User:a", "*", Operation.ALTER, ALLOW), "kafka-cluster"),
        (Acl(T, "", LIT, "User:a", "*", Operation.READ, ALLOW), "empty resource name"),
        (Acl(T, "t", LIT, "alice", "*", Operation.READ, ALLOW), "parse principal"),
        (Acl(T, "t\0", LIT, "User:a", "*", Operation.READ, ALLOW), "NUL"),
    ],
)
def test_kafka_s_refusals_of_a_new_acl(bad: Acl, message: str) -> None:
    with pytest.raises(InvalidAcl, match=message):
        check_new(bad)


def test_filters_match_as_kafka_s_binding_filter() -> None:
    literal = acl(T, "pay", Operation.READ)
    prefixed = acl(T, "pa", Operation.WRITE, pattern=PRE)
    wildcard = acl(T, "*", Operation.READ)
    every = AclFilter.of(1, None, 1, None, None, 1, 1)
    assert all(every.matches(a) for a in (literal, prefixed, wildcard))
    match = AclFilter.of(2, "pay", 2, None, None, 1, 1)
    assert [match.matches(a) for a in (literal, prefixed, wildcard)] == [True, True, True]
    exact = AclFilter.of(2, "pay", 3, None, None, 1, 1)
    assert [exact.matches(a) for a in (literal, prefixed, wildcard)] == [True, False, False]
    by_entry = AclFilter.of(1, None, 1, "User:alice", "*", 4, 3)
    assert [by_entry.matches(a) for a in (literal, prefixed)] == [False, True]
    with pytest.raises(InvalidAcl):
        AclFilter.of(99, None, 1, None, None, 1, 1).check()


def test_a_verdict_says_none_when_no_acl_speaks() -> None:
    held = Acls([acl(T, "t", Operation.READ)])
    assert held.verdict("User:alice", "h", T, "t", Operation.WRITE) is Verdict.NONE
    assert held.verdict("User:alice", "h", T, "t", Operation.READ) is Verdict.ALLOWED
