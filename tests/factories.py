"""Helpers the test files share: jobs made and moved through the engine, settings, threads and
processes started together, the admin's URLs, clients and forms. Plain functions; fixtures live
in conftest.py. Time is a parameter here too: pass ``now`` (None: the clocks' current time)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import uuid
from collections import Counter
from collections.abc import Callable, Iterable
from datetime import datetime
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth.models import Permission, User
from django.db import connection, connections
from django.test import Client, override_settings

import django_jobs
from django_jobs import engine
from django_jobs.conf import get_settings
from django_jobs.models import Event, Job
from django_jobs.services import Pruner
from django_jobs.testing import drain_queue
from tests.conftest import ROOT, subprocess_env, wait_until
from tests.tasks import read_records

# -- settings ------------------------------------------------------------------------------------


def jobs_settings(**overrides: Any) -> override_settings:
    """The test settings' DJANGO_JOBS with ``overrides`` on top, as an ``override_settings``."""
    return override_settings(DJANGO_JOBS={**settings.DJANGO_JOBS, **overrides})


# -- jobs through the engine ---------------------------------------------------------------------


def plain_function() -> None:
    """A module-level function the tests decorate with ``@task`` themselves."""


def job_row(job: Any) -> Job:
    """The job's row, from a result, a job, a claimed job or an id."""
    return Job.objects.get(id=getattr(job, "id", job))


def state_of(job: Any) -> str:
    """The job's state as stored, from a result, a job, a claimed job or an id."""
    return job_row(job).state


def count_states(ids: Iterable[Any]) -> Counter:
    """How many of the jobs ``ids`` are in each state."""
    return Counter(Job.objects.filter(id__in=list(ids)).values_list("state", flat=True))


def new_job(**fields: Any) -> engine.NewJob:
    """A one-attempt tests.tasks.noop job on queue "default" of backend "default", or as ``fields`` say."""
    values: dict[str, Any] = {
        "backend": "default", "task_path": "tests.tasks.noop", "queue": "default", "priority": 0, "args": [],
        "kwargs": {}, "max_attempts": 1, "options": {},
    }  # fmt: skip
    return engine.NewJob(**{**values, **fields})


def insert_job(*, using: str = "default", now: datetime | None = None, **fields: Any) -> Job:
    """``engine.insert_job`` of :func:`new_job` (``fields``), at ``now``."""
    return engine.insert_job(new_job(**fields), using=using, now=now)


def claim(
    *,
    now: datetime | None = None,
    limit: int = 100,
    queues: list[str] | None = None,
    worker_id: str = "w1",
    lease_seconds: float = 30,
    **options: Any,
) -> list[engine.ClaimedJob]:
    """``engine.claim_jobs`` of up to ``limit`` ready jobs of ``queues`` (None: all), as ``worker_id``."""
    return engine.claim_jobs(
        using="default", queues=queues, limit=limit, worker_id=worker_id, lease_seconds=lease_seconds, now=now,
        **options,
    )  # fmt: skip


def claim_job(job: Any, *, worker_id: str = "w1", lease_seconds: float = 30) -> engine.ClaimedJob:
    """Claim this one job (a result, a job or an id), whatever its queue; fails unless it was claimable."""
    [claimed] = claim(limit=1, worker_id=worker_id, lease_seconds=lease_seconds, job_ids=[_uuid(job)])
    return claimed


def claim_gated(
    queue: str, *, now: datetime | None = None, limit: int = 100, worker_id: str = "w1", lease_seconds: float = 30
) -> tuple[list[engine.ClaimedJob], float | None]:
    """``engine.claim_gated_jobs`` of ``queue``: the claimed jobs and when to try again."""
    return engine.claim_gated_jobs(
        using="default", queue=queue, limit=limit, worker_id=worker_id, lease_seconds=lease_seconds, now=now
    )


def record(
    claimed: engine.ClaimedJob, state: str = "completed", *, now: datetime | None = None, **outcome: Any
) -> dict[uuid.UUID, str]:
    """``engine.record_outcomes`` of one attempt's outcome (``state``, ``outcome``'s fields); what it wrote."""
    return engine.record_outcomes(
        [engine.Outcome(job_id=claimed.id, lease_token=claimed.lease_token, state=state, **outcome)],
        using="default",
        now=now,
    )


