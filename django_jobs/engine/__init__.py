"""The only writer of job state.

Every transition lives here: insert, claim, record outcomes (complete / retry / fail), release,
renew leases, promote, rescue, and the worker-table bookkeeping. Admin actions, the worker, the
backend and the CLI call these functions; nothing else updates a job row.

Rules every function follows:

* Each state change is guarded on the state it expects (and, for active jobs, on the lease
  token). Zero rows updated means another actor won a race: we log it and move on.
* Time is a parameter: ``now=None`` means the database clock where the driver has
  ``DATABASE_CLOCK`` (PostgreSQL: leases must not depend on the clocks of many worker hosts)
  and this process's clock elsewhere.
* The hot paths (claim, record outcomes) are one statement where the database allows it,
  because they run thousands of times a second and one round trip beats three. What differs
  between databases is asked of the database's driver (:mod:`django_jobs.drivers`): its
  capability flags, its spellings, and its verbs; no module here branches on a vendor.

One module per group of verbs; this package re-exports their public names, so callers
write ``engine.claim_jobs(...)``. Inside the package, modules import downward only::

    common <- effects <- partitions <- insert <- dedup, flows <- claim, outcomes, control,
    schedules, queues, maintenance, workers, keys
"""

from ..drivers.base import UNFINISHED_SQL
from ..models import known_queues  # its name here before the models' became the one definition
from ..spec.newjob import NewJob
from .claim import claim_gated_jobs, claim_jobs, gated_queues
from .common import (
    CANCEL_PREFIX,
    DROPPED,
    EVENT_TABLE,
    INSERT_CHUNK,
    JOB_TABLE,
    METRIC_TABLE,
    QUEUE_TABLE,
    START_TABLE,
    ClaimedJob,
    NewRow,
    Outcome,
    events_channel,
    events_enabled,
    ready_seq,
)
from .control import (
    CancelResult,
    append_job_log,
    cancel_job,
    cancel_requested_ids,
    is_cancel_requested,
    retry_job,
    set_progress,
)
from .dedup import (
    DEDUP_NEXT_TABLE,
    DEDUP_TABLE,
    DedupOutcome,
    delete_expired_dedup_keys,
    enqueue_deduplicated,
    insert_job_once,
    promote_dedup_stashes,
)
from .effects import notify, write_events
from .flows import FlowJob, FlowParentNotWaiting, cancel_descendants, children_values, insert_flow, settle_dependencies
from .insert import (
    InsertedJobs,
    PlainJob,
    insert_job,
    insert_jobs,
    insert_new_job,
    insert_plain_job,
    pipelined,
    plain_job,
)
from .keys import KINDS as ENCRYPTED_KINDS
from .keys import RotatedBatch, rotate_encrypted
from .maintenance import (
    RescuedJob,
    delete_jobs,
    make_due,
    promote_due_jobs,
    prune_expired_jobs,
    prune_over_count,
    rescue_stalled_jobs,
    trim_events,
    trim_metrics,
)
from .outcomes import record_outcomes, release_jobs, renew_leases
from .partitions import unblock_partitions
from .queues import (
    is_queue_paused,
    metric_queues,
    queue_counts,
    set_queue_paused,
    sync_queue_declarations,
    update_queue_state,
)
from .schedules import advance_schedule
from .workers import (
    heartbeat_worker,
    leader_id,
    register_worker,
    remove_dead_workers,
    resign_leadership,
    take_leadership,
    unregister_worker,
)

__all__ = [
    "CANCEL_PREFIX",
    "DROPPED",
    "CancelResult",
    "ClaimedJob",
    "DEDUP_NEXT_TABLE",
    "DEDUP_TABLE",
    "DedupOutcome",
    "ENCRYPTED_KINDS",
    "EVENT_TABLE",
    "FlowJob",
    "FlowParentNotWaiting",
    "INSERT_CHUNK",
    "InsertedJobs",
    "JOB_TABLE",
    "METRIC_TABLE",
    "NewJob",
    "NewRow",
    "Outcome",
    "QUEUE_TABLE",
    "RescuedJob",
    "RotatedBatch",
    "START_TABLE",
    "UNFINISHED_SQL",
    "advance_schedule",
    "append_job_log",
    "cancel_descendants",
    "cancel_job",
    "cancel_requested_ids",
    "children_values",
    "claim_gated_jobs",
    "claim_jobs",
    "delete_expired_dedup_keys",
    "delete_jobs",
    "enqueue_deduplicated",
    "events_channel",
    "events_enabled",
    "gated_queues",
    "heartbeat_worker",
    "insert_flow",
    "insert_job",
    "insert_job_once",
    "insert_jobs",
    "pipelined",
    "insert_new_job",
    "insert_plain_job",
    "PlainJob",
    "plain_job",
    "is_cancel_requested",
    "is_queue_paused",
    "known_queues",
    "leader_id",
    "resign_leadership",
    "take_leadership",
    "make_due",
    "metric_queues",
    "notify",
    "promote_dedup_stashes",
    "promote_due_jobs",
    "prune_expired_jobs",
    "prune_over_count",
    "queue_counts",
    "ready_seq",
    "record_outcomes",
    "register_worker",
    "release_jobs",
    "remove_dead_workers",
    "renew_leases",
    "rescue_stalled_jobs",
    "retry_job",
    "rotate_encrypted",
    "set_progress",
    "set_queue_paused",
    "settle_dependencies",
    "sync_queue_declarations",
    "trim_events",
    "trim_metrics",
    "unblock_partitions",
    "unregister_worker",
    "update_queue_state",
    "write_events",
]
