"""The exactly-once transaction coordinator: a REST service over one SQL store.

Packages by domain: `log` (topics, partition logs, producer state), `producers` (InitPid), with
`core` holding settings, the database and the error mapping.
"""

__version__ = "0.1.0"
