"""The idempotent producer's rules of a batch's sequence on a partition (docs/pages/http-api.md's
Records section): pure functions that both stores' paths apply, and the order in which a group
of appends sees a producer's batches."""

from __future__ import annotations

from collections.abc import Sequence
from enum import Enum

from coordinator.core.schemas import INT32_MAX
from coordinator.log import appends
from coordinator.log.edge import Append
from coordinator.log.errors import (
    InvalidProducerEpoch,
    InvalidTxnState,
    OutOfOrderSequenceNumber,
    UnknownProducerId,
)


def next_sequence(sequence: int) -> int:
    """Sequences wrap from 2**31-1 to 0, as in Kafka."""
    return 0 if sequence == INT32_MAX else sequence + 1


def last_sequence_of(base_sequence: int, count: int) -> int:
    return (base_sequence + count - 1) % (INT32_MAX + 1)


class Verdict(Enum):
    """What `sequence_rule` decides of a batch with a producer id."""

    APPEND = "append"
    # The state expired (or never was) and the log may hold this epoch's batch 0: it decides.
    FIRST_BATCH = "first batch"
    # Not the next sequence: a retry of a written batch, or out of order.
    RETRY_OR_GAP = "retry or gap"


def sequence_rule(
    view: appends.ProducerView | None,
    where: str,
    pid: int,
    epoch: int,
    base_sequence: int,
    transactional: bool,
) -> Verdict:
    """The HTTP API's idempotence rules for a batch of producer `pid` at `epoch` on partition
    `where`, given what is written (a pure function: both stores' paths apply it)."""
    if view is None:
        raise UnknownProducerId(f"producer id {pid} was never issued; call init-pid")
    if epoch < view.current_epoch:
        raise InvalidProducerEpoch(
            f"producer {pid} epoch {epoch} is older than its current epoch {view.current_epoch}"
        )
    if epoch > view.current_epoch and transactional:
        raise InvalidProducerEpoch(
            f"producer {pid} epoch {epoch} is newer than its current epoch {view.current_epoch}"
        )
    # An idempotent producer may raise its own epoch (KIP-360: Kafka's Java client does, after a
    # sequence it cannot resolve, and starts again from sequence 0), as Kafka's broker takes it:
    # the newer epoch starts at sequence 0 on each partition, after which the older one is
    # refused there.
    if view.state_epoch is not None and epoch < view.state_epoch:
        raise InvalidProducerEpoch(
            f"producer {pid} epoch {epoch} is older than its epoch {view.state_epoch} on {where}"
        )
    if not transactional and view.open_txn_offset is not None:
        raise InvalidTxnState(
            f"producer {pid} has a transaction open on {where} since offset "
            f"{view.open_txn_offset}; a non-transactional batch may not join it"
        )
    if view.state_epoch is None:
        if base_sequence != 0:
            raise UnknownProducerId(
                f"producer {pid} has no state on {where}, so its first batch must start at "
                f"sequence 0, not {base_sequence}; re-initialise the producer"
            )
        return Verdict.FIRST_BATCH
    if view.state_epoch < epoch:
        if base_sequence != 0:
            raise OutOfOrderSequenceNumber(
                f"the first batch of epoch {epoch} must start at sequence 0, not {base_sequence}"
            )
        return Verdict.APPEND
    assert view.last_sequence is not None
    if base_sequence == next_sequence(view.last_sequence):
        return Verdict.APPEND
    return Verdict.RETRY_OR_GAP


def in_sequence_order(batch: Sequence[Append]) -> list[int]:
    """The indices of `batch` in the order the rules see them: arrival order, but a producer's
    batches to one partition (at one epoch) in sequence order, in the places they came in.
    Requests sent one after another on different connections may arrive in either order; in
    one group, the later no longer fails as out of order for coming first. Sequences wrap at
    INT32_MAX: past the wrap, the small ones come after the large."""
    chains: dict[tuple[str, int, int, int], list[int]] = {}
    for i, append in enumerate(batch):
        header = append.checked.header
        if header.producer_id >= 0:
            key = (append.topic, append.partition, header.producer_id, header.producer_epoch)
            chains.setdefault(key, []).append(i)
    order = list(range(len(batch)))
    for places in chains.values():
        if len(places) < 2:
            continue
        sequences = {i: batch[i].checked.header.base_sequence for i in places}
        wrapped = max(sequences.values()) - min(sequences.values()) > _HALF_SEQUENCE
        for place, i in zip(
            places,
            sorted(places, key=lambda i: _unwrapped(sequences[i], wrapped)),
            strict=True,
        ):
            order[place] = i
    return order


_HALF_SEQUENCE = (INT32_MAX + 1) // 2


def _unwrapped(sequence: int, wrapped: bool) -> int:
    return sequence + INT32_MAX + 1 if wrapped and sequence < _HALF_SEQUENCE else sequence
