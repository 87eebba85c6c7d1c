"""``path("jobs/", include("django_jobs.urls"))`` mounts the health check at ``jobs/health/``
(docs/howto/health-checks.md)."""

from django.urls import path

from .views import health

app_name = "django_jobs"
urlpatterns = [path("health/", health, name="health")]
