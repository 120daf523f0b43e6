"""The fault workload's checker catches each anomaly it names, and only where it is: one small
valid history, and for each rule the smallest change that breaks it. Also the history files."""

from __future__ import annotations

import io
import json
import threading
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import pytest

from tests.fault.checker import ANOMALIES, Report, check
from tests.fault.history import (
    Begin,
    Event,
    Fault,
    FaultCount,
    Group,
    Read,
    Recorder,
    SentOffset,
    Txn,
    Write,
    load,
)
from tests.fault.runner import PROFILES, _Run

Record = tuple[int, str | None]
Log = dict[tuple[str, int], list[Record]]


def txn(
    producer: str,
    number: int,
    outcome: str,
    writes: list[tuple[int, str]],
    offset: bool = True,
    error: str | None = None,
) -> Txn:
    """A txn of `producer` writing `"{producer}-{number}-{i}"` to fault/{partition} in order."""
    name = f"{producer}-{number}"
    return Txn(
        process=producer,
        t=float(number),
        producer=producer,
        tid=f"fault-{producer}",
        txn=number,
        pid={"p1": 11, "p2": 12, "p3": 13}[producer],
        epoch=number,
        writes=[Write(topic="fault", partition=p, value=v) for p, v in writes],
        offsets=[
            SentOffset(
                group=f"fault-g-{producer}",
                topic="fault-in",
                partition=0,
                offset=number + 1,
                metadata=name,
            )
        ]
        if offset
        else [],
        outcome=outcome,  # type: ignore[arg-type]
        error=error,
    )


TXNS: list[Event] = [
    txn("p1", 0, "committed", [(0, "p1-0-0"), (1, "p1-0-1")]),
    txn("p1", 1, "aborted", [(0, "p1-1-0"), (1, "p1-1-1")], error="PRODUCER_FENCED"),
    txn("p1", 2, "committed", [(0, "p1-2-0"), (0, "p1-2-1")]),
    txn("p1", 3, "unknown", [(1, "p1-3-0")], error="timeout"),  # did not commit
    txn("p2", 0, "committed", [(1, "p2-0-0"), (0, "p2-0-1")]),
    txn("p2", 1, "unknown", [(0, "p2-1-0"), (1, "p2-1-1")], error="timeout"),  # did commit
    txn("p2", 2, "unknown", [(1, "p2-2-0"), (0, "p2-2-1")], offset=False),  # did not commit
    Begin(process="p2", t=3.5, producer="p2", txn=3),  # killed before it produced
    Begin(process="p3", t=0.5, producer="p3", txn=0),  # killed mid-commit: it committed
]

# What a correct service shows: committed records, with gaps for markers and aborted records.
VISIBLE: Log = {
    ("fault", 0): [(0, "p1-0-0"), (4, "p2-0-1"), (6, "p1-2-0"), (7, "p1-2-1"), (9, "p2-1-0")],
    ("fault", 1): [(0, "p1-0-1"), (4, "p2-0-0"), (6, "p2-1-1"), (10, "p3-0-0")],
}

GROUPS: list[Group] = [
    Group(
        process="runner",
        t=2.0,
        group="fault-g-p1",
        topic="fault-in",
        partition=0,
        offset=1,
        metadata="p1-0",
        phase="live",
    ),
    Group(
        process="runner",
        t=20.0,
        group="fault-g-p1",
        topic="fault-in",
        partition=0,
        offset=3,
        metadata="p1-2",
        phase="final",
    ),
    Group(
        process="runner",
        t=20.0,
        group="fault-g-p2",
        topic="fault-in",
        partition=0,
        offset=2,
        metadata="p2-1",
        phase="final",
    ),
]

FAULTS: list[Event] = [
    Fault(process="nemesis", t=1.0, fault="kill-service", detail={"pid": 4242}),
    Fault(process="nemesis", t=2.0, fault="delay", detail={"ms": 300}),
    FaultCount(process="proxy", t=30.0, fault="drop-response", count=3),
]


