"""The django-jobs admin, one module per admin: ``jobs`` (the jobs list and the job page),
``queues`` (the queues dashboards and controls), ``schedules``, ``topics`` (bus mode) and ``workers``; with the jobs
list's ``filters``, the count-free ``changelist``, the queue pages' ``charts`` and shared
``utils``."""

from . import jobs, queues, schedules, topics, workers  # noqa: F401 - registers the model admins
