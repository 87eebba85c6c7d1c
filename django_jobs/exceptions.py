"""The django-jobs exception family. Each class's docstring is its default message."""

from django.core.exceptions import ImproperlyConfigured
from django.tasks.exceptions import InvalidTask


class JobsError(Exception):
    """A django-jobs error."""

    def __init__(self, message: str | None = None):
        super().__init__(message or (self.__doc__ or "").strip())


class InvalidTaskArguments(JobsError, InvalidTask, TypeError):
    """Task arguments must be JSON: str, int, finite float, bool, None, list and dict with string keys."""


class InvalidArgumentValue(InvalidTaskArguments, ValueError):
    """A task argument has a value JSON or the database cannot store (NaN, infinity, a NUL character, a
    lone surrogate, bytes that are not UTF-8); pass finite numbers and valid text."""


class ArgumentTooDeep(InvalidArgumentValue):
    """The task's arguments nest lists and dicts deeper than django_jobs.backend.MAX_JSON_DEPTH levels;
    flatten them, or store the structure elsewhere and pass its key."""


class ArgumentOutOfRange(InvalidArgumentValue):
    """A task argument is an integer with more digits than Python's JSON reader accepts (4,300 by
    default); pass it as a string and convert it in the task."""


class PayloadTooLarge(InvalidArgumentValue):
    """The job's arguments are larger than MAX_PAYLOAD_BYTES; store big data elsewhere and pass a key."""


class InvalidQueueName(JobsError, InvalidTask):
    """Queue names are 1-100 characters of letters, digits, '_', '-', '.' and ':'."""


class InvalidTaskOptions(JobsError, InvalidTask):
    """A django-jobs task option has an invalid value."""


class InvalidOptionType(InvalidTaskOptions, TypeError):
    """A task option has the wrong type: priority is an int from -100 to 100, run_after an aware
    datetime or a timedelta."""


class RunAfterOutOfRange(InvalidTaskOptions, ValueError):
    """run_after is further ahead than the MAX_RUN_AFTER setting allows (default 10 years); check it
    for a typo, or raise the setting."""


class JobsConfigurationError(JobsError, ImproperlyConfigured):
    """django-jobs is misconfigured; run `manage.py check` for details."""


class PrometheusClientMissing(JobsConfigurationError):
    """Prometheus metrics need the prometheus-client library, which is not installed: run
    `pip install "django-db-jobs[prometheus]"`."""


class CryptographyMissing(JobsConfigurationError):
    """Encrypted jobs need the cryptography library, which is not installed: run
    `pip install "django-db-jobs[encryption]"`."""


class EncryptionKeysMissing(JobsConfigurationError):
    """This job is to be stored encrypted (encrypt=True), but DJANGO_JOBS["ENCRYPTION_KEYS"] is empty;
    nothing was enqueued. Add a key (see docs/howto/encryption.md)."""


class InvalidEncryptionKeys(JobsConfigurationError):
    """DJANGO_JOBS["ENCRYPTION_KEYS"] must be a list of Fernet keys (Fernet.generate_key()), the first
    one encrypting; see docs/howto/encryption.md."""


class DecryptionFailed(JobsError):
    """None of DJANGO_JOBS["ENCRYPTION_KEYS"] decrypts this value: the key that encrypted it was removed
    (or never configured here), or the stored value was altered."""


class InvalidKeyRotation(JobsError, ValueError):
    """A key rotation option has an invalid value: batch_size is an integer from 1 to 10,000, after a job id."""


class InvalidWorkerOption(JobsError, ValueError):
    """A worker option has an invalid value."""


class InvalidRetention(JobsError, ValueError):
    """A retention policy is malformed."""


class InvalidSchedule(JobsError, ValueError):
    """The schedule is invalid; nothing was saved."""


class InvalidEventCursor(JobsError, ValueError):
    """An event cursor is malformed: pass the ``cursor`` of an earlier page, ``"latest"`` or None."""


class TaskNotFound(JobsError):
    """The job's task path does not resolve to a Task instance; was the task renamed or removed?"""


class NonJSONReturnValue(JobsError, TypeError):
    """The task returned a value that is not JSON; return str, int, float, bool, None, list or dict."""


class OutcomeNotStored(JobsError):
    """The database refused to store the job's outcome (for example its return value)."""


class WorkerCrashed(JobsError):
    """The worker met a database error that retrying cannot fix; is the database migrated?"""


class JobStalled(JobsError):
    """The job's worker stopped renewing its lease too many times (it crashed or was killed)."""


class JobTimeout(JobsError):
    """The attempt ran past the task's timeout and was given up."""


class JobCancelled(JobsError):
    """The job was cancelled while it ran (``django_jobs.cancel``)."""


class JobNotRetryable(JobsError):
    """Only failed or cancelled jobs can be retried."""


class ChildProcessDied(JobsError):
    """The child process running the job (``--isolation process``) died before it answered."""


class InvalidFlow(JobsError, ValueError):
    """The flow cannot be enqueued as given; nothing was inserted."""


class ChildFailed(JobsError):
    """A child of this flow job failed, and its failure_policy "fail" failed the parent too."""