def reads(log: Log) -> list[Read]:
    """Live reads of each partition's first records, then every reader's final reads of all."""
    c1_live = log[("fault", 0)][:2]
    end = {tp: (records[-1][0] + 2 if records else 0) for tp, records in log.items()}
    result = [
        Read(
            process="c1",
            t=3.0,
            reader="c1",
            phase="live",
            topic="fault",
            partition=0,
            records=c1_live,
            last_stable_offset=c1_live[-1][0] + 1,
            high_watermark=c1_live[-1][0] + 3,
            offset=0,
            next_offset=c1_live[-1][0] + 1,
        ),
        # Without the optional offset and next_offset.
        Read(
            process="c2",
            t=3.0,
            reader="c2",
            phase="live",
            topic="fault",
            partition=1,
            records=log[("fault", 1)][:1],
            last_stable_offset=2,
            high_watermark=3,
        ),
    ]
    for reader in ("c1", "c2"):
        for (topic, partition), records in log.items():
            last = end[(topic, partition)]
            fetches = [records]
            if (reader, partition) == ("c2", 1):  # in two fetches
                fetches = [records[:2], records[2:]]
            start = 0
            for number, part in enumerate(fetches):
                stop = last if number == len(fetches) - 1 else part[-1][0] + 1
                result.append(
                    Read(
                        process=reader,
                        t=10.0,
                        reader=reader,
                        phase="final",
                        topic=topic,
                        partition=partition,
                        records=part,
                        last_stable_offset=last,
                        high_watermark=last,
                        offset=start,
                        next_offset=stop,
                    )
                )
                start = stop
    return result


def history(
    log: Log | None = None,
    groups: list[Group] | None = None,
    extra: list[Event] | None = None,
    txns: list[Event] | None = None,
) -> list[Event]:
    return [
        *(TXNS if txns is None else txns),
        *FAULTS,
        *reads(VISIBLE if log is None else log),
        *(GROUPS if groups is None else groups),
        *(extra or []),
    ]


def changed(**partitions: list[Record]) -> Log:
    """VISIBLE with some partitions replaced: changed(p0=[...])."""
    log = {tp: list(records) for tp, records in VISIBLE.items()}
    for name, records in partitions.items():
        log[("fault", int(name[1:]))] = sorted(records)
    return log


def found(report: Report) -> dict[str, int]:
    return {kind: n for kind, n in report.anomalies.items() if n}


def p(partition: int) -> list[Record]:
    return list(VISIBLE[("fault", partition)])


def without(records: Sequence[Record], *values: str) -> list[Record]:
    return [(o, v) for o, v in records if v not in values]


def swap(records: Sequence[Record], a: str, b: str) -> list[Record]:
    return [(o, b if v == a else a if v == b else v) for o, v in records]


# The valid history, and what may legitimately happen to unknown transactions.


def test_valid_history_reports_no_anomaly() -> None:
    report = check(history())
    assert report.anomalies == dict.fromkeys(ANOMALIES, 0)
    assert report.ok
    assert report.examples == {kind: [] for kind in ANOMALIES}
    assert (report.transactions_attempted, report.committed, report.aborted) == (9, 3, 1)
    assert (report.unknown, report.unknown_visible) == (5, 2)
    assert report.faults == {"kill-service": 1, "delay": 1, "drop-response": 3}
    assert report.warnings == []


def test_unknown_txn_fully_visible_is_fine() -> None:
    log = changed(p0=[*p(0), (11, "p2-2-1")], p1=[*p(1), (12, "p2-2-0")])
    report = check(history(log))
    assert report.ok, report.table()
    assert report.unknown_visible == 3


def test_unknown_txn_fully_invisible_is_fine() -> None:
    log = changed(p0=without(p(0), "p2-1-0"), p1=without(p(1), "p2-1-1"))
    groups = [*GROUPS[:2], replace(GROUPS[2], offset=1, metadata="p2-0")]
    report = check(history(log, groups))
    assert report.ok, report.table()
    assert report.unknown_visible == 1


def test_unknown_txn_half_visible_is_torn() -> None:
    report = check(history(changed(p1=[*p(1), (12, "p2-2-0")])))
    assert found(report) == {"torn_transaction": 1}
    assert "p2-2-0" in report.examples["torn_transaction"][0]
    assert "p2-2-1" in report.examples["torn_transaction"][0]


