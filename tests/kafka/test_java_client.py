"""Apache Kafka's own Java client (kafka-clients, pinned in tests/clients/java/pom.xml), unchanged,
against `coordinator serve`'s Kafka listener on SQLite and on Postgres.

One JVM per store runs every scenario of `tests/clients/java/.../Scenarios.java` (admin calls
and describeCluster; an idempotent producer; transactions committed and aborted under
read_committed; the exactly-once loop with `sendOffsetsToTransaction(offsets,
consumer.groupMetadata())` and one aborted round; a zombie fenced as the client documents,
ProducerFencedException; a transaction the coordinator aborted on its timeout, which the
producer aborts and goes on from; a group of two under `group.protocol=classic` and under
`group.protocol=consumer`; static membership under both; a client-metrics subscription set with
the Admin client, whose producer's pushed metrics (KIP-714) `GET /metrics` then shows), and each
scenario is a test here, so a gap shows as a failing cell. The client runs transaction version 2
(KIP-890), which the listener finalizes: the transactions scenario checks the epoch each end
raised. The README's test command builds it (`mvn package`); a missing build fails, never skips.
"""

from __future__ import annotations

import json
import os
import subprocess
from typing import Any

import pytest

from tests.support.java import java_command
from tests.support.kafka_broker import Broker, broker

__all__ = ["broker"]

pytestmark = pytest.mark.slow

SCENARIOS = [
    "admin",
    "idempotent_producer",
    "transactions",
    "exactly_once_loop",
    "zombie_fencing",
    "timed_out_transaction",
    "group_of_two_classic",
    "group_of_two_consumer",
    "static_membership",
    "static_membership_consumer",
    "telemetry",
]


@pytest.fixture(scope="module")
def outcomes(broker: Broker) -> dict[str, dict[str, Any]]:
    done = subprocess.run(
        java_command(broker.bootstrap, *SCENARIOS),
        env={**os.environ, "COORDINATOR_METRICS_URL": f"{broker.url}/metrics"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    found = {line["scenario"]: line for line in lines}
    assert sorted(found) == sorted(SCENARIOS), done.stdout + done.stderr[-4000:]
    return found


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_java_client(outcomes: dict[str, dict[str, Any]], scenario: str) -> None:
    outcome = outcomes[scenario]
    assert outcome["ok"], outcome["detail"]
