"""Admin for bus mode: the topics list (it replaces the Topic changelist), one page per topic
(its groups and settings) and one per consumer group (lag and lease per partition, blocked
partitions, pause/resume, seek, dead letters with replay and delete).

Pages (names in the ``admin`` namespace):

* ``django_jobs_topic_changelist`` (``/admin/django_jobs/topic/``): every topic with its
  partitions, messages published (and per minute lately), newest message and its groups' lag
  and messages consumed per minute.
* ``django_jobs_topic_dashboard`` (``<topic>/dashboard/``): the topic's throughput (a chart of
  the last hour), its groups and settings.
* ``django_jobs_topic_group`` (``<topic>/dashboard/group/<group>/``): one group, with a chart of
  its messages consumed per minute.
* ``django_jobs_topic_action`` (``<topic>/dashboard/action/<action>/``, POST): settings.
* ``django_jobs_topic_group_action`` (``<topic>/dashboard/group/<group>/<action>/``, POST):
  pause, resume, seek, retry, skip, replay, delete (delete shows a confirmation first).

Viewing needs ``django_jobs.view_topic`` (or change); the topic's settings need
``change_topic``; pause, resume, seek and retry or skip of a blocked partition need
``control_topic``; replaying dead letters ``replay_deadletter``, deleting them
``delete_deadletter``. Figures come from :mod:`django_jobs.console_topics` (shared with
``manage.py jobs``); every change goes through :func:`django_jobs.topic` and its
:class:`~django_jobs.topics.GroupControl`, never through a model's ``save()``. An encrypted
payload or error is never shown (``console.shown_payload``, ``console.shown_error``): the pages
say ``encrypted (not shown)``, and an encrypted topic's pages say that it is.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseBadRequest,
    HttpResponseNotAllowed,
    HttpResponseRedirect,
)
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone

import django_jobs

from .. import console_topics as console
from ..exceptions import JobsError
from ..models import Topic
from ..spec.topics import TOPIC_COLUMNS, topic_columns, validate_topic_name
from .charts import consumed_chart, published_chart
from .utils import database, moment

#: A group's controls and the permission (``django_jobs.<codename>``) each needs.
GROUP_ACTIONS = {
    "pause": "control_topic",
    "resume": "control_topic",
    "seek": "control_topic",
    "retry": "control_topic",
    "skip": "control_topic",
    "replay": "replay_deadletter",
    "delete": "delete_deadletter",
}
#: Dead letters the group page lists (newest first).
DEAD_LETTERS_SHOWN = 100
#: The settings form's fields: ``configure()``'s names, each in seconds but max_size and encrypt.
SETTINGS = ("max_size", "lease", "delay", "max_wait", "window_buffer", "retention", "max_age", "encrypt")
_HELP = {
    "max_size": "Most messages any group may lag behind; a publish beyond it raises TopicFull.",
    "lease": "Seconds a worker holds a partition's batch before another may take it over (>= 1).",
    "delay": "Seconds after publication a message becomes deliverable.",
    "max_wait": "A message older than this when its turn comes is skipped (counted as expired).",
    "window_buffer": "A partition is handed out only once its newest message is this old.",
    "retention": "Delete a message this long after publication once every group consumed it.",
    "max_age": "Delete a message this long after publication in any case.",
    "encrypt": "Store the payloads of messages published from now on encrypted with ENCRYPTION_KEYS.",
}


def _encrypt_select() -> forms.NullBooleanSelect:
    """Yes, no, or the declared value (None)."""
    widget = forms.NullBooleanSelect()
    widget.choices = [("unknown", "As declared"), ("true", "Yes"), ("false", "No")]
    return widget


class TopicSettingsForm(forms.Form):
    """A topic's runtime settings, as ``django_jobs.topic(name).configure()`` takes them (empty:
    back to the declared value, else the default). Validated again by ``configure()``."""

    max_size = forms.IntegerField(required=False, min_value=1, help_text=_HELP["max_size"])
    lease = forms.FloatField(required=False, min_value=1, label="Lease (s)", help_text=_HELP["lease"])
    delay = forms.FloatField(required=False, min_value=0, label="Delay (s)", help_text=_HELP["delay"])
    max_wait = forms.FloatField(required=False, min_value=0, label="Max wait (s)", help_text=_HELP["max_wait"])
    window_buffer = forms.FloatField(
        required=False, min_value=0, label="Window buffer (s)", help_text=_HELP["window_buffer"]
    )
    retention = forms.FloatField(required=False, min_value=0, label="Retention (s)", help_text=_HELP["retention"])
    max_age = forms.FloatField(required=False, min_value=0, label="Max age (s)", help_text=_HELP["max_age"])
    encrypt = forms.NullBooleanField(required=False, widget=_encrypt_select(), help_text=_HELP["encrypt"])

    @classmethod
    def of(cls, topic: str) -> TopicSettingsForm:
        """The form filled with the topic's own row (not the declared values it falls back to)."""
        row = Topic.objects.using(database()).filter(name=topic).first()
        initial = {} if row is None else {k: getattr(row, TOPIC_COLUMNS[k]) for k in SETTINGS}
        return cls(initial=initial)


