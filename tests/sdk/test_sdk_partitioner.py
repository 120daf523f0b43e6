"""Kafka's partitioner: murmur2 as the Java client computes it, and sticky for null keys."""

from __future__ import annotations

import random

import pytest

from sdk._partitioner import StickyPartitioner, murmur2, partition_for_key

# org.apache.kafka.common.utils.UtilsTest.testMurmur2 (Java `int` results).
KAFKA_VECTORS = [
    (b"21", -973932308),
    (b"foobar", -790332482),
    (b"a-little-bit-long-string", -985981536),
    (b"a-little-bit-longer-string", -1486304829),
    (b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
    (b"abc", 479470107),
]

# librdkafka's murmur2 unit test (unsigned results): every tail length 0..3 is covered.
LIBRDKAFKA_VECTORS = [
    (b"kafka", 0xD067CF64),
    (b"giberish123456789", 0x8F552B0C),
    (b"1234", 0x9FC97B14),
    (b"234", 0xE7C009CA),
    (b"34", 0x873930DA),
    (b"4", 0x5A4B5CA1),
]


@pytest.mark.parametrize(("key", "expected"), KAFKA_VECTORS)
def test_murmur2_equals_the_java_clients(key: bytes, expected: int) -> None:
    assert murmur2(key) == expected


@pytest.mark.parametrize(("key", "expected"), LIBRDKAFKA_VECTORS)
def test_murmur2_equals_librdkafkas_murmur2(key: bytes, expected: int) -> None:
    assert murmur2(key) & 0xFFFFFFFF == expected


def test_keyed_partition_is_to_positive_of_murmur2_modulo_the_partition_count() -> None:
    # toPositive(-790332482) = -790332482 & 0x7fffffff = 1357151166.
    assert partition_for_key(b"foobar", 7) == 1357151166 % 7
    assert partition_for_key(b"abc", 4) == 479470107 % 4
    assert all(0 <= partition_for_key(bytes([i]), 3) < 3 for i in range(256))


def test_null_keys_stick_to_one_partition_until_its_batch_closes() -> None:
    partitioner = StickyPartitioner(random.Random(7))
    first = partitioner.partition("t", 5)
    assert all(partitioner.partition("t", 5) == first for _ in range(10))
    moved = partitioner.on_new_batch("t", 5, first)
    assert moved != first
    assert partitioner.partition("t", 5) == moved


def test_a_new_sticky_partition_spreads_over_all_the_others() -> None:
    partitioner = StickyPartitioner(random.Random(1))
    chosen = {partitioner.on_new_batch("t", 4, 2) for _ in range(200)}
    assert chosen == {0, 1, 3}
    assert partitioner.on_new_batch("one", 1, 0) == 0
