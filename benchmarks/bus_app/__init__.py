"""The subscribers benchmarks/bus.py's worker processes run (installed with JOBS_BENCH_BUS=1)."""
