"""The processes of the fault workload, each recording its history (HISTORY.md): transactional
producers (through the SDK), a second instance of a live transactional id, read_committed readers.

    python -m tests.fault.workers producer --name p0 --url URL --seed S --out DIR --plans DIR --t0 T
    python -m tests.fault.workers second --name s0 --tid fault-p0 --url URL --seed S ... (as above)
    python -m tests.fault.workers reader --name c0 --urls URL[,URL] --phase live --out DIR --t0 T

SIGTERM asks a worker to finish what it is doing (a producer its transaction, a live reader its
round) and exit; a worker whose parent (the runner) is gone exits by itself.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import random
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx
import orjson

from sdk import KafkaError, KafkaException, KafkaTimeoutError, Producer, TopicPartition
from tests.fault.history import Begin, Group, Outcome, Read, Recorder, SentOffset, Txn, Write

TOPIC = "fault"
INPUT_TOPIC = "fault-in"  # the (never written) input whose offsets each transaction commits
ABORT_RATIO = 0.25  # transactions a producer aborts by choice
MAX_VALUES = 4  # values per transaction: 1..MAX_VALUES
TIMEOUT_RETRIES = 3  # calls of a transaction step that timed out, before giving it up
# A Kafka transaction still under way this long has hung in librdkafka (each step times out in
# 10 s, a commit or abort is called at most TIMEOUT_RETRIES times): see its watchdog.
STUCK_S = 45.0
LIVE_ROUND_S = 0.4  # pause between a live reader's rounds over every partition
GROUP_POLL_S = 2.0  # how often a live reader with groups looks at their committed offsets
FINAL_READ_S = 120.0  # bound on a final read of every partition

# Another instance took the transactional id over (docs/pages/http-api.md, Transactions).
_TAKEN_OVER = {KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH}

log = logging.getLogger("fault.workers")
T = TypeVar("T")

_stop = threading.Event()


def group_of(producer: str) -> str:
    return f"fault-g-{producer}"


def tid_of(producer: str) -> str:
    return f"fault-{producer}"


def producer_of(tid: str) -> str:
    """The producer whose transactional id `tid` is (`tid_of`'s inverse)."""
    return tid.removeprefix("fault-")


def history_path(out: Path, process: str) -> Path:
    return out / f"{process}.jsonl"


def plans_path(plans: Path, producer: str) -> Path:
    """A producer writes each transaction's writes here before it begins, so the runner can
    record the transaction as `unknown` with its writes if the producer dies without an outcome."""
    return plans / f"{producer}.jsonl"


def _on_sigterm(signum: int, frame: Any) -> None:
    _stop.set()


def _should_stop(parent: int) -> bool:
    return _stop.is_set() or os.getppid() != parent


# -- producers -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ProducerSettings:
    url: str
    txn_timeout_ms: int
    # The Kafka door: the listeners' addresses (host:port,...); None: the HTTP API at `url`.
    bootstrap: str | None = None
    request_timeout_ms: int = 3_000
    api_timeout_ms: int = 10_000


class CommitWitness(httpx.BaseTransport):
    """The SDK's transport, watching EndTxn(commit) requests: once one was sent without a
    definite refusal (a 4xx answer), the transaction may have committed, whatever error the SDK
    reports later (a retry after a lost answer can be fenced by then)."""

    def __init__(self) -> None:
        self.inner = httpx.HTTPTransport()
        self.commit_in_doubt = False

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        commit = _is_commit(request)
        try:
            response = self.inner.handle_request(request)
        except BaseException:
            if commit:
                self.commit_in_doubt = True
            raise
        if commit and not 400 <= response.status_code < 500:
            self.commit_in_doubt = True
        return response

    def close(self) -> None:
        self.inner.close()


def _is_commit(request: httpx.Request) -> bool:
    if request.method != "POST" or not request.url.path.endswith("/end"):
        return False
    try:
        return bool(orjson.loads(request.read()).get("commit"))
    except (orjson.JSONDecodeError, AttributeError):
        return True


class TransactionalWorker:
    """One transactional producer: begins, produces, sends offsets and commits or aborts, and
    records each transaction with the outcome it can vouch for."""

    def __init__(
        self,
        name: str,
        tid: str,
        settings: ProducerSettings,
        recorder: Recorder,
        plans: Path,
        rng: random.Random,
        partitions: int,
        parent: int,
    ) -> None:
        self.name = name
        self.tid = tid
        self.settings = settings
        self.recorder = recorder
        self.plans = plans
        self.rng = rng
        self.partitions = partitions
        self.parent = parent
        self.producer: Producer | None = None
        self.witness: CommitWitness | None = None
        self.next_txn = 0

    def ready(self, deadline: float | None = None) -> bool:
        """A producer with its transactions initialised (fencing every older instance), made anew
        when needed; False when told to stop (or past `deadline`) first."""
        attempt = 0
        while self.producer is None:
            if _should_stop(self.parent) or (deadline is not None and time.monotonic() > deadline):
                return False
            witness = CommitWitness()
            s = self.settings
            producer = Producer(
                {
                    "coordinator.url": s.url,
                    "transactional.id": self.tid,
                    "client.id": self.name,
                    "transaction.timeout.ms": s.txn_timeout_ms,
                    "request.timeout.ms": s.request_timeout_ms,
                    "default.api.timeout.ms": s.api_timeout_ms,
                    "delivery.timeout.ms": s.api_timeout_ms,
                    "retry.backoff.ms": 50,
                    "retry.backoff.max.ms": 500,
                    "linger.ms": 2,
                },
                transport=witness,
            )
            try:
                producer.init_transactions()
            except KafkaException as exc:
                log.info("%s: init_transactions failed: %s", self.name, exc)
                _close(producer)
                time.sleep(min(2.0, 0.1 * 2**attempt))
                attempt += 1
                continue
            self.producer, self.witness = producer, witness
        return True

    def drop_producer(self) -> None:
        if self.producer is not None:
            _close(self.producer)
        self.producer = self.witness = None

    def plan(self, txn: int) -> tuple[list[Write], list[SentOffset]]:
        writes = [
            Write(
                topic=TOPIC,
                partition=self.rng.randrange(self.partitions),
                value=f"{self.name}-{txn}-{i}",
            )
            for i in range(self.rng.randint(1, MAX_VALUES))
        ]
        offsets = [
            SentOffset(
                group=group_of(self.name),
                topic=INPUT_TOPIC,
                partition=0,
                offset=txn + 1,
                metadata=f"{self.name}-{txn}",
            )
        ]
        return writes, offsets

    def record_end(
        self,
        txn: int,
        outcome: Outcome,
        writes: list[Write],
        offsets: list[SentOffset],
        error: str | None,
        pid: int = -1,
        epoch: int = -1,
    ) -> None:
        """The transaction's end in the history (-1: the producer id and epoch not known)."""
        self.recorder.record(
            Txn(
                producer=self.name,
                txn=txn,
                outcome=outcome,
                tid=self.tid,
                pid=pid,
                epoch=epoch,
                writes=writes,
                offsets=offsets,
                error=error,
            )
        )

    def next_plan(self) -> tuple[int, list[Write], list[SentOffset]]:
        """The next transaction's number, writes and offsets, written to the plans file first
        (the checker reads what was meant, whatever the run then did)."""
        txn = self.next_txn
        self.next_txn += 1
        writes, offsets = self.plan(txn)
        with self.plans.open("ab") as f:
            f.write(
                orjson.dumps(
                    {
                        "producer": self.name,
                        "txn": txn,
                        "tid": self.tid,
                        "writes": [asdict(w) for w in writes],
                        "offsets": [asdict(o) for o in offsets],
                    }
                )
                + b"\n"
            )
        return txn, writes, offsets

    def transaction(self, commit: bool, think_s: float = 0.0) -> Outcome:
        """Run one transaction with the current producer and record it; the producer is dropped
        when it cannot go on (fenced, timed out, outcome in doubt)."""
        assert self.producer is not None and self.witness is not None
        producer, witness = self.producer, self.witness
        txn, writes, offsets = self.next_plan()
        # The SDK's own idea of (pid, epoch) as the transaction starts; for reading a history only.
        pid, epoch = producer._transaction_identity()
        self.recorder.record(Begin(producer=self.name, txn=txn))
        witness.commit_in_doubt = False
        error: str | None = None
        usable = True
        try:
            producer.begin_transaction()
            for write in writes:
                producer.produce(TOPIC, value=write.value, partition=write.partition)
            # Work between reading and committing, as a consume-transform-produce job has: a
            # pause of the process lands inside an open transaction most of the time.
            time.sleep(think_s)
            sent = [
                TopicPartition(o.topic, o.partition, o.offset, metadata=o.metadata) for o in offsets
            ]
            _retrying(lambda: producer.send_offsets_to_transaction(sent, group_of(self.name)))
            if commit:
                _retrying(producer.commit_transaction)
                outcome: Outcome = "committed"
            else:
                _retrying(producer.abort_transaction)
                outcome = "aborted"
        except KafkaException as exc:
            error = exc.code
            # Only an EndTxn(commit) commits; a timed-out epoch's transaction was aborted
            # (docs/pages/http-api.md).
            definite = not witness.commit_in_doubt or exc.code == KafkaError.TRANSACTION_TIMED_OUT
            outcome = "aborted" if definite else "unknown"
            usable = definite and exc.txn_requires_abort and not exc.fatal
            if usable:
                try:
                    _retrying(producer.abort_transaction)
                except KafkaException as again:
                    log.info("%s: txn %d: abort failed too: %s", self.name, txn, again)
                    usable = False
            log.info("%s: txn %d %s: %s", self.name, txn, outcome, exc)
        self.record_end(txn, outcome, writes, offsets, error, pid=pid, epoch=epoch)
        if not usable:
            self.drop_producer()
            if error in _TAKEN_OVER:
                # A fenced application restarts; not at once, which would leave the instance
                # that fenced it no time to commit anything.
                time.sleep(self.rng.uniform(0.2, 1.0))
        return outcome


class KafkaTransactionalWorker(TransactionalWorker):
    """The same transactions through the Kafka door: confluent-kafka (librdkafka) speaking
    Kafka's protocol to the services' listeners, as a Kafka application would. The outcome it
    can vouch for: only commit_transaction sends EndTxn(commit), so a failure before it is a
    definite abort; one inside it is unknown unless librdkafka says the transaction must be
    aborted (then it never committed)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.kafka: Any = None
        self.group_metadata: Any = None
        self._consumer: Any = None

    def ready(self, deadline: float | None = None) -> bool:
        import confluent_kafka as ck

        attempt = 0
        while self.kafka is None:
            if _should_stop(self.parent) or (deadline is not None and time.monotonic() > deadline):
                return False
            s = self.settings
            common: dict[str, Any] = {
                "bootstrap.servers": s.bootstrap,
                "client.id": self.name,
                "log_level": 3,
                # librdkafka 2.12+ re-bootstraps when every known broker is down, which with
                # one broker is every restart, and a transaction open then can hang past its
                # timeouts (its broker handle is never released); docs/pages/kafka.md says so.
                "metadata.recovery.strategy": "none",
            }
            if os.environ.get("FAULT_KAFKA_DEBUG"):
                common |= {"log_level": 7, "debug": os.environ["FAULT_KAFKA_DEBUG"]}
            producer = ck.Producer(
                {
                    **common,
                    "transactional.id": self.tid,
                    "transaction.timeout.ms": s.txn_timeout_ms,
                    "linger.ms": 2,
                    "retry.backoff.ms": 50,
                    "retry.backoff.max.ms": 500,
                }
            )
            try:
                producer.init_transactions(s.api_timeout_ms / 1000)
            except ck.KafkaException as exc:
                log.info("%s: init_transactions failed: %s", self.name, exc)
                time.sleep(min(2.0, 0.1 * 2**attempt))
                attempt += 1
                continue
            self._consumer = ck.Consumer({**common, "group.id": group_of(self.name)})
            self.group_metadata = self._consumer.consumer_group_metadata()
            self.kafka = producer
        # The base class's checks look for a producer; this worker's is the Kafka one.
        self.producer = self.kafka
        return True

    def drop_producer(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
        self.kafka = self.producer = self._consumer = self.group_metadata = None

    def transaction(self, commit: bool, think_s: float = 0.0) -> Outcome:
        """`_transaction` under a watchdog. librdkafka's send_offsets_to_transaction can hang
        past its timeout when the group's coordinator is decommissioned (dropped from Metadata:
        its broker died; confluentinc/librdkafka#5511, open in 2.16), as on Kafka. An
        application then gives that producer up and starts a new instance, which fences it;
        so does this worker: the transaction is `unknown`, the hung call is left to its
        thread, and whatever it does later is fenced and never recorded."""
        ended: list[Outcome] = []
        call = _Call()
        worker = threading.Thread(
            target=lambda: ended.append(self._transaction(commit, think_s, call)), daemon=True
        )
        worker.start()
        worker.join(STUCK_S)
        with call.lock:
            if ended:
                return ended[0]
            call.abandoned = True
            txn, writes, offsets = call.plan
            log.warning(
                "%s: txn %d: librdkafka hung for %gs; a new instance", self.name, txn, STUCK_S
            )
            self.record_end(txn, "unknown", writes, offsets, "HUNG")
        self.kafka = self.producer = self._consumer = self.group_metadata = None  # not closed
        return "unknown"

    def _transaction(self, commit: bool, think_s: float, call: _Call) -> Outcome:
        import confluent_kafka as ck

        producer = self.kafka
        assert producer is not None
        txn, writes, offsets = call.plan = self.next_plan()
        self.recorder.record(Begin(producer=self.name, txn=txn))
        timeout = self.settings.api_timeout_ms / 1000
        error: str | None = None
        usable = True
        in_commit = False
        try:
            producer.begin_transaction()
            for write in writes:
                producer.produce(TOPIC, value=write.value.encode(), partition=write.partition)
            time.sleep(think_s)
            sent = [
                ck.TopicPartition(o.topic, o.partition, o.offset, metadata=o.metadata)
                for o in offsets
            ]
            producer.send_offsets_to_transaction(sent, self.group_metadata, timeout)
            if commit:
                in_commit = True
                _kafka_retrying(lambda: producer.commit_transaction(timeout))
                outcome: Outcome = "committed"
            else:
                _kafka_retrying(lambda: producer.abort_transaction(timeout))
                outcome = "aborted"
        except ck.KafkaException as exc:
            failure = exc.args[0]
            error = failure.name()
            abortable = failure.txn_requires_abort() and not failure.fatal()
            outcome = "unknown" if in_commit and not abortable else "aborted"
            usable = abortable
            if abortable:
                try:
                    producer.abort_transaction(timeout)
                except ck.KafkaException as again:
                    log.info("%s: txn %d: abort failed too: %s", self.name, txn, again)
                    usable = False
            log.info("%s: txn %d %s: %s", self.name, txn, outcome, exc)
        with call.lock:
            if call.abandoned:
                return outcome  # the watchdog recorded it, and a new instance fenced this one
            self.record_end(txn, outcome, writes, offsets, error)
        if not usable:
            self.drop_producer()
            if error in ("PRODUCER_FENCED", "INVALID_PRODUCER_EPOCH", "_FENCED"):
                time.sleep(self.rng.uniform(0.2, 1.0))
        return outcome


@dataclass
class _Call:
    """One transaction of the Kafka worker, between its thread and the watchdog."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    abandoned: bool = False
    plan: tuple[int, list[Write], list[SentOffset]] = (-1, [], [])


def _kafka_retrying(call: Callable[[], T]) -> T:
    """commit_transaction and abort_transaction, called again after a retriable error (a
    timeout, a coordinator moving), as librdkafka's documentation says to."""
    import confluent_kafka as ck

    for attempt in range(TIMEOUT_RETRIES):
        try:
            return call()
        except ck.KafkaException as exc:
            if not exc.args[0].retriable() or attempt == TIMEOUT_RETRIES - 1:
                raise
    raise AssertionError("unreachable")


def _worker_class(settings: ProducerSettings) -> type[TransactionalWorker]:
    return TransactionalWorker if settings.bootstrap is None else KafkaTransactionalWorker


def _retrying(call: Callable[[], T]) -> T:
    """A transaction step, called again after a timeout, as the SDK's docstrings say to."""
    for attempt in range(TIMEOUT_RETRIES):
        try:
            return call()
        except KafkaTimeoutError:
            if attempt == TIMEOUT_RETRIES - 1:
                raise
    raise AssertionError("unreachable")


def _close(producer: Producer) -> None:
    with contextlib.suppress(KafkaException):
        producer.close(timeout=3)


def run_producer(args: argparse.Namespace) -> int:
    parent = os.getppid()
    out = Path(args.out)
    rng = random.Random(args.seed)
    settings = ProducerSettings(
        url=args.url, txn_timeout_ms=args.txn_timeout_ms, bootstrap=args.bootstrap
    )
    with Recorder(history_path(out, args.name), args.name, origin=args.t0) as recorder:
        worker = _worker_class(settings)(
            args.name,
            tid_of(args.name),
            settings,
            recorder,
            plans_path(Path(args.plans), args.name),
            rng,
            args.partitions,
            parent,
        )
        while not _should_stop(parent) and worker.ready():
            commit = rng.random() >= ABORT_RATIO
            worker.transaction(commit, think_s=rng.uniform(0, args.think_ms / 1000))
        worker.drop_producer()
    return 0


def run_second(args: argparse.Namespace) -> int:
    """A second instance of a live transactional id: InitPid fences the running instance (and
    aborts its open transaction); then, sometimes, one transaction of its own, recorded under
    its own name; then exit. The fenced instance must recover by itself."""
    parent = os.getppid()
    out = Path(args.out)
    rng = random.Random(args.seed)
    settings = ProducerSettings(
        url=args.url, txn_timeout_ms=args.txn_timeout_ms, bootstrap=args.bootstrap
    )
    with Recorder(history_path(out, args.name), args.name, origin=args.t0) as recorder:
        worker = _worker_class(settings)(
            args.name,
            args.tid,
            settings,
            recorder,
            plans_path(Path(args.plans), args.name),
            rng,
            args.partitions,
            parent,
        )
        if not worker.ready(deadline=time.monotonic() + args.deadline_s):
            log.info("%s: could not init %s in time", args.name, args.tid)
            return 0
        if rng.random() < 0.7:
            worker.transaction(commit=True)
        worker.drop_producer()
    return 0


# -- readers ---------------------------------------------------------------------------------------


class Unavailable(Exception):
    """No usable answer from this URL now; try again (perhaps elsewhere)."""


class Reader:
    """read_committed fetches over plain HTTP, rotating over its URLs when one fails."""

    def __init__(self, name: str, urls: list[str], recorder: Recorder) -> None:
        self.name = name
        self.urls = urls
        self.recorder = recorder
        self.turn = 0
        self.http = httpx.Client(timeout=httpx.Timeout(5.0))

    def close(self) -> None:
        self.http.close()

    def _get(self, path: str, params: dict[str, Any]) -> httpx.Response:
        url = self.urls[self.turn % len(self.urls)]
        self.turn += 1  # spread requests over every URL given
        try:
            return self.http.get(url + path, params=params)
        except httpx.HTTPError as exc:
            raise Unavailable(f"{url}: {type(exc).__name__}") from exc

    def fetch(self, partition: int, offset: int, phase: str) -> tuple[int, int, int]:
        """One fetch from `offset`; records it when it returned records. Returns (next_offset,
        last_stable_offset, high_watermark)."""
        response = self._get(
            f"/v1/topics/{TOPIC}/partitions/{partition}/records",
            {"offset": offset, "max_records": 500, "isolation_level": "read_committed"},
        )
        if response.status_code != 200:
            raise Unavailable(f"fetch {partition}@{offset}: {response.status_code}")
        page = response.json()
        if page["records"]:
            self.recorder.record(
                Read(
                    reader=self.name,
                    phase="final" if phase == "final" else "live",
                    topic=TOPIC,
                    partition=partition,
                    records=[(r["offset"], r["value"]) for r in page["records"]],
                    last_stable_offset=page["last_stable_offset"],
                    high_watermark=page["high_watermark"],
                    offset=offset,
                    next_offset=page["next_offset"],
                )
            )
        return page["next_offset"], page["last_stable_offset"], page["high_watermark"]

    def poll_groups(self, groups: list[str]) -> None:
        for group in groups:
            try:
                response = self._get(
                    f"/v1/groups/{group}/offsets",
                    {"topic": INPUT_TOPIC, "require_stable": "true"},
                )
            except Unavailable:
                continue
            if response.status_code != 200:
                continue  # UNSTABLE_OFFSET_COMMIT while a transaction holds one, or a fault
            for entry in response.json()["offsets"]:
                self.recorder.record(Group.observed(group, entry, "live"))


def run_reader(args: argparse.Namespace) -> int:
    parent = os.getppid()
    out = Path(args.out)
    urls = args.urls.split(",")
    groups = [g for g in (args.groups or "").split(",") if g]
    process = args.name
    path = history_path(out, f"{process}-final" if args.phase == "final" else process)
    with Recorder(path, process, origin=args.t0) as recorder:
        reader = Reader(process, urls, recorder)
        try:
            if args.phase == "final":
                return _final_read(reader, args.partitions)
            positions = [0] * args.partitions
            next_group_poll = time.monotonic()
            while not _should_stop(parent):
                for partition in range(args.partitions):
                    with contextlib.suppress(Unavailable):
                        positions[partition], _, _ = reader.fetch(
                            partition, positions[partition], "live"
                        )
                if groups and time.monotonic() >= next_group_poll:
                    reader.poll_groups(groups)
                    next_group_poll = time.monotonic() + GROUP_POLL_S
                _stop.wait(LIVE_ROUND_S)
        finally:
            reader.close()
    return 0


def _final_read(reader: Reader, partitions: int) -> int:
    """Every partition from offset 0 to its end; all faults have stopped and no transaction is
    open, so the end is the high watermark. Exits 1 when it could not get there."""
    deadline = time.monotonic() + FINAL_READ_S
    for partition in range(partitions):
        offset = 0
        while True:
            try:
                next_offset, lso, hw = reader.fetch(partition, offset, "final")
            except Unavailable as exc:
                if time.monotonic() > deadline:
                    log.error("final read of %d stuck at %d: %s", partition, offset, exc)
                    return 1
                time.sleep(0.2)
                continue
            if next_offset == offset:
                if lso != hw:
                    log.error("final read of %d ended at LSO %d below HW %d", partition, lso, hw)
                    return 1
                break
            offset = next_offset
    return 0


# -- command line ----------------------------------------------------------------------------------


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="python -m tests.fault.workers", description=__doc__)
    kinds = top.add_subparsers(dest="kind", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--name", required=True, help="process and producer name, e.g. p0")
        p.add_argument("--out", required=True, help="directory of the history files")
        p.add_argument("--t0", type=float, required=True, help="time.monotonic() at run start")
        p.add_argument("--partitions", type=int, default=6, help="partitions of topic 'fault'")

    def producing(p: argparse.ArgumentParser) -> None:
        common(p)
        p.add_argument("--url", required=True, help="where the SDK sends requests (the proxy)")
        p.add_argument("--seed", type=int, required=True)
        p.add_argument("--txn-timeout-ms", type=int, default=5_000)
        p.add_argument("--plans", required=True, help="directory of the transaction plans")
        p.add_argument(
            "--bootstrap",
            help="the Kafka listeners (host:port,...): produce through the Kafka door with "
            "confluent-kafka instead of the SDK over HTTP",
        )

    producer = kinds.add_parser("producer", help="transactions until SIGTERM")
    producing(producer)
    producer.add_argument(
        "--think-ms", type=int, default=0, help="longest random pause inside a transaction"
    )
    second = kinds.add_parser("second", help="a second instance of --tid, then exit")
    producing(second)
    second.add_argument("--tid", required=True, help="the live transactional id to take over")
    second.add_argument("--deadline-s", type=float, default=15.0)
    reader = kinds.add_parser("reader", help="read_committed fetches")
    common(reader)
    reader.add_argument("--urls", required=True, help="comma-separated base URLs")
    reader.add_argument("--phase", choices=("live", "final"), default="live")
    reader.add_argument("--groups", default="", help="comma-separated groups to watch (live)")
    return top


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO,
        format=f"%(asctime)s {args.name} %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)
    signal.signal(signal.SIGTERM, _on_sigterm)
    run = {"producer": run_producer, "second": run_second, "reader": run_reader}[args.kind]
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
