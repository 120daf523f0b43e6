"""The HTTP API's transactions as a small model, checked against the service by hypothesis on SQLite
and Postgres: random steps of several transactional ids, their producers and zombies, and the
coordinator's own aborts.

Each InitPid starts a new producer instance; the older ones stay around as zombies and keep
calling with the epoch they last knew. After every step the service must agree with the model:
each call's answer or refusal code, every transaction's state, producer id and epoch, every
partition's high watermark and LSO, and, for read_committed readers, exactly the committed records.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

import httpx
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from coordinator.app import create_app
from coordinator.core.clock import now_ms
from coordinator.transactions.aborts import abort_timed_out
from tests.support.api import assert_problem, batch, create_topic, produce, read_all, read_paged
from tests.support.services import Backend, empty_tables, make_settings

T = TypeVar("T")
TopicPartition = tuple[str, int]

TOPICS = ("a", "b")
PARTITIONS: list[TopicPartition] = [(topic, p) for topic in TOPICS for p in (0, 1)]
TRANSACTIONAL_IDS = ("tx-0", "tx-1", "tx-2")
PREFIX = "tx-"
OPEN = ("Ongoing", "Prepared")
TIMEOUT_MS = 60_000  # InitPid's default transaction_timeout_ms
# Later than any deadline the coordinator sets (a Prepared transaction may wait a day): the sweep
# then aborts every open transaction, as if each had outlived its timeout.
FAR_FUTURE_MS = 10**14
# Small pages, so that reads page past control markers and aborted batches.
PAGE_SIZE = 3

MODEL_SETTINGS = settings(
    # 24 runs of up to 30 steps on each store, about 35 s each on the suite's machine: the
    # suite's budget; each run of the suite draws new ones, and a failure is replayed first.
    max_examples=24,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    # No shrinking: every step goes through the store, so shrinking a failure takes many minutes;
    # the failing run of at most 30 steps is printed as it is, and replayed first next time.
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
)

# -- the model ----------------------------------------------------------------------------------


@dataclass(eq=False)
class ModelTxn:
    """One transaction: its partitions, the first offset of its records on each (what pins the
    LSO there while it is open), and how it ended (None while open)."""

    partitions: set[TopicPartition] = field(default_factory=set)
    first_offsets: dict[TopicPartition, int] = field(default_factory=dict)
    committed: bool | None = None


@dataclass
class Entry:
    """One offset of a partition's log: a record (of a transaction, or a plain idempotent one), or
    a transaction's control marker."""

    offset: int
    value: str | None  # None: a control marker
    txn: ModelTxn | None  # None: not in a transaction, committed as soon as written


@dataclass
class SentBatch:
    partition: TopicPartition
    epoch: int
    sequence: int
    values: list[str]
    answer: dict[str, Any]


@dataclass
class SentEnd:
    epoch: int
    commit: bool
    answer: dict[str, Any]
    version: int  # the transactional id's version right after this end


@dataclass
class SentGroup:
    body: dict[str, Any]
    answer: dict[str, Any]
    versions: dict[str, int]


@dataclass(eq=False)
class TransactionalId:
    name: str
    producer_id: int
    epoch: int  # the coordinator's current epoch
    state: str = "Empty"
    txn: ModelTxn | None = None  # the open (Ongoing or Prepared) transaction
    # Epochs whose transaction the coordinator aborted after its timeout.
    timed_out: set[int] = field(default_factory=set)
    # Raised by every InitPid and every end: a retry is only sent while it has not moved.
    version: int = 0
    instances: list[Instance] = field(default_factory=list)

    def refusal(self, epoch: int) -> str | None:
        """The code a call carrying `epoch` gets before any state check (docs/pages/http-api.md,
        Transactions)."""
        if epoch < self.epoch:
            return "TRANSACTION_TIMED_OUT" if epoch in self.timed_out else "PRODUCER_FENCED"
        assert epoch == self.epoch, "an instance never holds an epoch the coordinator did not give"
        return None


