#!/usr/bin/env bash
# Create .venv with the newest Python >= 3.12 that actually runs, and install django-db-jobs
# (editable) with its dev extras (which hold the optional prometheus-client and cryptography the
# tests use; re-run when pyproject.toml changes), then mysqlclient (the mysql extra) for the MariaDB half of the
# tests. Idempotent: re-running only installs what changed.
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

# mysqlclient (the mysql extra: keep the requirement in step with pyproject.toml) for the MariaDB
# tests. Installed apart from the dev extra so a failed build never blocks the rest: it is a C
# extension built from source on Linux (PyPI has no Linux wheels), needing pkg-config, the
# MariaDB/MySQL client headers, a C compiler and Python's headers. If the first build fails, the
# Debian packages that are missing are installed (apt-get, non-interactive) and the build retried.
# A failure is a warning here; scripts/test.sh fails the MariaDB half if it is enabled.
MYSQLCLIENT='mysqlclient>=2.2'

pip_mysqlclient() {
  .venv/bin/python -m pip install --quiet --disable-pip-version-check "$MYSQLCLIENT"
}

missing_debs() {
  # libmariadb-dev: the client headers and libmariadb.pc (what Debian's default-libmysqlclient-dev pulls in).
  local p want=(pkg-config gcc libmariadb-dev)
  if [ ! -f "$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["include"])')/Python.h" ]; then
    want+=(python3-dev)  # only helps a Debian-built Python; pyenv and python.org builds ship their headers
  fi
  for p in "${want[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || echo "$p"
  done
}

install_debs() {
  local sudo=()
  if [ "$(id -u)" != 0 ]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then sudo=(sudo -n); else return 1; fi
  fi
  command -v apt-get >/dev/null 2>&1 || return 1
  echo "Installing Debian packages for mysqlclient: $*"
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq &&
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

if ! .venv/bin/python -c 'import MySQLdb' 2>/dev/null; then
  if ! pip_mysqlclient 2>/tmp/mysqlclient-build.$$.log; then
    debs=$(command -v dpkg-query >/dev/null 2>&1 && missing_debs | tr '\n' ' ') || debs=
    if [ -n "${debs// /}" ] && install_debs $debs && pip_mysqlclient 2>>/tmp/mysqlclient-build.$$.log; then
      :
    else
      echo "WARNING: mysqlclient did not build, so the MariaDB/MySQL tests cannot run here." >&2
      [ -n "${debs// /}" ] && echo "         Missing Debian packages: $debs" >&2
      tail -n 15 /tmp/mysqlclient-build.$$.log >&2
    fi
  fi
  rm -f /tmp/mysqlclient-build.$$.log
fi
