"""django-jobs: durable background jobs for Django's Tasks framework, stored in your database."""

__version__ = "0.1.0"

from .backend import JobCall, call  # noqa: E402 - the public names, importable without settings
from .dedup import Dedup  # noqa: E402
from .eventlog import EventPage, events, follow_events  # noqa: E402
from .exceptions import Fail, QueueFull, Retry, Snooze  # noqa: E402
from .flows import Flow, flow  # noqa: E402
from .queues import queue  # noqa: E402
from .schedules import schedule, unschedule  # noqa: E402
from .tracing import trace  # noqa: E402

__all__ = [
    "Dedup",
    "EventPage",
    "Fail",
    "Flow",
    "JobCall",
    "QueueFull",
    "Retry",
    "Snooze",
    "__version__",
    "call",
    "cancel",
    "events",
    "flow",
    "follow_events",
    "queue",
    "retry",
    "schedule",
    "trace",
    "unschedule",
]


def cancel(result_id, *, backend="default"):  # noqa: ANN001, ANN201 - see django_jobs.api.cancel
    """Cancel a job; see :func:`django_jobs.api.cancel`."""
    from .api import cancel as _cancel

    return _cancel(result_id, backend=backend)


def retry(result_id, *, backend="default"):  # noqa: ANN001, ANN201 - see django_jobs.api.retry
    """Re-queue a failed or cancelled job; see :func:`django_jobs.api.retry`."""
    from .api import retry as _retry

    return _retry(result_id, backend=backend)
