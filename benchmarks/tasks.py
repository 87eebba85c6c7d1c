"""The tasks the benchmark enqueues."""

from django.tasks import task


@task
def noop() -> None:
    """Does nothing: the benchmark measures the queue, not the work."""
    return None
