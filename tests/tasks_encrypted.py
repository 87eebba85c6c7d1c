"""Tasks of the encryption tests (module level, so subprocess workers import them too)."""

import json

from django.tasks import task

from django_jobs import Dedup
from tests.tasks import record


@task(encrypt=True)
def echo(*args, **kwargs):
    return {"args": list(args), "kwargs": kwargs}


@task(encrypt=True, max_attempts=2, backoff=0)
def leaks(secret):
    """Fails with the secret in its message (and so in its traceback)."""
    raise ValueError(f"refused secret {secret}")


@task(encrypt=True)
def recorded(path, secret):
    """What the worker called it with, written to the probe file."""
    record(path, secret=secret)
    return f"done {secret}"


@task(encrypt=True, dedup=Dedup(lambda args, kwargs: f"user:{args[0]}"))
def deduplicated(user_id, secret):
    return secret


@task
def plain(value):
    return value


@task(encrypt=True, dedup=Dedup("encrypted-stash", keep_last_if_active=True))
def kept_last(secret):
    return secret


@task(takes_context=True)
def gather(context):
    """A plain flow parent: whether its encrypted children's values reached it decrypted."""
    return [json.dumps(v) for v in context.children_results().values()] == [
        json.dumps({"args": ["hunter2-secret"], "kwargs": {}})
    ]
