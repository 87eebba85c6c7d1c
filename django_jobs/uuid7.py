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
    global _last_ms, _counter
    with _lock:
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
        counter = _counter
    rand = int.from_bytes(os.urandom(8)) & ((1 << 62) - 1)
    value = (ms & ((1 << 48) - 1)) << 80
    value |= 0x7 << 76  # version
    value |= counter << 64
    value |= 0b10 << 62  # RFC 4122 variant
    value |= rand
    return uuid.UUID(int=value)