def test_unlogged_write_of_a_killed_txn_is_attributed_to_it() -> None:
    # p2-3 only began (its writes were never logged): its values read are its own, not strays,
    # and the txn is all-or-nothing like any unknown one.
    report = check(history(changed(p0=[*p(0), (11, "p2-3-0")])))
    assert report.ok, report.table()
    log = changed(p0=[*p(0), (11, "p2-3-0"), (12, "p2-3-1")])
    extra: list[Event] = [
        Read(
            reader="c3",
            phase="live",
            topic="fault",
            partition=1,
            records=[(13, "p2-3-2")],
            last_stable_offset=14,
            high_watermark=14,
            process="c3",
            t=5.0,
        )
    ]
    # Read live, gone from the final reads: lost; and the final reads show only part of it.
    assert found(check(history(log, extra=extra))) == {"lost_commit": 1, "torn_transaction": 1}


def test_committed_txn_half_visible_is_torn_and_lost() -> None:
    report = check(history(changed(p1=without(p(1), "p2-0-0"))))
    assert found(report) == {"torn_transaction": 1, "lost_commit": 1}


# One rule each.


def test_duplicate_value_is_reported() -> None:
    report = check(history(changed(p0=[*p(0), (11, "p1-0-0")])))
    assert found(report) == {"duplicate": 1}
    assert "fault/0@0" in report.examples["duplicate"][0]
    assert "fault/0@11" in report.examples["duplicate"][0]


def test_duplicate_value_in_another_partition_is_reported() -> None:
    report = check(history(changed(p1=[*p(1), (12, "p1-2-1")])))
    assert found(report) == {"duplicate": 1}


def test_lost_commit_is_reported() -> None:
    report = check(history(changed(p0=without(p(0), "p2-0-1"), p1=without(p(1), "p2-0-0"))))
    assert found(report) == {"lost_commit": 2}
    assert (
        "txn p2-0 (tid fault-p2, pid 12, epoch 0, committed)" in (report.examples["lost_commit"][0])
    )


def test_value_read_live_then_gone_is_a_lost_commit() -> None:
    # An unknown txn may stay invisible, but not after a read_committed read returned it.
    log = changed(p0=without(p(0), "p2-1-0"), p1=without(p(1), "p2-1-1"))
    groups = [*GROUPS[:2], replace(GROUPS[2], offset=1, metadata="p2-0")]
    seen: list[Event] = [
        Read(
            reader="c3",
            phase="live",
            topic="fault",
            partition=1,
            records=[(6, "p2-1-1")],
            last_stable_offset=7,
            high_watermark=7,
            process="c3",
            t=5.0,
        )
    ]
    report = check(history(log, groups, extra=seen))
    # The final reads covered offset 6 without it: they also disagree with the live read.
    assert found(report) == {"lost_commit": 1, "reader_disagreement": 2}


def test_final_group_offset_behind_last_commit_is_a_lost_commit() -> None:
    groups = [*GROUPS[:1], replace(GROUPS[1], offset=1, metadata="p1-0"), GROUPS[2]]
    report = check(history(groups=groups))
    assert found(report) == {"lost_commit": 1}
    assert "behind 3" in report.examples["lost_commit"][0]


def test_missing_final_group_offset_is_a_lost_commit() -> None:
    groups = [*GROUPS[:1], replace(GROUPS[1], offset=-1, metadata=None), GROUPS[2]]
    assert found(check(history(groups=groups))) == {"lost_commit": 1}


def test_group_offset_going_back_is_a_lost_commit() -> None:
    earlier = replace(GROUPS[1], t=1.5, phase="live")
    report = check(history(groups=[earlier, *GROUPS]))
    assert found(report) == {"lost_commit": 1}
    assert "went back from 3" in report.examples["lost_commit"][0]


def test_aborted_read_is_reported() -> None:
    report = check(history(changed(p0=[*p(0), (2, "p1-1-0")])))
    assert found(report) == {"aborted_read": 1}
    assert "PRODUCER_FENCED" in report.examples["aborted_read"][0]


