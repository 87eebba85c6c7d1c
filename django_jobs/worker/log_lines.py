"""runworker's own log handler, installed on the ``django_jobs`` logger when the project
configures no logging: a :class:`logging.StreamHandler` that costs less per line.

A worker logs one line per stored outcome (:mod:`.outcome_log`), so with short jobs the
logging module's cost is paid thousands of times a second: measured at about 9 µs per line
(``Logger.info`` into a ``StreamHandler`` with runworker's format), 13-19 % of a worker's CPU
per no-op job. Two parts of it do not need to be paid per line:

- the write and flush: inside :func:`batched` (the completer's loop over one outcome batch),
  this thread's lines are kept and written when the block ends, in the order they were logged,
  whole lines at most ``PIPE_BUF`` bytes per write (so that the processes of ``runworker -p N``,
  which share one stderr, never tear each other's lines: a pipe keeps a write that small
  whole). Lines from other threads (the producer's, the services') are written at once, as a
  ``StreamHandler`` does;
- the timestamp: ``%(asctime)s`` without a ``datefmt`` is ``time.strftime`` of the second,
  kept while the second is the same, plus the milliseconds. The text is the same as
  :class:`logging.Formatter`'s.

The record, its filters and its format are untouched: a project that configures logging
(``LOGGING``, any handler on the root logger) gets its own handlers, and :func:`batched`
changes nothing for them.
"""

from __future__ import annotations

import logging
import select
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

_batch = threading.local()  # .pending: {handler: [line, ...]} while this thread is inside batched()


class StampFormatter(logging.Formatter):
    """:class:`logging.Formatter` whose default ``asctime`` formats each second once."""

    _stamp: tuple[int, str] = (-1, "")

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:  # noqa: N802 - logging's name
        if datefmt is not None or not self.default_msec_format:
            return super().formatTime(record, datefmt)
        second = int(record.created)
        stamp = self._stamp  # one tuple, read and replaced whole: threads share the formatter
        if stamp[0] != second:
            stamp = (second, time.strftime(self.default_time_format, self.converter(record.created)))
            self._stamp = stamp
        return self.default_msec_format % (stamp[1], record.msecs)


class LineHandler(logging.StreamHandler):
    """A :class:`logging.StreamHandler` whose lines logged inside :func:`batched` are written
    together when the block ends."""

    def __init__(self, stream: Any = None) -> None:
        super().__init__(stream)
        self.setFormatter(StampFormatter(FORMAT))

    def emit(self, record: logging.LogRecord) -> None:
        pending = getattr(_batch, "pending", None)
        if pending is None:
            super().emit(record)
            return
        try:
            line = self.format(record) + self.terminator
        except RecursionError:  # as StreamHandler.emit
            raise
        except Exception:  # noqa: BLE001 - as StreamHandler.emit: report, never raise
            self.handleError(record)
            return
        pending.setdefault(self, []).append(line)

    def write_lines(self, lines: list[str]) -> None:
        """Write ``lines`` (formatted, each with its terminator) in as few writes of whole lines
        of at most ``PIPE_BUF`` bytes as they fit in (a longer line alone), each flushed."""
        self.acquire()
        try:
            for piece in _pieces(lines, select.PIPE_BUF):
                try:
                    self.stream.write(piece)
                    self.flush()
                except RecursionError:
                    raise
                except Exception:  # noqa: BLE001 - as StreamHandler.emit: report, never raise
                    self.handleError(logging.makeLogRecord({"msg": piece}))
        finally:
            self.release()


def _pieces(lines: list[str], limit: int) -> list[str]:
    """``lines`` joined into strings of whole lines of at most ``limit`` bytes (UTF-8), in order;
    a line longer than that is a string of its own."""
    pieces: list[str] = []
    current: list[str] = []
    size = 0
    for line in lines:
        n = len(line) if line.isascii() else len(line.encode())
        if current and size + n > limit:
            pieces.append("".join(current))
            current, size = [], 0
        current.append(line)
        size += n
    if current:
        pieces.append("".join(current))
    return pieces


@contextmanager
def batched() -> Iterator[None]:
    """Within the block, this thread's lines to a :class:`LineHandler` are kept, then written
    in one write per handler when the block ends (also when it raises). Nested: the outermost
    block writes."""
    if getattr(_batch, "pending", None) is not None:
        yield
        return
    pending: dict[LineHandler, list[str]] = {}
    _batch.pending = pending
    try:
        yield
    finally:
        _batch.pending = None
        for handler, lines in pending.items():
            handler.write_lines(lines)
