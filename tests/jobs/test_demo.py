"""`coordinator demo`, the README's first command: its CLI (options and defaults, an accurate
`--help`, bad options or a missing pyspark refused with a clear line and status 2 before anything
starts); its parts that need no Spark (the payments it generates, the transport that loses answers
and what it counts, the reconciliation that decides `mismatches`, the faults it chooses, how it
reads Spark's event log and the coordinator's admin listing); and the demo end to end, as a user
runs it: an embedded coordinator, payments through lost answers, the settlement job on the Spark
mini cluster with a task attempt killed midway and a straggler, settlements into a SQL table and
paid out once each at a stand-in bank. Exactly once must hold (`mismatches` 0) while the faults
really happened: answers lost and deduplicated, attempts failed, speculative copies run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from coordinator.cli import build_parser, main
from jobs.demo import (
    DroppingTransport,
    JobTransactions,
    SparkTasks,
    StandInBank,
    _demo,
    faults_for,
    generate_payments,
    produce_payments,
    reconcile,
    waves,
)
from jobs.settlement import Payment, Settlement, settle
from tests.support.sdk_support import Coordinator

# -- the CLI -------------------------------------------------------------------------------------


def test_demo_defaults() -> None:
    args = build_parser().parse_args(["demo"])
    assert args.run is _demo
    assert (args.events, args.merchants, args.rounds, args.seed) == (2000, 12, 2, 7)
    assert (args.drop_rate, args.master, args.keep) == (0.15, None, False)


def test_demo_options() -> None:
    sizes = ["--events", "300", "--merchants", "5", "--rounds", "1", "--seed", "3"]
    where = ["--drop-rate", "0.3", "--master", "local[2,3]", "--keep"]
    args = build_parser().parse_args(["demo", *sizes, *where])
    assert (args.events, args.merchants, args.rounds, args.seed) == (300, 5, 1, 3)
    assert (args.drop_rate, args.master, args.keep) == (0.3, "local[2,3]", True)


def test_demo_help_describes_the_run_and_local_mode() -> None:
    answer = subprocess.run(
        [sys.executable, "-m", "coordinator", "demo", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert answer.returncode == 0, answer.stderr
    text = " ".join(answer.stdout.split())
    for option in ("--events", "--merchants", "--rounds", "--seed", "--master", "--keep"):
        assert option in text
    assert "never speculates in local mode" in text
    assert "last line is one JSON object" in text
    assert "pip install '.[spark]'" in text


def test_top_level_help_lists_demo() -> None:
    assert "demo" in build_parser().format_help()


@pytest.mark.parametrize("events", ["0", "-3", "many"])
def test_bad_event_counts_are_refused(events: str) -> None:
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(["demo", "--events", events])
    assert exit_.value.code == 2


@pytest.mark.parametrize("rate", ["1", "1.5", "-0.1"])
def test_bad_drop_rates_are_refused(rate: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--drop-rate", rate]) == 2
    assert "--drop-rate" in capsys.readouterr().err


def test_without_pyspark_the_demo_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "pyspark", None)  # import pyspark raises ImportError
    assert main(["demo"]) == 2
    assert "pip install '.[spark]'" in capsys.readouterr().err


# -- payments ------------------------------------------------------------------------------------


def test_payments_are_reproducible_from_the_seed() -> None:
    assert generate_payments(50, 4, seed=3) == generate_payments(50, 4, seed=3)
    assert generate_payments(50, 4, seed=3) != generate_payments(50, 4, seed=4)


def test_payments_have_unique_ids_one_currency_per_merchant_and_cent_amounts() -> None:
    payments = generate_payments(500, 6, seed=1)
    assert len({p.payment_id for p in payments}) == 500
    currencies: dict[str, set[str]] = {}
    for p in payments:
        currencies.setdefault(p.merchant, set()).add(p.currency)
        assert 50 <= p.amount_minor <= 50_000
    assert all(len(c) == 1 for c in currencies.values())
    assert len(currencies) == 6


def test_waves_split_the_payments_in_order_without_loss() -> None:
    payments = generate_payments(11, 2, seed=1)
    parts = waves(payments, 3)
    assert [len(w) for w in parts] == [4, 4, 3]
    assert [p for w in parts for p in w] == payments


# -- the lossy transport -------------------------------------------------------------------------


def produce_answers(request: httpx.Request) -> httpx.Response:
    """A stand-in service: produce is answered `duplicate` when the same body comes again."""
    if not request.url.path.endswith("/records"):
        return httpx.Response(200, json={"ok": True})
    seen = produce_answers.seen  # type: ignore[attr-defined]
    body = request.content
    duplicate = body in seen
    seen.add(body)
    return httpx.Response(200, json={"base_offset": 0, "last_offset": 0, "duplicate": duplicate})


def test_transport_loses_only_produce_answers_and_counts_what_it_did() -> None:
    produce_answers.seen = set()  # type: ignore[attr-defined]
    transport = DroppingTransport(0.5, seed=1, inner=httpx.MockTransport(produce_answers))
    with httpx.Client(transport=transport, base_url="http://coordinator") as http:
        for _ in range(20):
            assert http.get("/v1/topics").status_code == 200  # never lost
        lost = 0
        for i in range(40):
            for _attempt in range(50):  # retry the same body until its answer arrives
                try:
                    http.post("/v1/topics/t/partitions/0/records", content=f"batch-{i}")
                    break
                except httpx.ReadError:
                    lost += 1
    assert transport.requests == 40 + lost
    assert transport.dropped == lost > 0
    # Every lost answer was followed by a retry of a stored batch: answered duplicate.
    assert transport.duplicates == lost


def test_transport_keeps_error_answers() -> None:
    def refuse(_: httpx.Request) -> httpx.Response:
        return httpx.Response(409, json={"code": "OUT_OF_ORDER_SEQUENCE_NUMBER"})

    transport = DroppingTransport(1.0, seed=1, inner=httpx.MockTransport(refuse))
    with httpx.Client(transport=transport, base_url="http://coordinator") as http:
        assert http.post("/v1/topics/t/partitions/0/records", content="x").status_code == 409
    assert (transport.requests, transport.dropped, transport.duplicates) == (1, 0, 0)


@pytest.mark.parametrize("seed", [1, 2])
def test_payments_through_lost_answers_are_in_the_log_exactly_once(
    service: Coordinator, seed: int
) -> None:
    service.create_topic("payments", 3)
    payments = generate_payments(300, 5, seed=seed)
    transport = DroppingTransport(0.3, seed=seed)
    produce_payments(service.url, payments, transport)
    logged = [Payment.from_json(v) for v in service.all_values("payments", 3)]
    assert sorted(logged, key=lambda p: p.payment_id) == payments
    assert transport.dropped > 0
    assert transport.duplicates == transport.dropped


# -- reconciliation ------------------------------------------------------------------------------


def expected_two_batches() -> list[Settlement]:
    payments = generate_payments(60, 3, seed=5)
    return settle(payments[:30], "b1") + settle(payments[30:], "b2")


def test_settlements_equal_to_the_expected_ones_are_no_mismatch() -> None:
    expected = expected_two_batches()
    check = reconcile(expected, list(reversed(expected)))
    assert check.mismatches == 0
    assert all(line.ok for line in check.lines)
    assert check.records == len(expected)


def test_a_duplicate_settlement_is_a_mismatch() -> None:
    expected = expected_two_batches()
    check = reconcile(expected, [*expected, expected[0]])
    assert check.duplicates == 1
    assert check.merchants_wrong == 1  # that merchant is settled twice over
    assert check.mismatches == 2


def test_a_missing_settlement_is_a_mismatch() -> None:
    expected = expected_two_batches()
    check = reconcile(expected, expected[1:])
    assert check.missing == 1
    assert check.mismatches == 2


def test_a_settlement_of_a_batch_nobody_ran_is_a_mismatch() -> None:
    expected = expected_two_batches()
    ghost = Settlement("b3", expected[0].merchant, expected[0].currency, 100, 1)
    check = reconcile(expected, [*expected, ghost])
    assert check.unexpected == 1
    assert check.mismatches == 2


def test_a_wrong_total_is_a_mismatch_even_when_the_merchant_sum_balances() -> None:
    expected = [Settlement("b1", "m-1", "EUR", 100, 1), Settlement("b2", "m-1", "EUR", 100, 1)]
    settled = [Settlement("b1", "m-1", "EUR", 150, 1), Settlement("b2", "m-1", "EUR", 50, 1)]
    check = reconcile(expected, settled)
    assert check.merchants_wrong == 0
    assert check.wrong == 2
    assert check.mismatches == 2


# -- faults, Spark's event log, the admin listing ------------------------------------------------


def test_faults_kill_the_busiest_task_and_stall_the_next_midway() -> None:
    # Ties go to the lower task number, so the choice is reproducible.
    assert faults_for({0: 3, 1: 3}, 1.0)[1][0].startswith("task 0 ")
    options, said = faults_for({0: 2, 1: 5, 2: 0, 3: 3}, 15.0)
    assert json.loads(options["testing.kill"]) == {
        "partitions": [1],
        "attempts": [0],
        "after_records": 2,
    }
    assert json.loads(options["testing.delay"]) == {
        "partitions": [3],
        "attempts": [0],
        "after_records": 1,
        "seconds": 15.0,
    }
    assert said == [
        "task 1 attempt 0 dies after writing 2 of its 5 records",
        "task 3 attempt 0 stalls 15 s after writing 1 of its 3 records",
    ]


def test_faults_need_tasks_with_output() -> None:
    assert faults_for({0: 0, 1: 0}, 15.0) == ({}, [])
    options, _ = faults_for({2: 1}, 15.0)
    assert set(options) == {"testing.kill"}


def task_end(stage: int, index: int, attempt: int, reason: str, speculative: bool) -> str:
    return json.dumps(
        {
            "Event": "SparkListenerTaskEnd",
            "Stage ID": stage,
            "Task End Reason": {"Reason": reason},
            "Task Info": {"Index": index, "Attempt": attempt, "Speculative": speculative},
        }
    )


def test_event_log_counts_failed_speculative_and_killed_attempts(tmp_path: Path) -> None:
    app = tmp_path / "eventlog_v2_app-1"
    app.mkdir()
    (app / "events_1_app-1").write_text(
        "\n".join(
            [
                json.dumps({"Event": "SparkListenerApplicationStart"}),
                task_end(3, 0, 0, "Success", False),
                task_end(3, 1, 0, "ExceptionFailure", False),
                task_end(3, 1, 1, "Success", False),
                task_end(3, 2, 1, "Success", True),
                task_end(3, 2, 0, "TaskKilled", False),
            ]
        )
    )
    tasks = SparkTasks.from_event_log(tmp_path)
    assert (tasks.failed, tasks.speculative, tasks.speculative_won, tasks.killed) == (1, 1, 1, 1)
    assert tasks.failures == ["stage 3 partition 1 attempt 0: ExceptionFailure"]


def test_admin_listing_counts_task_transactions_not_the_drivers() -> None:
    listing = [
        {"transactional_id": "settlement/driver", "state": "CompleteCommit"},
        {"transactional_id": "settlement/r1/0.0.11", "state": "CompleteCommit"},
        {"transactional_id": "settlement/r1/1.0.12", "state": "CompleteAbort"},
        {"transactional_id": "settlement/r1/1.1.15", "state": "CompleteCommit"},
        {"transactional_id": "settlement/r1/2.0.13", "state": "Ongoing"},
        {"transactional_id": "settlement/r1/3.0.14", "state": "Empty"},
        {"transactional_id": "settlement-stream/r1/0.0.1", "state": "CompleteAbort"},
    ]
    txns = JobTransactions.from_listing(listing, "settlement")
    assert (txns.committed, txns.aborted, txns.open) == (2, 1, 1)
    assert txns.aborted_attempts == ["r1/1.0.12"]


def test_the_stand_in_bank_counts_every_call_and_refuses_stale_fencing_tokens() -> None:
    with StandInBank() as bank:
        pay = {"key": "k", "merchant": "m-1", "currency": "EUR", "amount_minor": 150}
        assert httpx.post(bank.url, json={**pay, "fencing_token": 5}).status_code == 200
        assert httpx.post(bank.url, json={**pay, "fencing_token": 4}).status_code == 409
        assert httpx.post(bank.url, json={**pay, "fencing_token": 5}).status_code == 200
    assert (len(bank.calls), bank.refused) == (2, 1)  # a repeat is counted, never hidden
    assert bank.paid_per_merchant() == {("m-1", "EUR"): 300}


# -- end to end ----------------------------------------------------------------------------------


# No skip without pyspark or Java: the README's test command installs pyspark, and a machine
# without Java fails here, saying so, rather than passing quietly.
@pytest.mark.slow
@pytest.mark.timeout(900)
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
    # ... each loss counted in the report as the transport error the producer reported, not
    # printed as a warning
    assert figures["transport_errors_reported"] == figures["responses_dropped"]
    warned = [line for line in run.stderr.splitlines() if line.startswith("WARNING ")]
    assert warned == [], warned[:5]
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
