"""The layering seen from a fresh interpreter: what each layer may load, and check E001 without the app.

``lint-imports`` (make lint) checks the import graph; these tests check what the graph cannot say:
which modules an import really loads, and that the backend Django imports from ``TASKS`` stays
importable, and its checks answerable, when ``django_jobs`` is not an installed app.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

SETTINGS = """
import django
from django.conf import settings

settings.configure(
    INSTALLED_APPS=[{apps}],
    DATABASES={{"default": {{"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}}},
    TASKS={{"default": {{"BACKEND": "django_jobs.backend.JobsBackend", "QUEUES": [], "OPTIONS": {{}}}}}},
    USE_TZ=True,
)
"""


def run_python(code: str, *, apps: str = '"django_jobs"') -> dict:
    """Run ``code`` (after the settings above) in a new interpreter; it prints one JSON object."""
    script = SETTINGS.format(apps=apps) + textwrap.dedent(code)
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_spec_loads_before_django_is_set_up_and_imports_no_model_driver_or_engine():
    loaded = run_python(
        """
        import json, sys
        import django_jobs.spec.options, django_jobs.spec.payload, django_jobs.spec.schedules
        import django_jobs.spec.settings, django_jobs.spec.tasks
        from django_jobs import Dedup
        print(json.dumps(sorted(m for m in sys.modules if m.startswith("django_jobs."))))
        """
    )
    below_spec = {"django_jobs.conf", "django_jobs.exceptions", "django_jobs.states", "django_jobs.uuid7"}
    assert {m for m in loaded if not m.startswith("django_jobs.spec")} <= below_spec


def test_engine_and_drivers_load_no_database_client():
    loaded = run_python(
        """
        import json, sys
        django.setup()
        import django_jobs.drivers, django_jobs.engine
        print(json.dumps({"psycopg": "psycopg" in sys.modules, "MySQLdb": "MySQLdb" in sys.modules}))
        """
    )
    assert loaded == {"psycopg": False, "MySQLdb": False}


def test_the_views_and_runworker_load_prometheus_client_only_when_metrics_are_used():
    loaded = run_python(
        """
        import json, sys
        django.setup()
        import django_jobs.prometheus, django_jobs.views, django_jobs.management.commands.runworker
        before = "prometheus_client" in sys.modules
        django_jobs.prometheus.prometheus_client()
        print(json.dumps([before, "prometheus_client" in sys.modules]))
        """
    )
    assert loaded == [False, True]


def test_croniter_and_sqlite3_load_only_when_used():
    """A project without cron schedules holds no croniter (and dateutil) in its processes, and
    one on another database no sqlite3: 3.5 MiB of every worker's memory."""
    loaded = run_python(
        """
        import json, sys
        django.setup()
        import django_jobs.drivers, django_jobs.engine, django_jobs.schedules, django_jobs.worker
        import django_jobs.management.commands.runworker
        before = [m for m in ("croniter", "dateutil", "sqlite3") if m in sys.modules]
        from django_jobs.drivers.sqlite import version
        from django_jobs.spec.schedules import validate_spec
        version()
        validate_spec(cron="*/5 * * * *", every=None)
        print(json.dumps([before, [m for m in ("croniter", "sqlite3") if m in sys.modules]]))
        """
    )
    assert loaded == [[], ["croniter", "sqlite3"]]


def test_the_backend_reports_e001_when_the_app_is_not_installed():
    """Django imports the backend from TASKS and runs its checks whether or not django_jobs is an
    installed app; without it the models cannot load, so neither may need them to say so."""
    found = run_python(
        """
        import json
        django.setup()
        from django.core import checks
        from django.tasks import task_backends

        messages = list(task_backends["default"].check())
        print(json.dumps([m.id for m in messages] + [m.id for m in checks.run_checks() if m.id == "django_jobs.E001"]))
        """,
        apps='"django.contrib.contenttypes", "django.contrib.auth"',
    )
    assert found == ["django_jobs.E001", "django_jobs.E001"]
