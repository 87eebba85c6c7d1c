"""The subscribers and the table of benchmarks/bus_chaos.py (installed with JOBS_BENCH_BUS_CHAOS=1).
Its names, read by the script before Django is set up."""

TOPIC = "chaos"
ATOMIC_GROUP = "audit"
GROUPS = (ATOMIC_GROUP, "billing", "email")
#: The environment variable naming the probe directory in the workers.
PROBE_ENV = "JOBS_BUS_CHAOS_PROBE"
