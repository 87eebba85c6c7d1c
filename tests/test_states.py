"""Job states and their projection onto Django's TaskResultStatus."""

from __future__ import annotations

import pytest
from django.tasks import TaskResultStatus

from django_jobs.states import FINISHED_STATES, TRANSITIONS, JobState, to_task_status


@pytest.mark.parametrize(
    ("state", "status"),
    [
        ("waiting", TaskResultStatus.READY),
        ("delayed", TaskResultStatus.READY),
        ("waiting-children", TaskResultStatus.READY),
        ("active", TaskResultStatus.RUNNING),
        ("completed", TaskResultStatus.SUCCESSFUL),
        ("failed", TaskResultStatus.FAILED),
        ("cancelled", TaskResultStatus.FAILED),
    ],
)
def test_each_state_projects_onto_a_django_status(state, status):
    assert to_task_status(state) == status
    assert to_task_status(JobState(state)) == status


def test_the_seven_states_are_exactly_the_schemas_words():
    assert {s.value for s in JobState} == {
        "waiting",
        "delayed",
        "active",
        "completed",
        "failed",
        "waiting-children",
        "cancelled",
    }


def test_unknown_state_has_no_projection():
    with pytest.raises(ValueError):
        to_task_status("paused")


def test_finished_states_project_onto_finished_statuses():
    for state in JobState:
        finished_status = to_task_status(state) in {TaskResultStatus.SUCCESSFUL, TaskResultStatus.FAILED}
        assert finished_status == (state in FINISHED_STATES), state


def test_transitions_use_known_states_and_never_leave_completed():
    known = set(JobState)
    for source, target in TRANSITIONS:
        assert source in known and target in known
        assert source != target
    assert not any(source == JobState.COMPLETED for source, _ in TRANSITIONS)


def test_every_state_is_reachable_from_waiting():
    reachable, frontier = {JobState.WAITING}, [JobState.WAITING]
    while frontier:
        source = frontier.pop()
        for s, target in TRANSITIONS:
            if s == source and target not in reachable:
                reachable.add(target)
                frontier.append(target)
    assert reachable == set(JobState) - {JobState.WAITING_CHILDREN}  # flows create those directly
