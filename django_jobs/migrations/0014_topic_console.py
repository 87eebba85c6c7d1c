"""The topic console's permissions: control_topic (pause, resume, seek, retry or skip a blocked
partition) and replay_deadletter."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("django_jobs", "0012_topics")]

    operations = [
        migrations.AlterModelOptions(
            name="topic",
            options={
                "ordering": ("name",),
                "permissions": [
                    (
                        "control_topic",
                        "Can pause, resume and seek consumer groups and retry or skip blocked partitions",
                    )
                ],
            },
        ),
        migrations.AlterModelOptions(
            name="deadletter",
            options={"ordering": ("id",), "permissions": [("replay_deadletter", "Can replay dead letters")]},
        ),
    ]
