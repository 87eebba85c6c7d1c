"""Bus mode (queen's design, issue 16): topics, their messages, and each consumer group's
progress.

* :class:`Topic`: a topic's runtime settings (max size, lease, delay, max wait, window buffer,
  retention, encryption); a topic without a row uses ``DJANGO_JOBS["TOPICS"]`` and the defaults.
* :class:`TopicPartition`: one row per (topic, partition key): the counter that hands out
  positions (its row lock orders a partition's publishers) and the newest message's time.
* :class:`Message`: one row per published message, never one per group. ``position`` counts
  1, 2, 3... within its partition, in commit order, so a cursor is a position.
* :class:`ConsumerGroup`: a group of a topic (paused flag, where it started).
* :class:`GroupCursor`: a group's progress in one partition (queen's ``partition_leases``):
  the last position it consumed, and the lease (token, expiry) of the batch being processed.
* :class:`DeadLetter`: a message a group gave up on, with its error.
* :class:`TopicMetric`: a topic's and each group's running totals (published; acknowledged,
  dead-lettered, expired), recorded once a minute: throughput is the difference of two.

Writes go through :mod:`django_jobs.engine.topics`.
"""

from __future__ import annotations

from datetime import datetime

from django.db import models
from django.db.models import Q


class Topic(models.Model):
    """A topic's runtime settings; ``None`` means "as declared in ``DJANGO_JOBS["TOPICS"]``,
    else the default"."""

    name = models.CharField(primary_key=True, max_length=100)
    #: Publishing past this backlog raises TopicFull (see docs/howto/bus-mode.md).
    max_size = models.PositiveBigIntegerField(null=True, blank=True)
    lease_seconds = models.FloatField(null=True, blank=True)
    #: A message becomes deliverable this long after it is published (queen's delayed_processing).
    delay_seconds = models.FloatField(null=True, blank=True)
    #: A message older than this when its turn comes is skipped and counted as expired.
    max_wait_seconds = models.FloatField(null=True, blank=True)
    #: A partition is handed out only once its newest message is this old.
    window_buffer_seconds = models.FloatField(null=True, blank=True)
    #: A message is deleted this long after publication once every group consumed it...
    retention_seconds = models.FloatField(null=True, blank=True)
    #: ...and this long after publication in any case.
    max_age_seconds = models.FloatField(null=True, blank=True)
    #: Publish its messages' payloads encrypted with ENCRYPTION_KEYS (docs/howto/encryption.md).
    encrypt = models.BooleanField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = "django_jobs_topic"
        ordering = ("name",)
        permissions = [
            ("control_topic", "Can pause, resume and seek consumer groups and retry or skip blocked partitions")
        ]

    def __str__(self) -> str:
        return self.name


class TopicPartition(models.Model):
    """A partition of a topic: its position counter, locked by each publishing transaction."""

    id = models.BigAutoField(primary_key=True)
    topic = models.CharField(max_length=100)
    name = models.CharField(max_length=200, blank=True)
    #: The position of the partition's last message (0: none yet).
    last_position = models.BigIntegerField(default=0)
    newest_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "django_jobs_topic_partition"
        constraints = [models.UniqueConstraint(fields=["topic", "name"], name="django_jobs_topic_partition_name")]

    def __str__(self) -> str:
        return f"{self.topic}/{self.name or '(default)'}"


class Message(models.Model):
    """One published message. An encrypted one's payload is the envelope ``{"$encrypted": token}``
    (``django_jobs.spec.encryption``), whatever its topic's setting is now."""

    id = models.BigAutoField(primary_key=True)
    partition = models.ForeignKey(TopicPartition, on_delete=models.CASCADE, related_name="+")
    topic = models.CharField(max_length=100)
    position = models.BigIntegerField()
    payload = models.JSONField()
    transaction_id = models.CharField(max_length=255, null=True, blank=True)
    trace_id = models.CharField(max_length=64, blank=True, default="")
    created_at = models.DateTimeField()
    available_at = models.DateTimeField()

    class Meta:
        db_table = "django_jobs_message"
        constraints = [
            # The consume path: a group's next batch is a range of this index.
            models.UniqueConstraint(fields=["partition", "position"], name="django_jobs_message_position"),
            # NULLs are distinct on every database: a message without one is never a duplicate.
            models.UniqueConstraint(fields=["topic", "transaction_id"], name="django_jobs_message_transaction"),
        ]

    def __str__(self) -> str:
        return f"{self.topic}#{self.id}"


class ConsumerGroup(models.Model):
    """A consumer group of a topic."""

    id = models.BigAutoField(primary_key=True)
    topic = models.CharField(max_length=100)
    name = models.CharField(max_length=100)
    paused = models.BooleanField(default=False)
    created_at = models.DateTimeField()

    class Meta:
        db_table = "django_jobs_consumer_group"
        constraints = [models.UniqueConstraint(fields=["topic", "name"], name="django_jobs_consumer_group_name")]

    def __str__(self) -> str:
        return f"{self.topic}/{self.name}"


