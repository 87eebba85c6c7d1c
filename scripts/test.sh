#!/usr/bin/env bash
# make test: install what tests need, then makemigrations --check, ruff, lint-imports and the
# package check, then the whole suite on SQLite, on PostgreSQL and on MariaDB/MySQL (servers
# started if needed; JOBS_TEST_MYSQL=0 leaves MariaDB out): one pytest process per database, all
# at once, each on a test database of its own.
# Each writes its output to a log, printed whole when that process ends; a summary line per
# database and the combined exit status come last. Extra arguments go to every pytest.
set -uo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh || exit 1
PY=.venv/bin/python
status=0

loud() {
  echo
  echo "!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!"
  local line
  for line in "$@"; do printf '!! %-74s !!\n' "$line"; done
  echo "!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!"
}

echo "== makemigrations --check"
$PY example_project/manage.py makemigrations --check --dry-run || status=1

echo "== ruff"
$PY -m ruff check --quiet . || status=1

echo "== lint-imports: the layers and contracts of [tool.importlinter] in pyproject.toml"
.venv/bin/lint-imports --no-logo || status=1

echo "== package: build, twine check, install the wheel in a fresh venv, run the demo"
scripts/check_package.sh || status=1

echo "== browser for the admin's browser tests"
if JOBS_CHROMIUM=$(scripts/ensure_chromium.sh); then
  export JOBS_CHROMIUM
else
  echo "!! Chromium is missing: the browser tests will fail under CI=true and be skipped otherwise." >&2
fi

# -- which databases run ------------------------------------------------------------------------
# Test database names carry this script's pid, so two runs on one machine (or one server) never
# drop each other's database; JOBS_TEST_PG_NAME / JOBS_TEST_MY_NAME still win when set.
names=(SQLite)
envs=("JOBS_TEST_DB=sqlite")

scripts/ensure_postgres.sh
pg=$?
if [ $pg -eq 0 ]; then
  names+=(PostgreSQL)
  envs+=("JOBS_TEST_DB=postgres JOBS_TEST_PG_NAME=${JOBS_TEST_PG_NAME:-test_django_jobs_$$}")
elif [ $pg -eq 3 ]; then
  loud "No PostgreSQL server is installed on this machine: the PostgreSQL half of" \
    "the suite did NOT run. Install PostgreSQL to run it."
  if [ "${CI:-}" = "true" ]; then
    echo "CI=true: a missing PostgreSQL is a failure." >&2
    status=1
  fi
else
  echo "PostgreSQL could not be started; failing." >&2
  status=1
fi

# MariaDB/MySQL: on by default; JOBS_TEST_MYSQL=0 leaves that half out (say so loudly).
if [ "${JOBS_TEST_MYSQL:-1}" = "1" ]; then
  scripts/ensure_mariadb.sh
  my=$?
  if [ $my -eq 0 ] && ! $PY -c 'import MySQLdb' 2>/dev/null; then
    echo "mysqlclient (MySQLdb) is not importable from .venv, so the MariaDB tests cannot run; see the" >&2
    echo "warning scripts/bootstrap.sh printed. Failing." >&2
    status=1
  elif [ $my -eq 0 ]; then
    names+=(MariaDB)
    envs+=("JOBS_TEST_DB=mysql JOBS_TEST_MY_NAME=${JOBS_TEST_MY_NAME:-test_django_jobs_$$}")
  elif [ $my -eq 3 ]; then
    loud "No MariaDB/MySQL server is installed on this machine: the MariaDB half of" \
      "the suite did NOT run. Install MariaDB to run it."
    if [ "${CI:-}" = "true" ]; then
      echo "CI=true: a missing MariaDB is a failure." >&2
      status=1
    fi
  else
    echo "MariaDB could not be started; failing." >&2
    status=1
  fi
else
  loud "The MariaDB/MySQL half of the suite is OFF (JOBS_TEST_MYSQL=0)."
fi