def test_aborted_read_in_a_live_read_is_reported() -> None:
    stray: list[Event] = [
        Read(
            reader="c3",
            phase="live",
            topic="fault",
            partition=1,
            records=[(2, "p1-1-1")],
            last_stable_offset=3,
            high_watermark=3,
            process="c3",
            t=5.0,
        )
    ]
    assert found(check(history(extra=stray))) == {"aborted_read": 1}


def test_read_at_or_beyond_last_stable_offset_is_an_uncommitted_read() -> None:
    events = history()
    live = next(e for e in events if isinstance(e, Read) and e.reader == "c1")
    events[events.index(live)] = replace(live, last_stable_offset=4)
    report = check(events)
    assert found(report) == {"uncommitted_read": 1}
    assert "fault/0@4" in report.examples["uncommitted_read"][0]


@pytest.mark.parametrize("value", ["p9-0-0", "p1-0-7", "not-from-the-workload"])
def test_value_no_txn_wrote_is_an_uncommitted_read(value: str) -> None:
    report = check(history(changed(p0=[*p(0), (11, value)])))
    assert found(report) == {"uncommitted_read": 1}
    assert "no txn wrote it" in report.examples["uncommitted_read"][0]


def test_order_violation_within_a_txn_is_reported() -> None:
    report = check(history(changed(p0=swap(p(0), "p1-2-0", "p1-2-1"))))
    assert found(report) == {"order_violation": 1}
    assert "p1-2-1 at offset 6 before p1-2-0 at offset 7" in report.examples["order_violation"][0]


def test_order_violation_across_txns_is_reported() -> None:
    assert found(check(history(changed(p0=swap(p(0), "p2-0-1", "p2-1-0"))))) == {
        "order_violation": 1
    }


def test_reader_skipping_a_committed_record_is_a_reader_disagreement() -> None:
    events = history()
    final = next(
        e
        for e in events
        if isinstance(e, Read) and (e.reader, e.phase, e.partition) == ("c2", "final", 0)
    )
    events[events.index(final)] = replace(final, records=without(final.records, "p2-0-1"))
    report = check(events)
    assert found(report) == {"reader_disagreement": 1}
    assert "fault/0@4" in report.examples["reader_disagreement"][0]


def test_readers_returning_different_values_at_one_offset_disagree() -> None:
    events = history()
    final = next(
        e
        for e in events
        if isinstance(e, Read) and (e.reader, e.phase, e.partition) == ("c2", "final", 0)
    )
    events[events.index(final)] = replace(final, records=swap(final.records, "p1-2-0", "p1-2-1"))
    report = check(events)
    # Each value is then also at two offsets.
    assert found(report) == {"reader_disagreement": 2, "duplicate": 2}


@pytest.mark.parametrize(
    ("offset", "metadata", "why"),
    [(2, "p1-1", "aborted"), (1, "p1-9", "names no txn")],
)
def test_group_offset_of_a_txn_that_did_not_commit_is_ahead(
    offset: int, metadata: str, why: str
) -> None:
    groups = [replace(GROUPS[0], offset=offset, metadata=metadata), *GROUPS[1:]]
    report = check(history(groups=groups))
    assert found(report) == {"group_offset_ahead": 1}
    assert why in report.examples["group_offset_ahead"][0]


def test_group_offset_of_an_invisible_txn_is_ahead() -> None:
    # p1-3 is unknown and its write is not visible: its offsets cannot have committed either.
    groups = [GROUPS[0], replace(GROUPS[1], offset=4, metadata="p1-3"), GROUPS[2]]
    report = check(history(groups=groups))
    assert found(report) == {"group_offset_ahead": 1}
    assert "p1-3-0" in report.examples["group_offset_ahead"][0]


def test_every_anomaly_kind_has_a_test_above() -> None:
    names = " ".join(name for name in globals() if name.startswith("test_"))
    words = {
        "duplicate": "duplicate",
        "lost_commit": "lost_commit",
        "aborted_read": "aborted_read",
        "uncommitted_read": "uncommitted_read",
        "torn_transaction": "torn",
        "order_violation": "order_violation",
        "reader_disagreement": "reader_disagreement",
        "group_offset_ahead": "ahead",
    }
    assert set(words) == set(ANOMALIES)
    assert all(word in names for word in words.values())


