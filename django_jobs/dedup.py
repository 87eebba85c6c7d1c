"""``Dedup``, the deduplication option of a task; it lives in :mod:`django_jobs.spec.dedup` (this
path is kept for imports)."""

from .spec.dedup import DEBOUNCE, KEEP_LAST, MAX_KEY_LENGTH, SIMPLE, THROTTLE, Dedup, check_key

__all__ = ["DEBOUNCE", "KEEP_LAST", "MAX_KEY_LENGTH", "SIMPLE", "THROTTLE", "Dedup", "check_key"]
