"""Example project: SQLite by default (db.sqlite3 here); DATABASE_URL=postgres://... for PostgreSQL,
DATABASE_URL=mysql://... for MariaDB or MySQL."""

import os
from pathlib import Path
from urllib.parse import unquote, urlparse

BASE_DIR = Path(__file__).resolve().parent.parent
SECRET_KEY = os.environ.get("SECRET_KEY", "example-only-not-secret")
DEBUG = True
ALLOWED_HOSTS = ["*"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rangefilter",
    "django_jobs",
    "demo",
]
MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
ROOT_URLCONF = "example_project.urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
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
STATIC_URL = "static/"
USE_TZ = True
TIME_ZONE = "UTC"


def database_from_url(url: str) -> dict:
    """postgres://user:pass@host:port/name or mysql://user:pass@host:port/name (MariaDB or MySQL)."""
    parts = urlparse(url)
    if parts.scheme in ("postgres", "postgresql"):
        engine, default_name, options = "django.db.backends.postgresql", "postgres", {}
    elif parts.scheme in ("mysql", "mariadb"):
        # READ COMMITTED: claims (SKIP LOCKED) and guarded updates must not take REPEATABLE READ's
        # gap locks, which deadlock concurrent workers; see docs/howto/mariadb-mysql.md.
        engine, default_name = "django.db.backends.mysql", ""
        options = {"charset": "utf8mb4", "isolation_level": "read committed"}
    else:
        raise ValueError(f"DATABASE_URL must start with postgres:// or mysql://; got {parts.scheme!r}")
    name = unquote(parts.path.lstrip("/")) or default_name
    if not name:
        raise ValueError(f"DATABASE_URL must name the database, as in {parts.scheme}://user:pass@host:3306/name")
    return {
        "ENGINE": engine,
        "NAME": name,
        "USER": unquote(parts.username or ""),
        "PASSWORD": unquote(parts.password or ""),
        "HOST": parts.hostname or "",
        "PORT": str(parts.port or ""),
        "OPTIONS": options,
    }


if os.environ.get("DATABASE_URL"):
    DATABASES = {"default": database_from_url(os.environ["DATABASE_URL"])}
else:
    # django-jobs switches this file to WAL and sets a busy timeout itself.
    # IMMEDIATE transactions take the write lock up front, so a transaction that reads and then
    # writes waits its turn instead of failing with "database is locked".
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": BASE_DIR / "db.sqlite3",
            "OPTIONS": {"transaction_mode": "IMMEDIATE"},
        }
    }

TASKS = {
    "default": {
        "BACKEND": "django_jobs.backend.JobsBackend",
        "QUEUES": [],  # any queue
        "OPTIONS": {},
    }
}
DJANGO_JOBS = {"MAX_ATTEMPTS": 1}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"django_jobs": {"handlers": ["console"], "level": "WARNING"}},
}
