"""The demo's names and its one way of printing."""

from __future__ import annotations

from dataclasses import dataclass

CURRENCIES = ("EUR", "USD", "GBP")
PAYMENTS, SETTLEMENTS, REJECTED = "payments", "settlements", "payments-rejected"
JOB_ID, GROUP = "settlement", "settlement"
WRITE_TASKS = 4  # settlement tasks per run (jobs.settlement's `partitions`)
STRAGGLER_SECONDS = 15.0  # long enough for a speculative copy to start and win on 2 cores
LOCAL_STRAGGLER_SECONDS = 3.0  # local mode cannot speculate: the straggler only costs time


def say(line: str = "") -> None:
    print(line, flush=True)


@dataclass
class Options:
    events: int = 2000
    merchants: int = 12
    rounds: int = 2
    seed: int = 7
    drop_rate: float = 0.15
    master: str | None = None  # None: the mini cluster with speculation
    keep: bool = False
    output: str = "sql"  # settlements into a SQL table (txsql), or "topic" (txlog)