@dataclass(eq=False)
class Instance:
    """A producer instance: the identity it calls with and its next sequence per partition."""

    tid: TransactionalId
    number: int
    epoch: int
    sequences: dict[TopicPartition, int] = field(default_factory=dict)
    last_batch: SentBatch | None = None
    last_end: SentEnd | None = None

    def adopt(self, epoch: int) -> None:
        """Use the epoch an end handed out; the first batch of an epoch starts at sequence 0."""
        self.epoch = epoch
        self.sequences = {}

    def caller(self, epoch: int | None = None) -> dict[str, int]:
        return {
            "producer_id": self.tid.producer_id,
            "producer_epoch": self.epoch if epoch is None else epoch,
        }


# -- the machine --------------------------------------------------------------------------------

tid_index = st.integers(0, len(TRANSACTIONAL_IDS) - 1)
# Below 4: the newest instance of the id; otherwise one of its zombies, when it has any.
instance_choice = st.integers(0, 7)


class TransactionsMachine(RuleBasedStateMachine):
    def __init__(self, store: Backend) -> None:
        super().__init__()
        # A loop of its own: the app's engines are bound to the loop that first used them.
        self.runner = asyncio.Runner()
        self.app = create_app(make_settings(store))
        self.db = self.app.state.db
        self.client = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=self.app), base_url="http://coordinator"
        )
        self.logs: dict[TopicPartition, list[Entry]] = {tp: [] for tp in PARTITIONS}
        # What the last step may have changed, so the checks after it read only that.
        self.changed: set[TopicPartition] = set(PARTITIONS)
        self.touched: set[str] = set(TRANSACTIONAL_IDS)
        self.targeted: set[TopicPartition] = set()
        self.acted = True  # False after a step that sent nothing (no instance was fenced)
        self.tids: dict[str, TransactionalId] = {}
        self.values = 0
        self.last_group: SentGroup | None = None
        self.run(empty_tables(self.db))
        for topic in TOPICS:
            self.run(create_topic(self.client, topic, partitions=2))
        for name in TRANSACTIONAL_IDS:
            self.new_instance(name, keep_prepared=False)

    def teardown(self) -> None:
        try:
            self.run(self.client.aclose())
            self.run(self.db.dispose())
        finally:
            self.runner.close()

    # -- plumbing --

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        self.acted = True
        return self.runner.run(coroutine)

    def post(self, path: str, body: dict[str, Any]) -> httpx.Response:
        return self.run(self.client.post(path, json=body))

    def pick(self, index: int, choice: int) -> Instance:
        self.touched.add(TRANSACTIONAL_IDS[index])
        *zombies, newest = self.tids[TRANSACTIONAL_IDS[index]].instances
        return newest if choice < 4 or not zombies else zombies[choice % len(zombies)]

    def with_sent(self, what: str) -> list[Instance]:
        """The instances whose last batch or EndTxn (`what`) there is to retry."""
        return [
            instance
            for tid in self.tids.values()
            for instance in tid.instances
            if getattr(instance, what) is not None
        ]

    def pick_from(self, instances: list[Instance], choice: int) -> Instance:
        instance = instances[choice % len(instances)]
        self.touched.add(instance.tid.name)
        return instance

    def next_value(self, instance: Instance) -> str:
        self.values += 1
        return f"{instance.tid.name}/i{instance.number}/e{instance.epoch}/v{self.values}"

    def append(self, tp: TopicPartition, value: str | None, txn: ModelTxn | None) -> None:
        log = self.logs[tp]
        log.append(Entry(len(log), value, txn))
        self.changed.add(tp)

    def finish(self, tid: TransactionalId, commit: bool) -> None:
        """End the open transaction as the service must: a marker on each of its partitions, the
        new state, the epoch raised by one."""
        txn = tid.txn
        assert txn is not None and tid.state in OPEN
        txn.committed = commit
        for tp in sorted(txn.partitions):
            self.append(tp, None, txn)
        tid.txn = None
        tid.state = "CompleteCommit" if commit else "CompleteAbort"
        tid.epoch += 1
        tid.version += 1

    def new_instance(self, name: str, keep_prepared: bool) -> Instance:
        response = self.post(
            "/v1/init-pid", {"transactional_id": name, "keep_prepared": keep_prepared}
        )
        assert response.status_code == 200, response.text
        self.touched.add(name)
        answer = response.json()
        tid = self.tids.get(name)
        if tid is None:
            # A new transactional id: a fresh producer id at epoch 0.
            assert answer["producer_epoch"] == 0, answer
            assert answer["producer_id"] not in {t.producer_id for t in self.tids.values()}
            tid = self.tids[name] = TransactionalId(name, answer["producer_id"], 0)
        else:
            # The same producer id, the epoch raised by exactly one; the open transaction of the
            # older epoch aborted, unless it is Prepared and kept for the new instance.
            assert answer == {"producer_id": tid.producer_id, "producer_epoch": tid.epoch + 1}
            kept = tid.state == "Prepared" and keep_prepared
            if tid.state in OPEN and not kept:
                self.finish(tid, commit=False)
            else:
                tid.epoch += 1
                tid.version += 1
            if not kept:
                tid.state = "Empty"
            assert tid.epoch == answer["producer_epoch"]
        instance = Instance(tid, len(tid.instances), tid.epoch)
        tid.instances.append(instance)
        return instance

    def stable_offset(self, tp: TopicPartition) -> int:
        pinned = [
            tid.txn.first_offsets[tp]
            for tid in self.tids.values()
            if tid.txn is not None and tp in tid.txn.first_offsets
        ]
        return min(pinned, default=len(self.logs[tp]))

    def expected_records(self, tp: TopicPartition, read_committed: bool) -> list[tuple[int, str]]:
        stable = self.stable_offset(tp)
        return [
            (entry.offset, entry.value)
            for entry in self.logs[tp]
            if entry.value is not None
            and (
                not read_committed
                or ((entry.txn is None or entry.txn.committed) and entry.offset < stable)
            )
        ]

    # -- the producers' calls --

    @rule(index=tid_index, keep_prepared=st.booleans())
    def init_pid(self, index: int, keep_prepared: bool) -> None:
        self.new_instance(TRANSACTIONAL_IDS[index], keep_prepared)

    @rule(
        index=tid_index,
        choice=instance_choice,
        partitions=st.lists(st.sampled_from(PARTITIONS), min_size=1, max_size=2),
    )
    def add_partitions(self, index: int, choice: int, partitions: list[TopicPartition]) -> None:
        self.join(self.pick(index, choice), partitions)

    def join(self, instance: Instance, partitions: list[TopicPartition]) -> None:
        tid = instance.tid
        self.targeted.update(partitions)
        response = self.post(
            f"/v1/transactions/{tid.name}/partitions",
            {
                **instance.caller(),
                "partitions": [{"topic": t, "partition": p} for t, p in partitions],
            },
        )
        code = tid.refusal(instance.epoch)
        if code is None and tid.state == "Prepared":
            code = "INVALID_TXN_STATE"  # nothing joins a Prepared transaction
        if code is not None:
            assert_problem(response, 409, code)
            return
        assert response.status_code == 200, response.text
        assert response.json() == {"state": "Ongoing"}
        if tid.txn is None:
            tid.txn = ModelTxn()
        tid.state = "Ongoing"
        tid.txn.partitions.update(partitions)

    def target(self, tid: TransactionalId, choice: int) -> TopicPartition:
        """Mostly a partition of the id's open transaction, when it has one; else any."""
        joined = sorted(tid.txn.partitions) if tid.txn is not None else []
        return joined[choice % len(joined)] if joined and choice < 6 else PARTITIONS[choice % 4]

    @rule(
        index=tid_index,
        choice=instance_choice,
        where=st.integers(0, 7),
        size=st.integers(1, 3),
        join_first=st.booleans(),
        answer_lost=st.booleans(),
    )
    def produce_batch(
        self, index: int, choice: int, where: int, size: int, join_first: bool, answer_lost: bool
    ) -> None:
        """A transactional batch, after adding its partition to the transaction, or without (the
        batch adds it itself, starting a transaction when none is open: transaction version 2);
        sent again at once when its answer was lost."""
        instance = self.pick(index, choice)
        tid = instance.tid
        tp = self.target(tid, where)
        if join_first:
            self.join(instance, [tp])
        self.targeted.add(tp)
        sequence = instance.sequences.get(tp, 0)
        values = [self.next_value(instance) for _ in range(size)]
        body = batch(values, tid.producer_id, instance.epoch, sequence, transactional_id=tid.name)
        response = self.run(produce(self.client, tp[0], tp[1], body))
        code = tid.refusal(instance.epoch)
        if code is None and tid.state == "Prepared":
            code = "INVALID_TXN_STATE"  # nothing joins a Prepared transaction
        if code is not None:
            assert_problem(response, 409, code)
            return
        if tid.txn is None:
            tid.txn = ModelTxn()
        tid.state = "Ongoing"
        tid.txn.partitions.add(tp)
        high_watermark = len(self.logs[tp])
        assert response.status_code == 200, response.text
        assert response.json() == {
            "base_offset": high_watermark,
            "last_offset": high_watermark + size - 1,
            "duplicate": False,
        }
        tid.txn.first_offsets.setdefault(tp, high_watermark)
        for value in values:
            self.append(tp, value, tid.txn)
        instance.sequences[tp] = sequence + size
        instance.last_batch = SentBatch(tp, instance.epoch, sequence, values, response.json())
        if answer_lost:
            self.retry_last_batch(instance)

    @rule(index=tid_index, choice=instance_choice, where=st.integers(0, 7), size=st.integers(1, 2))
    def produce_idempotent_batch(self, index: int, choice: int, where: int, size: int) -> None:
        """A batch without a transactional id, from a transactional producer: a zombie must not get
        around its fencing this way, nor may a batch slip into an open transaction."""
        instance = self.pick(index, choice)
        tid = instance.tid
        tp = self.target(tid, where)
        self.targeted.add(tp)
        sequence = instance.sequences.get(tp, 0)
        values = [self.next_value(instance) for _ in range(size)]
        response = self.run(
            produce(
                self.client, tp[0], tp[1], batch(values, tid.producer_id, instance.epoch, sequence)
            )
        )
        if instance.epoch < tid.epoch:
            assert_problem(response, 409, "INVALID_PRODUCER_EPOCH")
            return
        joined = tid.txn is not None and tp in tid.txn.partitions
        holds_records = tid.txn is not None and tp in tid.txn.first_offsets
        # Records of the open transaction are on the partition: nothing is written there outside it.
        # A partition that only joined it: docs/pages/http-api.md does not say whether that counts
        # already.
        if holds_records or (joined and response.status_code != 200):
            assert_problem(response, 409, "INVALID_TXN_STATE")
            return
        high_watermark = len(self.logs[tp])
        assert response.status_code == 200, response.text
        assert response.json() == {
            "base_offset": high_watermark,
            "last_offset": high_watermark + size - 1,
            "duplicate": False,
        }
        for value in values:
            self.append(tp, value, None)
        instance.sequences[tp] = sequence + size

    def retriable(self) -> list[str]:
        """What there is to send again: a batch, an EndTxn, the last commit-group (while none of its
        ids moved on; after that docs/pages/http-api.md does not say whether a late copy is a
        retry)."""
        kinds = []
        if self.with_sent("last_batch"):
            kinds.append("batch")
        if self.with_sent("last_end"):
            kinds.append("end")
        group = self.last_group
        if group is not None and all(self.tids[n].version == v for n, v in group.versions.items()):
            kinds.append("commit-group")
        return kinds

    @precondition(lambda self: self.retriable())
    @rule(what=st.sampled_from(["batch", "end", "commit-group"]), choice=st.integers(0, 99))
    def retry(self, what: str, choice: int) -> None:
        """A producer sends its last batch or EndTxn again, or the driver its last commit-group,
        as after a lost answer: the same answer again, and nothing written twice."""
        kinds = self.retriable()
        kind = what if what in kinds else kinds[choice % len(kinds)]
        if kind == "batch":
            self.retry_last_batch(self.pick_from(self.with_sent("last_batch"), choice))
        elif kind == "end":
            instance = self.pick_from(self.with_sent("last_end"), choice)
            self.retry_last_end(instance, same_outcome=choice % 4 != 0)
        else:
            self.retry_last_commit_group()

    def retry_last_batch(self, instance: Instance) -> None:
        sent = instance.last_batch
        assert sent is not None
        tid = instance.tid
        self.targeted.add(sent.partition)
        body = batch(
            sent.values, tid.producer_id, sent.epoch, sent.sequence, transactional_id=tid.name
        )
        response = self.run(produce(self.client, sent.partition[0], sent.partition[1], body))
        code = tid.refusal(sent.epoch)
        if code is None and tid.state != "Ongoing":
            code = "INVALID_TXN_STATE"  # its transaction is Prepared now: nothing may join
        if code is not None:
            assert_problem(response, 409, code)
            return
        # Still its own Ongoing transaction: the original offsets, and nothing written.
        assert response.status_code == 200, response.text
        assert response.json() == {**sent.answer, "duplicate": True}

    @rule(index=tid_index, call=st.sampled_from(["partitions", "produce", "commit"]))
    def fenced_instances_keep_trying(self, index: int, call: str) -> None:
        """Every instance of the id holding an older epoch (zombies, and a newest instance whose
        transaction the coordinator aborted) tries again: each is refused, and writes nothing."""
        tid = self.tids[TRANSACTIONAL_IDS[index]]
        self.touched.add(tid.name)
        tp = PARTITIONS[0]
        self.targeted.add(tp)
        for instance in tid.instances:
            code = tid.refusal(instance.epoch)
            if code is None:
                continue
            if call == "partitions":
                response = self.post(
                    f"/v1/transactions/{tid.name}/partitions",
                    {**instance.caller(), "partitions": [{"topic": tp[0], "partition": tp[1]}]},
                )
            elif call == "produce":
                body = batch(
                    [self.next_value(instance)],
                    tid.producer_id,
                    instance.epoch,
                    instance.sequences.get(tp, 0),
                    transactional_id=tid.name,
                )
                response = self.run(produce(self.client, tp[0], tp[1], body))
            else:
                response = self.post(
                    f"/v1/transactions/{tid.name}/end", {**instance.caller(), "commit": True}
                )
            assert_problem(response, 409, code)

    @rule(index=tid_index, choice=instance_choice)
    def prepare(self, index: int, choice: int) -> None:
        instance = self.pick(index, choice)
        tid = instance.tid
        response = self.post(f"/v1/transactions/{tid.name}/prepare", instance.caller())
        code = tid.refusal(instance.epoch)
        if code is not None:
            assert_problem(response, 409, code)
            return
        if tid.state == "Prepared":
            # docs/pages/http-api.md allows Prepare from Ongoing, Empty or complete and is silent on
            # Prepared: a repeated Prepare may be answered again or refused, but it changes nothing.
            if response.status_code != 200:
                assert_problem(response, 409, "INVALID_TXN_STATE")
            else:
                assert response.json() == {"state": "Prepared"}
            return
        assert response.status_code == 200, response.text
        assert response.json() == {"state": "Prepared"}
        if tid.txn is None:
            tid.txn = ModelTxn()  # a task with no output prepares an empty transaction
        tid.state = "Prepared"

    @rule(index=tid_index, choice=instance_choice, commit=st.booleans(), answer_lost=st.booleans())
    def end_txn(self, index: int, choice: int, commit: bool, answer_lost: bool) -> None:
        instance = self.pick(index, choice)
        tid = instance.tid
        ended_epoch = instance.epoch
        response = self.post(
            f"/v1/transactions/{tid.name}/end", {**instance.caller(), "commit": commit}
        )
        code = tid.refusal(ended_epoch)
        if code is None and tid.state not in OPEN:
            code = "INVALID_TXN_STATE"  # nothing open at the current epoch
        if code is not None:
            assert_problem(response, 409, code)
            return
        assert response.status_code == 200, response.text
        # The answer carries the new epoch, which the instance uses from then on.
        assert response.json() == {
            "state": "CompleteCommit" if commit else "CompleteAbort",
            "producer_id": tid.producer_id,
            "producer_epoch": ended_epoch + 1,
        }
        self.finish(tid, commit)
        instance.adopt(tid.epoch)
        instance.last_end = SentEnd(ended_epoch, commit, response.json(), tid.version)
        if answer_lost:
            self.retry_last_end(instance, same_outcome=True)

    def retry_last_end(self, instance: Instance, same_outcome: bool) -> None:
        tid = instance.tid
        sent = instance.last_end
        assert sent is not None
        # docs/pages/http-api.md answers a retry again; once the id moved on (another end, an
        # InitPid) it does not say whether a late copy is a retry or a fenced request, so only the
        # other outcome is sent then.
        same_outcome = same_outcome and tid.version == sent.version
        commit = sent.commit if same_outcome else not sent.commit
        response = self.post(
            f"/v1/transactions/{tid.name}/end",
            {**instance.caller(sent.epoch), "commit": commit},
        )
        if same_outcome:
            assert response.status_code == 200, response.text
            assert response.json() == sent.answer
        else:
            # The other outcome is no retry: a request with an older epoch, fenced.
            code = tid.refusal(sent.epoch)
            assert code is not None
            assert_problem(response, 409, code)

    # -- the coordinator's aborts and commit-group --

    @rule(prepared_too=st.booleans())
    def time_out(self, prepared_too: bool) -> None:
        """The coordinator's sweep once every transaction timeout has passed: Ongoing transactions
        are aborted; Prepared ones wait for their commit far longer, unless that ran out too."""
        if prepared_too:
            self.sweep(FAR_FUTURE_MS, timing_out=OPEN)
        else:
            self.sweep(now_ms() + 2 * TIMEOUT_MS, timing_out=("Ongoing",))

    def sweep(self, now: int, timing_out: tuple[str, ...]) -> None:
        self.touched.update(self.tids)
        expected = sorted(name for name, tid in self.tids.items() if tid.state in timing_out)
        aborted = self.run(abort_timed_out(self.db, now=now))
        assert sorted(aborted) == expected
        for name in expected:
            tid = self.tids[name]
            tid.timed_out.add(tid.epoch)
            self.finish(tid, commit=False)

    @rule(
        members=st.lists(
            st.tuples(tid_index, instance_choice), min_size=1, max_size=3, unique_by=lambda m: m[0]
        ),
        abort_others=st.booleans(),
        answer_lost=st.booleans(),
    )
    def commit_group(
        self, members: list[tuple[int, int]], abort_others: bool, answer_lost: bool
    ) -> None:
        self.touched.update(self.tids)
        instances = [self.pick(index, choice) for index, choice in members]
        body = {
            "transactions": [
                {"transactional_id": instance.tid.name, **instance.caller()}
                for instance in instances
            ],
            "abort_others_with_prefix": PREFIX if abort_others else None,
        }
        response = self.post("/v1/transactions/commit-group", body)
        for instance in instances:
            tid = instance.tid
            code = tid.refusal(instance.epoch)
            if code is None and tid.state not in OPEN:
                code = "INVALID_TXN_STATE"
            if code is not None:
                # All or none: the first offender's error, naming it, and nothing changes.
                problem = assert_problem(response, 409, code)
                assert tid.name in problem["detail"], problem
                return
        listed = {instance.tid.name for instance in instances}
        others = [
            name
            for name, tid in sorted(self.tids.items())
            if abort_others and name not in listed and tid.state in OPEN
        ]
        for instance in sorted(instances, key=lambda i: i.tid.name):
            self.finish(instance.tid, commit=True)
            instance.adopt(instance.tid.epoch)
        for name in others:
            self.finish(self.tids[name], commit=False)
        assert response.status_code == 200, response.text
        answer = response.json()
        assert answer["committed"] == [
            {
                "transactional_id": instance.tid.name,
                "producer_id": instance.tid.producer_id,
                "producer_epoch": instance.epoch,
            }
            for instance in instances
        ]
        assert sorted(answer["aborted"]) == others
        versions = {name: self.tids[name].version for name in listed}
        sent = SentGroup(body, answer, versions)
        if answer_lost:
            self.last_group = sent
            self.retry_last_commit_group()
        # Later, a copy that aborts others by prefix would abort transactions opened since.
        self.last_group = None if abort_others else sent

    def retry_last_commit_group(self) -> None:
        sent = self.last_group
        assert sent is not None
        self.touched.update(self.tids)
        response = self.post("/v1/transactions/commit-group", sent.body)
        assert response.status_code == 200, response.text
        assert response.json() == sent.answer

    @rule(tp=st.sampled_from(PARTITIONS))
    def read_committed_in_small_pages(self, tp: TopicPartition) -> None:
        """A read_committed reader pages past control markers and aborted batches."""
        records, last_page = self.run(read_paged(self.client, tp[0], tp[1], PAGE_SIZE))
        assert values_of(records) == self.expected_records(tp, read_committed=True), tp
        assert last_page["high_watermark"] == len(self.logs[tp])
        assert last_page["last_stable_offset"] == self.stable_offset(tp)

    # -- what must hold after every step --

    @invariant()
    def service_agrees_with_model(self) -> None:
        """After each step: the high watermarks and LSOs of every topic the step wrote to, asked
        to write to, or could have written markers to (so a refused call wrote nothing), the state
        of each transactional id it touched, and the records of each partition it wrote to."""
        if self.acted:
            self.run(self.check())
        self.changed.clear()
        self.touched.clear()
        self.targeted.clear()
        self.acted = False

    async def check(self) -> None:
        names = sorted(self.touched)
        # The partitions the step wrote to, or asked to, or whose transaction it may have ended.
        affected = self.changed | self.targeted
        for name in names:
            txn = self.tids[name].txn
            affected |= txn.partitions if txn is not None else set()
        checked_topics = sorted({topic for topic, _ in affected})
        topics, descriptions, _ = await asyncio.gather(
            asyncio.gather(*(self.client.get(f"/v1/topics/{t}") for t in checked_topics)),
            asyncio.gather(*(self.client.get(f"/v1/transactions/{n}") for n in names)),
            asyncio.gather(*(self.check_records(tp) for tp in sorted(self.changed))),
        )
        for topic, response in zip(checked_topics, topics, strict=True):
            assert response.status_code == 200, response.text
            assert response.json()["partitions"] == [
                {
                    "partition": p,
                    "log_start_offset": 0,
                    "high_watermark": len(self.logs[(topic, p)]),
                    "last_stable_offset": self.stable_offset((topic, p)),
                }
                for p in (0, 1)
            ], f"high watermarks and LSOs of {topic}"
        for name, response in zip(names, descriptions, strict=True):
            tid = self.tids[name]
            assert response.status_code == 200, response.text
            description = response.json()
            partitions = sorted(tid.txn.partitions) if tid.txn is not None else []
            assert {
                "state": description["state"],
                "producer_id": description["producer_id"],
                "producer_epoch": description["producer_epoch"],
                "partitions": description["partitions"],
            } == {
                "state": tid.state,
                "producer_id": tid.producer_id,
                "producer_epoch": tid.epoch,
                "partitions": [{"topic": t, "partition": p} for t, p in partitions],
            }, f"describe {tid.name}"

    async def check_records(self, tp: TopicPartition) -> None:
        """read_committed: exactly the committed records below the LSO, in offset order, nothing
        aborted, open or repeated; read_uncommitted: every acknowledged record, aborted ones too."""
        committed, uncommitted = await asyncio.gather(
            read_all(self.client, tp[0], tp[1]),
            read_all(self.client, tp[0], tp[1], isolation_level="read_uncommitted"),
        )
        assert values_of(committed) == self.expected_records(tp, read_committed=True), tp
        assert values_of(uncommitted) == self.expected_records(tp, read_committed=False), tp


