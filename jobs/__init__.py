"""PySpark pipelines built on the SDK."""
