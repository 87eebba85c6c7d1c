"""``manage.py jobs``: the operations console in a terminal. Formatting only; what it shows comes
from :mod:`django_jobs.console` and what it changes goes through :mod:`django_jobs.api` and
:func:`django_jobs.queue`."""

from __future__ import annotations

import argparse
import json
import math
import time
from datetime import datetime
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.tasks import task_backends
from django.tasks.exceptions import TaskResultDoesNotExist
from django.utils import timezone
from django.utils.module_loading import autodiscover_modules

import django_jobs

from ...conf import get_settings
from ...console import attempt_runs, dashboard, job_detail, list_jobs
from ...exceptions import InvalidHealthOption, InvalidKeyRotation, JobsConfigurationError, JobsError
from ...health import check_health, health_options, this_host
from ...services import Pruner
from ...spec.encryption import SHOWN, is_encrypted, shown_errors
from ...states import JobState
from ..text import ANSI_REDRAW, due, duration, moment, moment_ms, parse_moment, table
from ..topic_commands import TopicCommands, add_topic_parsers


class Command(TopicCommands, BaseCommand):
    help = (
        "Look at and act on django-jobs queues, jobs and topics: status, list, show, retry, cancel, pause, resume, "
        "prune, health, rotate-keys, topics, lag, dead-letters."
    )

    # Django gives its common options (-v, --settings, --pythonpath, --traceback, --no-color,
    # --force-color, --skip-checks) to the top-level parser only, which refuses them after a
    # subcommand ("jobs status -v 0"). The command notes them as Django adds them and hands each
    # subcommand the same options.

    def create_parser(self, prog_name: str, subcommand: str, **kwargs: Any) -> CommandParser:
        self._common_options: list[tuple[tuple[str, ...], dict[str, Any]]] = []
        if self.requires_system_checks:  # create_parser adds it with parser.add_argument
            self._common_options.append((("--skip-checks",), {"action": "store_true", "help": "Skip system checks."}))
        return super().create_parser(prog_name, subcommand, **kwargs)

    def add_base_argument(self, parser: Any, *args: Any, **kwargs: Any) -> None:
        super().add_base_argument(parser, *args, **kwargs)
        self._common_options.append((args, kwargs))

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--backend", default="default", help="TASKS alias (default: default).")
        sub = parser.add_subparsers(dest="action", required=True)
        status = sub.add_parser("status", help="Unfinished jobs per queue and state, flags and limits.")
        status.add_argument("--watch", type=float, metavar="SECONDS", help="Refresh every SECONDS until Ctrl-C.")
        listing = sub.add_parser("list", help="The newest jobs, filtered.")
        listing.add_argument("--queue")
        listing.add_argument("--state")
        listing.add_argument("--task", help="Dotted task path.")
        listing.add_argument("--priority", type=int)
        listing.add_argument("--trace", help="A trace id: the jobs of one pipeline.")
        listing.add_argument("--partition")
        listing.add_argument("--since", help="Enqueued at or after this ISO 8601 time (e.g. 2026-11-30T06:00).")
        listing.add_argument("--until", help="Enqueued before this ISO 8601 time.")
        listing.add_argument("--limit", type=int, default=20)
        show = sub.add_parser("show", help="One job: arguments, result, errors with tracebacks, log.")
        show.add_argument("job_id")
        for name, text in (("retry", "Re-queue failed or cancelled jobs."), ("cancel", "Cancel jobs.")):
            p = sub.add_parser(name, help=text)
            p.add_argument("job_ids", nargs="+", metavar="ID")
        for name in ("pause", "resume"):
            p = sub.add_parser(name, help=f"{name.capitalize()} a queue for every worker.")
            p.add_argument("queue")
        prune = sub.add_parser(
            "prune", help="Delete the finished jobs whose retention ended (what the workers' pruner does), now."
        )
        prune.add_argument(
            "--max-seconds",
            type=float,
            default=60.0,
            help="Stop after about this long (default 60); run again to go on.",
        )
        rotate = sub.add_parser(
            "rotate-keys",
            help="Re-encrypt every encrypted job, message and dead letter with the first of ENCRYPTION_KEYS, in batches; "
            "safe while workers run.",
        )
        rotate.add_argument(
            "--batch-size",
            type=int,
            default=500,
            help="Rows (jobs, messages...) per transaction, 1-10000 (default 500).",
        )
        rotate.add_argument("--after", metavar="ID", help="Start after this job id (a stopped run printed it).")
        health = sub.add_parser(
            "health", help="Exit 0 when healthy, 1 when a check fails (one line each on stderr), 2 for a bad option."
        )
        health.add_argument("--min-workers", default=1, metavar="N", help="Fresh workers required (default 1).")
        hosts = health.add_mutually_exclusive_group()
        hosts.add_argument("--host", metavar="NAME", help="Count the workers of this host (default: this machine).")
        hosts.add_argument("--any-host", action="store_true", help="Count the workers of every host.")
        health.add_argument(
            "--max-wait",
            action="append",
            metavar="[QUEUE=]SECONDS",
            help="Longest wait of a queue's oldest ready job (default 300); QUEUE=SECONDS for one queue; "
            "'off' for no limit. Repeatable.",
        )
        health.add_argument("--max-rescues", metavar="COUNT", help="Most stalled jobs in the window (needs EVENTS).")
        health.add_argument("--window", metavar="MINUTES", help="The window of --max-rescues (default 15).")
        health.add_argument("--json", action="store_true", dest="as_json", help="Print the report as JSON.")
        add_topic_parsers(sub)
        # No default on a subcommand's copy: argparse writes every value a subparser holds over
        # the top level's, so a default there would undo "jobs -v 0 status". Given after the
        # subcommand, an option wins; not given, the value before it (or Django's default) stays.
        for subparser in sub.choices.values():
            for flags, kwargs in self._common_options:
                subparser.add_argument(*flags, **{**kwargs, "default": argparse.SUPPRESS})

    def execute(self, *args: Any, **options: Any) -> Any:
        if options.get("action") == "health":
            # A probe runs every few seconds and must stay silent when healthy: no system checks.
            options["skip_checks"] = True
        return super().execute(*args, **options)

    def handle(self, *args: Any, **options: Any) -> None:
        backend = options["backend"]
        try:
            self.using = task_backends[backend].database
        except Exception as exc:  # noqa: BLE001 - an unknown alias or a non-jobs backend
            raise CommandError(
                f"--backend {backend!r} is not a django-jobs backend in TASKS ({exc}).", returncode=2
            ) from None
        self.backend = backend
        self.verbosity = options["verbosity"]
        getattr(self, "do_" + options["action"].replace("-", "_"))(**options)

    # -- views ------------------------------------------------------------------------------------

    def do_status(self, watch: float | None = None, **_: Any) -> None:
        if watch is None:
            self.stdout.write(self._status_table(timezone.now()))
            return
        if not math.isfinite(watch) or watch <= 0:
            raise CommandError(f"--watch must be a number of seconds > 0; got {watch}.")
        # A terminal gets each snapshot drawn over the last (cursor home, clear screen: no
        # curses); a pipe or a file gets them one after the other, each under a line with its time.
        redraw = self.stdout.isatty()
        try:
            while True:
                now = timezone.now()
                snapshot = self._status_table(now)
                header = f"jobs status, refreshed {moment(now)} (every {watch:g}s, Ctrl-C to stop)"
                if redraw:
                    self.stdout.write(f"{ANSI_REDRAW}{header}\n\n{snapshot}")
                else:
                    self.stdout.write(f"{header}\n{snapshot}\n\n")
                self.stdout.flush()
                time.sleep(watch)
        except KeyboardInterrupt:  # Ctrl-C, while it sleeps or while it reads
            return

    def _status_table(self, now: datetime) -> str:
        board = dashboard(using=self.using, backend=self.backend, now=now)
        head = ["queue", "waiting", "delayed", "active", "waiting-children", "done/1h", "failed/1h", "jobs/min",
                "avg run", "oldest wait", "paused", "concurrency", "rate", "max size"]  # fmt: skip
        body = []
        for q in board.queues:
            r = q.row
            avg = q.hour.avg_runtime_ms
            age = q.oldest_waiting_age
            body.append(
                [
                    r.name,
                    *(str(r.counts[s]) for s in ("waiting", "delayed", "active", "waiting-children")),
                    str(q.hour.completed),
                    str(q.hour.failed),
                    f"{q.jobs_per_minute:g}",
                    "" if avg is None else f"{avg:,.0f} ms",
                    "" if age is None else duration(age.total_seconds()),
                    "yes" if r.paused else "",
                    "" if r.concurrency is None else str(r.concurrency),
                    "" if r.rate_limit is None else f"{r.rate_limit[0]}/{r.rate_limit[1]:g}s",
                    "" if r.max_size is None else str(r.max_size),
                ]
            )
        if not body:
            return "No queues with unfinished jobs, settings or jobs finished in the last day."
        lines = [table(head, body), ""]
        workers = board.workers.rows
        lines.append(f"{len(workers)} worker(s):" if workers else "No live workers.")
        for w in workers:
            stale = "  " + self.style.WARNING("STALE") if w.stale else ""
            lines.append(
                f"  {w.hostname} pid {w.pid}  queues {','.join(w.queues) or '*'}  concurrency {w.concurrency}  "
                f"running {w.running}  heartbeat {duration(w.heartbeat_age.total_seconds())} ago{stale}"
            )
        return "\n".join(lines)

    def do_list(self, queue=None, state=None, task=None, limit=20, **options: Any) -> None:  # noqa: ANN001
        filters = {k: options.get(k) for k in ("priority", "trace", "partition")}
        for name in ("since", "until"):
            filters[name] = parse_moment(options.get(name), name)

        if limit < 1:
            raise CommandError(f"--limit must be >= 1; got {limit}.")
        try:
            jobs = list_jobs(
                using=self.using, backend=self.backend, queue=queue, state=state, task=task, limit=limit, **filters
            )
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        head = ["id", "task", "queue", "state", "priority", "attempts", "enqueued", "runs at"]
        body = [
            [
                str(j.id),
                j.task_path,
                j.queue,
                j.state,
                str(j.priority),
                f"{j.attempts}/{j.max_attempts}",
                moment(j.enqueued_at),
                moment(j.available_at) if j.state == JobState.DELAYED else "",
            ]
            for j in jobs
        ]
        self.stdout.write(table(head, body) if body else "No jobs match.")

    def do_show(self, job_id: str, **_: Any) -> None:
        found = job_detail(using=self.using, job_id=job_id)
        if found is None:
            raise CommandError(f"No job with id {job_id!r}.")
        job, logs = found
        encrypted = bool((job.options or {}).get("encrypt"))

        def shown(value: Any) -> str:
            return SHOWN if encrypted or is_encrypted(value) else json.dumps(value)

        lines = [
            f"id          {job.id}",
            f"task        {job.task_path}",
            f"queue       {job.queue}" + (f"  partition {job.partition_key}" if job.partition_key else ""),
            f"state       {job.state}  attempts {job.attempts}/{job.max_attempts}  priority {job.priority}",
            f"enqueued    {moment(job.enqueued_at)}",
        ]
        if job.state == JobState.DELAYED:  # a delay or a retry's backoff: when the promoter frees it
            lines.append(f"runs at     {moment(job.available_at)} ({due(job.available_at, timezone.now())})")
        lines += [
            f"started     {moment(job.started_at)}  (claimed; the jobs of one claim share it)",
            f"finished    {moment(job.finished_at)}",
            f"args        {shown(job.args)}",
            f"kwargs      {shown(job.kwargs)}",
            f"result      {json.dumps(None) if job.return_value is None else shown(job.return_value)}",
            f"progress    {json.dumps(job.progress)}",
            f"trace       {job.trace_id or '-'}   parent {job.parent_id or '-'}",
        ]
        runs = attempt_runs(using=self.using, job_id=job.id)
        if runs:
            lines += ["", "attempts (each run by the database's clock, less the run time the worker measured):"]
            for run in runs:
                ran = "" if run.started_at is None else f"ran {moment_ms(run.started_at)} - "
                took = "" if run.runtime_ms is None else f" ({run.runtime_ms:,} ms)"
                error = f"  {run.error}" if run.error else ""
                lines.append(f"  {run.attempt or '?'}  {run.kind:<9}  {ran}{moment_ms(run.ended_at)}{took}{error}")
        if encrypted:
            lines.append("encrypted   yes: arguments, result and error messages are stored encrypted and not shown")
        for error in shown_errors(job.errors):
            heading = f"error (attempt {error.get('attempt', '?')}): {error.get('exception_class_path')}"
            lines += ["", self.style.ERROR(heading)]
            lines += ["  " + line for line in str(error.get("traceback", "")).rstrip().splitlines()]
        if logs:
            lines += ["", "log:"] + [f"  {moment(log.created_at)}  {log.line}" for log in logs]
        self.stdout.write("\n".join(lines))

    # -- actions ----------------------------------------------------------------------------------

    def do_retry(self, job_ids: list[str], **_: Any) -> None:
        self._each(job_ids, "retry", "re-queued")

    def do_cancel(self, job_ids: list[str], **_: Any) -> None:
        self._each(job_ids, "cancel", "cancelled (a running job is told to stop)")

    def _each(self, job_ids: list[str], verb: str, done: str) -> None:
        failed = []
        for job_id in job_ids:
            try:
                getattr(django_jobs, verb)(job_id, backend=self.backend)
            except (TaskResultDoesNotExist, JobsError) as exc:
                failed.append(job_id)
                self.stderr.write(f"{job_id}: {exc}")
                continue
            self._done(f"{job_id}: {done}")
        if failed:
            raise CommandError(f"{len(failed)} of {len(job_ids)} job(s) failed to {verb}: {', '.join(failed)}.")

    def do_pause(self, queue: str, **_: Any) -> None:
        self._queue(queue).pause()
        self._done(f"Queue {queue!r} paused: running jobs finish, no new one starts.")

    def do_resume(self, queue: str, **_: Any) -> None:
        self._queue(queue).resume()
        self._done(f"Queue {queue!r} resumed.")

    def _done(self, message: str) -> None:
        """Say what an action did, unless ``-v 0`` asked for errors only."""
        if self.verbosity > 0:
            self.stdout.write(message)

    def _queue(self, name: str) -> Any:
        try:
            return django_jobs.queue(name, backend=self.backend)
        except JobsError as exc:
            raise CommandError(str(exc)) from None

    # -- retention --------------------------------------------------------------------------------

    def do_prune(self, max_seconds: float = 60.0, **_: Any) -> None:
        if max_seconds <= 0:
            raise CommandError(f"--max-seconds must be > 0; got {max_seconds}.")
        autodiscover_modules("tasks")  # the tasks' own count limits, as a worker knows them
        settings = get_settings(self.backend)
        pruner = Pruner(using=self.using, settings=settings, interval=settings.PRUNE_INTERVAL, backend=self.backend)
        pruner.budget = max_seconds
        counts = pruner.run_once()
        self._done(
            f"Deleted {counts['jobs']} expired job(s), {counts['over_count']} over a count limit, "
            f"{counts['events']} event(s), {counts['metrics']} metric row(s) and {counts['topic_metrics']} topic "
            "metric row(s)."
        )

    # -- encryption -------------------------------------------------------------------------------

    def do_rotate_keys(self, batch_size: int = 500, after: str | None = None, **_: Any) -> None:
        def report(totals: Any) -> None:
            if self.verbosity > 1:
                self.stdout.write(
                    f"  {totals.examined} examined, {totals.rotated} re-encrypted, up to job {totals.last_id}"
                )

        try:
            done = django_jobs.rotate_keys(backend=self.backend, batch_size=batch_size, after=after, on_batch=report)
        except (InvalidKeyRotation, JobsConfigurationError) as exc:
            raise CommandError(str(exc)) from None
        bad_jobs = sum(1 for u in done.undecryptable if " " not in u)
        self._done(
            f"Re-encrypted {done.rotated} of {done.examined} encrypted job(s) with the first key "
            f"({done.examined - done.rotated - bad_jobs} had it already), {done.flow_values} flow value(s) and "
            f"{done.stashes} stashed dedup enqueue(s)."
        )
        self._done(
            f"Topics: re-encrypted {done.messages} message(s), {done.dead_letters} dead letter(s) and "
            f"{done.cursor_errors} group cursor error(s)."
        )
        if done.undecryptable:
            raise CommandError(
                f"{len(done.undecryptable)} encrypted value(s) that no key of ENCRYPTION_KEYS decrypts were left as "
                f"they are (keep the key that encrypted them): {', '.join(done.undecryptable[:20])}"
                + (" ..." if len(done.undecryptable) > 20 else "")
            )

    # -- health -----------------------------------------------------------------------------------

    def do_health(self, as_json: bool = False, verbosity: int = 1, **options: Any) -> None:
        try:
            thresholds = health_options(
                min_workers=options["min_workers"],
                host=None if options["any_host"] else this_host() if options["host"] is None else options["host"],
                max_wait=options["max_wait"] or (),
                max_rescues=options["max_rescues"],
                window=options["window"],
                backend=self.backend,
            )
        except InvalidHealthOption as exc:
            raise CommandError(f"--{exc}", returncode=2) from None
        report = check_health(thresholds, backend=self.backend)
        if as_json:
            self.stdout.write(json.dumps(report.as_json(), indent=2))
        elif verbosity >= 1:
            for check in report.checks:
                if check.ok:
                    self.stdout.write(f"{check.name}: {check.message}")
        for line in report.failures:
            self.stderr.write(line)
        if not report.ok:
            raise SystemExit(1)
