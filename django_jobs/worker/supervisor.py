"""``runworker --processes N``: fork N worker processes, restart one that dies, pass signals on.

Stop requests (see :mod:`.stop_signals`): the first SIGTERM/SIGINT is passed on to every
process, as is a second request (a signal more than ``REPEAT_WINDOW`` after the first, which
makes the processes exit at once); a signal within that window repeats the request and is not
passed on; a third request sends SIGKILL.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

from django.db import connections

from .stop_signals import STOP_SIGNALS, StopRequests, install_stop_handler

logger = logging.getLogger("django_jobs.worker")


#: A child exits with this when restarting it cannot help (the database is not migrated...).
EXIT_FATAL = 3


def supervise(processes: int, run_child: Callable[[int], int], *, restart_delay: float = 1.0) -> int:
    """Run ``run_child(index)`` in ``processes`` forked children until they exit by themselves
    (stop-when-empty, max-jobs, max-time) or a signal stops them. Returns the exit status.

    A child starts with SIGTERM and SIGINT blocked: ``run_child`` must install its handlers
    with :func:`.stop_signals.install_stop_handler` (``Worker(handle_signals=True).run()``
    does), which unblocks them, so a signal during the child's start-up waits for its handler."""
    children: dict[int, int] = {}  # pid -> index
    requests = StopRequests()

    def fork(index: int) -> None:
        connections.close_all()  # never share a database socket with a child
        # Block the stop signals across the fork: in this process until the child is in
        # ``children``, so forward() cannot miss it; in the child until its worker installs its
        # handlers (see above), so a signal during its start-up stops it gracefully instead of
        # killing it.
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        try:
            if requests.requests:  # stopping (a signal may have come in since the caller looked)
                return
            pid = os.fork()
            if pid == 0:
                code = 1
                try:
                    for signum in STOP_SIGNALS:  # not forward(): the child's worker installs its own
                        signal.signal(signum, signal.SIG_DFL)
                    code = run_child(index)
                except BaseException:  # noqa: BLE001
                    logger.exception("Worker process %d crashed.", index)
                finally:
                    sys.stdout.flush()
                    sys.stderr.flush()
                    os._exit(code)
            children[pid] = index
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)

    def forward(signum: int, frame: Any) -> None:
        # A signal handler: os.kill() and no more (see stop_signals).
        request = requests.count()
        if request == 0:
            return  # the same request again: the processes have it
        for pid in list(children):
            try:
                os.kill(pid, signum if request <= 2 else signal.SIGKILL)
            except ProcessLookupError:
                pass

    install_stop_handler(forward)
    for i in range(processes):
        fork(i)
    status = 0
    while children:
        try:
            pid, raw = os.wait()
        except ChildProcessError:
            break
        except InterruptedError:
            continue
        index = children.pop(pid, None)
        if index is None:
            continue
        code = os.waitstatus_to_exitcode(raw)
        if code == EXIT_FATAL and not requests.requests:
            logger.error("Worker process %d (pid %d) cannot work (see above); stopping all workers.", index, pid)
            status = EXIT_FATAL
            forward(signal.SIGTERM, None)
            continue
        if requests.requests or code == 0:
            status = status or (0 if code == 0 else 1)
            continue
        logger.error("Worker process %d (pid %d) died with %s; restarting it.", index, pid, code)
        time.sleep(restart_delay)
        fork(index)  # unless a signal came in meanwhile
    return status