# -- one pytest per database, in parallel ---------------------------------------------------------
logs=$(mktemp -d "${TMPDIR:-/tmp}/django-jobs-test.XXXXXX")
pids=()
# Job control: each pytest in a process group of its own. An interrupt (or TERM) of this script is
# passed on to each as SIGINT, so pytest tears its fixtures down, the worker processes that tests
# start included, before it exits. pytest restores SIGINT's handler itself, since a shell without
# job control starts background commands with SIGINT ignored.
set -m
PYTEST=($PY -c 'import signal, sys, pytest
signal.signal(signal.SIGINT, signal.default_int_handler)
sys.exit(pytest.console_main())')
interrupted() {
  local pid
  echo "Interrupted: stopping the test runs ..." >&2
  for pid in "${pids[@]}"; do kill -INT -- "-$pid" 2>/dev/null; done
  for _ in $(seq 1 30); do
    (IFS=,; pgrep -g "${pids[*]}" >/dev/null 2>&1) || break
    sleep 0.5
  done
  for pid in "${pids[@]}"; do kill -KILL -- "-$pid" 2>/dev/null; done
  for i in "${!pids[@]}"; do
    echo
    echo "== tests on ${names[$i]}: interrupted; the end of its output"
    tail -n 20 "$logs/$i.log"
  done
  exit 130
}
trap interrupted INT TERM
trap 'rm -rf "$logs"' EXIT

start=$SECONDS
for i in "${!names[@]}"; do
  echo "== tests on ${names[$i]}: started (${envs[$i]})"
  # shellcheck disable=SC2086 # envs[i] is a list of NAME=value words
  (env ${envs[$i]} "${PYTEST[@]}" "$@" >"$logs/$i.log" 2>&1; echo $? >"$logs/$i.rc") &
  pids+=($!)
done

# pytest's closing line ("=== 812 passed, 3 skipped in 241.20s (0:04:01) ===") without the rules.
closing_line() {
  grep -E '(passed|failed|error|skipped|deselected|no tests ran)[^=]* in [0-9.]+s' "$1" | tail -n 1 |
    sed -E 's/^=+ //; s/ =+$//'
}
count() { grep -oE "[0-9]+ $2" <<<"$1" | grep -oE '^[0-9]+' || echo 0; }

summary=()
total_passed=0 total_failed=0 total_skipped=0
left=${#names[@]}
declare -A reported=()
while [ "$left" -gt 0 ]; do
  for i in "${!names[@]}"; do
    [ -n "${reported[$i]:-}" ] && continue
    [ -s "$logs/$i.rc" ] || continue
    wait "${pids[$i]}" 2>/dev/null
    reported[$i]=1
    left=$((left - 1))
    rc=$(cat "$logs/$i.rc")
    took=$((SECONDS - start))
    echo
    echo "== tests on ${names[$i]} (exit $rc, $((took / 60))m $((took % 60))s): its output"
    cat "$logs/$i.log"
    line=$(closing_line "$logs/$i.log")
    [ "$rc" -eq 0 ] && verdict=ok || { verdict=FAILED; status=1; }
    summary+=("$(printf '%-12s %-6s exit %-3s %s' "${names[$i]}:" "$verdict" "$rc" "${line:-(no pytest summary line)}")")
    total_passed=$((total_passed + $(count "$line" passed)))
    total_failed=$((total_failed + $(count "$line" failed) + $(count "$line" errors?)))
    total_skipped=$((total_skipped + $(count "$line" skipped)))
  done
  [ "$left" -gt 0 ] && sleep 1
done
trap - INT TERM
set +m

echo
echo "== summary, per database (wall time $(((SECONDS - start) / 60))m $(((SECONDS - start) % 60))s)"
printf '%s\n' "${summary[@]}"
echo "tests: $total_passed passed, $total_failed failed, $total_skipped skipped"
[ $status -eq 0 ] && echo "== all green" || echo "== FAILED"
exit $status
