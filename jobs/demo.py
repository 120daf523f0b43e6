"""`coordinator demo`: the project's main job, end to end on one machine with nothing installed
but Python, Java and pyspark: payments through a lossy network, settled by Spark exactly once.

1. An embedded coordinator (`coordinator serve` on a temporary SQLite file and a free port).
2. Payments from an idempotent SDK Producer whose HTTP transport loses some answers after the
   service handled the request: the producer retries and the service answers `duplicate: true`.
3. The settlement job (`jobs.settlement`, batch mode, once per wave of payments) on a standalone
   Spark mini cluster with speculation on, where one write task's first attempt dies after
   writing part of its output and another's stalls until Spark runs a speculative copy. The
   settlements go into a SQL table (an SQLite file, through txsql, the input offsets with
   them; `--output topic`: the `settlements` topic through txlog).
4. Each committed settlement paid out to its merchant at a stand-in bank (an HTTP endpoint in
   this process that counts every call) through `EffectsClient.once`, in Spark tasks where one
   attempt dies after a payout and another stalls.
5. What happened, from the transport, Spark's event log, the coordinator's admin API and the
   bank, and the settlements read back against totals computed here from what was generated.

The last line printed is one JSON object of the figures; `mismatches` is 0 when exactly once held
(and the bank's calls equal the payouts).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from jobs.settlement import (
    BatchRun,
    Payment,
    Settlement,
    Source,
    committed_settlements,
    format_minor,
    settle,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

CURRENCIES = ("EUR", "USD", "GBP")
PAYMENTS, SETTLEMENTS, REJECTED = "payments", "settlements", "payments-rejected"
JOB_ID, GROUP = "settlement", "settlement"
WRITE_TASKS = 4  # settlement tasks per run (jobs.settlement's `partitions`)
STRAGGLER_SECONDS = 15.0  # long enough for a speculative copy to start and win on 2 cores
LOCAL_STRAGGLER_SECONDS = 3.0  # local mode cannot speculate: the straggler only costs time


def say(line: str = "") -> None:
    print(line, flush=True)


# -- payments ----------------------------------------------------------------------------------


def merchant_names(count: int) -> list[str]:
    return [f"m-{i:03d}" for i in range(1, count + 1)]


def currency_of(merchant: str) -> str:
    """Each merchant settles in one currency."""
    return CURRENCIES[int(merchant.removeprefix("m-")) % len(CURRENCIES)]


def generate_payments(events: int, merchants: int, seed: int) -> list[Payment]:
    """`events` payments for `merchants` merchants, some busier than others; the same seed
    gives the same payments. Amounts 0.50 .. 500.00, in cents."""
    rng = random.Random(seed)
    names = merchant_names(merchants)
    weights = [1.0 / (rank + 1) ** 0.5 for rank in range(merchants)]
    chosen = rng.choices(names, weights=weights, k=events)
    return [
        Payment(f"pay-{seed}-{i:06d}", merchant, rng.randint(50, 50_000), currency_of(merchant))
        for i, merchant in enumerate(chosen)
    ]


def waves(payments: Sequence[Payment], rounds: int) -> list[list[Payment]]:
    """The payments split into `rounds` consecutive waves, one settlement run after each."""
    size = -(-len(payments) // rounds)
    return [list(payments[i : i + size]) for i in range(0, len(payments), size)]


# -- the lossy network ---------------------------------------------------------------------------


def is_produce(request: httpx.Request) -> bool:
    return request.method == "POST" and request.url.path.endswith("/records")


class DroppingTransport(httpx.BaseTransport):
    """Forwards every request; loses the answer to a produce request the service stored with
    probability `drop` (seeded, so a run can be replayed). Counts produce requests, answers
    lost, and answers that said `duplicate: true` (a retry the service recognised)."""

    def __init__(self, drop: float, seed: int, inner: httpx.BaseTransport | None = None) -> None:
        self.inner = inner or httpx.HTTPTransport()
        self.drop = drop
        self.rng = random.Random(seed)
        self.lock = threading.Lock()
        self.requests = 0
        self.dropped = 0
        self.duplicates = 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = self.inner.handle_request(request)
        if not is_produce(request):
            return response
        response.read()
        written = response.status_code == 200
        duplicate = written and bool(response.json().get("duplicate"))
        with self.lock:
            self.requests += 1
            self.duplicates += duplicate
            # Only answers to batches the service stored: each loss is then a retry the service
            # must recognise, so `duplicates` ends equal to `dropped`.
            lose = written and self.rng.random() < self.drop
            self.dropped += lose
        if lose:
            response.close()
            raise httpx.ReadError("demo: the answer was lost after the service handled it")
        return response

    def close(self) -> None:
        self.inner.close()


# -- reconciliation ------------------------------------------------------------------------------


@dataclass(frozen=True)
class MerchantLine:
    merchant: str
    currency: str
    expected_minor: int
    expected_count: int
    settled_minor: int
    settled_count: int

    @property
    def ok(self) -> bool:
        return (self.expected_minor, self.expected_count) == (
            self.settled_minor,
            self.settled_count,
        )


@dataclass
class Reconciliation:
    """Settlements read back against the ones the generated payments call for."""

    lines: list[MerchantLine]
    records: int
    duplicates: int  # records whose (batch, merchant, currency) appeared before
    missing: int  # expected records absent
    unexpected: int  # records no batch calls for (e.g. a batch that should not exist)
    wrong: int  # records present once but with another total or count

    @property
    def merchants_wrong(self) -> int:
        return sum(not line.ok for line in self.lines)

    @property
    def mismatches(self) -> int:
        return self.merchants_wrong + self.duplicates + self.missing + self.unexpected + self.wrong


def reconcile(expected: Sequence[Settlement], settled: Sequence[Settlement]) -> Reconciliation:
    wanted = {s.key: s for s in expected}
    seen: Counter[tuple[str, str, str]] = Counter(s.key for s in settled)
    duplicates = sum(n - 1 for n in seen.values())
    missing = sum(1 for key in wanted if key not in seen)
    unexpected = sum(1 for key in seen if key not in wanted)
    first: dict[tuple[str, str, str], Settlement] = {}
    for s in settled:
        first.setdefault(s.key, s)
    wrong = sum(1 for key, s in first.items() if key in wanted and s != wanted[key])

    totals: dict[tuple[str, str], list[int]] = {}
    for which, records in ((0, expected), (1, settled)):
        for s in records:
            tally = totals.setdefault((s.merchant, s.currency), [0, 0, 0, 0])
            tally[2 * which] += s.total_minor
            tally[2 * which + 1] += s.count
    lines = [
        MerchantLine(merchant, currency, *tally)
        for (merchant, currency), tally in sorted(totals.items())
    ]
    return Reconciliation(lines, len(settled), duplicates, missing, unexpected, wrong)


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


class StandInBank:
    """The outside world: an HTTP endpoint (`url`, POST) that pays a merchant and counts every
    call it gets. It refuses a call whose fencing token is lower than one it saw for the same
    key (409), as a bank checking the token would; a repeated key is counted, never hidden."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls: list[dict[str, Any]] = []
        self.refused = 0
        self.highest: dict[str, int] = {}
        bank = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                status, answer = bank.pay(body)
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *_: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/pay"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def pay(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        with self.lock:
            key, token = body["key"], body["fencing_token"]
            if token < self.highest.get(key, -1):
                self.refused += 1
                return 409, {"error": f"stale fencing token {token} for {key}"}
            self.highest[key] = token
            self.calls.append(body)
            return 200, {"transfer": f"tr-{len(self.calls):06d}", "paid": body["amount_minor"]}

    def paid_per_merchant(self) -> dict[tuple[str, str], int]:
        totals: dict[tuple[str, str], int] = {}
        for call in self.calls:
            where = (call["merchant"], call["currency"])
            totals[where] = totals.get(where, 0) + call["amount_minor"]
        return totals

    def __enter__(self) -> StandInBank:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def payout_faults(straggler_seconds: float) -> tuple[dict[str, list[float]], list[str]]:
    """The payout tasks' faults: task 0's first attempt dies after its first payout, task 1's
    stalls after its first."""
    faults: dict[str, list[float]] = {"kill": [0, 0, 1], "stall": [1, 0, 1, straggler_seconds]}
    said = [
        "payout task 0 attempt 0 dies after its first payout",
        f"payout task 1 attempt 0 stalls {straggler_seconds:.0f} s after its first payout",
    ]
    return faults, said


