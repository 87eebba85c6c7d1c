"""Tasks for flows (tests/test_flows.py)."""

import time

from django.tasks import task

from tests.tasks import record


@task
def leaf(path: str, name: str, value=None):
    record(path, event="leaf", name=name)
    return value if value is not None else name


@task(takes_context=True)
def gather(context, path: str, name: str):
    """A parent: records what its children returned and which failed."""
    results = context.children_results()
    failures = context.children_failures()
    record(path, event="parent", name=name, results=results, failures=sorted(failures))
    return {"results": results, "failures": sorted(failures)}


@task
def breaks(path: str, name: str):
    record(path, event="breaks", name=name)
    raise RuntimeError(f"{name} broke")


@task
def slow_leaf(path: str, name: str, seconds: float):
    record(path, event="start", name=name)
    time.sleep(seconds)
    return name
