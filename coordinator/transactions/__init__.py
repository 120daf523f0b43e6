"""Transactions: transactional ids, epochs that fence zombies, the state machine, EndTxn with
control markers, commit-group, and the coordinator's timeouts.

The log calls the produce-time join through the interface it declares
(`coordinator.log.produce.GroupTransactions`), and the groups domain a stable fetch's pending
offsets through `coordinator.groups.service.PendingOffset`; the app gives them this domain's
(`coordinator.app.wire_domains`), so neither imports it."""