class GroupCursor(models.Model):
    """A group's progress in one partition, and the lease of the batch it is processing."""

    id = models.BigAutoField(primary_key=True)
    partition = models.ForeignKey(TopicPartition, on_delete=models.CASCADE, related_name="+")
    topic = models.CharField(max_length=100)
    group_name = models.CharField(max_length=100)
    #: The last position consumed (acknowledged, dead-lettered or expired).
    position = models.BigIntegerField(default=0)
    lease_token = models.UUIDField(null=True, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    leased_by = models.CharField(max_length=200, blank=True, default="")
    #: When the partition was last handed out: the oldest goes first (round robin).
    leased_at = models.DateTimeField()
    #: Failed attempts at the batch starting after ``position``.
    attempts = models.PositiveIntegerField(default=0)
    #: Not handed out before this time (a retry's backoff, a delayed head message).
    retry_at = models.DateTimeField(null=True, blank=True)
    #: on_failure="block": the partition waits for an operator.
    blocked = models.BooleanField(default=False)
    last_error = models.TextField(blank=True, default="")
    #: What the group consumed in this partition, running totals that never go down (a seek
    #: moves ``position``, not these): messages skipped past ``max_wait``, acknowledged, and
    #: given up to the dead letters. Each is bumped by the statement that moves the cursor, on
    #: this row the consumer updates anyway: counting adds no statement and no shared row.
    expired_count = models.BigIntegerField(default=0)
    acked_count = models.BigIntegerField(default=0)
    dead_lettered_count = models.BigIntegerField(default=0)

    class Meta:
        db_table = "django_jobs_group_cursor"
        constraints = [
            models.UniqueConstraint(fields=["partition", "group_name"], name="django_jobs_group_cursor_partition")
        ]
        indexes = [models.Index(fields=["topic", "group_name", "leased_at"], name="django_jobs_group_cursor_turn")]

    def __str__(self) -> str:
        return f"{self.topic}/{self.group_name} @ {self.position}"


class DeadLetterState(models.TextChoices):
    DEAD = "dead"
    REPLAY = "replay"
    REPLAYING = "replaying"


class DeadLetter(models.Model):
    """A message a group gave up on: a copy of it (retention may delete the original), the
    error, and whether an operator asked to replay it. The payload is copied as stored (an
    envelope when encrypted); the error and traceback of an encrypted topic's dead letter are
    stored encrypted (``spec.encryption.encrypt_text``)."""

    id = models.BigAutoField(primary_key=True)
    topic = models.CharField(max_length=100)
    group_name = models.CharField(max_length=100)
    partition_name = models.CharField(max_length=200, blank=True)
    message_id = models.BigIntegerField()
    position = models.BigIntegerField()
    payload = models.JSONField()
    transaction_id = models.CharField(max_length=255, null=True, blank=True)
    trace_id = models.CharField(max_length=64, blank=True, default="")
    published_at = models.DateTimeField()
    error = models.TextField(blank=True, default="")
    traceback = models.TextField(blank=True, default="")
    attempts = models.PositiveIntegerField(default=0)
    state = models.CharField(max_length=10, choices=DeadLetterState.choices, default=DeadLetterState.DEAD)
    lease_token = models.UUIDField(null=True, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField()

    class Meta:
        db_table = "django_jobs_dead_letter"
        ordering = ("id",)
        permissions = [("replay_deadletter", "Can replay dead letters")]
        indexes = [
            models.Index(fields=["topic", "group_name", "state"], name="django_jobs_dead_letter_group"),
        ]
        constraints = [
            models.CheckConstraint(
                condition=Q(state__in=["dead", "replay", "replaying"]), name="django_jobs_dead_letter_state"
            )
        ]

    def __str__(self) -> str:
        return f"{self.topic}/{self.group_name} dead letter {self.id}"


class TopicMetricQuerySet(models.QuerySet):
    """The reads of the throughput figures (admin, ``manage.py jobs topics``)."""

    def since(self, since: datetime, *, topic: str | None = None) -> models.QuerySet:
        """The rows of minutes from ``since`` on (of one topic or all), by series then minute,
        through the unique index (one topic) or the minute index (all)."""
        rows = self.filter(minute__gte=since)
        if topic is not None:
            rows = rows.filter(topic=topic)
        return rows.order_by("topic", "group_name", "minute")


class TopicMetric(models.Model):
    """The running totals of a topic (``group_name`` "") or of one of its groups at one moment
    of one minute, written by the worker's :class:`~django_jobs.services.TopicRecorder` at most
    once per (topic, group, minute) (a unique constraint decides between two writers).

    A topic's row holds ``published`` (its partitions' last positions summed); a group's row
    the sums of its cursors' counters (``acked``, ``dead_lettered``, ``expired``; ``published``
    is 0). Messages per minute are the differences of consecutive rows of a series, over the
    time between their ``taken_at``. The pruner deletes rows older than ``METRICS_KEEP_DAYS``.
    """

    id = models.BigAutoField(primary_key=True)
    topic = models.CharField(max_length=100)
    #: "": the topic itself (its published total); else a consumer group.
    group_name = models.CharField(max_length=100, blank=True, default="")
    minute = models.DateTimeField()
    #: When the totals were read (the database's clock on PostgreSQL), within ``minute``.
    taken_at = models.DateTimeField()
    published = models.BigIntegerField(default=0)
    acked = models.BigIntegerField(default=0)
    dead_lettered = models.BigIntegerField(default=0)
    expired = models.BigIntegerField(default=0)

    objects = TopicMetricQuerySet.as_manager()

    class Meta:
        db_table = "django_jobs_topic_metric"
        ordering = ("topic", "group_name", "minute")
        constraints = [
            models.UniqueConstraint(fields=["topic", "group_name", "minute"], name="django_jobs_topic_metric_minute")
        ]
        indexes = [models.Index(fields=["minute"], name="django_jobs_tmetric_minute_idx")]

    def __str__(self) -> str:
        return f"{self.topic}/{self.group_name or '(published)'} {self.minute:%Y-%m-%d %H:%M}"
