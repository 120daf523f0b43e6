"""A streams group's topology configured against the topics (`coordinator.groups.streams_topology`,
pure): missing sources, repartition topics' partition counts (fixed, or their writers' largest
source, through chains), co-partitioning, changelogs one partition per task, internal topics to
create or found wrongly partitioned, and topologies no streams application sends."""

from __future__ import annotations

import pytest

from coordinator.groups.streams_topology import (
    INCORRECTLY_PARTITIONED_TOPICS,
    MISSING_INTERNAL_TOPICS,
    MISSING_SOURCE_TOPICS,
    StreamsInvalidTopology,
    Subtopology,
    TopicInfo,
    Topology,
    configure,
    endpoint_partitions,
)

COMPACT = (("cleanup.policy", "compact"),)


def topics(**counts: int):  # type: ignore[no-untyped-def]
    return counts.get


def two_step(repartition: int = 0) -> Topology:
    """Streams' usual shape: subtopology 0 reads `in` and writes `rep`; 1 reads `rep` into a
    store with a changelog."""
    return Topology(
        1,
        (
            Subtopology("0", ("in",), ("rep",)),
            Subtopology(
                "1",
                repartition_source_topics=(TopicInfo("rep", repartition),),
                state_changelog_topics=(TopicInfo("store-changelog", configs=COMPACT),),
            ),
        ),
    )


def test_a_repartition_topic_takes_its_writers_largest_source_and_a_changelog_one_per_task() -> (
    None
):
    configured = configure(two_step(), topics(**{"in": 3}))
    assert configured.task_counts == {}
    assert sorted((t.name, t.partitions, t.configs) for t in configured.to_create) == [
        ("rep", 3, ()),
        ("store-changelog", 3, COMPACT),
    ]
    assert [code for code, _ in configured.statuses] == [MISSING_INTERNAL_TOPICS]

    made = configure(two_step(), topics(**{"in": 3, "rep": 3, "store-changelog": 3}))
    assert made.task_counts == {"0": 3, "1": 3}
    assert made.to_create == [] and made.statuses == []


def test_a_fixed_repartition_count_wins_and_a_wrongly_partitioned_internal_topic_is_reported() -> (
    None
):
    configured = configure(two_step(repartition=5), topics(**{"in": 3}))
    assert {t.name: t.partitions for t in configured.to_create} == {"rep": 5, "store-changelog": 5}

    wrong = configure(two_step(), topics(**{"in": 3, "rep": 2}))
    assert wrong.task_counts == {} and wrong.to_create == []
    [(code, detail)] = wrong.statuses
    assert code == INCORRECTLY_PARTITIONED_TOPICS and "rep" in detail and "3" in detail


def test_repartition_counts_follow_a_chain_and_a_cycle_with_no_count_is_refused() -> None:
    chain = Topology(
        1,
        (
            Subtopology("0", ("in",), ("a",)),
            Subtopology("1", (), ("b",), repartition_source_topics=(TopicInfo("a"),)),
            Subtopology("2", repartition_source_topics=(TopicInfo("b"),)),
        ),
    )
    configured = configure(chain, topics(**{"in": 4}))
    assert {t.name: t.partitions for t in configured.to_create} == {"a": 4, "b": 4}

    cycle = Topology(
        1,
        (
            Subtopology("0", (), ("b",), repartition_source_topics=(TopicInfo("a"),)),
            Subtopology("1", (), ("a",), repartition_source_topics=(TopicInfo("b"),)),
        ),
    )
    with pytest.raises(StreamsInvalidTopology, match="Failed to compute"):
        configure(cycle, topics())


def test_missing_source_topics_are_named_and_nothing_is_created() -> None:
    configured = configure(two_step(), topics())
    assert configured.to_create == [] and configured.task_counts == {}
    assert configured.statuses == [(MISSING_SOURCE_TOPICS, "Source topics in are missing.")]


def test_co_partitioned_sources_must_agree_and_a_repartition_topic_adopts_their_count() -> None:
    join = Topology(
        1,
        (
            Subtopology("0", ("left",), ("rekeyed",)),
            Subtopology(
                "1",
                ("right",),
                repartition_source_topics=(TopicInfo("rekeyed"),),
                copartition_groups=(("right", "rekeyed"),),
            ),
        ),
    )
    # `rekeyed` would take 8 from its writer; co-partitioned with `right` it takes 2.
    configured = configure(join, topics(left=8, right=2))
    assert {t.name: t.partitions for t in configured.to_create} == {"rekeyed": 2}

    both_external = Topology(1, (Subtopology("0", ("x", "y"), copartition_groups=(("x", "y"),)),))
    [(code, detail)] = configure(both_external, topics(x=2, y=3)).statuses
    assert code == INCORRECTLY_PARTITIONED_TOPICS and "co-partitioned" in detail
    assert configure(both_external, topics(x=3, y=3)).task_counts == {"0": 3}


@pytest.mark.parametrize(
    ("topology", "complaint"),
    [
        (Topology(1, ()), "no subtopologies"),
        (Topology(-1, (Subtopology("0", ("a",)),)), "non-negative"),
        (Topology(1, (Subtopology("0", ("a",)), Subtopology("0", ("b",)))), "repeat"),
        (Topology(1, (Subtopology("0"),)), "reads from no topic"),
        (
            Topology(
                1,
                (
                    Subtopology("0", ("a",), state_changelog_topics=(TopicInfo("c"),)),
                    Subtopology("1", ("b",), state_changelog_topics=(TopicInfo("c"),)),
                ),
            ),
            "named twice",
        ),
        (
            Topology(1, (Subtopology("0", repartition_source_topics=(TopicInfo("r"),)),)),
            "no partition count",
        ),
        (
            Topology(1, (Subtopology("0", repartition_source_topics=(TopicInfo("r", -1),)),)),
            "partitions -1",
        ),
        (
            Topology(1, (Subtopology("0", ("a",), state_changelog_topics=(TopicInfo("c", 3),)),)),
            "undefined partition count",
        ),
    ],
)
def test_topologies_no_streams_application_sends_are_refused(
    topology: Topology, complaint: str
) -> None:
    with pytest.raises(StreamsInvalidTopology, match=complaint):
        topology.check()


def test_a_topology_survives_its_json_and_tasks_map_to_the_partitions_they_serve() -> None:
    topology = two_step(repartition=2)
    assert Topology.of_json(topology.as_json()) == topology
    assert endpoint_partitions(topology, [("0", 1), ("1", 0), ("9", 3)]) == [
        ("in", 1),
        ("rep", 0),
    ]
