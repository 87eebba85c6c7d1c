"""Time-ordered UUIDs (RFC 9562 version 7).

Python 3.14 adds ``uuid.uuid7``; we support 3.12+, so this is a small generator of our own.
The 48-bit millisecond timestamp comes first, so ids sort by creation time and the primary
key index stays append-mostly. A 12-bit counter seeded at random keeps ids created within the
same millisecond (in one process) strictly increasing; the remaining 62 bits are random.
"""

import os
import threading
import time
import uuid

_lock = threading.Lock()
_last_ms = 0
_counter = 0


def uuid7() -> uuid.UUID:
    """Return a new UUIDv7, monotonic within this process."""
    with _lock:
        ms, counter = _next()
    return _make(ms, counter, int.from_bytes(os.urandom(8)))


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
        _counter = int.from_bytes(os.urandom(2)) & 0x7FF  # leave room to count up
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
    value = (ms & ((1 << 48) - 1)) << 80
    value |= 0x7 << 76  # version
    value |= counter << 64
    value |= 0b10 << 62  # RFC 4122 variant
    value |= rand & ((1 << 62) - 1)
    return _from_int(value)


def _uuid_from_int(value: int) -> uuid.UUID:
    """``uuid.UUID(int=value)`` for a value known to be a valid 128-bit UUID, without the
    constructor's checks of its other arguments (Python 3.14's ``UUID._from_int``)."""
    made = object.__new__(uuid.UUID)
    object.__setattr__(made, "int", value)
    object.__setattr__(made, "is_safe", uuid.SafeUUID.unknown)
    return made


_from_int = getattr(uuid.UUID, "_from_int", _uuid_from_int)
