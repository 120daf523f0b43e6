"""The store: one protocol (`Store`), two engines side by side (`coordinator.store.postgres`,
`coordinator.store.sqlite`), chosen by the database URL (`coordinator.store.engines.open_store`).
Domains hold a `Store` and ask it; none asks which database it is on."""

from coordinator.store.base import ROWS_PER_STATEMENT, Store, store_of

__all__ = ["ROWS_PER_STATEMENT", "Store", "store_of"]
