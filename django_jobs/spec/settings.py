"""The problems of a settings object, its declarations included (system check E002).

:mod:`django_jobs.conf` stays a leaf of the layers, importing nothing of ours but the exceptions,
so that the drivers and the engine can read settings. Validating ``QUEUES``, ``RETENTION`` and
``BACKOFF`` needs the spec modules that define those declarations, which read settings
themselves; so that validation lives here, one layer up, and calls :meth:`JobsSettings.validate`
for the rest.
"""

from __future__ import annotations

from ..conf import JobsSettings
from ..exceptions import InvalidRetention, JobsConfigurationError, JobsError
from .backoff import validate_backoff
from .queues import validate_queue_declarations
from .retention import validate_retention_setting
from .topics import validate_topic_declarations


def settings_problems(conf: JobsSettings) -> list[str]:
    """Human-readable problems of ``conf`` (empty when valid): those of
    :meth:`~django_jobs.conf.JobsSettings.validate`, then those of its declarations."""
    problems = conf.validate()
    if conf.QUEUES is not None:
        try:
            validate_queue_declarations(conf.QUEUES)
        except JobsConfigurationError as exc:
            problems.append(str(exc))
    if conf.TOPICS is not None:
        try:
            validate_topic_declarations(conf.TOPICS)
        except JobsError as exc:
            problems.append(f"TOPICS: {exc}")
    if conf.RETENTION is not None:
        try:
            validate_retention_setting(conf.RETENTION)
        except InvalidRetention as exc:
            problems.append(f"RETENTION: {exc}")
    try:
        validate_backoff(conf.BACKOFF)
    except ValueError as exc:
        problems.append(f"BACKOFF: {exc}")
    return problems


__all__ = ["settings_problems"]
