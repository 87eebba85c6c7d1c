"""The worker sends Django's task signals through django_jobs.dispatch.TaskSignal, which keeps each
sender's receivers between sends: it must call what ``send_robust`` calls, in order, see
connects and disconnects at once, let weakly-referenced receivers die, log a raising receiver
and go on, and hand async receivers to Django."""

from __future__ import annotations

import gc
import logging

import pytest
from django.dispatch import Signal

from django_jobs.dispatch import TaskSignal


class SenderA:
    pass


class SenderB:
    pass


class Result:
    id = "job-1"


RESULT = Result()


def test_it_calls_the_receivers_send_robust_calls_in_order_with_the_same_arguments():
    signal, calls = Signal(), []

    def first(signal, sender, task_result, **kw):
        calls.append(("first", sender, task_result, kw))

    def only_b(signal, sender, task_result, **kw):
        calls.append(("only_b", sender, task_result, kw))

    def last(signal, sender, task_result, **kw):
        calls.append(("last", sender, task_result, kw))

    signal.connect(first)
    signal.connect(only_b, sender=SenderB)
    signal.connect(last)
    sender = TaskSignal(signal)
    for who in (SenderA, SenderB, SenderA):
        sender.send(who, RESULT)
    ours, calls[:] = list(calls), []
    for who in (SenderA, SenderB, SenderA):
        signal.send_robust(sender=who, task_result=RESULT)
    assert ours == calls
    assert [c[0] for c in ours] == ["first", "last", "first", "only_b", "last", "first", "last"]


def test_connects_and_disconnects_show_at_the_next_send():
    signal, calls = Signal(), []

    def a(**kw):
        calls.append("a")

    def b(**kw):
        calls.append("b")

    sender = TaskSignal(signal)
    sender.send(SenderA, RESULT)  # no receivers yet
    signal.connect(a)
    sender.send(SenderA, RESULT)
    signal.connect(b)
    sender.send(SenderA, RESULT)
    signal.disconnect(a)
    sender.send(SenderA, RESULT)
    signal.disconnect(b)
    signal.connect(a)  # the same number of receivers as before, another one
    sender.send(SenderA, RESULT)
    assert calls == ["a", "a", "b", "b", "a"]


def test_a_weak_receiver_is_not_kept_alive_and_is_skipped_once_collected():
    signal, calls = Signal(), []

    class Owner:
        def receive(self, **kw):
            calls.append("owner")

    owner = Owner()
    signal.connect(owner.receive)  # weak: a bound method of owner
    sender = TaskSignal(signal)
    sender.send(SenderA, RESULT)
    alive = __import__("weakref").ref(owner)
    del owner
    gc.collect()
    assert alive() is None  # the cache did not keep it
    sender.send(SenderA, RESULT)
    sender.send(SenderA, RESULT)
    assert calls == ["owner"]
    assert signal.receivers == []  # Django's sweep ran (through send_robust)


def test_a_raising_receiver_is_logged_and_the_others_still_run(caplog):
    signal, calls = Signal(), []

    def bad(**kw):
        raise ValueError("receiver bug")

    def good(**kw):
        calls.append("good")

    signal.connect(bad)
    signal.connect(good)
    with caplog.at_level(logging.ERROR):
        TaskSignal(signal).send(SenderA, RESULT)
    assert calls == ["good"]
    assert any("raised for job job-1" in r.getMessage() and r.exc_info for r in caplog.records)


def test_an_async_receiver_goes_through_django():
    signal, calls = Signal(), []

    async def later(**kw):
        calls.append("async")

    def now(**kw):
        calls.append("sync")

    signal.connect(later)
    signal.connect(now)
    TaskSignal(signal).send(SenderA, RESULT)
    assert sorted(calls) == ["async", "sync"]


@pytest.mark.parametrize("times", [1, 3])
def test_the_worker_sends_djangos_task_signals_through_it(times):
    from django.tasks.signals import task_finished, task_started

    from django_jobs.worker import executor

    calls = []

    def receiver(sender, task_result, **kw):
        calls.append(task_result.id)

    task_started.connect(receiver)
    try:
        for _ in range(times):
            executor._send(task_started, SenderA, RESULT)
            executor._send(task_finished, SenderA, RESULT)  # not connected there
    finally:
        task_started.disconnect(receiver)
    assert calls == ["job-1"] * times
    assert isinstance(executor._SIGNALS[task_started], TaskSignal)
