"""MySQL/MariaDB only: the string columns that name something (queues, keys, task paths, worker
ids...) compare exactly, as on PostgreSQL and SQLite.

Django creates columns in the database's default collation, on MySQL/MariaDB a case- and
accent-insensitive one that ignores trailing spaces (``utf8mb4_general_ci``, PAD SPACE): there
"A", "a" and "a " would be one dedup key, one idempotency key, one queue. This migration moves
those columns to the binary NO PAD collation of their own character set: ``<charset>_nopad_bin``
on MariaDB (10.2+), ``utf8mb4_0900_bin`` on MySQL (8.0.17+, utf8mb4 only); where the server has
neither, ``<charset>_bin``, which compares exactly but still ignores trailing spaces (MySQL before
8.0.17, or MySQL columns in another character set than utf8mb4).

Not ``db_collation`` on the fields: a collation name is a vendor's (PostgreSQL and SQLite have
no ``utf8mb4_nopad_bin``), and which one exists depends on the server and on the column's
character set, which only the database knows. The character set is kept, read from
information_schema: converting it would rewrite the values and could pass an index's key length.

Each column is restated from ``SHOW CREATE TABLE`` with only its character set and collation
replaced, so its type, length, nullability and default stay as they were; the indexes are the
table's and stay too. One ``ALTER TABLE`` per table (one rebuild). Backwards, the columns go back
to the table's default collation, which is where Django had left them; that fails on a unique
key if rows now differ only by case, accents or trailing spaces.

A later ``AlterField`` of one of these columns restates it without a collation, back to the
table's default: such a migration must run this module's :func:`set_collation` again
(tests/contract/test_collation.py checks every column's collation on MySQL/MariaDB).
"""

import re

from django.db import migrations

#: The columns whose equality is identity, by table: looked up by value, in unique keys, or
#: compared with one another (which needs one collation on both sides). Left out: the
#: closed vocabularies the app writes and validates (state, status, catch_up...), free text
#: (hostname, cron, timezone, log lines), and the uuid / char(32) ids, which Django writes as
#: lowercase hex and to which foreign keys point.
COLUMNS = {
    "django_jobs_job": (
        "backend", "queue", "task_path", "worker_id", "dedup_key", "scheduler_key", "partition_key", "trace_id",
        "idempotency_key",
    ),
    "django_jobs_dedup": ("backend", "queue", "key"),
    "django_jobs_dedup_next": ("backend", "queue", "key"),
    "django_jobs_dependency": ("child_queue",),
    "django_jobs_event": ("queue", "kind"),
    "django_jobs_metric": ("queue",),
    "django_jobs_queuestate": ("name",),
    "django_jobs_jobstart": ("queue", "partition_key"),
    "django_jobs_schedule": ("backend", "name", "task_path", "queue"),
    "django_jobs_worker": ("id", "backend"),
}  # fmt: skip

#: The character set and collation clauses SHOW CREATE TABLE prints right after a column's type.
_CHARSET_CLAUSES = re.compile(r"^(?:(?:CHARACTER SET|CHARSET|COLLATE) \w+ ?)*")


def binary_collation(cursor, charset):
    """The exact collation of ``charset`` this server has: NO PAD binary where there is one."""
    candidates = [f"{charset}_nopad_bin", f"{charset}_0900_bin", f"{charset}_bin"]
    cursor.execute(
        "SELECT COLLATION_NAME FROM information_schema.COLLATIONS WHERE COLLATION_NAME IN (%s, %s, %s)", candidates
    )
    found = {row[0] for row in cursor.fetchall()}
    return next(name for name in candidates if name in found)


def _table_default(cursor, table, charset):
    """The collation a column of ``charset`` gets in ``table`` when it names none."""
    cursor.execute(
        "SELECT TABLE_COLLATION FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = %s",
        [table],
    )
    collation = cursor.fetchone()[0]
    if collation.startswith(f"{charset}_"):
        return collation
    cursor.execute(
        "SELECT DEFAULT_COLLATE_NAME FROM information_schema.CHARACTER_SETS WHERE CHARACTER_SET_NAME = %s", [charset]
    )
    return cursor.fetchone()[0]


def set_collation(schema_editor, columns, *, binary):
    """Move ``columns`` ({table: names}) to their character set's binary collation (``binary``)
    or back to their table's default one. MySQL/MariaDB only; a column already there is left."""
    if schema_editor.connection.vendor != "mysql":
        return
    with schema_editor.connection.cursor() as cursor:
        for table, names in columns.items():
            cursor.execute(
                "SELECT COLUMN_NAME, CHARACTER_SET_NAME, COLLATION_NAME FROM information_schema.COLUMNS "
                f"WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = %s AND COLUMN_NAME IN ({', '.join(['%s'] * len(names))})",
                [table, *names],
            )
            found = {name: (charset, collation) for name, charset, collation in cursor.fetchall()}
            missing = set(names) - set(found)
            if missing:
                raise RuntimeError(f"{table} has no column {', '.join(sorted(missing))}")
            cursor.execute(f"SHOW CREATE TABLE `{table}`")
            create = cursor.fetchone()[1]
            changes = []
            for name in names:
                charset, collation = found[name]
                target = binary_collation(cursor, charset) if binary else _table_default(cursor, table, charset)
                if collation == target:
                    continue
                # The definition as the server prints it ("varchar(100) NOT NULL", "varchar(255)
                # COLLATE utf8mb4_bin DEFAULT NULL"...) with its charset clauses replaced.
                definition = re.search(rf"^\s*`{name}` (.*?),?$", create, re.MULTILINE).group(1)
                column_type, _, rest = definition.partition(" ")
                rest = _CHARSET_CLAUSES.sub("", rest)
                changes.append(f"MODIFY `{name}` {column_type} CHARACTER SET {charset} COLLATE {target} {rest}".rstrip())
            if changes:
                schema_editor.execute(f"ALTER TABLE `{table}` {', '.join(changes)}")


def forwards(apps, schema_editor):
    set_collation(schema_editor, COLUMNS, binary=True)


def backwards(apps, schema_editor):
    set_collation(schema_editor, COLUMNS, binary=False)


class Migration(migrations.Migration):
    dependencies = [
        ("django_jobs", "0009_parent_index_only_where_set"),
    ]

    operations = [
        migrations.RunPython(forwards, backwards, atomic=False),
    ]
