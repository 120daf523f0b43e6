"""Reading what the admin CLI prints: its aligned tables."""

from __future__ import annotations


def table(text: str) -> list[dict[str, str]]:
    """Rows of an aligned table, each cell read at its header's column; misalignment fails."""
    header, *lines = text.rstrip("\n").splitlines()
    names = header.split()
    starts = [header.index(n) for n in names]
    rows = []
    for line in lines:
        # Every value starts exactly at its column, and none runs into the next one.
        assert all(line[s] != " " and line[s - 1] == " " for s in starts[1:]), (header, line)
        cells = [line[s:e] for s, e in zip(starts, [*starts[1:], None], strict=True)]
        rows.append(dict(zip(names, (c.strip() for c in cells), strict=True)))
    return rows
