"""Settings for the benchmark: its own PostgreSQL database (``jobs_bench`` by default), a
SQLite file with ``JOBS_BENCH_VENDOR=sqlite`` (the enqueue_many measurement uses both), or a
MariaDB/MySQL database with ``JOBS_BENCH_VENDOR=mysql`` (``benchmarks/mysql_figures.py``).

``PGHOST``/``PGPORT``/``PGUSER``/``PGPASSWORD`` pick the PostgreSQL server,
``MYSQL_HOST``/``MYSQL_TCP_PORT``/``MYSQL_USER``/``MYSQL_PWD`` the MariaDB/MySQL one (as
``scripts/ensure_mariadb.sh`` and ``tests/settings.py``), ``JOBS_BENCH_DB`` the database.
Worker subprocesses started by ``benchmarks/throughput.py`` and ``benchmarks/limits.py`` use this
module too.
"""

import os

SECRET_KEY = "benchmarks-only"
USE_TZ = True
TIME_ZONE = "UTC"
INSTALLED_APPS = ["django_jobs"]
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": os.environ.get("JOBS_BENCH_DB", "jobs_bench"),
        "USER": os.environ.get("PGUSER", "postgres"),
        "HOST": os.environ.get("PGHOST", "127.0.0.1"),
        "PORT": os.environ.get("PGPORT", "5432"),
        "PASSWORD": os.environ.get("PGPASSWORD", ""),
    }
}
TASKS = {"default": {"BACKEND": "django_jobs.backend.JobsBackend", "QUEUES": [], "OPTIONS": {}}}
DJANGO_JOBS = {"MAX_ATTEMPTS": 1}
# benchmarks/limits.py shortens the lease (and the rescuer's interval) for its SIGKILL run.
for _name in ("LEASE_SECONDS", "RESCUE_INTERVAL"):
    if os.environ.get(f"JOBS_BENCH_{_name}"):
        DJANGO_JOBS[_name] = float(os.environ[f"JOBS_BENCH_{_name}"])
# JOBS_BENCH_EVENTS=0: the same run without the event log (the A/B of its cost).
if os.environ.get("JOBS_BENCH_EVENTS") == "0":
    DJANGO_JOBS["EVENTS"] = False
# JOBS_BENCH_PREPARED=0: the same run with the hot statements unprepared (the A/B of preparing).
if os.environ.get("JOBS_BENCH_PREPARED") == "0":
    DJANGO_JOBS["PREPARED_STATEMENTS"] = False
# JOBS_BENCH_STRIPPED=1: the features' probes taken out of a plain job's path (benchmarks/stripped.py).
if os.environ.get("JOBS_BENCH_STRIPPED") == "1":
    INSTALLED_APPS = [*INSTALLED_APPS, "benchmarks.stripped.Stripped"]
# JOBS_BENCH_BUS=1: the subscribers of benchmarks/bus.py (bus mode).
if os.environ.get("JOBS_BENCH_BUS") == "1":
    INSTALLED_APPS = [*INSTALLED_APPS, "benchmarks.bus_app"]
# JOBS_BENCH_BUS_CHAOS=1: the subscribers and the handlers' table of benchmarks/bus_chaos.py.
if os.environ.get("JOBS_BENCH_BUS_CHAOS") == "1":
    INSTALLED_APPS = [*INSTALLED_APPS, "benchmarks.bus_chaos_app.apps.BusChaosConfig"]
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

if os.environ.get("JOBS_BENCH_VENDOR") == "sqlite":
    # The enqueue_many measurement also runs on SQLite: a file made for the run (JOBS_BENCH_SQLITE).
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": os.environ["JOBS_BENCH_SQLITE"],
            "OPTIONS": {"transaction_mode": "IMMEDIATE"},
        }
    }
elif os.environ.get("JOBS_BENCH_VENDOR") == "mysql":
    # As tests/settings.py: utf8mb4, and READ COMMITTED (row locks only; the reasons are there).
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.mysql",
            "NAME": os.environ.get("JOBS_BENCH_DB", "jobs_bench"),
            "USER": os.environ.get("MYSQL_USER", "root"),
            "HOST": os.environ.get("MYSQL_HOST", "127.0.0.1"),
            "PORT": os.environ.get("MYSQL_TCP_PORT", "3306"),
            "PASSWORD": os.environ.get("MYSQL_PWD", ""),
            "OPTIONS": {"charset": "utf8mb4", "isolation_level": "read committed"},
        }
    }
    # No partial indexes there: Django says so on every command (docs/howto/mariadb-mysql.md).
    SILENCED_SYSTEM_CHECKS = ["models.W036", "models.W037"]
