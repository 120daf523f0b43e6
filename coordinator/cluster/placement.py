"""Where things live in a cluster of brokers: the pure rules, no I/O.

- *Partition leadership* (`moves`): every partition led by a broker that is not live (or by
  none yet) goes to a live one, and leadership is then evened out, topic by topic and over the
  whole cluster, moving no more partitions than that takes (stable: a broker's death moves its
  partitions alone; a broker that joins takes its share and nothing else moves).
- *Coordinators* of groups and transactional ids (`coordinator_of`): rendezvous hashing over
  the live brokers, so a key moves only when its broker dies or a broker joins that outweighs
  it (Kafka hashes a key to a partition of `__consumer_offsets` and takes its leader; the
  effect, a key's coordinator spread evenly and stable, is the same).
"""

from __future__ import annotations

import hashlib
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

Key = tuple[str, int]  # (topic, partition)


@dataclass(frozen=True, slots=True)
class Broker:
    broker_id: int
    host: str
    port: int
    rack: str | None = None


def coordinator_of(key: str, live: Sequence[int]) -> int:
    """The live broker that coordinates `key` (a group id, a transactional id): the one whose
    hash with the key weighs most."""
    if not live:
        raise ValueError("no live broker")
    return max(live, key=lambda broker: (_weight(key, broker), -broker))


def _weight(key: str, broker: int) -> int:
    digest = hashlib.blake2b(f"{broker}\0{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def moves(leaders: Mapping[Key, int | None], live: Sequence[int]) -> dict[Key, int]:
    """The partitions that change leader, and to which live broker: first those whose leader is
    not live, each to the live broker leading fewest of its topic (then fewest in all, then the
    lowest id); then, while a broker leads two more of a topic than another, one of them moves
    to the other; then, while a broker leads two more in all than another, one moves where that
    leaves its topic no less even. Nothing moves when there is no live broker."""
    if not live:
        return {}
    brokers = sorted(set(live))
    placed: dict[Key, int] = {}
    total: Counter[int] = Counter({b: 0 for b in brokers})
    by_topic: dict[str, dict[int, list[int]]] = defaultdict(lambda: {b: [] for b in brokers})
    orphans: list[Key] = []
    for key in sorted(leaders):
        leader = leaders[key]
        if leader is not None and leader in total:
            placed[key] = leader
            total[leader] += 1
            by_topic[key[0]][leader].append(key[1])
        else:
            orphans.append(key)
    moved: dict[Key, int] = {}

    def move(key: Key, to: int) -> None:
        topic, partition = key
        was = placed.get(key)
        if was is not None:
            by_topic[topic][was].remove(partition)
            total[was] -= 1
        by_topic[topic][to].append(partition)
        total[to] += 1
        placed[key] = to
        if leaders[key] == to:
            moved.pop(key, None)
        else:
            moved[key] = to

    for key in orphans:
        counts = by_topic[key[0]]
        move(key, min(brokers, key=lambda b: (len(counts[b]), total[b], b)))
    for topic in sorted(by_topic):
        counts = by_topic[topic]
        while True:
            most = max(brokers, key=lambda b: (len(counts[b]), total[b], -b))
            fewest = min(brokers, key=lambda b: (len(counts[b]), total[b], b))
            if len(counts[most]) - len(counts[fewest]) <= 1:
                break
            move((topic, max(counts[most])), fewest)
    while True:
        most = max(brokers, key=lambda b: (total[b], -b))
        fewest = min(brokers, key=lambda b: (total[b], b))
        if total[most] - total[fewest] <= 1:
            break
        candidates = [
            (topic, max(counts[most]))
            for topic, counts in sorted(by_topic.items())
            if len(counts[most]) > len(counts[fewest])
        ]
        if not candidates:
            break
        move(candidates[0], fewest)
    return moved
