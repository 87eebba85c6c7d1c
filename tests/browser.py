"""Fixtures of the admin's browser tests (tests/test_admin_browser.py): a live server, Chromium
driven by Playwright, and one page per test that watches what the browser does.

The browser is Debian's Chromium (``scripts/ensure_chromium.sh`` installs it; ``scripts/test.sh``
exports its path as ``JOBS_CHROMIUM``), never one downloaded by ``playwright install``. Without
Playwright or Chromium the tests are skipped with the reason, except under ``CI=true``, where a
missing browser fails them: no skipped test may hide a failure there.

Every page of a test fails it, at its end, for a console error, an uncaught exception, a dialog
(``alert()`` of an injected script) or a request to any other origin than the live server's.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: Where the screenshots go, under stable names (the directory is in .gitignore).
SCREENSHOTS = ROOT / "test-artifacts" / "screenshots"
VIEWPORT = {"width": 1400, "height": 900}
PASSWORD = "pw-browser-tests"


def missing(reason: str) -> None:
    """Skip the test for a missing browser, or fail it under ``CI=true``."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason} (CI=true: a missing browser fails the browser tests)", pytrace=False)
    pytest.skip(reason)


def chromium_path() -> str | None:
    """``JOBS_CHROMIUM`` when set (it must exist), else ``chromium`` or ``chromium-browser`` on PATH."""
    wanted = os.environ.get("JOBS_CHROMIUM")
    if wanted:
        return wanted if os.path.exists(wanted) else None
    return shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="module")
def live_server_url() -> Iterator[str]:
    """pytest-django's live server (``LiveServer``, a thread of this process serving the test
    database), with the static files of the installed apps: the admin's CSS and JS.

    pytest-django's session ``live_server`` fixture serves static files only with
    ``django.contrib.staticfiles`` installed and ``STATIC_URL`` set, which tests/settings.py does
    not do (its requests then fail with a TypeError in Django's handler). So this fixture starts
    the same server with the staticfiles handler and, when unset, ``STATIC_URL=/static/``.
    Tests using it need ``@pytest.mark.django_db(transaction=True)``: the server thread reads
    committed rows only.
    """
    from django.conf import settings
    from django.contrib.staticfiles.handlers import StaticFilesHandler
    from django.test.utils import override_settings
    from pytest_django.live_server_helper import LiveServer

    static = override_settings(STATIC_URL=settings.STATIC_URL or "/static/")
    static.enable()
    server = LiveServer(os.environ.get("DJANGO_LIVE_TEST_SERVER_ADDRESS") or "localhost", start=False)
    server.thread.static_handler = StaticFilesHandler
    server._live_server_modified_settings.enable()  # ALLOWED_HOSTS += the server's host
    try:
        server.start()
        yield server.url
    finally:
        server.stop()
        server._live_server_modified_settings.disable()
        static.disable()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """One headless Chromium for the module."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        missing("Playwright is not installed (pip install -e '.[dev]')")
    executable = chromium_path()
    if executable is None:
        missing("Chromium is not installed (scripts/ensure_chromium.sh installs it; JOBS_CHROMIUM names it)")
    # Playwright's sync API keeps an asyncio loop marked running in this thread between its
    # calls, so Django would refuse the ORM calls the tests make between two clicks.
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
        with sync_playwright() as playwright:
            chromium = playwright.chromium.launch(executable_path=executable, args=["--no-sandbox"])
            try:
                yield chromium
            finally:
                chromium.close()


@dataclass
class Watched:
    """What a page did that a test must not let pass: console errors, uncaught exceptions,
    dialogs, requests to another origin. ``requests`` lists every URL requested."""

    origin: str
    requests: list[str] = field(default_factory=list)
    console_errors: list[str] = field(default_factory=list)
    page_errors: list[str] = field(default_factory=list)
    dialogs: list[str] = field(default_factory=list)

    def foreign_requests(self) -> list[str]:
        return [url for url in self.requests if not (url == self.origin or url.startswith(self.origin + "/"))]

    def problems(self) -> list[str]:
        return (
            [f"console error: {m}" for m in self.console_errors]
            + [f"uncaught exception: {m}" for m in self.page_errors]
            + [f"dialog opened: {m}" for m in self.dialogs]
            + [f"request to another origin: {u}" for u in self.foreign_requests()]
        )

    def check(self) -> None:
        problems = self.problems()
        assert not problems, "the browser saw:\n" + "\n".join(problems)


@pytest.fixture
def page(browser: Any, live_server_url: str) -> Iterator[Any]:
    """A fresh browser context and page (1400x900, base URL the live server's). ``page.watched``
    (a :class:`Watched`) records what it did; the test fails at its end if anything was wrong."""
    context = browser.new_context(viewport=VIEWPORT, base_url=live_server_url)
    context.set_default_timeout(10_000)
    # Chromium asks every origin for /favicon.ico; the test project has none (a 404 is a console error).
    context.route("**/favicon.ico", lambda route: route.fulfill(status=204, body=""))
    tab = context.new_page()
    watched = Watched(origin=live_server_url)
    tab.on("request", lambda request: watched.requests.append(request.url))
    tab.on("console", lambda message: message.type == "error" and watched.console_errors.append(message.text))
    tab.on("pageerror", lambda error: watched.page_errors.append(str(error)))

    def on_dialog(dialog: Any) -> None:
        watched.dialogs.append(f"{dialog.type}: {dialog.message}")
        dialog.dismiss()

    tab.on("dialog", on_dialog)
    tab.watched = watched
    try:
        yield tab
    finally:
        context.close()
    watched.check()


def login(page: Any, username: str, password: str = PASSWORD, next_url: str = "/admin/") -> None:
    """Log in through the admin's login form and land on ``next_url``."""
    page.goto(f"/admin/login/?next={next_url}")
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    page.click("#login-form input[type=submit]")
    page.wait_for_url(f"**{next_url}")


def screenshot(page: Any, name: str) -> Path:
    """Save the whole page as ``test-artifacts/screenshots/<name>.png``."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path
