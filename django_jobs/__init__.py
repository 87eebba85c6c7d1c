"""django-jobs: durable background jobs for Django's Tasks framework, stored in your database."""

__version__ = "0.1.0"

from .exceptions import Fail, Retry, Snooze  # noqa: E402 - the public names, importable without settings

__all__ = ["Fail", "Retry", "Snooze", "__version__"]
