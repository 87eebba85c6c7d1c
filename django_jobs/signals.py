"""django-jobs signals (Django's own ``task_enqueued``/``task_started``/``task_finished`` are sent
too). Payloads are documented in docs/reference/signals.md."""

from django.dispatch import Signal

#: Sent after each background service run. kwargs: ``service`` (name), ``counts`` (dict), ``worker_id``.
service_ran = Signal()
#: Sent when a worker starts and stops. kwargs: ``worker_id``, ``queues``, ``concurrency``.
worker_started = Signal()
#: kwargs: ``worker_id``, ``stats`` (a WorkerStats).
worker_stopped = Signal()
