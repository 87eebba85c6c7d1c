"""django-jobs: durable background jobs for Django's Tasks framework, stored in your database."""

__version__ = "0.1.0"

__all__ = ["__version__"]