def finish(
    claimed: engine.ClaimedJob, state: str = "completed", *, now: datetime | None = None, **outcome: Any
) -> None:
    """:func:`record` one outcome and assert it was written."""
    written = record(claimed, state, now=now, **outcome)
    assert claimed.id in written, f"the {state} outcome of {claimed.id} was not written"


def enqueue_and_drain(task: Any, *args: Any, queue: str = "default", **kwargs: Any) -> Any:
    """Enqueue ``task`` on ``queue`` and run that queue's jobs (``drain_queue``); returns the result."""
    result = task.using(queue_name=queue).enqueue(*args, **kwargs)
    drain_queue(queue)
    return result


def pruner(**overrides: Any) -> Pruner:
    """The Pruner service on the current settings, with ``overrides`` of its fields."""
    s = get_settings()
    if overrides:
        from dataclasses import replace

        s = replace(s, **overrides)
    return Pruner(using="default", settings=s, interval=1.0)


def prune(now: datetime | None = None, **overrides: Any) -> dict[str, int]:
    """One run of :func:`pruner` as of ``now``; returns its counts."""
    return pruner(**overrides).run_once(now=now)


def _uuid(job: Any) -> uuid.UUID:
    return uuid.UUID(str(getattr(job, "id", job)))


# -- the event log -------------------------------------------------------------------------------

#: Seconds to wait for committed events to be readable: on PostgreSQL a writing transaction of
#: any database of the server holds them back while it runs (see settled()).
VISIBLE = 60.0


def settled() -> str:
    """Wait until every committed event is readable and return the cursor at the end of the log.

    On PostgreSQL a page holds only events of transactions older than every running one, and
    that horizon is the whole server's: another database's open transaction (other test runs
    share the server) can hold our committed events back for a moment. On MySQL an event is
    readable once a reader published it."""

    def caught_up() -> str | None:
        latest = django_jobs.events("latest").cursor  # on MySQL this also publishes what committed
        last = Event.objects.order_by("-txid", "-id").first()
        return latest if latest == (f"{last.txid}.{last.id}" if last else "0.0") else None

    return wait_until(caught_up, timeout=VISIBLE, message="every committed event to be readable")


def pg_session(dbname: str | None = None) -> Any:
    """A psycopg connection of its own to the test server's ``dbname`` (None: the test database)."""
    import psycopg

    params = connections["default"].get_connection_params()
    return psycopg.connect(
        host=params.get("host"), port=params.get("port"), user=params.get("user"),
        password=params.get("password") or None, dbname=dbname or connections["default"].settings_dict["NAME"],
    )  # fmt: skip


def lock_waiters(conn: Any = None, *, query_like: str | None = None) -> int:
    """How many other sessions wait for a row lock (running a query ``LIKE query_like``), read on
    ``conn`` (default: the test's connection): of the test database on PostgreSQL, of the server
    on MariaDB. Poll it on MariaDB at least 0.1 s apart: InnoDB refreshes what it shows only when
    it was last read longer ago than that."""
    conn = conn or connection
    if getattr(conn, "vendor", "postgresql") == "mysql":
        sql = (
            "SELECT count(*) FROM information_schema.innodb_trx WHERE trx_state = 'LOCK WAIT' "
            "AND trx_mysql_thread_id <> CONNECTION_ID()"
        )
        query = " AND trx_query LIKE %s"
    else:
        sql = (
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()"
        )
        query = " AND query LIKE %s"
    with conn.cursor() as cursor:
        if query_like is None:
            cursor.execute(sql)
        else:
            cursor.execute(sql + query, [query_like])
        return cursor.fetchone()[0]


# -- probes, threads and processes ---------------------------------------------------------------


def records_of(probe: str, event: str) -> list[dict]:
    """The records tasks appended to ``probe`` (tests.tasks.record) for ``event``."""
    return [r for r in read_records(probe) if r.get("event") == event]


