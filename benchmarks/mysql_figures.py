#!/usr/bin/env python
"""django-jobs on MariaDB/MySQL, with one and with two worker processes (``make bench-mysql``).

The scenarios, sizes and report of ``benchmarks/sqlite_figures.py`` (read its docstring), on
the server named by ``MYSQL_HOST``/``MYSQL_TCP_PORT``/``MYSQL_USER``/``MYSQL_PWD`` (default
127.0.0.1:3306, root, no password: as ``scripts/ensure_mariadb.sh`` and ``tests/settings.py``).
What differs:

- each measurement gets its own database, ``JOBS_BENCH_DB`` (default ``jobs_bench``), dropped,
  re-created (utf8mb4) and migrated; ``benchmarks/settings.py`` with ``JOBS_BENCH_VENDOR=mysql``
  connects with READ COMMITTED and utf8mb4, as ``tests/settings.py`` does;
- MariaDB locks rows and skips the locked ones, so the drain runs twice, with
  ``runworker -p 1 -c 8`` and with ``-p 2 -c 8`` (a supervisor and two worker processes);
- when the server runs on this machine (its process found from ``@@pid_file`` or ``/proc``), a
  drain also reports the server process's CPU time per job, read from ``/proc/<pid>/stat``
  around the worker's run: every client of the server counts, so only a quiet server gives a
  meaningful figure;
- no LISTEN/NOTIFY: idle workers poll every ``POLL_INTERVAL`` (1 s by default, jittered), which
  the pickup latency shows.

Prints a table and one JSON line; ``--write`` replaces its section ("MariaDB") of
``docs/benchmarks.md``. ``--quick``: small counts, one run.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.sqlite_figures import Vendor, fail, file_system, main  # noqa: E402 - sys.path first

#: Never dropped, whatever JOBS_BENCH_DB says.
SYSTEM_SCHEMAS = {"mysql", "information_schema", "performance_schema", "sys"}
SERVER_NAMES = {"mariadbd", "mysqld"}
LOCAL_HOSTS = {"", "127.0.0.1", "localhost", "::1"}


def database() -> dict[str, Any]:
    """``benchmarks/settings.py``'s database: main() has set ``JOBS_BENCH_VENDOR=mysql``."""
    from benchmarks import settings

    db = settings.DATABASES["default"]
    if not db["ENGINE"].endswith("mysql"):
        fail(f"benchmarks/settings.py gives {db['ENGINE']}, not MySQL: JOBS_BENCH_VENDOR must be mysql.")
    return db


@contextlib.contextmanager
def server_cursor() -> Iterator[Any]:
    """A cursor of a connection to the server, in no database (so it may drop the benchmark's)."""
    import MySQLdb

    db = database()
    try:
        conn = MySQLdb.connect(
            host=db["HOST"], port=int(db["PORT"]), user=db["USER"], password=db["PASSWORD"], connect_timeout=5
        )
    except MySQLdb.Error as exc:
        fail(
            f"MariaDB/MySQL does not answer on {db['HOST']}:{db['PORT']} as {db['USER']} ({exc}); "
            "scripts/ensure_mariadb.sh starts a local one (make bench-mysql runs it)."
        )
    try:
        with conn.cursor() as cursor:
            yield cursor
    finally:
        conn.close()


def own_process(pid: int) -> str | None:
    """The name of process ``pid`` if it is a MariaDB/MySQL server."""
    try:
        name = Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return None
    return name if name in SERVER_NAMES else None