def values_of(records: list[dict[str, Any]]) -> list[tuple[int, str]]:
    return [(r["offset"], r["value"]) for r in records]


def test_random_producers_zombies_and_timeouts_leave_exactly_the_committed_records(
    store: Backend,
) -> None:
    run_state_machine_as_test(lambda: TransactionsMachine(store), settings=MODEL_SETTINGS)


async def test_every_epoch_whose_txn_timed_out_is_told_so_even_after_later_ends(
    app: Any, client: httpx.AsyncClient
) -> None:
    """The model's rule for TRANSACTION_TIMED_OUT on its own: it belongs to each epoch whose
    transaction outlived its timeout, not only to the id's latest end or latest timeout."""
    await create_topic(client, "a")
    response = await client.post("/v1/init-pid", json={"transactional_id": "tx"})
    pid = response.json()["producer_id"]

    async def add_partition(epoch: int) -> httpx.Response:
        return await client.post(
            "/v1/transactions/tx/partitions",
            json={
                "producer_id": pid,
                "producer_epoch": epoch,
                "partitions": [{"topic": "a", "partition": 0}],
            },
        )

    async def init_pid(epoch: int) -> None:
        response = await client.post("/v1/init-pid", json={"transactional_id": "tx"})
        assert response.json() == {"producer_id": pid, "producer_epoch": epoch}

    assert (await add_partition(0)).status_code == 200
    assert await abort_timed_out(app.state.db, now=FAR_FUTURE_MS) == ["tx"]
    assert_problem(await add_partition(0), 409, "TRANSACTION_TIMED_OUT")
    # The producer starts again, and its new instance completes a transaction.
    await init_pid(2)
    assert (await add_partition(2)).status_code == 200
    ended = await client.post(
        "/v1/transactions/tx/end", json={"producer_id": pid, "producer_epoch": 2, "commit": True}
    )
    assert ended.status_code == 200, ended.text
    # A late call of the timed-out epoch still learns that its transaction timed out.
    assert_problem(await add_partition(0), 409, "TRANSACTION_TIMED_OUT")
    # Then the transaction of epoch 3 times out as well: both epochs are told so.
    assert (await add_partition(3)).status_code == 200
    assert await abort_timed_out(app.state.db, now=FAR_FUTURE_MS) == ["tx"]
    await init_pid(5)
    assert_problem(await add_partition(3), 409, "TRANSACTION_TIMED_OUT")
    assert_problem(await add_partition(0), 409, "TRANSACTION_TIMED_OUT")
    # An epoch that ended by its own EndTxn is plainly fenced.
    assert_problem(await add_partition(2), 409, "PRODUCER_FENCED")
