.PHONY: demo test lint bench bench-peers bench-sqlite bench-mysql venv clean

venv:
	scripts/bootstrap.sh

demo:
	scripts/demo.sh

test:
	scripts/test.sh

lint: venv
	.venv/bin/python -m ruff check .
	.venv/bin/python -m ruff format --check django_jobs tests benchmarks example_project
	.venv/bin/lint-imports --no-logo

bench: venv
	scripts/ensure_postgres.sh
	.venv/bin/python benchmarks/throughput.py

# Side by side with pgqueuer, installed into the benchmark-only .bench-venv/peers (never a dependency).
bench-peers: venv
	scripts/ensure_postgres.sh
	.venv/bin/python benchmarks/peers.py --write

# SQLite (a fresh file per measurement, one worker process): no server needed.
bench-sqlite: venv
	.venv/bin/python benchmarks/sqlite_figures.py --write

# MariaDB/MySQL (its own database jobs_bench, dropped and re-created; 1 and 2 worker processes).
bench-mysql: venv
	scripts/ensure_mariadb.sh
	.venv/bin/python benchmarks/mysql_figures.py --write

clean:
	rm -rf .venv example_project/db.sqlite3* .pytest_cache