class SeekForm(forms.Form):
    """Where to move a group's cursors: ``GroupControl.seek(to)``."""

    to = forms.ChoiceField(
        choices=[
            ("beginning", "The beginning: deliver every stored message again"),
            ("end", "The end: skip everything published so far"),
            ("time", "A time: from the first message published at or after it"),
            ("message", "A message id: from that message, in its partition"),
        ]
    )
    at = forms.DateTimeField(required=False, label="Time", help_text="For “a time”: YYYY-MM-DD HH:MM[:SS].")
    message_id = forms.IntegerField(required=False, min_value=1, label="Message id")

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        to = data.get("to")
        if to == "time":
            if data.get("at") is None:
                raise forms.ValidationError("Give the time to seek to.")
            data["target"] = data["at"] if timezone.is_aware(data["at"]) else timezone.make_aware(data["at"])
        elif to == "message":
            if data.get("message_id") is None:
                raise forms.ValidationError("Give the id of the message to seek to.")
            data["target"] = data["message_id"]
        elif to:
            data["target"] = to
        return data


class TopicForm(forms.ModelForm):
    """The change form of a topic's row, validated as ``configure()`` validates its settings."""

    class Meta:
        model = Topic
        fields = (
            "name", "max_size", "lease_seconds", "delay_seconds", "max_wait_seconds", "window_buffer_seconds",
            "retention_seconds", "max_age_seconds", "encrypt",
        )  # fmt: skip
        widgets = {"encrypt": _encrypt_select()}
        help_texts = {"encrypt": _HELP["encrypt"]}

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        try:
            topic_columns(**{k: data.get(TOPIC_COLUMNS[k]) for k in SETTINGS})
        except JobsError as exc:
            raise forms.ValidationError(str(exc)) from None
        return data


