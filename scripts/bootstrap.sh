#!/usr/bin/env bash
# Create .venv with the newest Python >= 3.12 that actually runs, and install django-db-jobs
# (editable) with its dev extras. Idempotent: re-running only installs what changed.
set -euo pipefail
cd "$(dirname "$0")/.."

find_python() {
  local c
  for c in python3.14 python3.13 python3.12; do
    if command -v "$c" >/dev/null 2>&1 && "$c" -c 'import sys; assert sys.version_info >= (3, 12)' >/dev/null 2>&1; then
      command -v "$c"; return 0
    fi
  done
  if [ -n "${PYENV_ROOT:-}" ] || [ -d "$HOME/.pyenv" ]; then
    local root="${PYENV_ROOT:-$HOME/.pyenv}"
    for c in $(ls -d "$root"/versions/3.1[2-9]*/bin/python3 2>/dev/null | sort -V -r); do
      if "$c" -c 'import sys; assert sys.version_info >= (3, 12)' >/dev/null 2>&1; then
        echo "$c"; return 0
      fi
    done
  fi
  for c in python3 python; do
    if command -v "$c" >/dev/null 2>&1 && "$c" -c 'import sys; assert sys.version_info >= (3, 12)' >/dev/null 2>&1; then
      command -v "$c"; return 0
    fi
  done
  return 1
}

if [ ! -x .venv/bin/python ] || ! .venv/bin/python -c 'import sys; assert sys.version_info >= (3, 12)' 2>/dev/null; then
  if ! PY=$(find_python); then
    echo "ERROR: django-jobs needs Python 3.12 or newer (Django 6 does), and none was found." >&2
    echo "       Tried python3.14/3.13/3.12 on PATH, \$PYENV_ROOT/versions/3.1x, python3. Install one and retry." >&2
    exit 1
  fi
  echo "Creating .venv with $PY ($("$PY" -c 'import sys; print(sys.version.split()[0])'))"
  rm -rf .venv
  "$PY" -m venv .venv
fi

stamp=.venv/.installed-$(sha1sum pyproject.toml | cut -c1-12)
if [ ! -f "$stamp" ]; then
  .venv/bin/python -m pip install --quiet --disable-pip-version-check --upgrade pip
  .venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[dev]'
  rm -f .venv/.installed-*
  touch "$stamp"
fi
