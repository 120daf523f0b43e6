"""Fault-injection workload: a runner, a nemesis, a fault proxy and a checker that prove
exactly-once under faults. The history format is specified in tests/fault/HISTORY.md.
"""