# The report.


def test_examples_are_capped_but_counts_are_not() -> None:
    strays = [(11 + i, f"p9-{i}-0") for i in range(8)]
    report = check(history(changed(p0=[*p(0), *strays])))
    assert report.anomalies["uncommitted_read"] == 8
    assert len(report.examples["uncommitted_read"]) == 5


def test_summary_is_json_and_table_shows_every_count() -> None:
    report = check(history(changed(p0=[*p(0), (11, "p1-0-0")])))
    summary = json.loads(json.dumps(report.summary()))
    assert summary["ok"] is False
    assert summary["transactions"] == {
        "attempted": 9,
        "committed": 3,
        "aborted": 1,
        "unknown": 5,
        "unknown_visible": 2,
    }
    assert summary["faults"] == {"delay": 1, "drop-response": 3, "kill-service": 1}
    assert summary["anomalies"] == {**dict.fromkeys(ANOMALIES, 0), "duplicate": 1}
    assert list(summary["examples"]) == ["duplicate"]
    table = report.table()
    for line in ("attempted", "committed", "aborted", "unknown", "kill-service", *ANOMALIES):
        assert line in table
    lines = [line.split() for line in table.splitlines()]
    assert ["duplicate", "1"] in lines
    assert ["result", "ANOMALIES"] in lines
    assert "p1-0-0 at 2 offsets" in table


def test_conflicting_outcomes_are_a_warning_and_runner_unknown_yields_to_the_end() -> None:
    runner_unknown = txn("p1", 0, "unknown", [], offset=False)
    fenced = txn("p2", 0, "aborted", [])
    report = check(history(txns=[runner_unknown, *TXNS, fenced]))
    assert report.committed == 3
    assert len(report.warnings) == 1
    assert "p2-0" in report.warnings[0]


def test_a_long_clean_run_checks_clean() -> None:
    # The size of a 10-minute run: ~5000 txns and ~100k records read. (No duration is asserted;
    # quadratic work would show as this test running into pytest's timeout.)
    events: list[Event] = []
    log: dict[int, list[Record]] = {p: [] for p in range(8)}
    for number in range(500):
        for producer in range(10):
            name = f"p{producer}"
            writes = [((producer + i) % 8, f"{name}-{number}-{i}") for i in range(4)]
            events.append(
                Txn(
                    process=name,
                    t=float(number),
                    producer=name,
                    txn=number,
                    outcome="committed",
                    writes=[Write(topic="fault", partition=p, value=v) for p, v in writes],
                )
            )
            for partition, value in writes:
                log[partition].append((len(log[partition]) * 2, value))
    for reader, phase in [
        ("c1", "live"),
        ("c2", "live"),
        ("c3", "live"),
        ("c1", "final"),
        ("c2", "final"),
    ]:
        for partition, records in log.items():
            for start in range(0, len(records), 500):
                part = records[start : start + 500]
                events.append(
                    Read(
                        process=reader,
                        t=1.0,
                        reader=reader,
                        phase=phase,  # type: ignore[arg-type]
                        topic="fault",
                        partition=partition,
                        records=part,
                        last_stable_offset=part[-1][0] + 1,
                        high_watermark=part[-1][0] + 1,
                        offset=part[0][0],
                        next_offset=part[-1][0] + 1,
                    )
                )
    report = check(events)
    assert report.ok
    assert report.transactions_attempted == 5000
    assert report.records_read == 100_000


# The history files.


def test_recorded_history_loads_back_equal(tmp_path: Path) -> None:
    events = history()
    with Recorder(tmp_path / "h.jsonl", "runner") as recorder:
        for event in events:
            recorder.record(event)
    assert load(tmp_path / "h.jsonl") == events
    assert check(load([tmp_path / "h.jsonl"])).ok


def test_recorder_stamps_process_and_time(tmp_path: Path) -> None:
    ticks = iter([100.0, 101.5, 103.0])
    with Recorder(tmp_path / "h.jsonl", "p7", clock=lambda: next(ticks)) as recorder:
        recorder.record(Begin(producer="p7", txn=0))
        recorder.record(Begin(producer="p7", txn=1, process="other"))
    assert load(tmp_path / "h.jsonl") == [
        Begin(producer="p7", txn=0, process="p7", t=1.5),
        Begin(producer="p7", txn=1, process="other", t=3.0),
    ]


