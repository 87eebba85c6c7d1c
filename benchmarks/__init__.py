"""Benchmarks against a real PostgreSQL; run ``make bench`` (see docs/benchmarks.md)."""
