from django.apps import AppConfig


class BusChaosConfig(AppConfig):
    name = "benchmarks.bus_chaos_app"
    label = "bus_chaos"
    default_auto_field = "django.db.models.BigAutoField"