@admin.register(Topic)
class TopicAdmin(admin.ModelAdmin):
    """The topic pages (see the module docstring). The change form edits a topic's settings
    through ``configure_topic``; a topic needs no row to be used, so there is no add link."""

    form = TopicForm

    def get_model_perms(self, request):
        return {**super().get_model_perms(request), "add": False}

    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    def get_readonly_fields(self, request, obj=None):
        return ("name",) if obj is not None else ()

    def get_object(self, request, object_id, from_field=None):
        return None if "\x00" in str(object_id) else super().get_object(request, object_id, from_field)

    def save_model(self, request, obj, form, change):
        """Through the topic API, as ``django_jobs.topic(name).configure()``."""
        changes = {}
        for key in SETTINGS:
            column = TOPIC_COLUMNS[key]
            if column in form.changed_data:
                changes[key] = form.cleaned_data[column]
        if changes:
            django_jobs.topic(obj.name).configure(**changes)

    def get_urls(self):
        view = self.admin_site.admin_view
        return [
            path("<str:topic>/dashboard/", view(self.topic_view), name="django_jobs_topic_dashboard"),
            path(
                "<str:topic>/dashboard/action/<str:action>/",
                view(self.topic_action_view),
                name="django_jobs_topic_action",
            ),
            path("<str:topic>/dashboard/group/<str:group>/", view(self.group_view), name="django_jobs_topic_group"),
            path(
                "<str:topic>/dashboard/group/<str:group>/<str:action>/",
                view(self.group_action_view),
                name="django_jobs_topic_group_action",
            ),
            *super().get_urls(),
        ]

    # -- pages ------------------------------------------------------------------------------------

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        """The topics list, in place of the list of Topic rows."""
        self._check_view(request)
        rows = console.topic_overview(using=database())
        context = {
            **self._context(request, "Topics"),
            "topics": [
                {
                    "t": t,
                    "url": _url("django_jobs_topic_dashboard", t.name),
                    "newest": moment(t.newest_at),
                    "rate": console.shown_rate(t.published_per_minute),
                    "groups": [
                        {
                            "g": g,
                            "url": _url("django_jobs_topic_group", t.name, g.name),
                            "dead": g.dead,
                            "rate": console.shown_rate(g.consumed_per_minute),
                        }
                        for g in t.groups
                    ],
                }
                for t in rows
            ],
        }
        return TemplateResponse(request, "django_jobs/admin/topics/overview.html", context)

    def topic_view(self, request: HttpRequest, topic: str) -> HttpResponse:
        self._check_view(request)
        return self._render_topic(request, topic)

    def _render_topic(self, request: HttpRequest, topic: str, form: TopicSettingsForm | None = None) -> HttpResponse:
        _check_name(topic)
        detail = console.topic_detail(using=database(), name=topic)
        if detail is None:
            raise Http404(f"No topic {topic!r}.")
        can_change = self.has_change_permission(request)
        config = detail.config
        assert detail.flow is not None  # asked for (throughput=True)
        context = {
            **self._context(request, f"Topic “{topic}”"),
            "topic": detail.row,
            "newest": moment(detail.row.newest_at),
            "rate": console.shown_rate(detail.row.published_per_minute),
            "rate_minutes": console.RATE_MINUTES,
            "chart": published_chart(
                detail.flow, "topic-published", f"Messages published to {topic} per minute, last hour"
            ),
            "groups": [
                {
                    "g": g,
                    "url": _url("django_jobs_topic_group", topic, g.name),
                    "dead": g.dead,
                    "rate": console.shown_rate(g.consumed_per_minute),
                    "hour": _count(detail.group_flows[g.name].consumed),
                }
                for g in detail.row.groups
            ],
            "config": [
                ("Max size", config.max_size),
                ("Lease", _seconds(config.lease_seconds)),
                ("Delay", _seconds(config.delay_seconds)),
                ("Max wait", _seconds(config.max_wait_seconds)),
                ("Window buffer", _seconds(config.window_buffer_seconds)),
                ("Retention", _seconds(config.retention_seconds)),
                ("Max age", _seconds(config.max_age_seconds)),
                ("Encrypt", "yes: payloads are stored encrypted" if config.encrypt else "no"),
            ],
            "settings_form": (form or TopicSettingsForm.of(topic)) if can_change else None,
            "settings_url": _url("django_jobs_topic_action", topic, "settings"),
        }
        return TemplateResponse(request, "django_jobs/admin/topics/topic.html", context)

    def topic_action_view(self, request: HttpRequest, topic: str, action: str) -> HttpResponse:
        """The settings form's POST (``change_topic``)."""
        if action != "settings":
            raise Http404(f"No topic action {action!r}.")
        if not self.has_change_permission(request):
            raise PermissionDenied
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        _check_name(topic)
        if console.topic_detail(using=database(), name=topic, throughput=False) is None:
            raise Http404(f"No topic {topic!r}.")
        form = TopicSettingsForm(request.POST)
        if not form.is_valid():
            return self._render_topic(request, topic, form)
        try:
            django_jobs.topic(topic).configure(**{k: form.cleaned_data[k] for k in SETTINGS})
        except JobsError as exc:
            form.add_error(None, str(exc))
            return self._render_topic(request, topic, form)
        self.message_user(request, f"Settings of topic “{topic}” saved.", messages.SUCCESS)
        return HttpResponseRedirect(_url("django_jobs_topic_dashboard", topic))

    def group_view(self, request: HttpRequest, topic: str, group: str) -> HttpResponse:
        self._check_view(request)
        return self._render_group(request, topic, group)

    def _render_group(self, request: HttpRequest, topic: str, group: str, seek: SeekForm | None = None) -> HttpResponse:
        detail = _group(topic, group, throughput=True)
        assert detail.flow is not None  # asked for
        letters, more = console.dead_letters(using=database(), topic=topic, group=group, limit=DEAD_LETTERS_SHOWN)
        can = {a: request.user.has_perm(f"django_jobs.{p}") for a, p in GROUP_ACTIONS.items()}
        now = detail.now
        context = {
            **self._context(request, f"Group “{group}” of topic “{topic}”"),
            "topic": topic,
            "topic_url": _url("django_jobs_topic_dashboard", topic),
            "group": detail.row,
            "created": moment(detail.created_at),
            "rate": console.shown_rate(detail.row.consumed_per_minute),
            "published_rate": console.shown_rate(None if detail.published is None else detail.published.published),
            "rate_minutes": console.RATE_MINUTES,
            "chart": consumed_chart(
                detail.flow, "group-consumed", f"Messages of {topic} consumed by group {group} per minute, last hour"
            ),
            "partitions": [
                {
                    "p": p,
                    "lease_expires": moment(p.lease_expires_at),
                    "lease_expired": p.lease_expired(now),
                    "retry_at": moment(p.retry_at),
                }
                for p in detail.partitions
            ],
            "encrypted": detail.encrypted,
            "letters": [
                {
                    "l": letter,
                    "payload": console.shown_payload(letter.payload),
                    "error": _cut(console.shown_error(letter.error), 160),
                    "error_title": console.shown_error(letter.error),
                    "created": moment(letter.created_at),
                    "published": moment(letter.published_at),
                }
                for letter in letters
            ],
            "more_letters": more,
            "shown": DEAD_LETTERS_SHOWN,
            "can": can,
            "actions": {a: _url("django_jobs_topic_group_action", topic, group, a) for a in GROUP_ACTIONS},
            "seek_form": seek or SeekForm(),
        }
        return TemplateResponse(request, "django_jobs/admin/topics/group.html", context)

    def group_action_view(self, request: HttpRequest, topic: str, group: str, action: str) -> HttpResponse:
        """POST only (405 otherwise); each needs its permission (403). Delete shows a confirmation
        page first; its form posts again with ``confirm=yes``."""
        if action not in GROUP_ACTIONS:
            raise Http404(f"No group action {action!r}.")
        if not request.user.has_perm(f"django_jobs.{GROUP_ACTIONS[action]}"):
            raise PermissionDenied
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        _group(topic, group, throughput=False)
        control = django_jobs.topic(topic).group(group)
        back = HttpResponseRedirect(_url("django_jobs_topic_group", topic, group))
        try:
            response = getattr(self, f"_{action}")(request, control)
        except _MalformedSelection:
            return HttpResponseBadRequest("Malformed dead letter id in the selection.")
        except JobsError as exc:
            self.message_user(request, str(exc), messages.ERROR)
            return back
        return response or back

    # -- group actions ----------------------------------------------------------------------------

    def _pause(self, request: HttpRequest, control: Any) -> None:
        control.pause()
        self.message_user(request, f"Group “{control.name}” paused: batches out finish, no new one is handed out.")

    def _resume(self, request: HttpRequest, control: Any) -> None:
        control.resume()
        self.message_user(request, f"Group “{control.name}” resumed.")

    def _seek(self, request: HttpRequest, control: Any) -> HttpResponse | None:
        form = SeekForm(request.POST)
        if not form.is_valid():
            return self._render_group(request, control.topic, control.name, seek=form)
        moved = control.seek(form.cleaned_data["target"])
        self.message_user(request, f"Moved {moved} cursor(s) of group “{control.name}”; leases held were cleared.")
        return None

    def _retry(self, request: HttpRequest, control: Any) -> None:
        partition = request.POST.get("partition", "")
        control.retry_partition(partition)
        self.message_user(request, f"Partition “{partition or '(default)'}” unblocked: its batch is delivered again.")

    def _skip(self, request: HttpRequest, control: Any) -> None:
        partition = request.POST.get("partition", "")
        message_id = control.skip_partition(partition)
        self.message_user(
            request,
            f"Partition “{partition or '(default)'}” unblocked: message {message_id} moved to the dead letters."
            if message_id
            else f"Partition “{partition or '(default)'}” unblocked.",
        )

    def _replay(self, request: HttpRequest, control: Any) -> None:
        ids = _selection(request)
        n = control.replay(ids)
        self.message_user(
            request,
            f"{n} dead letter(s) queued for replay: the group's workers run them again."
            if n
            else "No dead letter was queued (none selected, or already replaying).",
            messages.SUCCESS if n else messages.WARNING,
        )

    def _delete(self, request: HttpRequest, control: Any) -> HttpResponse | None:
        ids = _selection(request)
        if ids == []:
            self.message_user(request, "No dead letter selected: nothing was deleted.", messages.WARNING)
            return None
        if request.POST.get("confirm") != "yes":
            letters = control.dead_letters()
            count = letters.count() if ids is None else letters.filter(id__in=ids).count()
            context = {
                **self._context(request, "Delete dead letters?"),
                "topic": control.topic,
                "group": control.name,
                "topic_url": _url("django_jobs_topic_dashboard", control.topic),
                "group_url": _url("django_jobs_topic_group", control.topic, control.name),
                "action_url": _url("django_jobs_topic_group_action", control.topic, control.name, "delete"),
                "ids": ids,
                "count": count,
            }
            return TemplateResponse(request, "django_jobs/admin/topics/confirm.html", context)
        n = control.delete_dead_letters(ids)
        self.message_user(request, f"Deleted {n} dead letter(s) of group “{control.name}”.")
        return None

    # -- helpers ----------------------------------------------------------------------------------

    def _context(self, request: HttpRequest, title: str) -> dict[str, Any]:
        return {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": title,
            "overview_url": reverse("admin:django_jobs_topic_changelist"),
        }

    def _check_view(self, request: HttpRequest) -> None:
        if not self.has_view_or_change_permission(request):
            raise PermissionDenied