class QueueFull(JobsError):
    """The queue (or partition) would pass its max size of unfinished jobs; nothing was
    enqueued. Wait for workers to catch up, or raise the limit."""

    def __init__(
        self,
        message: str | None = None,
        *,
        queue: str = "",
        size: int = 0,
        limit: int = 0,
        adding: int = 1,
        partition: str | None = None,
    ):
        self.queue, self.size, self.limit, self.adding, self.partition = queue, size, limit, adding, partition
        if message is None:
            where = f"Partition {partition!r} of queue {queue!r}" if partition is not None else f"Queue {queue!r}"
            what = "this job" if adding == 1 else f"these {adding} jobs"
            message = (
                f"{where} is full: {size} unfinished job(s), max size {limit}; {what} would pass it, so nothing "
                "was enqueued. Retry later (workers free room as jobs finish), or raise the limit with "
                f"django_jobs.queue({queue!r}).set_{'partition_' if partition is not None else ''}max_size(...)."
            )
        super().__init__(message)


class QueueBusy(JobsError):
    """The queue has running jobs; pass force=True to remove them anyway."""


class InvalidQueueSetting(JobsError, ValueError):
    """A queue limit has an invalid value."""


class InvalidHealthOption(JobsError, ValueError):
    """A health check option has an invalid value; see docs/howto/health-checks.md for the options."""


class DatabaseUnavailable(JobsError):
    """The database could not be reached."""


class JobAction(Exception):  # noqa: N818 - these are instructions, not errors
    """Raised by a task to tell the worker what to do with this attempt. Import the subclasses
    from ``django_jobs``; ``JobContext.fail/retry/snooze`` raise them for you."""


class Fail(JobAction):
    """Fail the job for good now, whatever attempts remain.

    ``Fail("message")`` records the message; ``Fail(exc)`` records that exception as the error.
    """

    def __init__(self, error_or_message: BaseException | str | None = None):
        self.error = error_or_message if isinstance(error_or_message, BaseException) else None
        super().__init__(str(error_or_message) if error_or_message is not None else "failed by the task")


class Retry(JobAction):
    """Give this attempt up and run again after ``delay`` seconds (default: the task's backoff).

    Counts as a failed attempt: with no attempts left the job fails. ``error`` (an exception or a
    message) is what the attempt records.
    """

    def __init__(self, error: BaseException | str | None = None, delay: float | None = None):
        if delay is not None and (not isinstance(delay, (int, float)) or isinstance(delay, bool) or delay < 0):
            raise ValueError(f"Retry delay must be a number of seconds >= 0 or None; got {delay!r}.")
        self.error = error if isinstance(error, BaseException) else None
        self.delay = delay
        super().__init__(str(error) if error is not None else "retry requested by the task")


class Snooze(JobAction):
    """Run the job again after ``seconds`` without counting this attempt (Oban's snooze)."""

    def __init__(self, seconds: float):
        if not isinstance(seconds, (int, float)) or isinstance(seconds, bool) or not seconds > 0:
            raise ValueError(f"Snooze needs a number of seconds > 0; got {seconds!r}.")
        self.seconds = float(seconds)
        super().__init__(f"snoozed for {seconds}s")


# -- bus mode (topics) ------------------------------------------------------------------------------


class InvalidTopicName(JobsError, ValueError):
    """Topic and consumer group names are 1-100 characters of letters, digits, '_', '-', '.' and ':'."""


class InvalidPublishOption(JobsError, ValueError):
    """A publish option has an invalid value: partition is a string of at most 200 characters,
    transaction_id a non-empty string of at most 255, delay a number of seconds >= 0 or a timedelta."""


class InvalidTopicSetting(JobsError, ValueError):
    """A topic setting has an invalid value; see docs/reference/settings.md#topics."""


class InvalidSubscriber(JobsError, ValueError):
    """A subscriber option has an invalid value; see docs/howto/bus-mode.md#subscribers."""


class InvalidSeek(JobsError, ValueError):
    """seek() takes "beginning", "end", an aware datetime or the id of a message of the topic."""


class TopicFull(QueueFull):
    """The topic would pass its max size; nothing was published."""

    def __init__(self, message: str | None = None, *, topic: str = "", size: int = 0, limit: int = 0, adding: int = 1):
        if message is None and not topic:
            message = (self.__doc__ or "").strip()
        elif message is None:
            what = "this message" if adding == 1 else f"these {adding} messages"
            message = (
                f"Topic {topic!r} is full: its largest backlog is {size} message(s), max size {limit}; {what} would "
                f"pass it, so nothing was published. Retry later, or raise the limit with "
                f"django_jobs.topic({topic!r}).configure(max_size=...)."
            )
        super().__init__(message, queue=topic, size=size, limit=limit, adding=adding)
        self.topic = topic


class LeaseLost(JobsError):
    """The partition's lease was lost (it expired and another worker took the partition, or an
    operator moved the cursor): this acknowledgement was refused and nothing changed."""


class PartitionNotBlocked(JobsError, ValueError):
    """The partition of this group is not blocked: there is nothing to retry or skip."""
