"""Tasks that declare their own schedule (``@task(schedule=...)``). Imported only by the tests
that need them: importing registers the declarations for the whole process."""

from datetime import timedelta

from django.tasks import task


@task(schedule="*/5 * * * *")
def every_five_minutes() -> None:
    pass


@task(schedule={"name": "ordered-report", "every": timedelta(hours=1), "args": [7], "queue": "reports"},
      partition="reports")  # fmt: skip
def hourly_report(n: int) -> int:
    return n
