#!/usr/bin/env bash
# make demo: install, migrate the SQLite example project, enqueue demo jobs, run a worker until
# they are done, print the table.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
unset DATABASE_URL
.venv/bin/python example_project/manage.py migrate --verbosity 0
.venv/bin/python example_project/manage.py demo
