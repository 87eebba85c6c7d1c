#!/usr/bin/env bash
# Make sure Debian's Chromium is installed for the browser tests (tests/test_admin_browser.py,
# driven by Playwright with executable_path). Prints the browser's path on success.
# Exit 0: found or installed; 3: not installable here (not root, or no apt).
set -uo pipefail
for c in chromium chromium-browser; do
  if command -v "$c" >/dev/null 2>&1; then command -v "$c"; exit 0; fi
done
if [ "$(id -u)" != "0" ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "Chromium is not installed and cannot be installed here (needs root and apt-get)." >&2
  exit 3
fi
echo "Installing Debian's chromium for the browser tests (once)..." >&2
export DEBIAN_FRONTEND=noninteractive
if ! apt-get install -y -q --no-install-recommends chromium >/tmp/django-jobs-chromium-install.log 2>&1; then
  apt-get update -q >>/tmp/django-jobs-chromium-install.log 2>&1
  apt-get install -y -q --no-install-recommends chromium >>/tmp/django-jobs-chromium-install.log 2>&1 || {
    echo "apt-get install chromium failed; see /tmp/django-jobs-chromium-install.log" >&2
    exit 3
  }
fi
command -v chromium
