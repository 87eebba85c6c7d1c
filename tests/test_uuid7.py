"""The time-ordered primary key generator (RFC 9562 UUIDv7)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
import uuid
from types import SimpleNamespace

import pytest

from django_jobs import uuid7 as uuid7_module
from django_jobs.models import Job
from django_jobs.uuid7 import uuid7, uuid7_hex, uuid7_many


def timestamp_ms(value: uuid.UUID) -> int:
    return value.int >> 80


def test_uuid7_has_version_7_and_the_rfc_4122_variant():
    for _ in range(100):
        value = uuid7()
        assert value.version == 7
        assert value.variant == uuid.RFC_4122


def test_uuid7_starts_with_the_current_unix_millisecond():
    before = time.time_ns() // 1_000_000
    value = uuid7()
    after = time.time_ns() // 1_000_000
    assert before <= timestamp_ms(value) <= after + 1  # +1: a counter overflow borrows the next ms


def test_uuid7_is_strictly_increasing_within_a_thread():
    values = [uuid7() for _ in range(10_000)]
    assert all(a < b for a, b in zip(values, values[1:], strict=False))
    assert all(a.bytes < b.bytes for a, b in zip(values, values[1:], strict=False)), "byte order (PostgreSQL)"
    assert all(a.hex < b.hex for a, b in zip(values, values[1:], strict=False)), "hex order (SQLite char(32))"


def test_uuid7_is_unique_and_monotonic_per_thread_across_threads():
    thread_count, per_thread = 8, 2_000
    barrier = threading.Barrier(thread_count)
    results: list[list[uuid.UUID]] = [[] for _ in range(thread_count)]

    def generate(i: int) -> None:
        barrier.wait(10)
        results[i] = [uuid7() for _ in range(per_thread)]

    threads = [threading.Thread(target=generate, args=(i,)) for i in range(thread_count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    every = [value for values in results for value in values]
    assert len(every) == thread_count * per_thread
    assert len(set(every)) == len(every)
    for values in results:
        assert values == sorted(values)


def test_uuid7_many_continues_the_sequence_of_uuid7():
    values = [uuid7(), *uuid7_many(5_000), uuid7(), *uuid7_many(1), *uuid7_many(0)]
    assert len(values) == 5_003
    assert all(a < b for a, b in zip(values, values[1:], strict=False))
    assert all(v.version == 7 and v.variant == uuid.RFC_4122 for v in values)


def test_uuid7_many_stays_ordered_past_the_counter_in_one_millisecond(frozen_clock):
    values = uuid7_many(10_000)
    assert all(a < b for a, b in zip(values, values[1:], strict=False))
    assert timestamp_ms(values[-1]) > 1_700_000_000_000, "borrowed later milliseconds"


def test_uuid7_sorts_by_creation_time_across_milliseconds():
    values = []
    start = time.monotonic()
    while len({timestamp_ms(v) for v in values}) < 3 and time.monotonic() - start < 5:
        values.append(uuid7())
    assert len({timestamp_ms(v) for v in values}) >= 3
    assert sorted(values) == values
    assert [timestamp_ms(v) for v in values] == sorted(timestamp_ms(v) for v in values)


@pytest.fixture
def frozen_clock(monkeypatch):
    """Freeze the clock uuid7 reads; the generator's state is restored afterwards."""
    now = {"ns": 1_700_000_000_000 * 1_000_000}
    monkeypatch.setattr(uuid7_module, "_last_ms", 0)
    monkeypatch.setattr(uuid7_module, "_counter", 0)
    monkeypatch.setattr(uuid7_module, "time", SimpleNamespace(time_ns=lambda: now["ns"]))
    return now


def test_uuid7_stays_ordered_past_the_counter_in_one_millisecond(frozen_clock):
    values = [uuid7() for _ in range(10_000)]  # more than the 12-bit counter holds
    assert all(a < b for a, b in zip(values, values[1:], strict=False))
    assert len(set(values)) == len(values)
    assert timestamp_ms(values[-1]) > 1_700_000_000_000, "borrowed later milliseconds"
    assert all(v.version == 7 and v.variant == uuid.RFC_4122 for v in values)


def test_uuid7_stays_ordered_when_the_clock_steps_back(frozen_clock):
    first = [uuid7() for _ in range(10)]
    frozen_clock["ns"] -= 5_000 * 1_000_000  # five seconds back
    second = [uuid7() for _ in range(10)]
    values = first + second
    assert all(a < b for a, b in zip(values, values[1:], strict=False))


def test_job_primary_key_defaults_to_a_uuid7():
    first, second = Job(), Job()
    assert first.id.version == 7
    assert first.id < second.id


def test_a_forked_child_does_not_reuse_its_parent_s_random_bits():
    """The random bits come from a pool read ahead; a child that kept its parent's pool would
    hand out the same bits as the parent's next ids (and the same ids within one millisecond).
    The fork runs in a fresh single-threaded interpreter: forking the test process, which has
    threads, could deadlock the child."""
    script = """
import os
from django_jobs.uuid7 import uuid7
uuid7()  # the pool is read
low = (1 << 62) - 1
read_end, write_end = os.pipe()
pid = os.fork()
if pid == 0:
    os.write(write_end, ",".join(str(uuid7().int & low) for _ in range(5)).encode())
    os._exit(0)
os.close(write_end)
os.waitpid(pid, 0)
with os.fdopen(read_end) as pipe:
    child = {int(bits) for bits in pipe.read().split(",")}
parent = {uuid7().int & low for _ in range(5)}
print(len(child), len(child & parent))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.split() == ["5", "0"], done.stdout + done.stderr


def test_uuid7_hex_is_the_hex_of_the_next_uuid7_in_the_same_order():
    values = []
    for _ in range(2_000):
        values += [uuid7(), uuid.UUID(uuid7_hex())]
    assert values == sorted(values) and len(set(values)) == len(values)
    assert all(value.version == 7 and value.variant == uuid.RFC_4122 for value in values)
    assert all(len(uuid7_hex()) == 32 for _ in range(10))
