"""Every table, imported in one place so `Base.metadata` is complete (for Alembic and tests)."""

from coordinator.core.database import Base
from coordinator.log.models import Batch, Partition, ProducerState, Topic
from coordinator.producers.models import ProducerId

__all__ = ["Base", "Batch", "Partition", "ProducerId", "ProducerState", "Topic"]
