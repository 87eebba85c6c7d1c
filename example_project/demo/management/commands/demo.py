"""``manage.py demo``: enqueue the demo jobs, run a worker until they are done, print a table."""

from datetime import timedelta

from django.core.management import call_command
from django.core.management.base import BaseCommand
from django.utils import timezone

from demo.tasks import add, broken, flaky, ping, slow_report
from django_jobs.models import Job


class Command(BaseCommand):
    help = "Enqueue demo jobs, run a worker until they are done, and print what happened."

    def handle(self, *args, **options):
        results = [
            add.enqueue(2, 3),
            flaky.enqueue("payments"),
            slow_report.using(run_after=timezone.now() + timedelta(seconds=3)).enqueue("weekly"),
            broken.enqueue(42),
            ping.enqueue("db1"),
        ]
        self.stdout.write(f"Enqueued {len(results)} jobs; running a worker until they are done...")
        call_command("runworker", concurrency=4, stop_when_empty=True, sleep="0.2", verbosity=2)
        self.stdout.write("")
        self.stdout.write(f"{'task':<22} {'queue':<8} {'state':<10} {'attempts':<8} result")
        self.stdout.write("-" * 90)
        for r in results:
            job = Job.objects.get(id=r.id)
            r.refresh()
            if job.state == "completed":
                outcome = repr(r.return_value)
            elif r.errors:
                outcome = r.errors[-1].traceback.strip().splitlines()[-1]
            else:
                outcome = ""
            self.stdout.write(
                f"{r.task.name:<22} {job.queue:<8} {job.state:<10} {job.attempts}/{job.max_attempts:<6} {outcome[:60]}"
            )
        self.stdout.write("")
        self.stdout.write(
            "In a terminal: .venv/bin/python example_project/manage.py jobs status\n"
            "In the admin: .venv/bin/python example_project/manage.py createsuperuser, then\n"
            ".venv/bin/python example_project/manage.py runserver and open http://127.0.0.1:8000/admin/django_jobs/queuestate/"
        )
