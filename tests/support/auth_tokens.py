"""The principals of the access tests, as a tokens file lists them."""

from __future__ import annotations

TOKENS = {
    "admin": {"token": "admin-token-1", "principal": "ops", "roles": ["admin"]},
    "producer": {
        "token": "producer-token-1",
        "principal": "etl-writer",
        "roles": ["producer"],
        "transactional_id_prefixes": ["a-"],
        "topic_prefixes": ["pay"],
        "group_prefixes": ["g-"],
    },
    "consumer": {
        "token": "consumer-token-1",
        "principal": "etl-reader",
        "roles": ["consumer"],
        "topic_prefixes": ["pay"],
        "group_prefixes": ["g-"],
    },
    "nothing": {
        "token": "nothing-token-1",
        "principal": "nobody",
        "roles": ["producer", "consumer"],
        "transactional_id_prefixes": [],
        "topic_prefixes": [],
        "group_prefixes": [],
    },
}
