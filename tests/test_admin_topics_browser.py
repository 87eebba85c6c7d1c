"""The topic pages in a real browser (Chromium through Playwright, tests/browser.py): they fit
1280 px with the sidebar open, read in dark mode, and their buttons act (pause, replay, a
delete confirmed on its own page). Screenshots: topics.png, topic-group.png (and -dark)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.test import override_settings
from django.utils import timezone

import django_jobs
from django_jobs.engine import topics as bus
from django_jobs.models import ConsumerGroup, DeadLetter
from tests import browser as browser_fixtures
from tests.browser import PASSWORD, login, screenshot
from tests.test_admin_browser import contrast, luminance, style

browser = browser_fixtures.browser
live_server_url = browser_fixtures.live_server_url
page = browser_fixtures.page

pytestmark = pytest.mark.django_db(transaction=True)

TOPICS = "/admin/django_jobs/topic/"
GROUP = f"{TOPICS}orders.placed/dashboard/group/billing-service/"
LATER = timezone.now() + timedelta(days=1)


@pytest.fixture(scope="module", autouse=True)
def fast_password_hashing():
    with override_settings(PASSWORD_HASHERS=["django.contrib.auth.hashers.MD5PasswordHasher"]):
        yield


def seed() -> None:
    """A topic of three groups over four partitions with long names, a lease held, a blocked
    partition and dead letters with long errors and payloads."""
    topic = "orders.placed"
    for group in ("billing-service", "email-notifications", "analytics-warehouse-loader"):
        bus.ensure_group(topic, group, start_from="beginning", using="default")
    t = django_jobs.topic(topic)
    for p in ("customer-000000000000000000000001", "customer-000000000000000000000002", "eu-west", ""):
        t.publish_many(
            [{"payload": {"order": i, "html": "<b>bold</b>", "note": "x" * 400}, "partition": p} for i in range(6)]
        )
    for _ in range(3):
        b = bus.acquire_batch(topic, "billing-service", batch_size=1, worker_id="w", using="default", now=LATER)
        error = "payments.gateway.CardDeclinedError: " + "the issuer refused the card " * 8
        bus.fail_batch(b, error=error, max_attempts=1, using="default", now=LATER)
    b = bus.acquire_batch(topic, "email-notifications", batch_size=1, worker_id="w", using="default", now=LATER)
    bus.fail_batch(b, error="smtplib.SMTPServerDisconnected: " + "y" * 300, max_attempts=1, on_failure="block",
                   using="default", now=LATER)  # fmt: skip
    bus.acquire_batch(
        topic, "billing-service", batch_size=2, worker_id="web-1.example.internal:4242:0123456789abcdef",
        using="default",
    )  # fmt: skip


def superuser(page) -> None:
    User.objects.create_superuser("root", password=PASSWORD)
    login(page, "root")


def wide_tables(page) -> int:
    return page.evaluate(
        "() => [...document.querySelectorAll('.jobs-scroll')].filter(b => b.scrollWidth > b.clientWidth + 1).length"
    )


def test_the_topic_pages_fit_1280_pixels_with_the_sidebar_open_in_light_and_dark(page):
    seed()
    superuser(page)
    page.set_viewport_size({"width": 1280, "height": 900})
    for url, shot in ((TOPICS, "topics"), (f"{TOPICS}orders.placed/dashboard/", "topic"), (GROUP, "topic-group")):
        page.goto(url)
        assert page.locator("#nav-sidebar").is_visible(), "the sidebar is open"
        assert wide_tables(page) == 0, f"{url}: no table scrolls sideways at 1280 px"
        assert page.evaluate("document.documentElement.scrollWidth <= document.documentElement.clientWidth"), url
        screenshot(page, shot)
    assert "web-1.example.internal:4242" in page.locator("#jobs-partitions").inner_text(), "the lease's holder"
    assert "<b>bold</b>" in page.locator("#jobs-dead-letters").inner_text(), "markup in a payload shows as text"
    page.emulate_media(color_scheme="dark")
    page.goto(GROUP)
    screenshot(page, "topic-group-dark")
    body_bg = style(page, "body", "backgroundColor")
    assert luminance(body_bg) < 0.05, f"the admin's dark theme applies (body background {body_bg})"
    figure = style(page, '#jobs-partitions td[data-figure="lag"]', "color")
    assert contrast(figure, body_bg) >= 4.5, f"table figures {figure} on {body_bg}"
    assert wide_tables(page) == 0


def test_group_buttons_pause_replay_and_delete_after_confirming(page):
    seed()
    superuser(page)
    page.goto(GROUP)
    page.get_by_role("button", name="Pause group").click()
    page.wait_for_url(f"**{GROUP}")
    assert ConsumerGroup.objects.get(name="billing-service").paused
    first = DeadLetter.objects.filter(group_name="billing-service").order_by("id").first()
    page.locator(f'tr[data-letter="{first.id}"] button', has_text="Replay").click()
    page.wait_for_url(f"**{GROUP}")
    first.refresh_from_db()
    assert first.state == "replay"
    page.locator('#jobs-dead-letters input[name="ids"]').nth(0).check()
    page.locator("#jobs-delete-selected").click()
    assert "This deletes 1 dead letter(s)" in page.locator("#jobs-confirm-summary").inner_text()
    assert DeadLetter.objects.filter(group_name="billing-service").count() == 3
    page.get_by_role("button", name="Yes, delete them").click()
    page.wait_for_url(f"**{GROUP}")
    assert DeadLetter.objects.filter(group_name="billing-service").count() == 2
