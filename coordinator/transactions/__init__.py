"""Transactions: transactional ids, epochs that fence zombies, the state machine, EndTxn with
control markers, commit-group, and the coordinator's timeouts."""
