"""Tasks for the admin security sweep (tests/test_admin_security.py): each writes markup into
the fields a task controls (log, progress, return value, error message and traceback), one
payload per field, so the tests can tell which field a page shows. Module-level, so their
dotted paths resolve."""

from django.tasks import task


def payload(label: str) -> str:
    """Markup that runs script when a page leaves it unescaped: in element content
    (``<script>``), in a double-quoted attribute (``"><img onerror>``) and in a single-quoted one
    (``'><svg onload>``). ``label`` names the field it was put in."""
    return f'<script>alert("{label}")</script>"><img src=x onerror=alert({label})>\'><svg onload=alert({label})>'


def compact(label: str) -> str:
    """A payload that fits a 64-character column (trace ids)."""
    return f'<script>alert({label})</script>"><img src=x onerror=alert({label})>'


def shown(label: str) -> str:
    """How a page shows the payload ``label`` once escaped: the same in text, in an attribute and
    inside pretty-printed JSON (this part holds no quote)."""
    return f"&lt;img src=x onerror=alert({label})&gt;"


@task(takes_context=True)
def shows_everything(context, *args, **kwargs):
    """Logs a line, reports progress (a dict) and returns a value, each with its own payload."""
    context.log(payload("logline"))
    context.set_progress({"step": payload("progress"), "current": 1, "total": 2})
    return {"echo": payload("result")}


@task(max_attempts=1, takes_context=True)
def fails_with_markup(context, *args, **kwargs):
    """Logs a line, then raises ValueError with a payload (the error message and traceback)."""
    context.log(payload("faillog"))
    raise ValueError(payload("error"))


@task
def quiet(*args, **kwargs) -> None:
    return None


@task(max_attempts=1)
def fails_plainly() -> None:
    raise ValueError("plain failure")
