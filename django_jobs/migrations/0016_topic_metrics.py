"""Bus mode's metrics (issue 16): running totals of what each group consumed, on its cursors
(acknowledged and dead-lettered; ``expired_count`` was there already), and the per-minute
snapshots of those totals and of each topic's published count.

Cursors that exist already count from this migration on (their totals start at 0). On
MySQL/MariaDB the new name columns compare exactly, as migration 0010 does for the job tables.
"""

import importlib

from django.db import migrations, models

_collation = importlib.import_module("django_jobs.migrations.0010_mysql_binary_collation")

#: The columns whose equality is identity (see migration 0010).
COLUMNS = {"django_jobs_topic_metric": ("topic", "group_name")}


def forwards(apps, schema_editor):
    _collation.set_collation(schema_editor, COLUMNS, binary=True)


def backwards(apps, schema_editor):
    pass  # the table is dropped next


class Migration(migrations.Migration):
    # 0015 is taken by another branch's migration (topic encryption); the merge renumbers or
    # chains these two.
    dependencies = [("django_jobs", "0015_topic_encrypt")]

    operations = [
        migrations.AddField(
            model_name="groupcursor",
            name="acked_count",
            field=models.BigIntegerField(default=0),
        ),
        migrations.AddField(
            model_name="groupcursor",
            name="dead_lettered_count",
            field=models.BigIntegerField(default=0),
        ),
        migrations.CreateModel(
            name="TopicMetric",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("topic", models.CharField(max_length=100)),
                ("group_name", models.CharField(blank=True, default="", max_length=100)),
                ("minute", models.DateTimeField()),
                ("taken_at", models.DateTimeField()),
                ("published", models.BigIntegerField(default=0)),
                ("acked", models.BigIntegerField(default=0)),
                ("dead_lettered", models.BigIntegerField(default=0)),
                ("expired", models.BigIntegerField(default=0)),
            ],
            options={
                "db_table": "django_jobs_topic_metric",
                "ordering": ("topic", "group_name", "minute"),
                "indexes": [models.Index(fields=["minute"], name="django_jobs_tmetric_minute_idx")],
                "constraints": [
                    models.UniqueConstraint(
                        fields=("topic", "group_name", "minute"), name="django_jobs_topic_metric_minute"
                    )
                ],
            },
        ),
        migrations.RunPython(forwards, backwards, atomic=False),
    ]
