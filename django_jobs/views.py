"""Views a project mounts in its own URLconf: :func:`health`, a JSON health check for probes
(``path("jobs/health/", django_jobs.views.health)``, or ``include("django_jobs.urls")``;
docs/howto/health-checks.md), and :func:`metrics`, Prometheus's exposition
(docs/howto/prometheus.md). Neither has a login: protect them as those pages say. The admin's
pages live in :mod:`django_jobs.admin`.
"""

from __future__ import annotations

import logging

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET, require_safe

from .exceptions import InvalidHealthOption
from .health import check_health, database_of, health_options
from .prometheus import exposition

__all__ = ["health", "metrics"]

logger = logging.getLogger("django_jobs.health")

#: The query parameters :func:`health` reads; any other is a 400 (a typo must not pass silently).
PARAMETERS = frozenset({"backend", "min_workers", "host", "max_wait", "max_rescues", "window"})


@never_cache
@require_GET
def health(request: HttpRequest) -> JsonResponse:
    """200 ``{"status": "ok", "backend", "checks": {...}}`` when every check passes, 503 with
    ``"status": "fail"`` when one fails, 400 ``{"status": "error", "error": ...}`` for a bad query
    parameter, 405 for a method other than GET.

    The parameters mirror ``manage.py jobs health``: ``backend``, ``min_workers``, ``host``,
    ``max_wait`` (repeatable: ``max_wait=60&max_wait=emails=600``), ``max_rescues``, ``window``.
    Unlike the command, workers on every host count unless ``host`` names one: this view usually
    runs in a web process, where no worker runs.
    """
    params = request.GET
    try:
        unknown = sorted(set(params) - PARAMETERS)
        if unknown:
            raise InvalidHealthOption(
                f"unknown parameter(s) {', '.join(unknown)}; known: {', '.join(sorted(PARAMETERS))}."
            )
        for name in PARAMETERS - {"max_wait"}:
            if len(params.getlist(name)) > 1:
                raise InvalidHealthOption(f"{name} is given more than once.")
        backend = params.get("backend", "default")
        database_of(backend)
        options = health_options(
            min_workers=params.get("min_workers", 1),
            host=params.get("host"),
            max_wait=params.getlist("max_wait"),
            max_rescues=params.get("max_rescues"),
            window=params.get("window"),
            backend=backend,
        )
        report = check_health(options, backend=backend)
    except InvalidHealthOption as exc:
        return JsonResponse({"status": "error", "error": str(exc)}, status=400)
    for check in report.checks:
        if check.cause:  # the database's own message stays in the log: it may name hosts and users
            logger.warning("Health check %s of backend %r failed: %s", check.name, backend, check.cause)
    return JsonResponse(report.as_json(), status=200 if report.ok else 503)


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
