"""``manage.py demo``: enqueue the demo jobs, run a worker until they are done, print a table."""

from datetime import timedelta

from django.core.management import call_command
from django.core.management.base import BaseCommand
from django.utils import timezone

from demo.tasks import add, broken, delayed_report, flaky, ping
from django_jobs.models import Job

DELAY = 3


class Command(BaseCommand):
    help = "Enqueue demo jobs, run a worker until they are done, and print what happened."

    def handle(self, *args, **options):
        results = [
            add.enqueue(2, 3),
            flaky.enqueue("payments"),
            delayed_report.using(run_after=timezone.now() + timedelta(seconds=DELAY)).enqueue("weekly"),
            broken.enqueue(42),
            ping.enqueue("db1"),
        ]
        self.stdout.write(
            f"Enqueued {len(results)} jobs: delayed_report runs {DELAY}s from now; flaky fails once, then "
            "succeeds; broken fails both its attempts (on purpose).\nRunning a worker until they are done...\n"
        )
        call_command("runworker", concurrency=4, stop_when_empty=True, sleep="0.2", verbosity=1)
        self.stdout.write("")
        self.stdout.write(f"{'task':<16} {'queue':<8} {'state':<10} {'attempts':<9} {'ran after':<10} result")
        self.stdout.write("-" * 96)
        for r in results:
            job = Job.objects.get(id=r.id)
            r.refresh()
            if job.state == "completed":
                outcome = repr(r.return_value)
            elif r.errors:
                outcome = r.errors[-1].traceback.strip().splitlines()[-1]
            else:
                outcome = ""
            # From the enqueue to the start of the last attempt: the delay, or the retry's backoff.
            last = job.last_attempted_at or job.started_at
            waited = f"{(last - job.enqueued_at).total_seconds():.1f}s" if last else ""
            attempts = f"{job.attempts}/{job.max_attempts}"
            self.stdout.write(
                f"{r.task.name:<16} {job.queue:<8} {job.state:<10} {attempts:<9} {waited:<10} {outcome[:45]}"
            )
        self.stdout.write("")
        self.stdout.write(
            "Next:\n"
            "  In a terminal: .venv/bin/python example_project/manage.py jobs status\n"
            "  In the admin: .venv/bin/python example_project/manage.py createsuperuser, then\n"
            "  .venv/bin/python example_project/manage.py runserver and open "
            "http://127.0.0.1:8000/admin/django_jobs/queuestate/"
        )
