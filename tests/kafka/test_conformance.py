"""Differential conformance in the suite (issue 38, item 3): the corpus of
`tests/support/conformance_corpus.py` replayed against the listener, on both stores, and held to
Apache Kafka's answers as `bench/conformance.py` recorded them from the real broker
(`conformance_kafka.json`). Every difference must be one `KNOWN` explains; the findings table is
`docs/pages/conformance.md`. No JVM runs here: Kafka's side is the recording.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from coordinator.kafka.server import KafkaListener
from coordinator.kafka.wire import SUPPORTED
from tests.support.conformance import differences, explain, run_scenario
from tests.support.conformance_corpus import KNOWN, SCENARIOS
from tests.support.kafka_listener import connect, listener

__all__ = ["listener"]

RECORDED = json.loads((Path(__file__).parent / "conformance_kafka.json").read_text())


def test_the_recording_covers_the_corpus_and_every_served_api_and_version() -> None:
    assert set(RECORDED["scenarios"]) == set(SCENARIOS)
    sent = {
        (step["api_key"], step["version"])
        for steps in RECORDED["scenarios"].values()
        for step in steps
    }
    served = {(key, v) for key, (low, high) in SUPPORTED.items() for v in range(low, high + 1)}
    assert served - sent == set(), "served versions the corpus never sends"


# The listener as the reference broker is set: a first rebalance that does not wait for more
# members (group.initial.rebalance.delay.ms 0).
@pytest.mark.parametrize("listener", [{"group_initial_rebalance_delay_ms": 0}], indirect=True)
@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
async def test_the_listener_answers_as_kafka_does(listener: KafkaListener, scenario: str) -> None:
    async def connection() -> Any:
        return await connect(listener)

    ours = await run_scenario(SCENARIOS, scenario, connection)
    found = differences(scenario, RECORDED["scenarios"][scenario], ours)
    unexplained = [
        f"{d.where}: Kafka {json.dumps(d.kafka)[:200]}, listener {json.dumps(d.ours)[:200]}"
        for d in found
        if explain(d, KNOWN) is None
    ]
    assert unexplained == []
