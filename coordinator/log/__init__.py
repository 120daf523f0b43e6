"""The partition logs: topics, record batches, offsets, producer state, produce and fetch."""
