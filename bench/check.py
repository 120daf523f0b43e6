"""The check of a produced record batch (`sdk.recordbatch.check`, issue 49 item 2): the compiled
walk of its records (sdk/_walk.c) against the pure-Python walk (sdk/_walking.py), in one
process, on the batches real producers send.

Workloads, each a batch built once and checked over and over for `--seconds`:
- java-defaults: Kafka's Java producer at its defaults, 16 KiB batches of 100-byte records,
  uncompressed;
- java-1mb: 1 MB batches of 100-byte records (batch.size=1048576), uncompressed;
- rdkafka-100: librdkafka with 100-record batches of 100 bytes;
- lz4-1mb, zstd-1mb, gzip-1mb: 1 MB of 100-byte records, compressed: these are inflated in
  pieces as they are walked (`sdk._compression.inflate`);
- headers: 1,000 records of 50 bytes with three headers each.

For each: MB of records section checked per second (MB = 10**6 bytes, counted uncompressed),
with the compiled walk and with the Python one, and `ratio` = compiled over Python. `walk_only`
is the same for the walk alone, without the CRC or the codecs.

    python bench/check.py --seconds 2

The last stdout line is one JSON object with the figures; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable

from sdk import _walking
from sdk import recordbatch as rb


def _records(count: int, size: int, headers: int = 0) -> list[rb.BuildRecord]:
    value = bytes(range(256)) * (size // 256 + 1)
    return [
        (1_700_000_000_000 + i, b"key-%d" % (i % 100), value[i % 200 : i % 200 + size],
         [(f"h{n}", b"v%d" % i) for n in range(headers)])
        for i in range(count)
    ]  # fmt: skip


WORKLOADS: dict[str, tuple[list[rb.BuildRecord], int]] = {
    "java-defaults": (_records(150, 100), rb.COMPRESSION_NONE),
    "java-1mb": (_records(9_000, 100), rb.COMPRESSION_NONE),
    "rdkafka-100": (_records(100, 100), rb.COMPRESSION_NONE),
    "lz4-1mb": (_records(9_000, 100), rb.COMPRESSION_LZ4),
    "zstd-1mb": (_records(9_000, 100), rb.COMPRESSION_ZSTD),
    "gzip-1mb": (_records(9_000, 100), rb.COMPRESSION_GZIP),
    "headers": (_records(1_000, 50, headers=3), rb.COMPRESSION_NONE),
}


def _rate(work: Callable[[], object], size: int, seconds: float) -> float:
    """MB per second of `work` on `size` bytes, over `seconds`."""
    done = 0
    start = time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        work()
        done += 1
    return done * size / elapsed / 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0, help="per workload and walk")
    args = parser.parse_args()
    if _walking.COMPILED is None:
        sys.exit("the compiled walk is not built: pip install -e . with a C compiler")
    figures: dict[str, dict[str, float]] = {}
    for name, (records, codec) in WORKLOADS.items():
        batch = rb.build(records, compression=codec)
        section = bytes(rb.build(records)[rb.HEADER_SIZE :])
        count = len(records)
        row: dict[str, float] = {"batch_bytes": len(batch), "section_bytes": len(section)}
        for label, walker in (("compiled", _walking.COMPILED), ("python", _walking.PyWalker)):
            _walking.Walker = walker
            row[f"{label}_mb_s"] = round(
                _rate(lambda b=batch: rb.check(b), len(section), args.seconds), 1
            )
            row[f"{label}_walk_mb_s"] = round(
                _rate(
                    lambda w=walker, s=section, n=count: _walking.walk([s], n, w),
                    len(section),
                    args.seconds,
                ),
                1,
            )
        _walking.Walker = _walking.COMPILED
        row["ratio"] = round(row["compiled_mb_s"] / row["python_mb_s"], 2)
        row["walk_only_ratio"] = round(row["compiled_walk_mb_s"] / row["python_walk_mb_s"], 2)
        figures[name] = row
        print(name, row, file=sys.stderr)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
