#!/usr/bin/env bash
# make test: install what tests need, start PostgreSQL if needed, run the whole suite on SQLite
# and on PostgreSQL, then makemigrations --check. Extra arguments go to pytest.
set -uo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh || exit 1
PY=.venv/bin/python
status=0

echo "== makemigrations --check"
$PY example_project/manage.py makemigrations --check --dry-run || status=1

echo "== ruff"
$PY -m ruff check --quiet . || status=1

echo "== package: build, twine check, install the wheel in a fresh venv, run the demo"
scripts/check_package.sh || status=1

echo "== browser for the admin's browser tests"
if JOBS_CHROMIUM=$(scripts/ensure_chromium.sh); then
  export JOBS_CHROMIUM
else
  echo "!! Chromium is missing: the browser tests will fail under CI=true and be skipped otherwise." >&2
fi

echo "== tests on SQLite"
JOBS_TEST_DB=sqlite $PY -m pytest "$@" || status=1

scripts/ensure_postgres.sh
pg=$?
if [ $pg -eq 0 ]; then
  echo "== tests on PostgreSQL"
  JOBS_TEST_DB=postgres $PY -m pytest "$@" || status=1
elif [ $pg -eq 3 ]; then
  echo
  echo "!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!"
  echo "!! No PostgreSQL server is installed on this machine: the PostgreSQL half of  !!"
  echo "!! the suite did NOT run. Install PostgreSQL to run it.                       !!"
  echo "!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!"
  if [ "${CI:-}" = "true" ]; then
    echo "CI=true: a missing PostgreSQL is a failure." >&2
    status=1
  fi
else
  echo "PostgreSQL could not be started; failing." >&2
  status=1
fi
[ $status -eq 0 ] && echo "== all green" || echo "== FAILED"
exit $status
