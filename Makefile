.PHONY: demo test lint bench venv clean

venv:
	scripts/bootstrap.sh

demo:
	scripts/demo.sh

test:
	scripts/test.sh

lint: venv
	.venv/bin/python -m ruff check .
	.venv/bin/python -m ruff format --check django_jobs tests benchmarks example_project

bench: venv
	scripts/ensure_postgres.sh
	.venv/bin/python benchmarks/throughput.py

clean:
	rm -rf .venv example_project/db.sqlite3* .pytest_cache
