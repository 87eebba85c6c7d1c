"""``enqueue()``'s plain insert sent through libpq itself (psycopg's ``pq`` layer), under
psycopg's cursor: the statement prepared once per connection under a name of ours, then one
``Bind``/``Execute`` per job with its parameters as text.

Why: a one-job enqueue waits for its commit, so every microsecond of the client's Python is one
more of the round trip. psycopg's cursor adapts each parameter through its dumpers, keeps a
prepared-statement cache and builds a result set; for this one statement of known parameter
types, libpq directly took 25-50 µs of user CPU per call against 62-75 through the cursor. A
whole ``enqueue()`` spends 6-22 µs less of the client's CPU this way, 1.5-7 % of its time
(alternating pairs; docs/benchmarks.md).

What stays psycopg's: the connection, its lock, its wait loop (so Ctrl-C cancels the statement
as psycopg's own execute does) and its error classes, raised from the server's answer exactly as
psycopg raises them. :func:`send_plain` returns None, sending nothing, wherever it would not
behave like the cursor: a parameter of a type it does not know, a client encoding other than
UTF-8, a connection in pipeline mode. Imports psycopg only when called.
"""

from __future__ import annotations

import functools
from datetime import datetime
from typing import Any


def _int_text(value: int) -> bytes:
    return str(value).encode()


def _datetime_text(value: datetime) -> bytes:
    # ISO 8601; naive (USE_TZ = False) is read in the session's zone, as psycopg's dumper has it.
    return value.isoformat().encode()


#: The text of each parameter type the plain insert passes, by exact type (a subclass, a bool,
#: anything else: the cursor sends the statement).
_TEXT = {str: str.encode, int: _int_text, datetime: _datetime_text}
#: The type each is prepared with, as psycopg's dumpers declare them (text: 0, the server infers
#: it; the id goes as its 32 hex digits, cast to ``uuid`` by the statement). Left to the server,
#: an integer for a column of a domain type (``priority``, ``max_attempts``) is a parameter of
#: that domain, whose input function looks the domain's CHECK up again at every Bind: 10 µs of
#: the server's CPU per enqueue. As ``int8`` it is cast in the plan, which checks the domain with
#: the CHECK compiled once.
_OID = {str: 0, int: 20, datetime: 1184}


@functools.lru_cache(maxsize=64)
def _numbered(sql: str) -> bytes:
    """``sql``'s ``%s`` placeholders as ``$1, $2...`` and its ``%%`` as ``%``: the statement as
    libpq prepares it (what psycopg's query conversion makes of it)."""
    parts = sql.split("%%")
    n = 0
    out = []
    for part in parts:
        pieces = part.split("%s")
        text = pieces[0]
        for piece in pieces[1:]:
            n += 1
            text += f"${n}" + piece
        out.append(text)
    return "%".join(out).encode()


def send_plain(conn: Any, sql: str, params: list[Any]) -> tuple[bool, str | None] | None:
    """Run ``sql`` (a statement of :func:`~django_jobs.drivers.inserts.plain_insert_sql`,
    returning at most one row whose first column is text) with ``params`` on the psycopg
    connection ``conn``; return ``(inserted, that text)``, or None when this path does not
    serve (nothing was sent: use the cursor). Raises what psycopg's execute would raise.

    Only outside a transaction (autocommit, the statement its own transaction): psycopg sends
    ``DEALLOCATE ALL`` after a rollback or a DDL statement when it holds prepared statements of
    its own, which takes ours too. A statement that is gone then fails before it runs, and
    outside a transaction nothing is lost: it is prepared again, under a new name, and sent
    once more. Inside a transaction that failure would abort the caller's transaction, so there
    the cursor sends it (psycopg knows what it deallocated)."""
    pgconn = conn.pgconn
    # Autocommit and IDLE (TransactionStatus.IDLE is 0): with autocommit off (Django's atomic
    # block) psycopg opens the transaction with the next statement it sends, so IDLE alone does
    # not say that this one would run on its own.
    if not conn.autocommit or pgconn.transaction_status or pgconn.pipeline_status or conn.info.encoding != "utf-8":
        return None
    kinds = tuple(map(type, params))
    try:
        values = [_TEXT[kind](value) for kind, value in zip(kinds, params, strict=True)]
    except (KeyError, UnicodeEncodeError):
        return None
    from psycopg import errors, generators, pq  # optional: the package imports without psycopg

    with conn.lock:
        for retry in (False, True):
            name = _prepared(conn, sql, kinds, retry)
            pgconn.send_query_prepared(name, values)
            try:
                result = _check(conn.wait(generators.execute(pgconn)), pq.ExecStatus.TUPLES_OK, conn)
                break
            except errors.InvalidSqlStatementName:
                if retry:
                    raise  # gone again at once: a pooler (the caller stops preparing)
    if not result.ntuples:
        return False, None
    value = result.get_value(0, 0)
    return True, None if value is None else value.decode()


def _prepared(conn: Any, sql: str, kinds: tuple[type, ...], again: bool) -> bytes:
    """The name ``sql`` is prepared under on ``conn`` for parameters of the types ``kinds``,
    preparing it first when it is not (or ``again``: the server no longer has it). Each
    preparation gets a name never used on the connection before, so a ``DEALLOCATE ALL``
    psycopg has yet to send cannot collide with it."""
    from psycopg import generators, pq  # optional: the package imports without psycopg

    state = getattr(conn, "_django_jobs_wire", None)
    if state is None:
        state = conn._django_jobs_wire = ([0], {})
    counter, names = state
    key = (sql, kinds)
    name = None if again else names.get(key)
    if name is None:
        counter[0] += 1
        name = b"_django_jobs_%d" % counter[0]
        conn.pgconn.send_prepare(name, _numbered(sql), param_types=[_OID[kind] for kind in kinds])
        _check(conn.wait(generators.execute(conn.pgconn)), pq.ExecStatus.COMMAND_OK, conn)
        names[key] = name
    return name


def forget(conn: Any) -> None:
    """Forget the statements this module prepared on ``conn``."""
    state = getattr(conn, "_django_jobs_wire", None)
    if state is not None:
        state[1].clear()


def _check(results: list[Any], status: int, conn: Any) -> Any:
    """The one result of a statement, or the error psycopg raises for it."""
    from psycopg import errors, pq  # optional: the package imports without psycopg

    result = results[-1]
    if result.status != status:
        if result.status == pq.ExecStatus.FATAL_ERROR:
            raise errors.error_from_result(result, encoding=conn.info.encoding)
        raise errors.InternalError(
            f"unexpected result status {pq.ExecStatus(result.status).name} from the plain insert"
        )
    return result
