"""System checks. Ids are stable; each is listed in docs/reference/checks.md.

E001 django_jobs missing from INSTALLED_APPS      E002 invalid DJANGO_JOBS / OPTIONS
E003 DATABASE alias unknown or vendor unsupported E004 database too old
E005 SQLite with more than one worker process     E006 MIDDLEWARE entry that does not import
E007 invalid SCHEDULES declaration                E008 MySQL/MariaDB without SKIP LOCKED
E009 invalid ENCRYPTION_KEYS, or no cryptography W003 an encrypt=True task or topic without ENCRYPTION_KEYS
W001 invalid name in QUEUES                      W002 admin without rangefilter

E001 itself is :func:`django_jobs.backend.check_app_installed`: this module imports the drivers,
and so the models, which cannot load without the app; ``JobsBackend.check`` runs E001 first and
imports this module only once it passes.
"""

from __future__ import annotations

from typing import Any

from django.apps import apps
from django.conf import settings
from django.core import checks
from django.db import connections
from django.utils.module_loading import import_string

from .backend import check_app_installed
from .conf import GLOBAL_ONLY, SETTING_NAMES, get_settings
from .db import jobs_database_aliases
from .drivers import DRIVERS
from .drivers.mysql import MIN_MARIADB, MIN_MYSQL
from .drivers.postgresql import MIN_VERSION as MIN_POSTGRESQL
from .drivers.sqlite import MIN_VERSION as MIN_SQLITE
from .drivers.sqlite import version as sqlite_version
from .exceptions import InvalidSchedule, JobsConfigurationError, JobsError
from .spec.encryption import key_problems, require_keys
from .spec.queues import QUEUE_NAME_RE
from .spec.schedules import declaration_fields, declared_schedules
from .spec.settings import settings_problems
from .spec.tasks import declared_tasks
from .spec.topics import validate_topic_declarations

SUPPORTED_VENDORS = tuple(DRIVERS)


def check_backend(backend: Any) -> list[checks.CheckMessage]:
    """Checks for one JobsBackend (called through Django's tasks check)."""
    errors = check_app_installed(backend.alias)  # E001, which JobsBackend.check runs first on its own
    where = f"TASKS[{backend.alias!r}]"
    option_keys = set(settings.TASKS.get(backend.alias, {}).get("OPTIONS") or {})
    unknown = sorted(option_keys - SETTING_NAMES)
    for key in sorted(option_keys & GLOBAL_ONLY):
        errors.append(
            checks.Error(
                f"{where}: OPTIONS[{key!r}] concerns every backend of the process and is ignored here.",
                hint=f"Set {key} in DJANGO_JOBS instead.",
                id="django_jobs.E002",
            )
        )
    if unknown:
        errors.append(
            checks.Error(
                f"{where}: unknown OPTIONS key(s) {unknown}.",
                hint=f"Allowed keys: {sorted(SETTING_NAMES)}; see docs/reference/settings.md.",
                id="django_jobs.E002",
            )
        )
    try:
        conf = get_settings(backend.alias)
    except (JobsConfigurationError, TypeError) as exc:
        errors.append(checks.Error(f"{where}: {exc}", hint="See docs/reference/settings.md.", id="django_jobs.E002"))
        return errors
    for problem in settings_problems(conf):
        errors.append(
            checks.Error(f"{where}: {problem}", hint="See docs/reference/settings.md.", id="django_jobs.E002")
        )
    if conf.DATABASE not in settings.DATABASES:
        errors.append(
            checks.Error(
                f"{where}: DATABASE {conf.DATABASE!r} is not in DATABASES.",
                hint=f"Use one of {sorted(settings.DATABASES)} in OPTIONS['DATABASE'] or DJANGO_JOBS['DATABASE'].",
                id="django_jobs.E003",
            )
        )
    else:
        engine = settings.DATABASES[conf.DATABASE].get("ENGINE", "")
        if _vendor_of(conf.DATABASE, engine) not in SUPPORTED_VENDORS:
            errors.append(
                checks.Error(
                    f"{where}: database {conf.DATABASE!r} uses {engine!r}, which django-jobs does not support.",
                    hint="Use PostgreSQL or MariaDB/MySQL (production), or SQLite (development).",
                    id="django_jobs.E003",
                )
            )
    if isinstance(conf.MIDDLEWARE, (list, tuple)):
        for path in conf.MIDDLEWARE:
            if not isinstance(path, str):
                continue  # reported by E002
            try:
                factory = import_string(path)
            except ImportError as exc:
                errors.append(
                    checks.Error(
                        f"{where}: MIDDLEWARE entry {path!r} does not import ({exc}).",
                        hint="Give the dotted path of a middleware factory; see docs/howto/middleware.md.",
                        id="django_jobs.E006",
                    )
                )
                continue
            if not callable(factory):
                errors.append(
                    checks.Error(
                        f"{where}: MIDDLEWARE entry {path!r} is not callable.",
                        hint="A middleware is a factory: factory(call_next) -> handler(context).",
                        id="django_jobs.E006",
                    )
                )
    if isinstance(conf.SCHEDULES, dict):
        declared = declared_schedules(backend.alias)
        for name, declaration in (declared if isinstance(declared, dict) else {}).items():
            try:
                declaration_fields(name, declaration)
            except InvalidSchedule as exc:
                errors.append(
                    checks.Error(
                        f"{where}: {exc}",
                        hint="Fix the declaration in SCHEDULES; see docs/howto/schedules.md.",
                        id="django_jobs.E007",
                    )
                )
    for name in sorted(backend.queues, key=repr):
        if not isinstance(name, str) or not QUEUE_NAME_RE.match(name):
            errors.append(
                checks.Warning(
                    f"{where}: queue name {name!r} in QUEUES is not valid; tasks cannot use it.",
                    hint="Queue names are 1-100 characters of letters, digits, '_', '-', '.' and ':'.",
                    id="django_jobs.W001",
                )
            )
    if apps.is_installed("django.contrib.admin") and not apps.is_installed("rangefilter"):
        errors.append(
            checks.Warning(
                f"{where}: 'rangefilter' is not in INSTALLED_APPS, so the jobs admin has no date-range filters.",
                hint="Add 'rangefilter' (django-admin-rangefilter, installed with django-jobs) to INSTALLED_APPS.",
                id="django_jobs.W002",
            )
        )
    return errors


