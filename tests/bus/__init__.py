"""A test app holding the subscribers the bus-mode process tests run: installed only in worker
processes started with JOBS_TEST_BUS=1 (tests/settings.py), so that the other tests' workers
run no subscriber."""
