"""The django-jobs admin: jobs, schedules and workers (``jobs``); queues and their dashboards
(``queues``)."""

from . import jobs, queues  # noqa: F401 - registers the model admins
