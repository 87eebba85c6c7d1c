from django.apps import AppConfig


class DjangoJobsConfig(AppConfig):
    name = "django_jobs"
    verbose_name = "Jobs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Wiring only: never query the database here. Imported in ready(), not at the top: the
        # checks reach the models, which Django imports after this module.
        from . import checks, db  # noqa: F401  (registers checks and the SQLite set-up hook)
