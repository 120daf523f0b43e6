"""A share group's acknowledgements held by a transaction: taken into it (the transactional
producer's call, `coordinator.transactions.share_acks`) and settled when it ends
(`coordinator.transactions.finishing`): a commit applies them, an abort releases the records.
Both run in the transaction's unit of work, after its rows' locks, in the fixed lock order."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence

from sqlalchemy.ext.asyncio import AsyncSession

from coordinator.core.clock import now_ms
from coordinator.core.settings import Settings
from coordinator.groups.models import ConsumerGroup
from coordinator.shares.errors import InvalidRecordState
from coordinator.shares.inflight import ShareState
from coordinator.shares.service import (
    TP,
    AckBatch,
    load,
    locked_rows,
    rules_of,
    share_group,
    store,
    wake_after_commit,
)
from coordinator.store import store_of


async def hold_in(
    session: AsyncSession,
    settings: Settings,
    group_id: str,
    member_id: str,
    txn: str,
    acks: Mapping[TP, Sequence[AckBatch]],
) -> None:
    """Take a member's acknowledgements into transaction `txn`, in its unit of work (which
    holds the transaction's row): all of them, or INVALID_RECORD_STATE (naming the partition)
    and none."""
    await share_group(session, group_id)
    rules = await rules_of(session, settings, group_id)
    now = now_ms()
    for tp in sorted(acks):
        loaded = await load(session, group_id, tp, rules, now)
        held = copy.deepcopy(loaded.state)
        try:
            for batch in acks[tp]:
                held.hold(txn, member_id, batch.first, batch.last, batch.types)
        except InvalidRecordState as refused:
            raise InvalidRecordState(f"{tp[0]}-{tp[1]}: {refused.detail}") from None
        loaded.state = held
        store(loaded.row, loaded.state, now)


async def settle_in(
    session: AsyncSession,
    txn: str,
    partitions: Sequence[tuple[str, str, int]],
    commit: bool,
) -> None:
    """Transaction `txn` ended: on each (group, topic, partition) it held records of, a commit
    applies its acknowledgements, an abort releases the records. In the ending unit of work,
    after the transaction's and its partitions' locks."""
    settings = store_of(session).settings
    now = now_ms()
    released: set[TP] = set()
    for group_id in sorted({g for g, _, _ in partitions}):
        group = await session.get(ConsumerGroup, group_id)
        if group is None:
            continue  # deleted with its share partitions
        rules = await rules_of(session, settings, group_id)
        tps = [(t, p) for g, t, p in partitions if g == group_id]
        for row in await locked_rows(session, group_id, tps):
            state = ShareState.of(row.start_offset, row.end_offset, row.spans)
            state.expire(now, rules.limits)
            if state.settle_transaction(txn, commit, rules.limits) and not commit:
                released.add((row.topic, row.partition))
            store(row, state, now)
    wake_after_commit(session, released)
