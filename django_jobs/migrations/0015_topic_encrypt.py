"""A topic's ``encrypt`` setting: its messages' payloads stored encrypted (None: as declared in
``DJANGO_JOBS["TOPICS"]``, else not)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("django_jobs", "0014_topic_console")]

    operations = [
        migrations.AddField(
            model_name="topic",
            name="encrypt",
            field=models.BooleanField(blank=True, null=True),
        ),
    ]
