#!/usr/bin/env bash
# Make sure a local PostgreSQL answers on 127.0.0.1:5432 and the `test` database exists.
# Exit 0: ready. Exit 3: no PostgreSQL server is installed here. Exit 1: installed but unusable.
set -uo pipefail
export PGHOST=${PGHOST:-127.0.0.1} PGPORT=${PGPORT:-5432} PGUSER=${PGUSER:-postgres}

ready() { pg_isready -q -h "$PGHOST" -p "$PGPORT" 2>/dev/null; }

if ! command -v pg_isready >/dev/null 2>&1 && ! ls /etc/postgresql >/dev/null 2>&1; then
  exit 3
fi
if ! ready; then
  if command -v pg_ctlcluster >/dev/null 2>&1 && ls /etc/postgresql >/dev/null 2>&1; then
    for v in $(ls /etc/postgresql); do
      echo "Starting PostgreSQL $v ..."
      pg_ctlcluster --skip-systemctl-redirect "$v" main start || true
    done
  else
    exit 3
  fi
  for _ in $(seq 1 60); do ready && break; sleep 0.5; done
fi
if ! ready; then
  echo "PostgreSQL is installed but does not answer on $PGHOST:$PGPORT." >&2
  exit 1
fi
db=${PGDATABASE:-test}
if ! psql -d postgres -tAc "SELECT 1 FROM pg_database WHERE datname = '$db'" 2>/dev/null | grep -q 1; then
  psql -d postgres -qc "CREATE DATABASE \"$db\"" || { echo "Could not create database $db" >&2; exit 1; }
fi
exit 0
