"""Backoff forms; they live in :mod:`django_jobs.spec.backoff` (this path is kept for imports)."""

from .spec.backoff import compute_backoff, validate_backoff

__all__ = ["compute_backoff", "validate_backoff"]
