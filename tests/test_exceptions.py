"""Every exception lives in django_jobs.exceptions under JobsError, and its old import path still works."""

import importlib
import inspect

import pytest

from django_jobs import exceptions
from django_jobs.exceptions import JobAction, JobsError

MOVED = [
    ("django_jobs.worker", "InvalidWorkerOption"),
    ("django_jobs.worker.runner", "InvalidWorkerOption"),
    ("django_jobs.retention", "InvalidRetention"),
    ("django_jobs.schedules", "InvalidSchedule"),
    ("django_jobs.eventlog", "InvalidEventCursor"),
    ("django_jobs.queues", "InvalidQueueSetting"),
    ("django_jobs.queues", "QueueBusy"),
    ("django_jobs.api", "JobNotRetryable"),
]


@pytest.mark.parametrize(("module", "name"), MOVED)
def test_old_import_path_gives_the_class_of_django_jobs_exceptions(module, name):
    assert getattr(importlib.import_module(module), name) is getattr(exceptions, name)


def test_every_exception_is_a_jobs_error_or_a_job_action_and_says_its_docstring_by_default():
    classes = [c for c in vars(exceptions).values() if inspect.isclass(c) and c.__module__ == exceptions.__name__]
    assert len(classes) > 30
    for cls in classes:
        assert issubclass(cls, (JobsError, JobAction)), cls
        if issubclass(cls, JobsError) and cls is not exceptions.QueueFull:
            assert str(cls()) == cls.__doc__.strip(), cls