def _url(name: str, *args: str) -> str:
    return reverse(f"admin:{name}", args=args)


def _check_name(name: str, what: str = "topic") -> None:
    """404 for a name no topic or group can have."""
    try:
        validate_topic_name(name, what)
    except JobsError:
        raise Http404(f"No {what} {name!r}.") from None


def _group(topic: str, group: str, *, throughput: bool) -> console.GroupDetail:
    _check_name(topic)
    _check_name(group, "group")
    detail = console.group_detail(using=database(), topic=topic, group=group, throughput=throughput)
    if detail is None:
        raise Http404(f"No group {group!r} of topic {topic!r}.")
    return detail


class _MalformedSelection(ValueError):
    pass


def _selection(request: HttpRequest) -> list[int] | None:
    """The dead letters an action acts on: ``one`` (a row's button), the checked ``ids``, or every
    one of the group with ``all=1`` (None). A malformed id raises _MalformedSelection (a 400)."""
    if request.POST.get("all") == "1":
        return None
    picked = [request.POST["one"]] if request.POST.get("one") else request.POST.getlist("ids")
    if not all(i.isdigit() and int(i) < 2**63 for i in picked):
        raise _MalformedSelection
    return [int(i) for i in picked]


def _count(n: float) -> int:
    """A count summed from per-minute figures, which may hold a share of a gap between snapshots."""
    return round(n)


def _seconds(value: float | None) -> str:
    return "–" if value is None else f"{value:g} s"


def _cut(text: str, limit: int) -> str:
    line = text.strip().splitlines()[-1] if text.strip() else ""
    return line if len(line) <= limit else line[: limit - 1] + "…"


__all__ = ["GROUP_ACTIONS", "SeekForm", "TopicAdmin", "TopicSettingsForm"]