def _vendor_of(alias: str, engine: str) -> str:
    """The vendor of a database without connecting (PostGIS counts as PostgreSQL, SpatiaLite as
    SQLite, Django's MySQL GIS backend as MySQL). Known engines are told by name, so a missing
    driver (MySQLdb, psycopg) is not imported here."""
    if "postgresql" in engine or "postgis" in engine:
        return "postgresql"
    if "sqlite" in engine or "spatialite" in engine:
        return "sqlite"
    if "mysql" in engine:
        return "mysql"
    try:  # a custom backend: ask its wrapper (imports the driver, does not connect)
        return connections[alias].vendor
    except Exception:  # noqa: BLE001 - driver missing or alias unknown: unsupported either way
        return engine


@checks.register()
def check_encryption(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """E009: ``ENCRYPTION_KEYS`` is not a list of Fernet keys, or cryptography is missing; W003:
    a declared ``encrypt=True`` task, or a topic declared with ``encrypt`` in ``TOPICS``, and no
    key (its enqueue or publish would raise EncryptionKeysMissing)."""
    try:
        conf = get_settings()
        keys = conf.ENCRYPTION_KEYS
    except (JobsConfigurationError, TypeError):
        return []  # a malformed DJANGO_JOBS: E002 says so
    hint = "Generate a key with Fernet.generate_key(); see docs/howto/encryption.md."
    if keys:
        problems = key_problems(keys)
        if problems:
            return [checks.Error(p, hint=hint, id="django_jobs.E009") for p in problems]
        try:
            require_keys()
        except JobsConfigurationError as exc:  # CryptographyMissing
            return [
                checks.Error(
                    f"ENCRYPTION_KEYS is set but cannot be used: {exc}",
                    hint='pip install "django-db-jobs[encryption]"',
                    id="django_jobs.E009",
                )
            ]
        return []
    warnings: list[checks.CheckMessage] = []
    encrypted = sorted(t.module_path for t in declared_tasks() if getattr(t, "encrypt", False))
    if encrypted:
        warnings.append(
            checks.Warning(
                f"Task(s) {', '.join(encrypted)} have encrypt=True but DJANGO_JOBS['ENCRYPTION_KEYS'] is empty: "
                "enqueueing them raises EncryptionKeysMissing.",
                hint=hint,
                id="django_jobs.W003",
            )
        )
    topics = _encrypted_topics(conf.TOPICS)
    if topics:
        warnings.append(
            checks.Warning(
                f"Topic(s) {', '.join(topics)} have encrypt=True in DJANGO_JOBS['TOPICS'] but "
                "DJANGO_JOBS['ENCRYPTION_KEYS'] is empty: publishing to them raises EncryptionKeysMissing.",
                hint=hint,
                id="django_jobs.W003",
            )
        )
    return warnings


def _encrypted_topics(declared: Any) -> list[str]:
    """The topics ``TOPICS`` declares with ``encrypt=True`` (none when it is invalid: E002 says so)."""
    try:
        columns = validate_topic_declarations(declared or {})
    except JobsError:
        return []
    return sorted(name for name, values in columns.items() if values.get("encrypt"))


@checks.register(checks.Tags.database)
def check_database_version(app_configs: Any = None, databases: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """E004, E008: the jobs database is too old for the SQL the engine uses (runs with --database)."""
    errors: list[checks.CheckMessage] = []
    for alias in sorted(jobs_database_aliases() & set(databases or ())):
        if alias not in connections:
            continue
        conn = connections[alias]
        if conn.vendor == "postgresql":
            conn.ensure_connection()
            major = conn.pg_version // 10000
            if major < MIN_POSTGRESQL:
                errors.append(
                    checks.Error(
                        f"Database {alias!r} is PostgreSQL {major}; django-jobs needs {MIN_POSTGRESQL} or newer.",
                        hint="Upgrade PostgreSQL.",
                        id="django_jobs.E004",
                    )
                )
        elif conn.vendor == "sqlite" and sqlite_version() < MIN_SQLITE:
            errors.append(
                checks.Error(
                    f"SQLite {'.'.join(map(str, sqlite_version()))} is too old; django-jobs needs "
                    f"{'.'.join(map(str, MIN_SQLITE))} or newer (UPDATE ... RETURNING).",
                    hint="Use a Python built against a newer SQLite, or PostgreSQL.",
                    id="django_jobs.E004",
                )
            )
        elif conn.vendor == "mysql":
            conn.ensure_connection()
            problem = mysql_version_problem(conn.mysql_version, conn.mysql_is_mariadb)
            if problem:
                errors.append(
                    checks.Error(
                        f"Database {alias!r} is {problem}",
                        hint=f"Upgrade to MariaDB {_dotted(MIN_MARIADB)} or MySQL {_dotted(MIN_MYSQL)} or newer.",
                        id="django_jobs.E008",
                    )
                )
    return errors


def _dotted(version: tuple[int, ...]) -> str:
    return ".".join(map(str, version))


def mysql_version_problem(version: tuple[int, ...], mariadb: bool) -> str | None:
    """Why a MySQL or MariaDB server of ``version`` cannot run django-jobs, or None if it can.

    Workers claim jobs with ``SELECT ... FOR UPDATE SKIP LOCKED``, which MySQL has since 8.0.1
    and MariaDB since 10.6. (``version`` as Django's ``connection.mysql_version``.)"""
    name, minimum = ("MariaDB", MIN_MARIADB) if mariadb else ("MySQL", MIN_MYSQL)
    if tuple(version) >= minimum:
        return None
    return (
        f"{name} {_dotted(version)}; django-jobs needs {name} {_dotted(minimum)} or newer "
        "(SELECT ... FOR UPDATE SKIP LOCKED)."
    )


def check_worker_processes(alias: str, processes: int) -> list[checks.CheckMessage]:
    """E005: SQLite serialises writers on one file; several worker processes only contend."""
    if processes > 1 and connections[alias].vendor == "sqlite":
        return [
            checks.Error(
                f"runworker --processes {processes} on SQLite database {alias!r}.",
                hint="Run one process with more threads (-p 1 -c 8), or use PostgreSQL or MariaDB/MySQL for several "
                "processes.",
                id="django_jobs.E005",
            )
        ]
    return []
