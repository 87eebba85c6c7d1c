"""The django-jobs exception family. Each class's docstring is its default message."""

from django.core.exceptions import ImproperlyConfigured
from django.tasks.exceptions import InvalidTask


class JobsError(Exception):
    """A django-jobs error."""

    def __init__(self, message: str | None = None):
        super().__init__(message or (self.__doc__ or "").strip())


class InvalidTaskArguments(JobsError, InvalidTask):
    """Task arguments must be JSON: str, int, finite float, bool, None, list and dict with string keys."""


class PayloadTooLarge(InvalidTaskArguments):
    """The job's arguments are larger than MAX_PAYLOAD_BYTES; store big data elsewhere and pass a key."""


class InvalidQueueName(JobsError, InvalidTask):
    """Queue names are 1-100 characters of letters, digits, '_', '-', '.' and ':'."""


class InvalidTaskOptions(JobsError, InvalidTask):
    """A django-jobs task option has an invalid value."""


class JobsConfigurationError(JobsError, ImproperlyConfigured):
    """django-jobs is misconfigured; run `manage.py check` for details."""


class TaskNotFound(JobsError):
    """The job's task path does not resolve to a Task instance; was the task renamed or removed?"""


class NonJSONReturnValue(JobsError):
    """The task returned a value that is not JSON; return str, int, float, bool, None, list or dict."""


class OutcomeNotStored(JobsError):
    """The database refused to store the job's outcome (for example its return value)."""


class WorkerCrashed(JobsError):
    """The worker met a database error that retrying cannot fix; is the database migrated?"""


class JobStalled(JobsError):
    """The job's worker stopped renewing its lease too many times (it crashed or was killed)."""


class DatabaseUnavailable(JobsError):
    """The database could not be reached."""
