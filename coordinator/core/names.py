"""What a name may be, for every door: a topic name as Kafka allows it, and the ids clients make up
(transactional ids, group ids, member ids). The HTTP door's field types and the domains' checks
of what the Kafka door hands them both apply these."""

from __future__ import annotations

import re

TOPIC_PATTERN = r"^[A-Za-z0-9._-]{1,249}$"
_TOPIC = re.compile(TOPIC_PATTERN)
ID_MAX = 255


def not_dots(value: str) -> str:
    # As in Kafka: legal characters, but clients rewrite them away in a URL path.
    if value in (".", ".."):
        raise ValueError("'.' and '..' are not topic names")
    return value


def topic_name_problem(name: str) -> str | None:
    """Why `name` is not a topic name, or None when it is one."""
    if not _TOPIC.fullmatch(name):
        return f"{name[:64]!r}: 1 to 249 of the characters A-Z a-z 0-9 . _ -"
    try:
        not_dots(name)
    except ValueError as exc:
        return str(exc)
    return None


def printable(value: str) -> str:
    if not value.isprintable():
        raise ValueError("must contain printable characters only")
    return value


def id_problem(value: str) -> str | None:
    """Why `value` is not a client-made id (1 to 255 printable characters), or None."""
    if not 1 <= len(value) <= ID_MAX:
        return f"must be 1 to {ID_MAX} characters"
    if not value.isprintable():
        return "must contain printable characters only"
    return None
