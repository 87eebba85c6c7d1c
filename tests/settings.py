"""Test settings. JOBS_TEST_DB=sqlite (default), postgres or mysql (MariaDB/MySQL) picks the database.

Subprocess workers started by the tests set JOBS_TEST_DB_NAME to the test database pytest-django
created, so they work on the same rows.
"""

import os
import tempfile
from pathlib import Path

SECRET_KEY = "tests"
USE_TZ = True
TIME_ZONE = "UTC"
INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rangefilter",
    "django_jobs",
    "tests",
]
if os.environ.get("JOBS_TEST_BUS"):
    # Worker processes of tests/test_bus_worker.py: the subscribers they run (tests/bus).
    INSTALLED_APPS.append("tests.bus")
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
ROOT_URLCONF = "tests.urls"
STATIC_URL = "static/"
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

VENDOR = os.environ.get("JOBS_TEST_DB", "sqlite")
SUBPROCESS_DB_NAME = os.environ.get("JOBS_TEST_DB_NAME")

if VENDOR == "postgres":
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": SUBPROCESS_DB_NAME or os.environ.get("PGDATABASE", "test"),
            "USER": os.environ.get("PGUSER", "postgres"),
            "HOST": os.environ.get("PGHOST", "127.0.0.1"),
            "PORT": os.environ.get("PGPORT", "5432"),
            "PASSWORD": os.environ.get("PGPASSWORD", ""),
            "TEST": {"NAME": os.environ.get("JOBS_TEST_PG_NAME", "test_django_jobs")},
        }
    }
    if os.environ.get("JOBS_TEST_SSLMODE"):
        # A subprocess connecting through tests/faultproxy.py, which must read the protocol in clear.
        DATABASES["default"]["OPTIONS"] = {"sslmode": os.environ["JOBS_TEST_SSLMODE"]}
elif VENDOR == "sqlite":
    # A file, not :memory:, so worker threads and subprocess workers share it.
    _dir = Path(os.environ.get("JOBS_TEST_SQLITE_DIR", tempfile.gettempdir()))
    _name = SUBPROCESS_DB_NAME or str(_dir / f"django_jobs_test_{os.getpid()}.sqlite3")
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": _name,
            "TEST": {"NAME": _name},
            "OPTIONS": {"transaction_mode": "IMMEDIATE"},
        }
    }
elif VENDOR == "mysql":
    # MariaDB >= 10.6 or MySQL >= 8.0.1; the same variables as scripts/ensure_mariadb.sh.
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.mysql",
            "NAME": SUBPROCESS_DB_NAME or os.environ.get("MYSQL_DATABASE", "test"),
            "USER": os.environ.get("MYSQL_USER", "root"),
            "HOST": os.environ.get("MYSQL_HOST", "127.0.0.1"),
            "PORT": os.environ.get("MYSQL_TCP_PORT", "3306"),
            "PASSWORD": os.environ.get("MYSQL_PWD", ""),
            "OPTIONS": {
                "charset": "utf8mb4",
                # READ COMMITTED, not InnoDB's default REPEATABLE READ. Under REPEATABLE READ the
                # claims (SELECT ... FOR UPDATE SKIP LOCKED) and guarded updates (UPDATE ... WHERE
                # state = 'active' AND lease_token = ...) take next-key (gap) locks on every index
                # range they scan, which concurrent inserts and claims then wait on: deadlocks. And
                # its plain SELECTs read the transaction's first snapshot while its UPDATEs read the
                # latest committed rows. READ COMMITTED locks only the rows it matches and reads
                # what was committed, as on PostgreSQL. (Django's default too: spelled out so
                # that it stays.)
                "isolation_level": "read committed",
            },
            "TEST": {
                "NAME": os.environ.get("JOBS_TEST_MY_NAME", "test_django_jobs"),
                "CHARSET": "utf8mb4",
            },
        }
    }
else:
    raise RuntimeError(f"JOBS_TEST_DB must be sqlite, postgres or mysql, not {VENDOR!r}")

TASKS = {
    "default": {"BACKEND": "django_jobs.backend.JobsBackend", "QUEUES": [], "OPTIONS": {}},
    "limited": {
        "BACKEND": "django_jobs.backend.JobsBackend",
        "QUEUES": ["default", "emails"],
        "OPTIONS": {"MAX_PAYLOAD_BYTES": 1024, "MAX_ATTEMPTS": 2},
    },
}
DJANGO_JOBS = {
    # Short intervals keep the fault tests quick; tests that need other values override them.
    "LEASE_SECONDS": float(os.environ.get("JOBS_TEST_LEASE", "30")),
    "POLL_INTERVAL": 0.2,
    # Also the PartitionSweeper's interval: a test that a partition moves on without it sets it long.
    "PROMOTE_INTERVAL": float(os.environ.get("JOBS_TEST_PROMOTE_INTERVAL", "0.2")),
    "RESCUE_INTERVAL": 0.5,
    # Worker processes of the async mode's tests run with and without a middleware.
    "MIDDLEWARE": [m for m in os.environ.get("JOBS_TEST_MIDDLEWARE", "").split(",") if m],
    # A project that declares encrypt=True tasks configures a key (check W003 warns otherwise); the
    # encryption tests set their own with override_settings. Made by Fernet.generate_key(), for tests only.
    "ENCRYPTION_KEYS": ["JUNcOqmtPu5UZ1j3PYmBcvwE4Tot6Rsm9kIaL6CcPO0="],
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": "WARNING"},
}
# A worker subprocess as a project without logging configuration runs it (runworker's own handler).
if os.environ.get("JOBS_TEST_NO_LOGGING") == "1":
    LOGGING = {"version": 1, "disable_existing_loggers": False}
# Subprocess workers of the encryption tests get the test's keys through the environment.
if os.environ.get("JOBS_TEST_ENCRYPTION_KEYS"):
    DJANGO_JOBS["ENCRYPTION_KEYS"] = os.environ["JOBS_TEST_ENCRYPTION_KEYS"].split(",")
