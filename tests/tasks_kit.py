"""Tasks for the test kit's tests (tests/test_testing_kit.py), written as a project using
django-jobs would write its own."""

import threading

from asgiref.sync import sync_to_async
from django.db import connections
from django.tasks import task

from django_jobs import Retry, Snooze

#: Emails "sent" by send_welcome_email, in order; tests clear it first.
SENT: list[str] = []


@task
def send_welcome_email(email: str, template: str = "welcome") -> str:
    SENT.append(email)
    return f"sent {template} to {email}"


@task
def sign_up(email: str) -> str:
    """Enqueues a follow-up job, as a view or a task often does."""
    send_welcome_email.enqueue(email)
    return f"signed up {email}"


@task
def argument_types(*args, **kwargs) -> dict:
    """Returns the types the task received, so a test sees what the JSON round trip made of them."""
    return {
        "args": [type(a).__name__ for a in args],
        "kwargs": {k: type(v).__name__ for k, v in kwargs.items()},
    }


@task(takes_context=True, max_attempts=3, backoff=3600)
def flaky(context, succeed_on: int) -> int:
    """Fails until attempt ``succeed_on``; its hour-long backoff keeps a retry delayed."""
    if context.attempt < succeed_on:
        raise RuntimeError(f"attempt {context.attempt} failed")
    return context.attempt


@task(takes_context=True, max_attempts=3, backoff=3600)
def charge_card(context, action: str) -> str:
    """Ends its attempt with the handler action named by ``action``."""
    if action == "fail":
        context.fail("card declined")
    if action == "retry":
        raise Retry("gateway busy", delay=30)
    if action == "snooze":
        raise Snooze(60)
    return "charged"


@task(takes_context=True)
def import_rows(context, rows: int) -> dict:
    """Logs a line per row and reports its progress."""
    logged = [context.log(f"row {i}") for i in range(rows)]
    progressed = context.set_progress({"done": rows, "of": rows})
    return {"logged": logged, "progressed": progressed}


@task
def always_snoozes() -> None:
    raise Snooze(3600)


@task(takes_context=True, max_attempts=3, backoff=0)
def rate_limited(context) -> None:
    """Fails its first attempt (a transient error, retried at once), then snoozes: the rate
    limit it meets is an hour away from lifting."""
    if context.attempt == 1:
        raise ConnectionError("reset by peer")
    raise Snooze(3600)


def _close_connections_off_the_main_thread() -> None:
    # Where the async ORM ran the query on another thread than the test's, that thread's
    # connection would outlive the test and keep PostgreSQL from dropping the test database.
    # On the test's own thread the connection holds the test's transaction: leave it alone.
    if threading.current_thread() is not threading.main_thread():
        connections.close_all()


@task
async def user_exists(username: str) -> bool:
    """An async task reading the database, as async tasks do."""
    from django.contrib.auth.models import User

    try:
        return await User.objects.filter(username=username).aexists()
    finally:
        await sync_to_async(_close_connections_off_the_main_thread)()
