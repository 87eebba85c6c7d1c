"""Settings for ``benchmarks/console.py``: ``benchmarks.settings`` (its own PostgreSQL database,
``JOBS_BENCH_DB``) plus the admin, so the test client can load the console's pages, and the
pruner's settings from the environment, so the worker subprocesses of ``--pruner`` use a short
retention:

- ``JOBS_BENCH_RETENTION``: seconds completed and failed jobs are kept (``DJANGO_JOBS["RETENTION"]``);
- ``JOBS_BENCH_PRUNE_INTERVAL``: seconds between the pruner's runs (``PRUNE_INTERVAL``).
"""

import os

from benchmarks.settings import *  # noqa: F403 - the benchmark's database and TASKS
from benchmarks.settings import DJANGO_JOBS

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "rangefilter",
    "django_jobs",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
# The admin at /admin/, as a project mounts it.
ROOT_URLCONF = "tests.urls"
ALLOWED_HOSTS = ["testserver", "localhost"]
STATIC_URL = "/static/"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]
DJANGO_JOBS = dict(DJANGO_JOBS)
if os.environ.get("JOBS_BENCH_RETENTION"):
    _age = float(os.environ["JOBS_BENCH_RETENTION"])
    DJANGO_JOBS["RETENTION"] = {"completed": _age, "failed": _age}
if os.environ.get("JOBS_BENCH_PRUNE_INTERVAL"):
    DJANGO_JOBS["PRUNE_INTERVAL"] = float(os.environ["JOBS_BENCH_PRUNE_INTERVAL"])
