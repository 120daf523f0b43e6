"""A streams group's topology (KIP-1071) as data, and the rules by which the coordinator
configures it, as Kafka's InternalTopicManager does, with no I/O: which source topics are
missing, how many partitions each internal topic needs (a repartition topic as many as the
largest source topic of the subtopologies that write to it, or what it fixes; co-partitioned
topics alike; a changelog topic one per task), how many tasks each subtopology has (its
largest source topic, repartition topics included), and which internal topics must be created.

The service creates the missing internal topics (`coordinator.groups.streams`), and the tasks
are assigned to the members as a consumer group's partitions are (`groups.membership`): a task
is to a streams group what a partition is to a consumer group.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from coordinator.core.errors import CoordinatorError

# Kafka's StreamsGroupHeartbeatResponse.Status codes.
STALE_TOPOLOGY = 0
MISSING_SOURCE_TOPICS = 1
INCORRECTLY_PARTITIONED_TOPICS = 2
MISSING_INTERNAL_TOPICS = 3
SHUTDOWN_APPLICATION = 4


class StreamsInvalidTopology(CoordinatorError):
    code = "STREAMS_INVALID_TOPOLOGY"
    status = 400
    title = "Invalid streams topology"


@dataclass(frozen=True, slots=True)
class TopicInfo:
    """An internal topic as the topology states it: partitions 0 for the coordinator to
    decide (always 0 for a changelog), replication factor 0 for the default."""

    name: str
    partitions: int = 0
    replication_factor: int = 0
    configs: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class Subtopology:
    id: str
    source_topics: tuple[str, ...] = ()
    repartition_sink_topics: tuple[str, ...] = ()
    state_changelog_topics: tuple[TopicInfo, ...] = ()
    repartition_source_topics: tuple[TopicInfo, ...] = ()
    # Groups of this subtopology's source topics (both kinds, by name) that must be
    # co-partitioned.
    copartition_groups: tuple[tuple[str, ...], ...] = ()

    def all_sources(self) -> list[str]:
        return [*self.source_topics, *(t.name for t in self.repartition_source_topics)]


@dataclass(frozen=True, slots=True)
class Topology:
    epoch: int
    subtopologies: tuple[Subtopology, ...]

    def check(self) -> None:
        """STREAMS_INVALID_TOPOLOGY for a topology no streams application sends."""
        if self.epoch < 0:
            raise StreamsInvalidTopology("Topology epoch must be non-negative.")
        if not self.subtopologies:
            raise StreamsInvalidTopology("the topology has no subtopologies")
        ids = [s.id for s in self.subtopologies]
        if len(set(ids)) != len(ids):
            raise StreamsInvalidTopology(f"subtopology ids repeat: {sorted(ids)}")
        internal: list[str] = []
        for s in self.subtopologies:
            if not s.all_sources():
                raise StreamsInvalidTopology(f"subtopology {s.id!r} reads from no topic")
            # (The replication factor is not checked: Streams sends -1 for the default, and
            # the store keeps one copy whatever it says.)
            for t in s.repartition_source_topics:
                if t.partitions < 0:
                    raise StreamsInvalidTopology(
                        f"repartition topic {t.name!r}: partitions {t.partitions} (0 for the "
                        "coordinator's choice, else positive)"
                    )
            for t in s.state_changelog_topics:
                if t.partitions:
                    raise StreamsInvalidTopology(
                        f"Changelog topic {t.name} must have an undefined partition count, but "
                        f"it is set to {t.partitions}."
                    )
            internal += [t.name for t in (*s.state_changelog_topics, *s.repartition_source_topics)]
        if len(set(internal)) != len(internal):
            raise StreamsInvalidTopology("an internal topic is named twice in the topology")
        sinks = {t for s in self.subtopologies for t in s.repartition_sink_topics}
        for s in self.subtopologies:
            for t in s.repartition_source_topics:
                if t.name not in sinks and t.partitions == 0:
                    raise StreamsInvalidTopology(
                        f"repartition topic {t.name!r} of subtopology {s.id!r} has no partition "
                        "count and no subtopology writes to it"
                    )

    def as_json(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "subtopologies": [
                {
                    "id": s.id,
                    "source_topics": list(s.source_topics),
                    "repartition_sink_topics": list(s.repartition_sink_topics),
                    "state_changelog_topics": [_topic_json(t) for t in s.state_changelog_topics],
                    "repartition_source_topics": [
                        _topic_json(t) for t in s.repartition_source_topics
                    ],
                    "copartition_groups": [list(g) for g in s.copartition_groups],
                }
                for s in self.subtopologies
            ],
        }

    @classmethod
    def of_json(cls, doc: Mapping[str, Any]) -> Topology:
        return cls(
            doc["epoch"],
            tuple(
                Subtopology(
                    s["id"],
                    tuple(s["source_topics"]),
                    tuple(s["repartition_sink_topics"]),
                    tuple(_topic_of(t) for t in s["state_changelog_topics"]),
                    tuple(_topic_of(t) for t in s["repartition_source_topics"]),
                    tuple(tuple(g) for g in s["copartition_groups"]),
                )
                for s in doc["subtopologies"]
            ),
        )


def _topic_json(t: TopicInfo) -> dict[str, Any]:
    return {
        "name": t.name,
        "partitions": t.partitions,
        "replication_factor": t.replication_factor,
        "configs": [list(kv) for kv in t.configs],
    }


def _topic_of(doc: Mapping[str, Any]) -> TopicInfo:
    return TopicInfo(
        doc["name"],
        doc["partitions"],
        doc["replication_factor"],
        tuple((k, v) for k, v in doc["configs"]),
    )


@dataclass(frozen=True, slots=True)
class InternalTopic:
    name: str
    partitions: int
    configs: tuple[tuple[str, str], ...]


@dataclass
class Configured:
    """The topology against the topics as they are: each subtopology's task count (none while
    something is wrong), the internal topics to create, and the statuses to tell members."""

    task_counts: dict[str, int] = field(default_factory=dict)
    to_create: list[InternalTopic] = field(default_factory=list)
    statuses: list[tuple[int, str]] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {"task_counts": self.task_counts, "statuses": [list(s) for s in self.statuses]}


class _Unconfigurable(Exception):
    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status, self.detail = status, detail


def configure(topology: Topology, partitions_of: Callable[[str], int | None]) -> Configured:
    """`topology` against the topics `partitions_of` knows (their partition counts; None: no
    such topic)."""
    try:
        _missing_sources(topology, partitions_of)
        decided = _repartition_counts(topology, partitions_of)
        _copartition(topology, partitions_of, decided)
        tasks = {
            s.id: max(_count(name, partitions_of, decided) for name in s.all_sources())
            for s in topology.subtopologies
        }
        for s in topology.subtopologies:
            for t in s.state_changelog_topics:
                decided[t.name] = tasks[s.id]
        to_create = []
        for s in topology.subtopologies:
            for t in (*s.repartition_source_topics, *s.state_changelog_topics):
                existing = partitions_of(t.name)
                if existing is None:
                    to_create.append(InternalTopic(t.name, decided[t.name], t.configs))
                elif existing != decided[t.name]:
                    raise _Unconfigurable(
                        INCORRECTLY_PARTITIONED_TOPICS,
                        f"Existing topic {t.name} has different number of partitions: expected "
                        f"{decided[t.name]}, found {existing}",
                    )
    except _Unconfigurable as failure:
        return Configured(statuses=[(failure.status, failure.detail)])
    if to_create:
        names = ", ".join(sorted(t.name for t in to_create))
        return Configured(
            to_create=to_create,
            statuses=[(MISSING_INTERNAL_TOPICS, f"Internal topics are missing: {names}")],
        )
    return Configured(task_counts=tasks)


def _missing_sources(topology: Topology, partitions_of: Callable[[str], int | None]) -> None:
    missing = sorted(
        {t for s in topology.subtopologies for t in s.source_topics if partitions_of(t) is None}
    )
    if missing:
        names = ", ".join(missing)
        raise _Unconfigurable(MISSING_SOURCE_TOPICS, f"Source topics {names} are missing.")


def _count(
    name: str, partitions_of: Callable[[str], int | None], decided: Mapping[str, int]
) -> int:
    if name in decided:
        return decided[name]
    found = partitions_of(name)
    if found is None:
        raise _Unconfigurable(MISSING_SOURCE_TOPICS, f"Source topics {name} are missing.")
    return found


def _repartition_counts(
    topology: Topology, partitions_of: Callable[[str], int | None]
) -> dict[str, int]:
    """Each repartition topic's partitions: its own if it states them, else the largest source
    topic of the subtopologies that write to it (found as far as upstream counts allow)."""
    decided = {
        t.name: t.partitions
        for s in topology.subtopologies
        for t in s.repartition_source_topics
        if t.partitions > 0
    }
    pending = {
        t.name
        for s in topology.subtopologies
        for t in s.repartition_source_topics
        if t.partitions == 0
    }
    while pending:
        progress = False
        for name in sorted(pending):
            writers = [s for s in topology.subtopologies if name in s.repartition_sink_topics]
            counts = []
            for w in writers:
                for source in w.all_sources():
                    if source in decided:
                        counts.append(decided[source])
                    elif source not in pending:
                        found = partitions_of(source)
                        if found is not None:
                            counts.append(found)
            if counts:
                decided[name] = max(counts)
                pending.discard(name)
                progress = True
        if not progress:
            raise StreamsInvalidTopology(
                "Failed to compute number of partitions for all repartition topics: "
                + ", ".join(sorted(pending))
            )
    return decided


def _copartition(
    topology: Topology, partitions_of: Callable[[str], int | None], decided: dict[str, int]
) -> None:
    """Co-partitioned topics have one partition count: the external topics' (which must
    agree), else the largest fixed repartition topic's, else the largest decided one; a
    flexible repartition topic takes it."""
    fixed = {
        t.name for s in topology.subtopologies for t in s.repartition_source_topics if t.partitions
    }
    for s in topology.subtopologies:
        repartition = {t.name for t in s.repartition_source_topics}
        for group in s.copartition_groups:
            external = {t: partitions_of(t) for t in group if t not in repartition}
            counts = {c for c in external.values() if c is not None}
            if len(counts) > 1:
                raise _Unconfigurable(
                    INCORRECTLY_PARTITIONED_TOPICS,
                    f"Topics {sorted(external)} must be co-partitioned, but have partition "
                    f"counts {sorted(counts)}",
                )
            internal = [t for t in group if t in repartition]
            if counts:
                target = counts.pop()
            elif any(t in fixed for t in internal):
                target = max(decided[t] for t in internal if t in fixed)
            elif internal:
                target = max(decided[t] for t in internal)
            else:
                continue
            for t in internal:
                if t in fixed and decided[t] != target:
                    raise _Unconfigurable(
                        INCORRECTLY_PARTITIONED_TOPICS,
                        f"Repartition topic {t} has {decided[t]} partitions, but must be "
                        f"co-partitioned with topics of {target}",
                    )
                decided[t] = target


def endpoint_partitions(
    topology: Topology, active: Iterable[tuple[str, int]]
) -> list[tuple[str, int]]:
    """The topic partitions active tasks materialize (Interactive Queries' map): each task's
    source topics' partition of its number."""
    by_id = {s.id: s for s in topology.subtopologies}
    out: set[tuple[str, int]] = set()
    for sub, partition in active:
        s = by_id.get(sub)
        if s is not None:
            out.update((t, partition) for t in s.all_sources())
    return sorted(out)
