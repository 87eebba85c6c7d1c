"""A plain job no longer writes an index entry only the queue counts read.

django_jobs_unfinished_idx held every unfinished job (an entry at enqueue and another at each
claim) for the per-queue counts and a queue's ``max_size``; it now holds partitioned jobs only,
for the partition probes. A queue's counts add up the partial indexes of the unfinished states
instead (``django_jobs.states.UNFINISHED_PARTS``): the ready and blocked indexes, the running
jobs' index, and two new ones that only delayed jobs and flow parents pay for.

MySQL/MariaDB: nothing changes in the database. Django builds a partial index there as a full
one, so the old index already served every count, and the two new ones would cost every job an
entry; they exist in the migration state only (a later migration that drops them must skip
MySQL as these steps do). Building the indexes reads the job table once: migrate with the
workers stopped, or expect enqueues to wait for it."""

from django.db import migrations, models


class NotOnMySQL(migrations.SeparateDatabaseAndState):
    """``operation`` in the migration state everywhere; in the database, not on MySQL/MariaDB."""

    def __init__(self, operation):
        super().__init__(state_operations=[operation], database_operations=[operation])

    def database_forwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.vendor != "mysql":
            super().database_forwards(app_label, schema_editor, from_state, to_state)

    def database_backwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.vendor != "mysql":
            super().database_backwards(app_label, schema_editor, from_state, to_state)


class Migration(migrations.Migration):

    dependencies = [
        ('django_jobs', '0017_event_data_lz4'),
    ]

    operations = [
        NotOnMySQL(migrations.RemoveIndex(
            model_name='job',
            name='django_jobs_unfinished_idx',
        )),
        NotOnMySQL(migrations.AddIndex(
            model_name='job',
            index=models.Index(condition=models.Q(('state', 'delayed')), fields=['queue', 'available_at'], name='django_jobs_delayed_q_idx'),
        )),
        NotOnMySQL(migrations.AddIndex(
            model_name='job',
            index=models.Index(condition=models.Q(('state', 'waiting-children')), fields=['queue'], name='django_jobs_parent_wait_idx'),
        )),
        NotOnMySQL(migrations.AddIndex(
            model_name='job',
            index=models.Index(condition=models.Q(('partition_key__isnull', False), ('state__in', ['waiting', 'delayed', 'active', 'waiting-children'])), fields=['queue', 'partition_key', 'id'], name='django_jobs_unfinished_idx'),
        )),
    ]