# -- the service -------------------------------------------------------------------------------


@contextlib.contextmanager
def embedded_coordinator(
    workdir: Path, database_url: str | None = None, kafka_listener: str | None = None
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """`coordinator serve` on a free loopback port, on an SQLite file in `workdir` (or on
    `database_url`), its log in `workdir`, with a Kafka listener on `kafka_listener`
    (HOST:PORT) when given; stopped on the way out. Yields its URL and process."""
    from coordinator.launcher import Launched

    database = database_url or f"sqlite:///{workdir / 'coordinator.db'}"
    listener = ["--kafka-listener", kafka_listener] if kafka_listener else []
    served = Launched(
        workdir,
        database_url=database,
        args=["--log-level", "warning", *listener],
        log=workdir / "coordinator.log",
    )
    with served:
        assert served.process is not None
        yield served.url, served.process


def read_topic(url: str, topic: str) -> list[str]:
    """Every committed record's value of `topic` (read_committed), partition by partition."""
    values: list[str] = []
    with httpx.Client(base_url=url, timeout=30) as http:
        partitions = http.get(f"/v1/topics/{topic}").json()["partitions"]
        for partition in partitions:
            offset = 0
            while True:
                page = http.get(
                    f"/v1/topics/{topic}/partitions/{partition['partition']}/records",
                    params={"offset": offset, "max_records": 10_000},
                ).json()
                values.extend(r["value"] for r in page["records"])
                if page["next_offset"] == offset:
                    break
                offset = page["next_offset"]
    return values


# -- the run -----------------------------------------------------------------------------------


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


def produce_payments(url: str, payments: Sequence[Payment], transport: DroppingTransport) -> None:
    """Send `payments` through an idempotent producer over `transport`; every one must be
    delivered (the retries are the producer's own)."""
    from sdk import Producer

    failures: list[Any] = []

    def delivered(err: Any, _msg: Any) -> None:
        if err is not None:
            failures.append(err)

    config = {
        "coordinator.url": url,
        "enable.idempotence": True,
        "linger.ms": 5,
        # Small batches: many requests, so that some answers get lost.
        "batch.size": 1024,
        "retry.backoff.ms": 20,
        "on_delivery": delivered,
    }
    with Producer(config, transport=transport) as producer:
        for payment in payments:
            producer.produce(PAYMENTS, payment.to_json(), key=payment.merchant)
            producer.poll(0)
        remaining = producer.flush(60)
    if remaining or failures:
        raise RuntimeError(f"payments not delivered: {remaining} left, errors {failures[:3]}")


def write_tasks_of(spark: SparkSession, merchants: Sequence[str]) -> dict[int, int]:
    """How many settlement records each write task will get: Spark's own hash of `merchant`
    (the settlement job's repartition), computed by Spark on these merchants."""
    from pyspark.sql import functions as F

    frame = spark.createDataFrame([(m,) for m in sorted(set(merchants))], "merchant string")
    rows = (
        frame.repartition(WRITE_TASKS, "merchant")
        .groupBy(F.spark_partition_id().alias("task"))
        .count()
        .collect()
    )
    return {row["task"]: row["count"] for row in rows}


def faults_for(tasks: dict[int, int], straggler_seconds: float) -> tuple[dict[str, str], list[str]]:
    """`testing.kill` for the busiest write task's first attempt (it dies after half its
    records), `testing.delay` for the next busiest (it stalls after half of its own); and a
    sentence for each."""
    busiest = sorted(((n, task) for task, n in tasks.items() if n > 0), key=lambda t: (-t[0], t[1]))
    options: dict[str, str] = {}
    said: list[str] = []
    if busiest:
        count, task = busiest[0]
        after = max(1, count // 2)
        options["testing.kill"] = json.dumps(
            {"partitions": [task], "attempts": [0], "after_records": after}
        )
        said.append(f"task {task} attempt 0 dies after writing {after} of its {count} records")
    if len(busiest) > 1:
        count, task = busiest[1]
        after = max(1, count // 2)
        options["testing.delay"] = json.dumps(
            {
                "partitions": [task],
                "attempts": [0],
                "after_records": after,
                "seconds": straggler_seconds,
            }
        )
        said.append(
            f"task {task} attempt 0 stalls {straggler_seconds:.0f} s after writing {after} of "
            f"its {count} records"
        )
    return options, said


@contextlib.contextmanager
def spark_for(options: Options, workdir: Path) -> Iterator[tuple[SparkSession, str, bool]]:
    """The SparkSession the demo runs on: the mini cluster with speculation, or `master`.
    Yields the session, a description, and whether Spark can speculate there."""
    from jobs.cluster import mini_cluster, session

    events = workdir / "spark-events"
    events.mkdir(exist_ok=True)
    conf = {
        "spark.eventLog.enabled": "true",
        "spark.eventLog.dir": events.as_uri(),
        # One plain JSON Lines file (Spark 4 defaults to rolling, zstd-compressed logs).
        "spark.eventLog.compress": "false",
        "spark.eventLog.rolling.enabled": "false",
    }
    with contextlib.ExitStack() as stack:
        if options.master is None:
            cluster = stack.enter_context(mini_cluster(workdir=workdir / "cluster"))
            master = cluster.master_url
            where = f"{master}: 2 workers (127.0.0.2, 127.0.0.3), 1 core each, speculation on"
            speculates = True
        else:
            master = options.master
            speculates = not master.startswith("local")
            where = master + ("" if speculates else " (Spark never speculates in local mode)")
        spark = session("coordinator-demo", master, speculation=True, conf=conf, log_dir=workdir)
        stack.callback(spark.stop)
        # The task failures are injected and reported from the event log; in local mode their
        # stack traces would bury the report. A failed job still raises here.
        spark.sparkContext.setLogLevel("FATAL")
        yield spark, where, speculates


def run(options: Options) -> dict[str, Any]:
    started = time.monotonic()
    workdir = Path(tempfile.mkdtemp(prefix="txlog-demo-"))
    try:
        return _run(options, workdir, started)
    finally:
        if options.keep:
            kept = "coordinator.db, ledger.db, coordinator.log, spark-events, cluster logs"
            say(f"kept: {workdir} ({kept})")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


def _run(options: Options, workdir: Path, started: float) -> dict[str, Any]:
    from jobs.settlement import pay_settlements, run_batch
    from sdk import AdminClient, NewTopic
    from sdk.spark import register

    payments = generate_payments(options.events, options.merchants, options.seed)
    say("coordinator demo: payments settled by Spark, exactly once, through lost answers,")
    say("failed task attempts and speculative copies")
    say()
    with embedded_coordinator(workdir) as (url, service):
        say(f"coordinator  {url} (pid {service.pid}), SQLite {workdir / 'coordinator.db'}")
        with AdminClient({"coordinator.url": url}) as admin:
            for future in admin.create_topics(
                [NewTopic(PAYMENTS, 3), NewTopic(SETTLEMENTS, 2), NewTopic(REJECTED, 1)]
            ).values():
                future.result()
        transport = DroppingTransport(options.drop_rate, options.seed)
        expected: list[Settlement] = []
        runs: list[BatchRun] = []
        sql_url = f"sqlite:///{workdir / 'ledger.db'}" if options.output == "sql" else None
        source = Source(url, PAYMENTS, SETTLEMENTS, JOB_ID, GROUP, sql_url=sql_url)
        table = f"table settlements in {workdir / 'ledger.db'}, through txsql"
        say(f"settlements  {table if sql_url else 'topic ' + SETTLEMENTS + ', through txlog'}")
        with StandInBank() as bank, spark_for(options, workdir) as (spark, where, speculates):
            register(spark)
            say(f"spark        {where}")
            say(f"bank         {bank.url} (a stand-in that counts every call)")
            straggle = STRAGGLER_SECONDS if speculates else LOCAL_STRAGGLER_SECONDS
            for number, wave in enumerate(waves(payments, options.rounds), start=1):
                say()
                say(
                    f"round {number}: {len(wave)} payments -> {PAYMENTS} (answers lost at "
                    f"{options.drop_rate:.0%})"
                )
                before = (transport.requests, transport.dropped, transport.duplicates)
                produce_payments(url, wave, transport)
                say(
                    f"  produce requests {transport.requests - before[0]}, answers lost "
                    f"{transport.dropped - before[1]}, retries answered duplicate "
                    f"{transport.duplicates - before[2]}"
                )
                writer_options, faults = faults_for(
                    write_tasks_of(spark, [p.merchant for p in wave]), straggle
                )
                for fault in faults or ["no faults: no settlement task has output"]:
                    say(f"  fault: {fault}")
                round_started = time.monotonic()
                batch = run_batch(
                    spark, source, partitions=WRITE_TASKS, writer_options=writer_options
                )
                runs.append(batch)
                expected.extend(settle(wave, batch.batch))
                say(
                    f"  settled {batch.batch} in {time.monotonic() - round_started:.1f} s; "
                    f"offsets committed for group {GROUP!r}" + (" with the rows" if sql_url else "")
                )
                paying_faults, said = payout_faults(straggle)
                for fault in said:
                    say(f"  fault: {fault}")
                paid_before = len(bank.calls)
                payouts = pay_settlements(
                    spark, source, bank.url, partitions=WRITE_TASKS, faults=paying_faults
                )
                say(
                    f"  payouts: {payouts} settlements committed so far, bank calls this round "
                    f"{len(bank.calls) - paid_before}"
                )
        if sql_url is None:
            with httpx.Client(base_url=url, timeout=30) as http:
                committed = http.get(f"/v1/groups/{GROUP}/offsets").json()["offsets"]
        else:
            from sdk.spark import sql_committed_offsets

            stored = sql_committed_offsets(sql_url, GROUP).get(PAYMENTS, {})
            committed = [
                {"topic": PAYMENTS, "partition": p, "offset": o} for p, o in stored.items()
            ]
        findings = Findings(
            payments=payments,
            in_log=[Payment.from_json(v) for v in read_topic(url, PAYMENTS)],
            transport=transport,
            tasks=SparkTasks.from_event_log(workdir / "spark-events"),
            txns=JobTransactions.of(url, JOB_ID),
            sql=SqlCommits.of(sql_url, JOB_ID) if sql_url else None,
            check=reconcile(
                expected,
                committed_settlements(None, source)
                if sql_url
                else [Settlement.from_json(v) for v in read_topic(url, SETTLEMENTS)],
            ),
            bank=bank,
            runs=runs,
            expected=len(expected),
            committed={e["partition"]: e["offset"] for e in committed if e["topic"] == PAYMENTS},
        )
    return findings.report(options, started)


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
            f"lost, {transport.duplicates} retries deduplicated by the service"
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


# -- the command line (wired into `coordinator demo`) --------------------------------------------


DESCRIPTION = (
    "Start an embedded coordinator (SQLite, temporary), produce payments through an idempotent "
    "producer whose answers are sometimes lost, settle them per merchant with a Spark job "
    "(speculation on, one task attempt killed mid-output, one straggler) into a SQL table, pay "
    "each settlement out once at a stand-in bank, and check the settlements and the payouts "
    "against the payments. Prints a report; the last line is one JSON object with "
    "the figures, `mismatches` 0 when exactly once held (exit status 1 otherwise). Needs "
    "`pip install '.[spark]'` and Java 17."
)


def add_demo_parser(commands: Any) -> None:
    """`coordinator demo`: a subcommand of the CLI's parser."""
    demo = commands.add_parser(
        "demo",
        help="run the main job end to end: payments through a lossy network, settled by Spark "
        "exactly once despite failed and speculative task attempts (needs pyspark and Java)",
        description=DESCRIPTION,
    )
    add_demo_options(demo)


def add_demo_options(demo: argparse.ArgumentParser) -> None:
    demo.add_argument("--events", type=_positive, default=2000, help="payments (2000)")
    demo.add_argument("--merchants", type=_positive, default=12, help="merchants (12)")
    demo.add_argument(
        "--rounds",
        type=_positive,
        default=2,
        help="waves of payments, each followed by a settlement run that settles only the new "
        "ones (2)",
    )
    demo.add_argument("--seed", type=int, default=7, help="seed of the payments and losses (7)")
    demo.add_argument(
        "--drop-rate",
        type=float,
        default=0.15,
        help="share of produce answers lost after the service handled them (0.15)",
    )
    demo.add_argument(
        "--master",
        help="Spark master (default: a local standalone cluster of 2 workers on 127.0.0.2 and "
        "127.0.0.3, where Spark speculates; local[2,3] also works, with task retries but no "
        "speculation: Spark never speculates in local mode)",
    )
    demo.add_argument(
        "--output",
        choices=["sql", "topic"],
        default="sql",
        help="where the settlements go: a SQL table in an SQLite file through txsql, the input "
        "offsets committed with them (sql, the default), or the settlements topic through txlog "
        "(topic)",
    )
    demo.add_argument(
        "--keep",
        action="store_true",
        help="keep the working folder (the SQLite store, service and Spark logs) and say where",
    )
    demo.set_defaults(run=_demo)


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def _demo(args: argparse.Namespace) -> int:
    if not 0 <= args.drop_rate < 1:
        print("--drop-rate: must be in [0, 1)", file=sys.stderr)
        return 2
    try:
        import pyspark  # noqa: F401
    except ImportError:
        print(
            "coordinator demo needs pyspark: pip install '.[spark]' (and Java 17)", file=sys.stderr
        )
        return 2
    options = Options(
        events=args.events,
        merchants=args.merchants,
        rounds=args.rounds,
        seed=args.seed,
        drop_rate=args.drop_rate,
        master=args.master,
        keep=args.keep,
        output=args.output,
    )
    # SIGTERM unwinds like Ctrl-C: Spark, the cluster and the service are stopped on the way out.
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        figures = run(options)
    except KeyboardInterrupt:
        print("interrupted: Spark, the cluster and the coordinator were stopped", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
    print(json.dumps(figures), flush=True)
    return 0 if figures["mismatches"] == 0 else 1


def _interrupt(signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m jobs.demo`: the same as `coordinator demo`."""
    parser = argparse.ArgumentParser(prog="python -m jobs.demo", description=DESCRIPTION)
    add_demo_options(parser)
    return _demo(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
