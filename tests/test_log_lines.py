"""runworker's own log handler (``django_jobs.worker.log_lines``): the lines of one outcome
batch leave in one write, other threads' lines at once, and the text is what
``logging.Formatter`` with runworker's format would print."""

from __future__ import annotations

import logging
import re
import select
import threading

import pytest

from django_jobs.models import Job
from django_jobs.worker.log_lines import FORMAT, LineHandler, StampFormatter, batched
from tests import tasks
from tests.conftest import read_log


class Stream:
    """A stream that keeps each write apart."""

    def __init__(self) -> None:
        self.writes: list[str] = []
        self.flushes = 0

    def write(self, text: str) -> None:
        self.writes.append(text)

    def flush(self) -> None:
        self.flushes += 1


def record(message: str, created: float, level: int = logging.INFO) -> logging.LogRecord:
    rec = logging.LogRecord("django_jobs.worker.jobs", level, __file__, 1, message, None, None)
    rec.created, rec.msecs = created, (created - int(created)) * 1000  # as LogRecord.__init__ sets them
    return rec


@pytest.mark.parametrize(
    "times",
    [
        [1764670000.0, 1764670000.25, 1764670000.999, 1764670001.0005, 1764670001.5],
        [1764670059.9999, 1764670060.0, 1764670060.0, 1764673599.5, 1764673600.1],
    ],
)
def test_the_stamp_formatter_prints_what_logging_formatter_prints(times):
    ours, theirs = StampFormatter(FORMAT), logging.Formatter(FORMAT)
    for created in times:
        rec = record("Job x completed", created)
        assert ours.format(rec) == theirs.format(rec)
    rec = record("with a datefmt", times[0])
    assert StampFormatter(FORMAT, datefmt="%H:%M").format(rec) == logging.Formatter(FORMAT, "%H:%M").format(rec)


def make_handler() -> tuple[LineHandler, Stream]:
    stream = Stream()
    return LineHandler(stream), stream


def test_outside_a_batch_each_line_is_written_and_flushed_at_once():
    handler, stream = make_handler()
    handler.handle(record("one", 1764670000.0))
    assert len(stream.writes) == 1 and stream.flushes == 1
    handler.handle(record("two", 1764670000.5))
    assert [w.rsplit(": ", 1)[1] for w in stream.writes] == ["one\n", "two\n"]


def test_a_batch_is_written_once_in_order_when_it_ends_and_other_threads_are_not_held():
    handler, stream = make_handler()
    with batched():
        for i in range(5):
            handler.handle(record(f"line {i}", 1764670000.0 + i / 10))
        # Another thread (a task's own logging) is written at once, not kept for this batch.
        other = threading.Thread(target=handler.handle, args=(record("other thread", 1764670001.0),))
        other.start()
        other.join()
        assert [w.rsplit(": ", 1)[1] for w in stream.writes] == ["other thread\n"]
        with batched():  # nested: the outer block writes
            handler.handle(record("line 5", 1764670001.0))
        assert len(stream.writes) == 1
    assert len(stream.writes) == 2, "the batch's six lines in one write"
    lines = stream.writes[1].splitlines()
    assert [line.rsplit(": ", 1)[1] for line in lines] == [f"line {i}" for i in range(6)]
    assert lines[0] == logging.Formatter(FORMAT).format(record("line 0", 1764670000.0))


def test_a_batch_that_raises_still_writes_its_lines():
    handler, stream = make_handler()
    with pytest.raises(RuntimeError), batched():
        handler.handle(record("before the error", 1764670000.0))
        raise RuntimeError("boom")
    assert len(stream.writes) == 1 and "before the error" in stream.writes[0]
    handler.handle(record("after", 1764670000.0))
    assert len(stream.writes) == 2, "the thread is out of its batch"


def test_a_long_batch_leaves_in_writes_of_whole_lines_a_pipe_keeps_whole():
    # runworker -p N: the processes share one stderr; a pipe keeps a write of PIPE_BUF bytes whole.
    handler, stream = make_handler()
    with batched():
        for i in range(200):
            handler.handle(record(f"line {i:03d} é", 1764670000.0))
        handler.handle(record("x" * (2 * select.PIPE_BUF), 1764670000.0))
        handler.handle(record("after the long one", 1764670000.0))
    assert len(stream.writes) > 2
    for piece in stream.writes:
        assert piece.endswith("\n")
        assert len(piece.encode()) <= select.PIPE_BUF or piece.count("\n") == 1, "only a long line goes alone"
    lines = "".join(stream.writes).splitlines()
    assert [line.rsplit(": ", 1)[1] for line in lines] == [f"line {i:03d} é" for i in range(200)] + [
        "x" * (2 * select.PIPE_BUF),
        "after the long one",
    ]


def test_runworker_installs_it_when_the_project_configures_no_logging():
    from django_jobs.management.commands.runworker import Command

    ours, root = logging.getLogger("django_jobs"), logging.getLogger()
    saved = (ours.handlers[:], root.handlers[:], ours.level)
    ours.handlers[:], root.handlers[:] = [], []
    try:
        Command()._configure_logging(1)
        assert [type(h) for h in ours.handlers] == [LineHandler]
        assert ours.level == logging.INFO
        root.handlers[:] = saved[1]
        ours.handlers[:] = []
        Command()._configure_logging(1)
        assert ours.handlers == [], "a project with handlers of its own gets none of ours"
    finally:
        ours.handlers[:], root.handlers[:] = saved[0], saved[1]
        ours.setLevel(saved[2])


def test_a_handler_of_another_kind_is_not_held_by_a_batch():
    stream = Stream()
    plain = logging.StreamHandler(stream)
    with batched():
        plain.handle(record("plain", 1764670000.0))
        assert len(stream.writes) == 1


#: runworker's line per completed job, as its own handler prints it.
LINE_RE = re.compile(
    r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} INFO django_jobs\.worker\.jobs: "
    r"Job ([0-9a-f-]{36}) tests\.tasks\.noop completed on attempt 1/\d+ in [^\n]+$",
    re.M,
)


@pytest.mark.django_db(transaction=True)
def test_a_worker_of_a_project_without_logging_prints_one_line_per_job_through_it(worker_process):
    ids = [str(r.id) for r in tasks.noop.enqueue_many([()] * 60)]
    proc = worker_process("--stop-when-empty", "-c", "8", "-v", "1", env={"JOBS_TEST_NO_LOGGING": "1"})
    assert proc.wait(60) == 0, read_log(proc)
    log = read_log(proc)
    assert sorted(LINE_RE.findall(log)) == sorted(ids), log
    assert Job.objects.filter(state="completed").count() == 60


@pytest.mark.django_db(transaction=True)
def test_the_worker_writes_an_outcome_batch_with_fewer_writes_than_lines(in_process_command):
    ids = [str(r.id) for r in tasks.noop.enqueue_many([()] * 100)]
    handler, stream = make_handler()
    logger = logging.getLogger("django_jobs")
    logger.addHandler(handler)
    try:
        in_process_command("--stop-when-empty", "-c", "8", "-v", "1")
    finally:
        logger.removeHandler(handler)
    text = "".join(stream.writes)
    assert sorted(re.findall(r"Job ([0-9a-f-]{36}) tests\.tasks\.noop completed", text)) == sorted(ids)
    carrying = [w for w in stream.writes if " completed on attempt " in w]
    assert len(carrying) < 100, "the lines of one outcome batch leave together"
