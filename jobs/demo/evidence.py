"""What Spark and the coordinator saw: Spark's event log, the job's transactions, txsql's
commits."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

# -- what Spark and the coordinator saw ----------------------------------------------------------


@dataclass
class SparkTasks:
    """Task attempts from Spark's event log (SparkListenerTaskEnd events)."""

    failed: int = 0  # ended with an error (a Python worker died, an exception)
    speculative: int = 0  # speculative copies launched
    speculative_won: int = 0
    killed: int = 0  # killed by Spark: mostly the losers of a speculation race
    failures: list[str] = field(default_factory=list)

    @classmethod
    def from_event_log(cls, folder: Path) -> SparkTasks:
        tasks = cls()
        for path in sorted(p for p in folder.rglob("*") if p.is_file()):
            for line in path.read_text(errors="replace").splitlines():
                if '"SparkListenerTaskEnd"' not in line:
                    continue
                event = json.loads(line)
                info, reason = event["Task Info"], event["Task End Reason"]["Reason"]
                if info.get("Speculative"):
                    tasks.speculative += 1
                    tasks.speculative_won += reason == "Success"
                if reason == "TaskKilled":
                    tasks.killed += 1
                elif reason != "Success":
                    tasks.failed += 1
                    tasks.failures.append(
                        f"stage {event['Stage ID']} partition {info['Index']} attempt "
                        f"{info['Attempt']}: {reason}"
                    )
        return tasks


@dataclass
class JobTransactions:
    """The settlement job's transactions as the coordinator's admin API lists them."""

    committed: int = 0
    aborted: int = 0
    open: int = 0  # Ongoing or Prepared: would pin the LSO
    aborted_attempts: list[str] = field(default_factory=list)  # `{partition}.{attempt}` ids

    @classmethod
    def of(cls, url: str, job_id: str) -> JobTransactions:
        with httpx.Client(base_url=url, timeout=30) as http:
            answer = http.get("/v1/admin/transactions", params={"prefix": f"{job_id}/"})
            answer.raise_for_status()
        return cls.from_listing(answer.json()["transactions"], job_id)

    @classmethod
    def from_listing(cls, transactions: Sequence[dict[str, Any]], job_id: str) -> JobTransactions:
        """Tally the task attempts' transactions (not the driver's) by outcome."""
        found = cls()
        for txn in transactions:
            tid, state = txn["transactional_id"], txn["state"]
            if not tid.startswith(f"{job_id}/") or tid == f"{job_id}/driver":
                continue
            if state == "CompleteCommit":
                found.committed += 1
            elif state == "CompleteAbort":
                found.aborted += 1
                found.aborted_attempts.append(tid.removeprefix(f"{job_id}/"))
            elif state in ("Ongoing", "Prepared"):
                found.open += 1
        return found


@dataclass
class SqlCommits:
    """The settlement job's commits into the SQL table, from its `txsql_commits` records."""

    commits: int = 0
    attempts_committed: int = 0  # winning task attempts
    rows_discarded: int = 0  # staged by losing attempts (killed, speculative), thrown away

    @classmethod
    def of(cls, sql_url: str, job_id: str) -> SqlCommits:
        from sqlalchemy import text

        from sdk.spark._sql import engine_for

        engine = engine_for(sql_url)
        try:
            with engine.connect() as connection:
                rows = connection.execute(
                    text("SELECT winners, discarded_rows FROM txsql_commits WHERE job_id = :job"),
                    {"job": job_id},
                ).all()
        finally:
            engine.dispose()
        return cls(
            len(rows),
            sum(len(json.loads(winners)) for winners, _ in rows),
            sum(int(d) for _, d in rows),
        )
