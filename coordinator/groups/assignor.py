"""The coordinator's assignor: spreads the subscribed topics' partitions evenly over the members
that subscribe to them, keeping each partition where it is wherever balance allows (sticky).

A pure function of its inputs, so it is tested on its own and gives every service process the
same answer for the same group. Written here rather than taken from a library: Kafka's own
assignors live in the Java broker, and this one is small.

"Even" means: no partition could move to another member subscribed to its topic that has two or
more fewer partitions. With identical subscriptions that is Kafka's uniform assignor's result:
partition counts differ by at most one.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

TopicPartition = tuple[str, int]


def assign(
    subscriptions: Mapping[str, Iterable[str]],
    partitions: Mapping[str, int],
    current: Mapping[TopicPartition, str],
) -> dict[TopicPartition, str]:
    """The target owner of every partition some member subscribes to.

    `subscriptions`: member id -> subscribed topics; `partitions`: topic -> partition count;
    `current`: the previous target (partition -> member), which the answer keeps where it can.
    Deterministic: ties go to the member id that sorts first.
    """
    members = sorted(subscriptions)
    subscribed = {m: frozenset(subscriptions[m]) for m in members}
    eligible: dict[str, list[str]] = {}
    for topic in sorted({t for topics in subscribed.values() for t in topics}):
        if partitions.get(topic, 0) > 0:
            eligible[topic] = [m for m in members if topic in subscribed[m]]

    owned: dict[str, list[TopicPartition]] = {m: [] for m in members}
    target: dict[TopicPartition, str] = {}
    unassigned: list[TopicPartition] = []
    for topic in eligible:
        for partition in range(partitions[topic]):
            tp = (topic, partition)
            keeper = current.get(tp)
            if keeper is not None and keeper in subscribed and topic in subscribed[keeper]:
                target[tp] = keeper
                owned[keeper].append(tp)
            else:
                unassigned.append(tp)

    # Each new partition to the least loaded member that may take it.
    for tp in unassigned:
        chosen = min(eligible[tp[0]], key=lambda m: (len(owned[m]), m))
        target[tp] = chosen
        owned[chosen].append(tp)

    # Then move partitions from the most loaded member to the least loaded one subscribed to their
    # topic while the two differ by two or more. Each move lowers the sum of squared loads, so
    # this ends; only as many partitions move as balance needs.
    while True:
        move = _next_move(members, owned, eligible)
        if move is None:
            return target
        giver, taker, tp = move
        owned[giver].remove(tp)
        owned[taker].append(tp)
        target[tp] = taker


def _next_move(
    members: list[str],
    owned: dict[str, list[TopicPartition]],
    eligible: dict[str, list[str]],
) -> tuple[str, str, TopicPartition] | None:
    for giver in sorted(members, key=lambda m: (-len(owned[m]), m)):
        for topic in sorted({t for t, _ in owned[giver]}):
            taker = min(eligible[topic], key=lambda m: (len(owned[m]), m))
            if len(owned[giver]) - len(owned[taker]) >= 2:
                # The partition that came last: the ones held longest stay.
                tp = max(tp for tp in owned[giver] if tp[0] == topic)
                return giver, taker, tp
    return None
