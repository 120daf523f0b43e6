"""Consumer group offsets, committed plainly or inside a transaction."""
