"""``Job.parent`` keeps no foreign-key constraint in the database.

Its check ran for every job at commit (PostgreSQL defers it; a NULL ``parent_id`` fires the
trigger too): 7 us of the server's CPU per one-job enqueue, paid by the jobs outside a flow
(docs/benchmarks.md). django-jobs checks a parent itself when it attaches a child (a guarded
increment of the parent's ``pending_children``), and unlinks children before it deletes jobs
with raw SQL; Django's collector does ``SET_NULL`` for a delete through the ORM or the admin.
The index on ``parent_id`` (``django_jobs_parent_idx``) stays.
"""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_jobs", "0019_checks_as_domains"),
    ]

    operations = [
        migrations.AlterField(
            model_name="job",
            name="parent",
            field=models.ForeignKey(
                blank=True,
                db_constraint=False,
                db_index=False,
                null=True,
                on_delete=django.db.models.deletion.SET_NULL,
                related_name="children",
                to="django_jobs.job",
            ),
        ),
    ]
