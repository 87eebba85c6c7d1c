"""The handlers' own records of benchmarks/bus_chaos.py: one row per message a handler handled."""

from django.db import models


class Write(models.Model):
    """A handler's write for one message. The ``atomic=True`` group's rows commit with its
    cursor's move, so each of its messages must have exactly one; the other groups' rows commit
    as they are written (one per delivery)."""

    group = models.CharField(max_length=50)
    partition = models.CharField(max_length=50)
    position = models.BigIntegerField()
    n = models.IntegerField()
    pid = models.IntegerField()
    attempt = models.IntegerField()

    class Meta:
        app_label = "bus_chaos"

    def __str__(self) -> str:
        return f"{self.group} {self.partition}#{self.position} by {self.pid}"
