"""How long finished jobs are kept; the policies live in :mod:`django_jobs.spec.retention` (this
path is kept for imports). See docs/howto/retention.md."""

from .exceptions import InvalidRetention
from .spec.retention import (
    DEFAULT_AGE,
    MAX_AGE,
    STATES,
    Policy,
    count_limits,
    parse_policy,
    policy_for,
    purge_at,
    queue_policies,
    task_count_limits,
    task_policies,
    validate_policies,
    validate_retention_setting,
)

__all__ = [
    "DEFAULT_AGE", "MAX_AGE", "STATES", "InvalidRetention", "Policy", "count_limits", "parse_policy", "policy_for",
    "purge_at", "queue_policies", "task_count_limits", "task_policies", "validate_policies",
    "validate_retention_setting",
]  # fmt: skip
