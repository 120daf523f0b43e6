"""What the demo found, printed, and its figures for the last line."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

from jobs.demo.bank import StandInBank
from jobs.demo.common import PAYMENTS, SETTLEMENTS, Options, say
from jobs.demo.evidence import JobTransactions, SparkTasks, SqlCommits
from jobs.demo.network import DroppingTransport
from jobs.demo.reconcile import Reconciliation
from jobs.settlement import (
    BatchRun,
    Payment,
    format_minor,
)


@dataclass
class Findings:
    """Everything the demo saw, once Spark has stopped."""

    payments: list[Payment]  # generated
    in_log: list[Payment]  # read back from the payments topic
    transport: DroppingTransport
    tasks: SparkTasks
    txns: JobTransactions
    sql: SqlCommits | None  # the SQL output's commits (None: the topic output)
    check: Reconciliation
    bank: StandInBank
    runs: list[BatchRun]
    expected: int  # settlement records the payments call for
    committed: dict[int, int]  # the group's committed offsets on the payments topic

    def report(self, options: Options, started: float) -> dict[str, Any]:
        """Print what happened; the figures for the last line. `mismatches` counts, besides the
        settlements' (see `Reconciliation`), payments duplicated, lost or altered in the log,
        committed input offsets other than the last run's end, and transactions left open."""
        check, tasks, txns, transport = self.check, self.tasks, self.txns, self.transport
        ids = Counter(p.payment_id for p in self.in_log)
        generated = {p.payment_id: p for p in self.payments}
        lost = sum(1 for pid in generated if pid not in ids)
        altered = sum(1 for p in self.in_log if generated.get(p.payment_id) != p)
        log_duplicates = sum(n - 1 for n in ids.values())
        end = dict(self.runs[-1].end.get(PAYMENTS, {})) if self.runs else {}
        offsets_ok = self.committed == end
        bank, payouts = self.bank, self.expected
        owed: dict[tuple[str, str], int] = {}
        for line in check.lines:
            owed[(line.merchant, line.currency)] = line.expected_minor
        paid = bank.paid_per_merchant()
        merchants_paid_wrong = sum(
            1 for where in set(owed) | set(paid) if owed.get(where, 0) != paid.get(where, 0)
        )
        mismatches = (
            check.mismatches
            + log_duplicates
            + lost
            + altered
            + (0 if offsets_ok else 1)
            + txns.open
            + abs(len(bank.calls) - payouts)
            + merchants_paid_wrong
        )

        say()
        say("what happened")
        say(
            f"  payments: {len(self.payments)} generated, {len(self.in_log)} in the log "
            f"(duplicates {log_duplicates}, lost {lost}, altered {altered})"
        )
        say(
            f"  producer: {transport.requests} produce requests, {transport.dropped} answers "
            f"lost ({transport.errors_reported} transport errors reported, each retried), "
            f"{transport.duplicates} retries deduplicated by the service"
        )
        say(
            f"  spark: {tasks.failed} task attempts failed, {tasks.speculative} speculative "
            f"copies ({tasks.speculative_won} won), {tasks.killed} attempts killed after losing "
            "the race"
        )
        for failure in tasks.failures:
            say(f"    {failure}")
        if self.sql is None:
            say(
                f"  coordinator: {txns.committed} task transactions committed, {txns.aborted} "
                f"aborted (failed, speculative losers), {txns.open} left open"
            )
            aborted = ", ".join(sorted(txns.aborted_attempts)) or "none"
            say(f"    aborted (run/partition.attempt.task): {aborted}")
            where = f"{SETTLEMENTS} (read_committed)"
        else:
            say(
                f"  txsql: {self.sql.commits} commits of {self.sql.attempts_committed} winning "
                f"attempts; {self.sql.rows_discarded} rows staged by failed and speculative "
                "attempts discarded"
            )
            where = "the SQL table"
        say(
            f"  settlements: {check.records} records in {where} from {len(self.runs)} runs; "
            f"input offsets committed = log end: {offsets_ok}"
        )
        say(
            f"  bank: {len(bank.calls)} calls for {payouts} payouts, {bank.refused} refused "
            f"(stale fencing token), merchants paid a wrong total {merchants_paid_wrong}"
        )
        say()
        say(f"  {'merchant':<9} {'cur':<4} {'expected':>12} {'n':>5}   {'settled':>12} {'n':>5}")
        for line in check.lines:
            say(
                f"  {line.merchant:<9} {line.currency:<4} "
                f"{format_minor(line.expected_minor):>12} {line.expected_count:>5}   "
                f"{format_minor(line.settled_minor):>12} {line.settled_count:>5}   "
                f"{'ok' if line.ok else 'MISMATCH'}"
            )
        say()
        say(
            f"  duplicate settlements {check.duplicates}, missing {check.missing}, unexpected "
            f"{check.unexpected}, wrong {check.wrong}, merchants off {check.merchants_wrong}"
        )
        say(
            "exactly once held: every payment settled once"
            if mismatches == 0
            else f"EXACTLY ONCE BROKEN: {mismatches} mismatches"
        )
        return {
            "events": len(self.payments),
            "merchants": options.merchants,
            "rounds": len(self.runs),
            "master": options.master or "mini-cluster",
            "produce_requests": transport.requests,
            "responses_dropped": transport.dropped,
            "transport_errors_reported": transport.errors_reported,
            "retries_deduplicated": transport.duplicates,
            "payments_in_log": len(self.in_log),
            "task_attempts_failed": tasks.failed,
            "task_attempts_speculated": tasks.speculative,
            "speculative_wins": tasks.speculative_won,
            "task_attempts_killed": tasks.killed,
            "output": options.output,
            "transactions_committed": txns.committed,
            "transactions_aborted": txns.aborted,
            "sql_commits": self.sql.commits if self.sql else 0,
            "staged_rows_discarded": self.sql.rows_discarded if self.sql else 0,
            "payouts": payouts,
            "bank_calls": len(bank.calls),
            "bank_refused": bank.refused,
            "settlements_written": check.records,
            "settlements_expected": self.expected,
            "mismatches": mismatches,
            "seconds": round(time.monotonic() - started, 1),
        }
