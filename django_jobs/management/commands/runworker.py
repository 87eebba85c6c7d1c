"""``manage.py runworker``: parse options, then ``Worker(...).run()``. No logic lives here."""

from __future__ import annotations

import logging
import math
import sys
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from ...checks import check_worker_processes
from ...exceptions import JobsError, WorkerCrashed
from ...prometheus import MAX_PORT, WorkerMetrics, prometheus_client
from ...worker import Worker
from ...worker.log_lines import LineHandler
from ...worker.runner import DEFAULT_PREFETCH, MAX_WAIT_SECONDS
from ...worker.supervisor import EXIT_FATAL, supervise


def _seconds(name: str, raw: str, *, zero_ok: bool = False, high: float | None = None) -> float:
    """``--name SECONDS``: a finite number, from 0 (``zero_ok``) or above it, up to ``high``."""
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if math.isnan(value):  # float() reads "nan" too, and NaN passes no comparison with a bound
        raise CommandError(f"--{name} must be a number of seconds; got {raw!r}.")
    if value < 0 or (value == 0 and not zero_ok):
        raise CommandError(f"--{name} must be {'>=' if zero_ok else '>'} 0 seconds; got {raw!r}.")
    if high is not None and value > high:
        raise CommandError(f"--{name} must be at most {high:g} seconds; got {raw!r}.")
    if math.isinf(value):
        raise CommandError(f"--{name} must be a finite number of seconds (leave it out for no limit); got {raw!r}.")
    return value


def _int(name: str, raw: str, low: int) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise CommandError(f"--{name} must be a whole number >= {low}; got {raw!r}.") from None
    if value < low:
        raise CommandError(f"--{name} must be a whole number >= {low}; got {raw!r}.")
    return value


