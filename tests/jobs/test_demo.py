"""`coordinator demo` end to end, as a user runs it: an embedded coordinator, payments through
lost answers, the settlement job on the Spark mini cluster with a task attempt killed midway
and a straggler, settlements into a SQL table and paid out once each at a stand-in bank.
Exactly once must hold (`mismatches` 0) while the faults really happened: answers lost and
deduplicated, attempts failed, speculative copies run."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

# No skip without pyspark or Java: the README's test command installs pyspark, and a machine
# without Java fails here, saying so, rather than passing quietly.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def test_demo_settles_every_payment_once_despite_retries_failures_and_speculation() -> None:
    events, merchants = 400, 8
    options = ["--events", str(events), "--merchants", str(merchants), "--seed", "11"]
    run = subprocess.run(
        [sys.executable, "-m", "coordinator", "demo", *options],
        capture_output=True,
        text=True,
        timeout=840,
    )
    report = run.stdout
    assert run.returncode == 0, f"{report[-4000:]}\n--- stderr\n{run.stderr[-4000:]}"
    figures = json.loads(report.strip().splitlines()[-1])

    assert figures["mismatches"] == 0, report
    assert figures["events"] == figures["payments_in_log"] == events
    assert figures["settlements_written"] == figures["settlements_expected"] > 0
    # The faults happened: lost answers were retried and recognised ...
    assert figures["responses_dropped"] > 0
    assert figures["retries_deduplicated"] == figures["responses_dropped"]
    # ... attempts died midway and stragglers got speculative copies that won ...
    assert figures["task_attempts_failed"] > 0, report
    assert figures["task_attempts_speculated"] > 0, report
    assert figures["speculative_wins"] > 0, report
    # ... the settlements went into the SQL table, what the lost attempts had staged thrown away
    # by the commits ...
    assert figures["output"] == "sql" and figures["sql_commits"] == figures["rounds"]
    assert figures["staged_rows_discarded"] > 0
    # ... and the bank was called once per payout, despite a killed and a stalled payout task.
    assert figures["bank_calls"] == figures["payouts"] == figures["settlements_expected"]
    assert "exactly once held" in report
