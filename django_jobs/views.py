"""Views a project mounts in its own URLconf (the admin's pages live in :mod:`django_jobs.admin`)."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_safe

from .prometheus import exposition

__all__ = ["metrics"]


@never_cache
@require_safe
def metrics(request: HttpRequest, backend: str = "default") -> HttpResponse:
    """Prometheus's text exposition of ``backend``'s queues and workers, read from the database
    at each scrape (:class:`django_jobs.prometheus.DatabaseCollector`; docs/howto/prometheus.md
    lists the metrics). Mount it with ``path("metrics/", django_jobs.views.metrics)``; pass
    ``{"backend": "alias"}`` as the path's kwargs for another backend. It checks no
    permission: protect it as the rest of your site's internals (network, proxy, or wrap it).

    Raises PrometheusClientMissing (an ImproperlyConfigured) when prometheus-client is not
    installed and JobsConfigurationError when ``backend`` is not a JobsBackend's alias.
    """
    body, content_type = exposition(backend=backend)
    return HttpResponse(body, content_type=content_type)