def test_concurrent_writers_never_split_a_line(tmp_path: Path) -> None:
    path = tmp_path / "h.jsonl"
    big = [(i, f"p1-{i}-0" * 20) for i in range(300)]  # lines of ~8 kB

    def write(name: str) -> None:
        # Each thread opens its own descriptor, as separate processes would.
        with Recorder(path, name) as recorder:
            for _ in range(50):
                recorder.record(
                    Read(reader=name, phase="live", topic="fault", partition=0, records=big)
                )

    shared = Recorder(path, "shared")

    def write_shared() -> None:
        for number in range(200):
            shared.record(Begin(producer="p1", txn=number))

    threads = [threading.Thread(target=write, args=(f"c{i}",)) for i in range(6)]
    threads += [threading.Thread(target=write_shared) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    shared.close()
    events = load(path)
    assert len(events) == 6 * 50 + 2 * 200
    assert all(e.records == big for e in events if isinstance(e, Read))


def test_load_skips_a_line_cut_short_by_a_kill(tmp_path: Path) -> None:
    path = tmp_path / "h.jsonl"
    with Recorder(path, "p1") as recorder:
        recorder.record(Begin(producer="p1", txn=0))
    with path.open("ab") as file:
        file.write(b'{"kind": "txn", "producer": "p1", "txn": 0, "outc')
    events = load(path)
    assert len(events) == 1
    assert events[0] == Begin(producer="p1", txn=0, process="p1", t=events[0].t)


def test_load_rejects_a_corrupt_line_before_the_last(tmp_path: Path) -> None:
    path = tmp_path / "h.jsonl"
    path.write_bytes(
        b'{"kind": "begin", "producer": "p1", "txn": 0, "process": "p1", "t": 0}\n'
        b"{garbage\n"
        b'{"kind": "begin", "producer": "p1", "txn": 1, "process": "p1", "t": 1}\n'
    )
    with pytest.raises(ValueError, match=r"h\.jsonl:2"):
        load(path)


def test_load_reads_several_files_and_ignores_unknown_kinds(tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_text(
        '{"kind": "begin", "producer": "p1", "txn": 0, "process": "p1", "t": 0, "new": 1}\n'
        '{"kind": "note", "process": "runner", "t": 0}\n'
    )
    (tmp_path / "b.jsonl").write_text(
        '{"kind": "fault-count", "fault": "delay", "count": 4, "process": "proxy", "t": 9}\n'
    )
    events = load([tmp_path / "a.jsonl", tmp_path / "b.jsonl"])
    assert events == [
        Begin(producer="p1", txn=0, process="p1", t=0),
        FaultCount(fault="delay", count=4, process="proxy", t=9),
    ]
    assert check(events).faults == {"delay": 4}


# What a run must do before it ends.


def test_a_run_goes_on_until_it_did_the_work_and_the_faults_its_profile_demands(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An amount, not a rate: a slow machine's run is short of work, and the run goes on (within
    its grace) until the producers' history holds the committed transactions and the nemesis the
    failovers that the failover profile asks for; an aborted transaction counts for nothing."""
    profile = PROFILES["failover"]
    with _Run(profile, 1, tmp_path, io.StringIO()) as run:
        injected = dict.fromkeys(profile.fault_kinds, 1) | {"failover": 4}
        monkeypatch.setattr(run, "injected", lambda: injected)
        with Recorder(run.history / "p1.jsonl", "p1") as recorder:
            for number in range(profile.min_committed - 1):
                recorder.record(txn("p1", number, "committed", [(0, f"p1-{number}-0")]))
            recorder.record(txn("p1", 1000, "aborted", [(0, "p1-1000-0")]))
            demanded = f"{profile.min_committed} committed transactions"
            assert run.not_yet_done() == ["failover", demanded]
            injected["failover"] = 5
            assert run.not_yet_done() == [demanded]
            recorder.record(txn("p1", 1001, "committed", [(0, "p1-1001-0")]))
        assert run.not_yet_done() == []