def race(n: int, fn: Callable[[int], object], timeout: float = 60) -> list:
    """Run ``fn(i)`` in ``n`` threads released together, each on (and closing) its own database
    connection; returns the results in thread order, re-raises the first error."""
    barrier = threading.Barrier(n)
    results: list = [None] * n
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            barrier.wait(10)
            results[i] = fn(i)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test thread
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    assert not any(t.is_alive() for t in threads), "a racing thread did not finish"
    if errors:
        raise errors[0]
    return results


def run_python(*args: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run ``python <args>`` on the test database from the repository root; its output as text."""
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=subprocess_env(env), capture_output=True, text=True, timeout=timeout
    )


def race_scripts(script: str, *args: str, processes: int, go: Path, ready_timeout: float = 60) -> list[dict]:
    """Run ``python -c script go *args`` in ``processes`` processes; each touches ``go.<pid>.ready``
    and waits for ``go`` to exist, so they start together. Returns the JSON each one printed."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script, str(go), *args],
            cwd=ROOT,
            env=subprocess_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(processes)
    ]
    try:
        ready = f"{go.name}.*.ready"
        wait_until(lambda: len(list(go.parent.glob(ready))) == processes, timeout=ready_timeout, message="racers")
        go.touch()
        outputs = [p.communicate(timeout=60) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert all(p.returncode == 0 for p in procs), [err for _, err in outputs]
    return [json.loads(out) for out, _ in outputs]


# -- the admin -----------------------------------------------------------------------------------


def queue_page(name: str) -> str:
    """The URL of a queue's page in the admin."""
    return f"/admin/django_jobs/queuestate/{name}/dashboard/"


def queue_action(name: str, verb: str) -> str:
    """The URL a queue's control (pause, resume, limits, clean, drain) posts to."""
    return f"/admin/django_jobs/queuestate/{name}/dashboard/{verb}/"


def job_page(job_id: Any) -> str:
    """The URL of a job's page in the admin."""
    return f"/admin/django_jobs/job/{job_id}/change/"


def get_page(client: Client, url: str, params: dict | None = None) -> str:
    """GET ``url`` with ``client``, assert a 200 and return the body."""
    response = client.get(url, params or {})
    assert response.status_code == 200, (url, params, response.status_code, response.get("Location"))
    return response.content.decode()


def listed(body: str) -> set[str]:
    """The job ids of a changelist page (its row checkboxes)."""
    return set(re.findall(r'name="_selected_action" value="([0-9a-f-]{36})"', body))


def staff_user(*codenames: str, name: str = "staff", staff: bool = True) -> User:
    """A user (staff unless ``staff=False``) holding exactly ``codenames`` of django_jobs; no password."""
    user = User.objects.create_user(name, password=None, is_staff=staff)  # no password hashing: force_login
    perms = list(Permission.objects.filter(content_type__app_label="django_jobs", codename__in=codenames))
    assert sorted(p.codename for p in perms) == sorted(codenames), "every permission exists"
    user.user_permissions.set(perms)
    return user


def staff_client(*codenames: str, name: str = "staff", staff: bool = True) -> Client:
    """A client logged in as a new :func:`staff_user`."""
    client = Client()
    client.force_login(staff_user(*codenames, name=name, staff=staff))
    return client


def superuser_client(name: str = "root", **client_options: Any) -> Client:
    """A client (``Client(**client_options)``) logged in as a new superuser ``name``."""
    client = Client(**client_options)
    client.force_login(User.objects.create_superuser(name, password=None))
    return client


def schedule_form(**fields: str) -> dict[str, str]:
    """The admin's schedule form data: an enabled "from-admin" schedule of tests.tasks.noop, with ``fields`` set."""
    data = {
        "backend": "default", "name": "from-admin", "enabled": "on", "task_path": "tests.tasks.noop", "args": "[]",
        "kwargs": "{}", "queue": "", "priority": "", "options": "{}", "cron": "", "every_seconds": "",
        "offset_seconds": "0", "timezone": "UTC", "start_at_0": "", "start_at_1": "", "end_at_0": "", "end_at_1": "",
        "limit": "", "catch_up": "latest",
    }  # fmt: skip
    data.update(fields)
    return data
