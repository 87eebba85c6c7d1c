"""Time-ordered UUIDs (RFC 9562 version 7).

Python 3.14 adds ``uuid.uuid7``; we support 3.12+, so this is a small generator of our own.
The 48-bit millisecond timestamp comes first, so ids sort by creation time and the primary
key index stays append-mostly. A 12-bit counter seeded at random keeps ids created within the
same millisecond (in one process) strictly increasing; the remaining 62 bits are random.

The random bits come from ``os.urandom``, read 4 KiB at a time: two reads per id were two
system calls of a one-job enqueue. A forked child drops what its parent read, so two processes
never hand out the same bits.
"""

import os
import threading
import time
import uuid

_lock = threading.Lock()
_last_ms = 0
_counter = 0
_POOL_BYTES = 4096
_pool = b""
_taken = 0


def _drop_pool() -> None:
    global _pool, _taken
    _pool, _taken = b"", 0


os.register_at_fork(after_in_child=_drop_pool)


def _random(n: int) -> int:
    """``n`` random bytes as an int, from the pool (read again when short); call with ``_lock`` held."""
    global _pool, _taken
    if _taken + n > len(_pool):
        _pool, _taken = os.urandom(max(_POOL_BYTES, n)), 0
    start = _taken
    _taken += n
    return int.from_bytes(_pool[start:_taken])


def uuid7() -> uuid.UUID:
    """Return a new UUIDv7, monotonic within this process."""
    with _lock:
        ms, counter = _next()
        rand = _random(8)
    return _make(ms, counter, rand)


def uuid7_hex() -> str:
    """:func:`uuid7`'s next id as its 32 hex digits (``uuid7().hex``), without making the UUID:
    what ``enqueue()`` of a plain job needs (engine.insert_plain_job)."""
    with _lock:
        ms, counter = _next()
        rand = _random(8)
    return f"{_value(ms, counter, rand):032x}"


def uuid7_many(n: int) -> list[uuid.UUID]:
    """``n`` new UUIDv7s, as ``n`` calls of :func:`uuid7` would return them, for less: one
    lock and one read of random bytes for all (a bulk enqueue makes thousands)."""
    with _lock:
        stamps = [_next() for _ in range(n)]
    rand = os.urandom(8 * n)
    return [_make(ms, counter, int.from_bytes(rand[8 * i : 8 * i + 8])) for i, (ms, counter) in enumerate(stamps)]


def _next() -> tuple[int, int]:
    """The millisecond and counter of the next id; call with ``_lock`` held."""
    global _last_ms, _counter
    ms = time.time_ns() // 1_000_000
    if ms > _last_ms:
        _last_ms = ms
        _counter = _random(2) & 0x7FF  # leave room to count up
    else:
        # Same (or an earlier, after a clock step back) millisecond: keep order by
        # counting up; when the 12-bit counter overflows, borrow the next millisecond.
        _counter += 1
        if _counter > 0xFFF:
            _last_ms += 1
            _counter = 0
        ms = _last_ms
    return ms, _counter


def _make(ms: int, counter: int, rand: int) -> uuid.UUID:
    return _from_int(_value(ms, counter, rand))


def _value(ms: int, counter: int, rand: int) -> int:
    value = (ms & ((1 << 48) - 1)) << 80
    value |= 0x7 << 76  # version
    value |= counter << 64
    value |= 0b10 << 62  # RFC 4122 variant
    value |= rand & ((1 << 62) - 1)
    return value


def _uuid_from_int(value: int) -> uuid.UUID:
    """``uuid.UUID(int=value)`` for a value known to be a valid 128-bit UUID, without the
    constructor's checks of its other arguments (Python 3.14's ``UUID._from_int``)."""
    made = object.__new__(uuid.UUID)
    object.__setattr__(made, "int", value)
    object.__setattr__(made, "is_safe", uuid.SafeUUID.unknown)
    return made


_from_int = getattr(uuid.UUID, "_from_int", _uuid_from_int)
