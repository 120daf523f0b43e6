"""Operations: list and describe transactions, producers per partition, find hanging
transactions, abort; the dashboard and metrics."""
