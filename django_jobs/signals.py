"""django-jobs signals (Django's own ``task_enqueued``/``task_started``/``task_finished`` are sent
too). Payloads are documented in docs/reference/signals.md; keep the two in step.

Job signals are sent with the backend's class as ``sender`` (as Django's task signals are) and
``job_id`` (str), ``queue`` and ``backend`` (the TASKS alias) among their keyword arguments. They
are sent after the change is stored; a receiver that raises is logged and changes nothing.
"""

import logging

from django.dispatch import Signal
from django.tasks import task_backends

from .backend import JobsBackend

#: Sent after each background service run. kwargs: ``service`` (name), ``counts`` (dict), ``worker_id``.
service_ran = Signal()
#: Sent when a worker starts and stops. kwargs: ``worker_id``, ``queues``, ``concurrency``.
worker_started = Signal()
#: kwargs: ``worker_id``, ``stats`` (a WorkerStats).
worker_stopped = Signal()

#: An attempt failed and the job will run again. kwargs: ``job_id``, ``queue``, ``backend``,
#: ``attempt`` (the attempt that failed), ``run_at`` (aware datetime of the next attempt),
#: ``error`` (dict: exception_class_path, traceback).
job_retried = Signal()
#: A task snoozed: it runs again at ``run_at`` without counting the attempt. kwargs: ``job_id``,
#: ``queue``, ``backend``, ``attempt``, ``run_at``.
job_snoozed = Signal()
#: A job was cancelled. kwargs: ``job_id``, ``queue``, ``backend``, ``was_running`` (False: it
#: was waiting or delayed and is cancelled at once; True: its running attempt ended ``cancelled``).
job_cancelled = Signal()
#: The rescuer found a running job whose lease expired (its worker died or hung). kwargs:
#: ``job_id``, ``queue``, ``backend``, ``state`` (``waiting``: it will run again; ``failed``: it
#: stalled more than MAX_STALLED times; ``cancelled``: it had been cancelled while it ran, and
#: ``job_cancelled`` follows).
job_stalled = Signal()
#: A stalled job was put back to waiting (sent after ``job_stalled``). kwargs: ``job_id``,
#: ``queue``, ``backend``.
job_rescued = Signal()


def send_job_signal(signal: Signal, backend: str, **kwargs: object) -> None:
    """Send a job signal with the backend's class as sender; a receiver that raises is logged."""
    if not signal.receivers:
        return
    try:
        sender: type = type(task_backends[backend])
    except Exception:  # noqa: BLE001 - the alias vanished from settings; still send the signal
        sender = JobsBackend
    for receiver, response in signal.send_robust(sender=sender, backend=backend, **kwargs):
        if isinstance(response, Exception):
            logging.getLogger("django_jobs").error(
                "Receiver %r of a django-jobs signal raised", receiver, exc_info=response
            )
