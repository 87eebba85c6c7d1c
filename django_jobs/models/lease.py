"""Named leases on the database's clock.

A row is one lease: ``holder`` owns it until ``expires_at`` and renews it before then; once it
has expired anyone may take it. ``leader:<backend>`` names the worker that runs the leader-only
services of a backend alias (engine.workers.take_leadership). ``events`` is the MySQL/MariaDB
event publisher's gate: its ``counter`` numbers the batches of events made visible to readers
(drivers/mysql.py, ``events_horizon``); its row lock makes publishers take turns.
"""

from __future__ import annotations

from django.db import models


class Lease(models.Model):
    name = models.CharField(primary_key=True, max_length=200)
    holder = models.CharField(max_length=200, blank=True, default="")
    expires_at = models.DateTimeField(null=True, blank=True)
    counter = models.BigIntegerField(default=0)

    class Meta:
        db_table = "django_jobs_lease"

    def __str__(self) -> str:
        return self.name
