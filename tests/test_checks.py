"""System checks: stable ids, a hint on every message, and a clean bill for a valid set-up."""

from __future__ import annotations

import pytest
from django.conf import settings
from django.core import checks
from django.db import connection
from django.tasks import task_backends
from django.test import override_settings

from django_jobs.backend import JobsBackend
from django_jobs.checks import check_backend, check_database_version, check_worker_processes, mysql_version_problem

BACKEND = "django_jobs.backend.JobsBackend"


def ids(messages) -> list[str]:
    return [m.id for m in messages]


def backend(alias: str = "default", queues: list | None = None, options: dict | None = None) -> JobsBackend:
    return JobsBackend(alias, {"BACKEND": BACKEND, "QUEUES": queues or [], "OPTIONS": options or {}})


def assert_hinted(messages) -> None:
    for message in messages:
        assert message.hint, f"{message.id} has no hint"
        assert message.id.startswith("django_jobs."), message.id


@pytest.mark.django_db
def test_valid_configuration_has_no_django_jobs_messages():
    messages = checks.run_checks(databases=["default"])
    assert [m for m in messages if (m.id or "").startswith("django_jobs.")] == []


def test_backends_in_tasks_are_checked_through_django():
    assert task_backends["default"].check() == []
    assert task_backends["limited"].check() == []


def test_app_missing_from_installed_apps_is_e001():
    without_app = [app for app in settings.INSTALLED_APPS if app != "django_jobs"]
    with override_settings(INSTALLED_APPS=without_app):
        messages = check_backend(backend())
    assert ids(messages) == ["django_jobs.E001"]
    assert "INSTALLED_APPS" in messages[0].msg
    assert_hinted(messages)


@pytest.mark.parametrize(
    ("overrides", "setting"),
    [
        ({"LEASE_SECONDS": 0}, "LEASE_SECONDS"),
        ({"LEASE_SECONDS": "30"}, "LEASE_SECONDS"),
        ({"MAX_ATTEMPTS": 0}, "MAX_ATTEMPTS"),
        ({"MAX_STALLED": -1}, "MAX_STALLED"),
        ({"MAX_PAYLOAD_BYTES": 0}, "MAX_PAYLOAD_BYTES"),
        ({"POLL_INTERVAL": 0}, "POLL_INTERVAL"),
        ({"SERVICE_BATCH_SIZE": 1.5}, "SERVICE_BATCH_SIZE"),
        ({"SIZE_LIMITS_REFRESH": -1}, "SIZE_LIMITS_REFRESH"),
        ({"SIZE_LIMITS_REFRESH": True}, "SIZE_LIMITS_REFRESH"),
        ({"SIZE_LIMITS_REFRESH": "1"}, "SIZE_LIMITS_REFRESH"),
        ({"SIZE_LIMITS_REFRESH": 3601}, "SIZE_LIMITS_REFRESH"),
        ({"SIZE_LIMITS_REFRESH": float("nan")}, "SIZE_LIMITS_REFRESH"),
        ({"BACKOFF": "linear"}, "BACKOFF"),
        ({"BACKOFF": [-1]}, "BACKOFF"),
    ],
)
def test_invalid_django_jobs_value_is_e002(overrides, setting):
    with override_settings(DJANGO_JOBS=overrides):
        messages = task_backends["default"].check()
    assert ids(messages) == ["django_jobs.E002"]
    assert setting in messages[0].msg
    assert_hinted(messages)


@pytest.mark.parametrize("refresh", [0, 0.25, 3600])
def test_size_limits_refresh_from_0_to_an_hour_is_valid(refresh):
    with override_settings(DJANGO_JOBS={"SIZE_LIMITS_REFRESH": refresh}):
        assert task_backends["default"].check() == []


def test_unknown_django_jobs_setting_is_e002_for_an_existing_backend():
    with override_settings(DJANGO_JOBS={"LEASE_SECOND": 30}):
        messages = task_backends["default"].check()
    assert ids(messages) == ["django_jobs.E002"]
    assert "LEASE_SECOND" in messages[0].msg
    assert_hinted(messages)


def test_unknown_django_jobs_setting_is_reported_not_raised_by_a_new_backend():
    with override_settings(DJANGO_JOBS={"LEASE_SECOND": 30}):
        messages = backend("fresh").check()
    assert ids(messages) == ["django_jobs.E002"]


def test_invalid_backend_option_is_e002():
    tasks_setting = {**settings.TASKS, "bad": {"BACKEND": BACKEND, "QUEUES": [], "OPTIONS": {"MAX_ATTEMPTS": 0}}}
    with override_settings(TASKS=tasks_setting):
        messages = backend("bad", options={"MAX_ATTEMPTS": 0}).check()
    assert ids(messages) == ["django_jobs.E002"]
    assert "TASKS['bad']" in messages[0].msg and "MAX_ATTEMPTS" in messages[0].msg
    assert_hinted(messages)


def test_unknown_backend_option_is_e002():
    tasks_setting = {**settings.TASKS, "typo": {"BACKEND": BACKEND, "QUEUES": [], "OPTIONS": {"MAX_ATTEMPT": 3}}}
    with override_settings(TASKS=tasks_setting):
        messages = backend("typo", options={"MAX_ATTEMPT": 3}).check()
    assert ids(messages) == ["django_jobs.E002"]


