from django.contrib import admin
from django.urls import include, path

from django_jobs import views

urlpatterns = [
    path("admin/", admin.site.urls),
    path("jobs/", include("django_jobs.urls")),
    path("metrics/", views.metrics),
    path("metrics/limited/", views.metrics, {"backend": "limited"}),
]
