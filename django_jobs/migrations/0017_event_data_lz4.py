"""PostgreSQL: the event log's ``data`` is compressed with lz4 where the server has it.

An ``enqueued-many`` event names the ids of up to 500 jobs (about 19 kB), which PostgreSQL
compresses before storing it out of line; with its default method (pglz) that compression was
4 % of the server's CPU in a bulk enqueue. lz4 compresses as well here at a fraction of the
cost. Only new values are compressed with it; older rows are read as they are.

A no-op elsewhere, and on a PostgreSQL before 14 or built without lz4 (the setting then keeps
the server's default). The ALTER takes the event table's ACCESS EXCLUSIVE lock for a moment
(no rewrite): it waits for transactions writing events, so migrate with the workers stopped or
expect them to pause. A dump of this table restores on a server without lz4 only with
``pg_dump --no-toast-compression``."""

from django.db import migrations


def lz4_available(cursor) -> bool:
    """The server can compress a column with lz4 (PostgreSQL 14+, built with it)."""
    cursor.execute(
        "SELECT current_setting('server_version_num')::int >= 140000 AND EXISTS ("
        "SELECT 1 FROM pg_settings WHERE name = 'default_toast_compression' AND 'lz4' = ANY(enumvals))"
    )
    return bool(cursor.fetchone()[0])


def set_compression(method: str):
    """A RunPython step that sets the compression of the event log's ``data`` to ``method``."""

    def step(apps, schema_editor):
        if schema_editor.connection.vendor != "postgresql":
            return
        with schema_editor.connection.cursor() as cursor:
            if lz4_available(cursor):
                schema_editor.execute(f"ALTER TABLE django_jobs_event ALTER COLUMN data SET COMPRESSION {method}")

    return step


class Migration(migrations.Migration):

    dependencies = [
        ('django_jobs', '0016_topic_metrics'),
    ]

    operations = [
        migrations.RunPython(set_compression("lz4"), set_compression("DEFAULT")),
    ]