class MySQL(Vendor):
    name = "mysql"
    script = "benchmarks/mysql_figures.py"
    make_target = "bench-mysql"
    drain_processes = (1, 2)  # row locks and SKIP LOCKED: several processes share a queue

    @contextlib.contextmanager
    def fresh_database(self) -> Iterator[None]:
        name = database()["NAME"]
        if name.lower() in SYSTEM_SCHEMAS or not name.replace("_", "").isalnum():
            fail(f"will not drop the database {name!r} (JOBS_BENCH_DB).")
        with server_cursor() as cursor:
            cursor.execute(f"DROP DATABASE IF EXISTS `{name}`")
            cursor.execute(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4")
        try:
            yield
        finally:
            with server_cursor() as cursor:
                cursor.execute(f"DROP DATABASE IF EXISTS `{name}`")

    def drain_args(self, processes: int) -> list[str]:
        return ["-p", str(processes), "-c", "8", "--stop-when-empty"]

    def server_process(self) -> tuple[int, str] | None:
        """The server's process when it runs on this machine: the pid in its ``@@pid_file``, or
        else the one MariaDB/MySQL server process in ``/proc``."""
        if database()["HOST"] not in LOCAL_HOSTS:
            return None
        with server_cursor() as cursor:
            cursor.execute("SELECT @@pid_file, @@datadir")
            pid_file, datadir = cursor.fetchone()
        with contextlib.suppress(OSError, ValueError, IndexError):
            pid = int((Path(datadir) / pid_file).read_text().split()[0])  # pid_file may be relative
            if name := own_process(pid):
                return pid, name
        found = [
            (int(p.name), name)
            for p in Path("/proc").iterdir()
            if p.name.isdigit() and (name := own_process(int(p.name)))
        ]
        if len(found) == 1:
            return found[0]
        print(
            f"{Path(sys.argv[0]).name}: the server's CPU time is not measured: "
            f"{len(found)} MariaDB/MySQL server processes on this machine, and {pid_file} not readable.",
            file=sys.stderr,
        )
        return None

    def facts(self) -> dict[str, Any]:
        from importlib.metadata import version as installed

        from django.db import connection

        isolation = "tx_isolation" if connection.mysql_is_mariadb else "transaction_isolation"  # MySQL 8 has only this
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT VERSION(), @@SESSION.{isolation}, @@character_set_connection, @@collation_database, "
                "@@innodb_flush_log_at_trx_commit, @@log_bin, @@innodb_buffer_pool_size, @@datadir"
            )
            version, isolation, charset, collation, flush, log_bin, pool, datadir = cursor.fetchone()
        return {
            "server": "MariaDB" if connection.mysql_is_mariadb else "MySQL",
            "version": version.split("-")[0],
            "mysqlclient": installed("mysqlclient"),
            "isolation": isolation,
            "charset": charset,
            "collation": collation,
            "innodb_flush_log_at_trx_commit": int(flush),
            "log_bin": bool(int(log_bin)),
            "buffer_pool_mib": int(pool) // 2**20,
            "datadir": datadir,
        }

    def describe(self, facts: dict[str, Any]) -> str:
        db = database()
        datadir = facts.get("datadir", "?")
        if db["HOST"] in LOCAL_HOSTS:
            datadir = f"{datadir} ({file_system(datadir)})"
        return (
            f"{self.brand(facts)} {facts.get('version', '?')} at {db['HOST']}:{db['PORT']} (mysqlclient "
            f"{facts.get('mysqlclient', '?')}), {facts.get('isolation', '?')}, {facts.get('charset', '?')} "
            f"({facts.get('collation', '?')}), innodb_flush_log_at_trx_commit "
            f"{facts.get('innodb_flush_log_at_trx_commit', '?')}, binary log {'on' if facts.get('log_bin') else 'off'}, "
            f"buffer pool {facts.get('buffer_pool_mib', '?')} MiB; data directory {datadir}"
        )

    def brand(self, facts: dict[str, Any]) -> str:
        return facts.get("server", "MariaDB")

    def heading(self, facts: dict[str, Any]) -> str:
        return self.brand(facts)

    def intro(self, facts: dict[str, Any]) -> str:
        return (
            f"{self.brand(facts)} locks rows and skips the locked ones (`SELECT ... FOR UPDATE SKIP LOCKED`), so\n"
            "several worker processes share a queue, as on PostgreSQL; it has no LISTEN/NOTIFY, so idle\n"
            "workers poll."
        )

    def setup(self, facts: dict[str, Any]) -> str:
        return (
            f"each measurement gets a fresh database, `{database()['NAME']}` dropped, re-created\n"
            "(utf8mb4) and migrated (`benchmarks/settings.py` with `JOBS_BENCH_VENDOR=mysql`: READ\n"
            "COMMITTED and utf8mb4, as `tests/settings.py`), and runs in a fresh process; the server runs\n"
            "throughout (its buffer pool stays warm)."
        )


if __name__ == "__main__":
    main(MySQL(), __doc__)
