"""InitPid: issue producer ids (docs/pages/http-api.md, Producer ids). The transactions domain's, as
Kafka's InitProducerId is its transaction coordinator's: a transactional id's producer is fenced and
its open transaction ended here; an idempotent producer only gets a new id from `producers`."""

from __future__ import annotations

from coordinator.core.settings import Settings
from coordinator.producers.errors import InvalidTransactionTimeout
from coordinator.producers.repository import issue_producer_id
from coordinator.producers.schemas import InitPidResponse
from coordinator.store import Store
from coordinator.transactions import service as transactions
from coordinator.transactions.inputs import InitPid


async def init_pid(
    db: Store,
    settings: Settings,
    body: InitPid,
    recovering: tuple[int, int] | None = None,
) -> InitPidResponse:
    """InitPid. `recovering` (Kafka's InitProducerId only, KIP-360): the producer id and epoch of
    a running transactional producer bumping its own epoch, checked against the current ones; an
    idempotent producer gets a fresh producer id either way, as from Kafka's broker."""
    body.check()
    maximum = settings.transaction_max_timeout_ms
    if not 1 <= body.transaction_timeout_ms <= maximum:
        raise InvalidTransactionTimeout(
            f"transaction_timeout_ms must be between 1 and {maximum}, "
            f"not {body.transaction_timeout_ms}"
        )
    if body.transactional_id is not None:
        producer_id, epoch = await transactions.init_transactional(
            db,
            settings,
            body.transactional_id,
            body.transaction_timeout_ms,
            body.keep_prepared,
            recovering,
        )
        return InitPidResponse(producer_id=producer_id, producer_epoch=epoch)
    async with db.write() as session:
        producer_id = await issue_producer_id(session, None)
    return InitPidResponse(producer_id=producer_id, producer_epoch=0)
