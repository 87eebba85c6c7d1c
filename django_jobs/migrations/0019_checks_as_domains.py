"""PostgreSQL: the job table's CHECK constraints become domain types of its columns.

PostgreSQL 15 reads every CHECK constraint of a table back from its stored text and plans it
again for each INSERT and UPDATE statement; a domain's constraints are read once per
connection. The job table's seven checks cost a one-job enqueue 20-30 us of the server's CPU,
a tenth of it (docs/benchmarks.md, "The hot path, lever by lever"). As domains they refuse the same
values, with the same error (a check violation, Django's IntegrityError): ``state`` outside the
job states, ``priority`` outside -100..100, ``max_attempts`` below 1, a counter below 0.

Only the database changes, and only PostgreSQL's: the migration state keeps the model's fields
and its three named check constraints, which SQLite and MariaDB/MySQL keep as they are (they
compile a constraint once per prepared statement). A database built from the models without
migrations (``--nomigrations``) gets the table CHECKs, which check the same values.

A later migration that alters one of these six columns on PostgreSQL must keep its domain
(Django would make it a plain column again) or replace it; tests/contract/test_checks_as_domains.py
fails when a column of the job table has a table CHECK or lost its domain. Changing the types
reads the table once to check the stored values; no row is rewritten and the indexes keep their
storage. The table is locked meanwhile: migrate with the workers stopped, or expect enqueues to
wait for it.
"""

from django.db import migrations

TABLE = "django_jobs_job"
#: The domains as this migration made them; a change of states or ranges is a later migration.
DOMAINS = {
    "django_jobs_state": (
        "varchar(20) CHECK (VALUE IN "
        "('waiting', 'delayed', 'active', 'completed', 'failed', 'waiting-children', 'cancelled'))"
    ),
    "django_jobs_priority": "smallint CHECK (VALUE BETWEEN -100 AND 100)",
    "django_jobs_max_attempts": "integer CHECK (VALUE >= 1)",
    "django_jobs_count": "integer CHECK (VALUE >= 0)",
}
#: column -> (its domain, the type it had)
COLUMNS = {
    "state": ("django_jobs_state", "varchar(20)"),
    "priority": ("django_jobs_priority", "smallint"),
    "max_attempts": ("django_jobs_max_attempts", "integer"),
    "attempts": ("django_jobs_count", "integer"),
    "stalled_count": ("django_jobs_count", "integer"),
    "pending_children": ("django_jobs_count", "integer"),
}
#: The table CHECKs the backwards migration puts back: Django's names and conditions.
CHECKS = {
    "django_jobs_job_attempts_check": "attempts >= 0",
    "django_jobs_job_max_attempts_check": "max_attempts >= 0",
    "django_jobs_job_pending_children_check": "pending_children >= 0",
    "django_jobs_job_stalled_count_check": "stalled_count >= 0",
    "django_jobs_priority_range": "priority >= -100 AND priority <= 100",
    "django_jobs_max_attempts_min": "max_attempts >= 1",
    "django_jobs_state_valid": (
        "state IN ('waiting', 'delayed', 'active', 'completed', 'failed', 'waiting-children', 'cancelled')"
    ),
}


def to_domains(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    for name, definition in DOMAINS.items():
        schema_editor.execute(f"CREATE DOMAIN {name} AS {definition}")
    with schema_editor.connection.cursor() as cursor:
        # Every CHECK of the table, whatever an older Django named the columns' own.
        cursor.execute(
            "SELECT conname FROM pg_constraint WHERE conrelid = %s::regclass AND contype = 'c' ORDER BY conname",
            [TABLE],
        )
        checks = [name for (name,) in cursor.fetchall()]
    quote = schema_editor.quote_name
    changes = [f"DROP CONSTRAINT {quote(name)}" for name in checks]
    changes += [f"ALTER COLUMN {column} TYPE {domain}" for column, (domain, _) in COLUMNS.items()]
    schema_editor.execute(f"ALTER TABLE {TABLE} {', '.join(changes)}")  # one statement: one read of the table


def to_checks(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    changes = [f"ALTER COLUMN {column} TYPE {base}" for column, (_, base) in COLUMNS.items()]
    changes += [f"ADD CONSTRAINT {name} CHECK ({condition})" for name, condition in CHECKS.items()]
    schema_editor.execute(f"ALTER TABLE {TABLE} {', '.join(changes)}")
    for name in DOMAINS:
        schema_editor.execute(f"DROP DOMAIN {name}")


class Migration(migrations.Migration):
    dependencies = [
        ("django_jobs", "0018_unfinished_parts"),
    ]

    operations = [
        migrations.RunPython(to_domains, to_checks, elidable=False),
    ]