class Command(BaseCommand):
    help = "Run django-jobs workers: claim jobs from the database and run them."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "-q",
            "--queue",
            action="append",
            dest="queues",
            metavar="QUEUE[,QUEUE]",
            help="Queues to work (comma-separated or repeated; '*' for all). Default: all.",
        )
        parser.add_argument(
            "--topics",
            action="append",
            dest="topics",
            metavar="TOPIC[,TOPIC]",
            help="Topics whose subscribers to run (bus mode; comma-separated or repeated; '*' for all). "
            "Default: every subscriber of the installed apps' 'subscribers' modules.",
        )
        parser.add_argument("--no-topics", action="store_true", help="Run no subscribers, only jobs.")
        parser.add_argument("-c", "--concurrency", default="1", help="Jobs at once per process (threads). Default 1.")
        parser.add_argument(
            "-p", "--processes", default="1", help="Worker processes (a supervisor forks them). Default 1."
        )
        parser.add_argument(
            "--stop-when-empty",
            action="store_true",
            help="Exit once no waiting, delayed or active job is left in the queues.",
        )
        parser.add_argument("--max-jobs", default=None, help="Exit after this many jobs (per process).")
        parser.add_argument("--max-time", default=None, help="Exit after this many seconds.")
        parser.add_argument(
            "--sleep",
            default=None,
            help="Idle poll interval in seconds (jittered), up to a day. Default POLL_INTERVAL.",
        )
        parser.add_argument(
            "--grace", default="30", help="Seconds running jobs get to finish on shutdown (0 to a day). Default 30."
        )
        parser.add_argument(
            "--worker-id", default=None, help="Worker id: 1-200 printable characters (default host-pid-random)."
        )
        parser.add_argument(
            "--prefetch",
            default=str(DEFAULT_PREFETCH),
            help=f"While jobs are short, hold up to concurrency x N claimed jobs (1: only one per thread). "
            f"Default {DEFAULT_PREFETCH}.",
        )
        parser.add_argument("--backend", default="default", help="Alias in TASKS. Default 'default'.")
        parser.add_argument(
            "--metrics-port",
            default=None,
            metavar="PORT",
            help="Serve Prometheus metrics over HTTP on this port (needs prometheus-client); with "
            "--processes N, process i serves on PORT+i.",
        )
        parser.add_argument(
            "--metrics-addr",
            default="0.0.0.0",
            metavar="ADDR",
            help="The address --metrics-port listens on. Default 0.0.0.0 (every interface).",
        )
        parser.add_argument(
            "--isolation",
            choices=["thread", "process"],
            default="thread",
            help="thread (default): run jobs in this process's threads; process: run each slot's jobs in a "
            "child process that is killed at a job's timeout or cancel (CPU-bound or never-ending code).",
        )

    def handle(self, *args: Any, **opts: Any) -> None:
        queues: list[str] | None = None
        topics: list[str] | None = [] if opts["no_topics"] else None
        if opts["topics"] and not opts["no_topics"]:
            topics = [t.strip() for raw in opts["topics"] for t in raw.split(",") if t.strip()]
            if not topics:
                raise CommandError("--topics needs at least one topic name (or '*').")
        if opts["queues"]:
            queues = [q.strip() for raw in opts["queues"] for q in raw.split(",") if q.strip()]
            if not queues:
                raise CommandError("--queue needs at least one queue name (or '*').")
        concurrency = _int("concurrency", opts["concurrency"], 1)
        prefetch = _int("prefetch", opts["prefetch"], 1)
        processes = _int("processes", opts["processes"], 1)
        max_jobs = _int("max-jobs", opts["max_jobs"], 1) if opts["max_jobs"] is not None else None
        max_time = _seconds("max-time", opts["max_time"]) if opts["max_time"] is not None else None
        sleep = _seconds("sleep", opts["sleep"], high=MAX_WAIT_SECONDS) if opts["sleep"] is not None else None
        grace = _seconds("grace", opts["grace"], zero_ok=True, high=MAX_WAIT_SECONDS)
        # The Worker checks the id itself (not empty, printable...); an empty one is refused
        # there, not taken for "generate one".
        if opts["worker_id"] is not None and processes > 1:
            raise CommandError("--worker-id names one process; leave it out with --processes > 1.")
        metrics_port = _metrics_port(opts["metrics_port"], processes)
        self._configure_logging(opts["verbosity"])

        def make(
            worker_id: str | None = None, handle_signals: bool = True, metrics: WorkerMetrics | None = None
        ) -> Worker:
            try:
                return Worker(
                    queues=queues,
                    concurrency=concurrency,
                    backend=opts["backend"],
                    stop_when_empty=opts["stop_when_empty"],
                    max_jobs=max_jobs,
                    max_time=max_time,
                    sleep=sleep,
                    grace=grace,
                    worker_id=worker_id,
                    handle_signals=handle_signals,
                    isolation=opts["isolation"],
                    prefetch=prefetch,
                    on_outcome=metrics.observe if metrics is not None else None,
                    topics=topics,
                )
            except JobsError as exc:
                raise CommandError(str(exc)) from None

        def start_metrics() -> WorkerMetrics | None:
            """This process's metrics (None without --metrics-port); serve() comes later."""
            if metrics_port is None:
                return None
            try:
                return WorkerMetrics(backend=opts["backend"])
            except JobsError as exc:
                raise CommandError(str(exc)) from None

        def serve(metrics: WorkerMetrics | None, port: int) -> None:
            if metrics is not None:
                try:
                    metrics.serve(port=port, addr=opts["metrics_addr"])
                except (JobsError, OSError) as exc:
                    raise CommandError(
                        f"--metrics-port: cannot serve on {opts['metrics_addr']}:{port}: {exc}"
                    ) from None

        # A worker validates every option before anything forks. With --processes N, each
        # process counts its own outcomes and serves them on a port of its own (PORT+i): the
        # supervisor forks before any metric exists, so no counter is shared or lost.
        metrics = start_metrics() if processes == 1 else None
        worker = make(opts["worker_id"], metrics=metrics)
        problems = check_worker_processes(worker.using, processes)
        if problems:
            p = problems[0]
            raise CommandError(f"{p.id}: {p.msg} {p.hint}")
        if processes == 1:
            serve(metrics, metrics_port or 0)
            try:
                stats = worker.run()
            except WorkerCrashed as exc:
                raise CommandError(str(exc)) from None
            finally:
                if metrics is not None:
                    metrics.stop()
            self.stdout.write(stats.summary())
            if opts["verbosity"] >= 2 and stats.outcome_window:
                self.stdout.write(f"Outcome window: {stats.outcome_window}.")
            return

        def run_child(index: int) -> int:
            try:
                child_metrics = start_metrics()
                child = make(None, metrics=child_metrics)
                serve(child_metrics, (metrics_port or 0) + index)
                stats = child.run()
            except (WorkerCrashed, CommandError) as exc:
                self.stderr.write(f"[process {index}] {exc}")
                return EXIT_FATAL
            self.stdout.write(f"[process {index}] {stats.summary()}")
            if opts["verbosity"] >= 2 and stats.outcome_window:
                self.stdout.write(f"[process {index}] Outcome window: {stats.outcome_window}.")
            return 0

        code = supervise(processes, run_child)
        if code:
            sys.exit(code)

    def _configure_logging(self, verbosity: int) -> None:
        logger = logging.getLogger("django_jobs")
        if not logger.handlers and not logging.getLogger().handlers:
            # A StreamHandler that writes the lines of one outcome batch together (log_lines).
            logger.addHandler(LineHandler(self.stderr._out))
        logger.setLevel(logging.WARNING if verbosity < 1 else logging.INFO if verbosity < 3 else logging.DEBUG)
        if _default_task_logging():
            # Django's own receivers log every task start and finish on "django.tasks" (INFO, a
            # failure at ERROR with its traceback), the same facts as our line per outcome
            # (django_jobs.worker.jobs): printed twice, with a traceback per failed attempt at
            # every -v. Off, too, no record is built, about a tenth of a short job's CPU.
            logging.getLogger("django.tasks").setLevel(logging.CRITICAL + 1)


def _metrics_port(raw: str | None, processes: int) -> int | None:
    """``--metrics-port``: None when left out; a port such that PORT+processes-1 is one too, and
    prometheus-client installed."""
    if raw is None:
        return None
    port = _int("metrics-port", raw, 1)
    if port + processes - 1 > MAX_PORT:
        top = "" if processes == 1 else f" (with --processes {processes}, ports {port}..{port + processes - 1})"
        raise CommandError(f"--metrics-port must be a port 1..{MAX_PORT - processes + 1}{top}; got {raw!r}.")
    try:
        prometheus_client()
    except JobsError as exc:
        raise CommandError(f"--metrics-port: {exc}") from None
    return port


def _default_task_logging() -> bool:
    """True unless the project configures "django.tasks" itself: LOGGING names that logger, or
    LOGGING_CONFIG is the project's own."""
    if getattr(settings, "LOGGING_CONFIG", "logging.config.dictConfig") != "logging.config.dictConfig":
        return False
    config = getattr(settings, "LOGGING", None) or {}
    return "django.tasks" not in (config.get("loggers") or {})
