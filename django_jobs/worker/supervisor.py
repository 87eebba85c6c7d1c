"""``runworker --processes N``: fork N worker processes, restart one that dies, pass signals on."""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

from django.db import connections

logger = logging.getLogger("django_jobs.worker")


#: A child exits with this when restarting it cannot help (the database is not migrated...).
EXIT_FATAL = 3


def supervise(processes: int, run_child: Callable[[int], int], *, restart_delay: float = 1.0) -> int:
    """Run ``run_child(index)`` in ``processes`` forked children until they exit by themselves
    (stop-when-empty, max-jobs, max-time) or a signal stops them. Returns the exit status."""
    children: dict[int, int] = {}  # pid -> index
    stopping = {"signals": 0}

    def fork(index: int) -> None:
        connections.close_all()  # never share a database socket with a child
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                signal.signal(signal.SIGINT, signal.SIG_DFL)
                code = run_child(index)
            except BaseException:  # noqa: BLE001
                logger.exception("Worker process %d crashed.", index)
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        children[pid] = index

    def forward(signum: int, frame: Any) -> None:
        stopping["signals"] += 1
        for pid in list(children):
            try:
                os.kill(pid, signal.SIGKILL if stopping["signals"] > 2 else signum)
            except ProcessLookupError:
                pass

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
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
        if code == EXIT_FATAL and not stopping["signals"]:
            logger.error("Worker process %d (pid %d) cannot work (see above); stopping all workers.", index, pid)
            status = EXIT_FATAL
            forward(signal.SIGTERM, None)
            continue
        if stopping["signals"] or code == 0:
            status = status or (0 if code == 0 else 1)
            continue
        logger.error("Worker process %d (pid %d) died with %s; restarting it.", index, pid, code)
        time.sleep(restart_delay)
        if not stopping["signals"]:
            fork(index)
    return status