def test_database_alias_missing_from_databases_is_e003():
    with override_settings(DJANGO_JOBS={"DATABASE": "elsewhere"}):
        messages = task_backends["default"].check()
    assert ids(messages) == ["django_jobs.E003"]
    assert "'elsewhere'" in messages[0].msg
    assert_hinted(messages)


@pytest.mark.filterwarnings("ignore:Overriding setting DATABASES")
def test_unsupported_database_engine_is_e003():
    databases = {**settings.DATABASES, "legacy": {"ENGINE": "django.db.backends.oracle", "NAME": "x"}}
    with override_settings(DATABASES=databases, DJANGO_JOBS={"DATABASE": "legacy"}):
        messages = task_backends["default"].check()
    assert ids(messages) == ["django_jobs.E003"]
    assert "oracle" in messages[0].msg
    assert_hinted(messages)


@pytest.mark.django_db
def test_supported_database_version_has_no_e004():
    assert check_database_version(databases=["default"]) == []


@pytest.mark.filterwarnings("ignore:Overriding setting DATABASES")
@pytest.mark.parametrize(
    "engine", ["django.db.backends.mysql", "django.contrib.gis.db.backends.mysql", "django.db.backends.postgresql"]
)
def test_mysql_and_mariadb_are_supported_vendors(engine):
    # Told by the engine's name: neither connects nor needs the driver (MySQLdb) installed.
    databases = {**settings.DATABASES, "other": {"ENGINE": engine, "NAME": "x"}}
    with override_settings(DATABASES=databases, DJANGO_JOBS={"DATABASE": "other"}):
        assert task_backends["default"].check() == []


@pytest.mark.parametrize(
    ("version", "mariadb", "too_old"),
    [
        ((8, 0, 0), False, True),
        ((5, 7, 44), False, True),
        ((8, 0, 1), False, False),
        ((8, 4, 3), False, False),
        ((9, 1, 0), False, False),
        ((10, 5, 27), True, True),
        ((10, 6, 0), True, False),
        ((10, 11, 19), True, False),
        ((11, 4, 2), True, False),
        # A MariaDB version is never read as a MySQL one, nor the reverse.
        ((10, 5, 27), False, False),
        ((8, 4, 3), True, True),
    ],
)
def test_mysql_and_mariadb_without_skip_locked_are_e008(version, mariadb, too_old):
    problem = mysql_version_problem(version, mariadb)
    if not too_old:
        assert problem is None
        return
    name, needed = ("MariaDB", "10.6") if mariadb else ("MySQL", "8.0.1")
    assert problem == (
        f"{name} {'.'.join(map(str, version))}; django-jobs needs {name} {needed} or newer "
        "(SELECT ... FOR UPDATE SKIP LOCKED)."
    )


def test_several_worker_processes_on_sqlite_is_e005():
    messages = check_worker_processes("default", 2)
    if connection.vendor == "sqlite":
        assert ids(messages) == ["django_jobs.E005"]
        assert "--processes 2" in messages[0].msg
        assert_hinted(messages)
    else:
        assert messages == []


def test_one_worker_process_is_fine_on_every_database():
    assert check_worker_processes("default", 1) == []


def test_invalid_queue_names_in_queues_are_w001():
    messages = backend(queues=["default", "has space", "", "x" * 101]).check()
    assert ids(messages) == ["django_jobs.W001"] * 3
    assert all(isinstance(m, checks.Warning) for m in messages)
    for name in ("'has space'", "''", f"'{'x' * 101}'"):
        assert any(f"queue name {name} in QUEUES" in m.msg for m in messages), name
    assert_hinted(messages)


def test_non_string_queue_name_among_valid_ones_is_w001():
    messages = backend(queues=["default", 5]).check()
    assert ids(messages) == ["django_jobs.W001"]


def test_every_problem_is_reported_at_once():
    with override_settings(DJANGO_JOBS={"LEASE_SECONDS": 0, "MAX_STALLED": -1, "DATABASE": "elsewhere"}):
        messages = backend(queues=["bad name"]).check()
    assert sorted(ids(messages)) == ["django_jobs.E002", "django_jobs.E002", "django_jobs.E003", "django_jobs.W001"]
    assert_hinted(messages)


@pytest.mark.parametrize("key", ["NOTIFY_CHANNEL", "SQLITE_WAL", "SQLITE_BUSY_TIMEOUT_MS"])
def test_process_wide_setting_in_backend_options_is_e002(key):
    value = {"NOTIFY_CHANNEL": "other", "SQLITE_WAL": False, "SQLITE_BUSY_TIMEOUT_MS": 10}[key]
    tasks_setting = {"default": {"BACKEND": BACKEND, "QUEUES": [], "OPTIONS": {key: value}}}
    with override_settings(TASKS=tasks_setting):
        messages = task_backends["default"].check()
    assert ids(messages) == ["django_jobs.E002"]
    assert "DJANGO_JOBS" in messages[0].hint


def test_invalid_notify_channel_is_e002():
    with override_settings(DJANGO_JOBS={"NOTIFY_CHANNEL": "Bad-Channel"}):
        messages = task_backends["default"].check()
    assert ids(messages) == ["django_jobs.E002"]
    assert "NOTIFY_CHANNEL" in messages[0].msg
