"""A TCP proxy in front of PostgreSQL that loses answers: the server commits, the client never hears.

The fault tests route a worker (or a ``manage.py jobs`` command) through it; the test process
itself keeps talking to PostgreSQL directly. It runs an asyncio loop in a daemon thread of the
test process::

    with FaultProxy(upstream=("127.0.0.1", 5432)) as proxy:
        trap = proxy.arm(b"SET state = 'active'")      # the claim
        ... start a worker with proxy.env() ...
        wait_until(lambda: trap.fired)

It frames the PostgreSQL protocol (type byte + int32 length) in both directions, so it can cut
precisely: once a client query (a simple ``Q``, or the ``B`` of the extended protocol that runs a
statement, named or not, whose ``P`` text is remembered per connection: a prepared statement is
parsed once and then only bound) contains an armed trap's pattern, the proxy lets it through and
holds back the server's answer from then on. Answers ending in ReadyForQuery ``T`` (still inside a transaction) or ``E`` (failed
transaction) are passed on, so a transaction goes on to its COMMIT; the first answer ending in
ReadyForQuery ``I`` (idle: the statement or the transaction is over, committed unless an error
was seen) is dropped and both sockets are closed. The client sees a lost connection after the
server committed.

Matching starts at a message boundary because a client waits for ReadyForQuery before sending its
next query (psycopg does not pipeline by default). SSL must be off through the proxy (the
``sslmode=disable`` that :meth:`FaultProxy.env` asks for): an encrypted stream is passed through
untouched and can never be trapped.
"""

from __future__ import annotations

import asyncio
import struct
import threading
import time
from collections import deque
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

SSL_REQUEST = 80877103
GSSENC_REQUEST = 80877104
CANCEL_REQUEST = 80877102

T = TypeVar("T")


@dataclass
class Trap:
    """Cut the connection after the answer to the next ``count`` queries containing ``pattern``
    (after letting ``skip`` of them through)."""

    pattern: bytes
    count: int = 1
    skip: int = 0
    seen: int = 0
    fired: int = 0

    def take(self, message: bytes) -> bool:
        if self.fired >= self.count or self.pattern not in message:
            return False
        self.seen += 1
        if self.seen <= self.skip:
            return False
        self.fired += 1
        return True


@dataclass
class Cut:
    """One answer the proxy dropped: what was asked, and what the connection asked before."""

    pattern: bytes
    query: str  # the trapped query
    after: list[str]  # queries the client sent after it, before the cut (a transaction's COMMIT)
    before: list[str]  # the last queries of the connection before the trapped one
    rows: int  # DataRows answering the trapped query itself (the rows a claim took, say)
    error_seen: bool  # an ErrorResponse came back meanwhile: the transaction may have rolled back
    at: float = field(default_factory=time.monotonic)


def _text(message: bytes, limit: int = 400) -> str:
    return message.rstrip(b"\0").decode("utf-8", "replace")[:limit]


class _Connection:
    def __init__(self, proxy: FaultProxy, client: tuple, server: tuple):
        self.proxy = proxy
        self.client_r, self.client_w = client
        self.server_r, self.server_w = server
        self.recent: deque[str] = deque(maxlen=8)
        self.trap: Trap | None = None  # armed on this connection: the answers are held back
        self.trapped_query = ""
        self.before: list[str] = []
        self.after: list[str] = []
        self.rows = 0
        self.answered = False  # the trapped query's own answer is complete
        self.error_seen = False
        self.held: list[bytes] = []
        self.closed = False
        # Parsed statements by name (b"" the unnamed one): a prepared statement's text is sent
        # once, in its Parse; every later run only names it in a Bind.
        self.statements: dict[bytes, bytes] = {}

    def abort(self) -> None:
        if not self.closed:
            self.closed = True
            self.client_w.transport.abort()
            self.server_w.transport.abort()

    async def run(self) -> None:
        try:
            if await self._startup():
                await asyncio.gather(self._client_to_server(), self._server_to_client())
            else:  # SSL or GSS encryption was accepted, or a cancel request: pass bytes through
                await asyncio.gather(_pipe(self.client_r, self.server_w), _pipe(self.server_r, self.client_w))
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            pass
        finally:
            self.abort()
            self.proxy._forget(self)

    async def _startup(self) -> bool:
        """Pass the untyped start-up packets on; True once the typed protocol starts."""
        while True:
            head = await self.client_r.readexactly(4)
            (length,) = struct.unpack("!i", head)
            body = await self.client_r.readexactly(length - 4)
            self.server_w.write(head + body)
            await self.server_w.drain()
            (code,) = struct.unpack("!i", body[:4])
            if code == CANCEL_REQUEST:
                return False
            if code in (SSL_REQUEST, GSSENC_REQUEST):
                answer = await self.server_r.readexactly(1)
                self.client_w.write(answer)
                await self.client_w.drain()
                if answer != b"N":
                    return False
                continue
            return True

    async def _client_to_server(self) -> None:
        while True:
            head = await self.client_r.readexactly(5)
            (length,) = struct.unpack("!i", head[1:])
            body = await self.client_r.readexactly(length - 4)
            kind, query = head[:1], None
            if kind == b"P":  # Parse: name \0 query \0 ...; runs nothing until a Bind names it
                name, rest = body.split(b"\0", 1)
                self.statements[name] = rest.split(b"\0", 1)[0]
            elif kind == b"B":  # Bind: portal \0 statement \0 ...; what the Execute after it runs
                query = self.statements.get(body.split(b"\0", 2)[1], b"")
            elif kind == b"Q":
                query = body
            if query is not None:
                text = _text(query)
                if self.trap is not None:
                    self.after.append(text)
                else:
                    trap = self.proxy._match(query)
                    if trap is not None:
                        # Before the query goes out, so its answer is already held back.
                        self.trap, self.trapped_query, self.before = trap, text, list(self.recent)
                self.recent.append(text)
            self.server_w.write(head + body)
            await self.server_w.drain()
            if head[:1] == b"X":  # Terminate
                return

    async def _server_to_client(self) -> None:
        while True:
            head = await self.server_r.readexactly(5)
            (length,) = struct.unpack("!i", head[1:])
            body = await self.server_r.readexactly(length - 4)
            if self.trap is None:
                self.client_w.write(head + body)
                await self.client_w.drain()
                continue
            self.held.append(head + body)
            if head[:1] == b"D" and not self.answered:
                self.rows += 1
            elif head[:1] == b"E":
                self.error_seen = True
            if head[:1] != b"Z":
                continue
            self.answered = True
            if body[:1] == b"I":
                # The statement (or transaction) is over on the server: drop its answer.
                self.proxy._record(
                    Cut(self.trap.pattern, self.trapped_query, self.after, self.before, self.rows, self.error_seen)
                )
                self.abort()
                return
            # Still inside a transaction ('T') or in a failed one ('E'): let it go on.
            self.client_w.write(b"".join(self.held))
            self.held = []
            await self.client_w.drain()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while data := await reader.read(65536):
        writer.write(data)
        await writer.drain()


class FaultProxy:
    """A PostgreSQL proxy on 127.0.0.1 (a free port) forwarding to ``upstream``; see the module
    docstring. Thread-safe: the test thread arms traps while the loop thread forwards."""

    def __init__(self, upstream: tuple[str, int] = ("127.0.0.1", 5432)):
        self.upstream = upstream
        self.host = "127.0.0.1"
        self.port = 0
        self.connections = 0  # accepted so far
        self.kills = 0  # connections aborted by kill_connections()
        self._cuts: list[Cut] = []
        self._traps: list[Trap] = []
        self._live: set[_Connection] = set()
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="fault-proxy", daemon=True)
        self._server: asyncio.Server | None = None

    # -- life cycle --------------------------------------------------------------------------

    def start(self) -> FaultProxy:
        self._thread.start()
        self._server = self._call(asyncio.start_server(self._accept, self.host, 0))
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            self.kill_connections()
            self._server = None
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def env(self) -> dict[str, str]:
        """Environment for a subprocess of the test settings to connect through the proxy."""
        return {"PGHOST": self.host, "PGPORT": str(self.port), "JOBS_TEST_SSLMODE": "disable"}

    # -- faults ------------------------------------------------------------------------------

    def arm(self, pattern: bytes, count: int = 1, skip: int = 0) -> Trap:
        """Lose the answer to the next ``count`` queries containing ``pattern`` (any connection),
        after ``skip`` of them went through."""
        trap = Trap(pattern, count, skip)
        with self._lock:
            self._traps.append(trap)
        return trap

    def disarm(self) -> None:
        with self._lock:
            self._traps.clear()

    @property
    def cuts(self) -> list[Cut]:
        with self._lock:
            return list(self._cuts)

    def cuts_of(self, trap: Trap) -> list[Cut]:
        return [c for c in self.cuts if c.pattern == trap.pattern]

    def kill_connections(self) -> int:
        """Abort every connection now (mid-answer or idle); return how many."""

        async def kill() -> int:
            live = list(self._live)
            for conn in live:
                conn.abort()
            return len(live)

        n = self._call(kill())
        with self._lock:
            self.kills += n
        return n

    cut_all = kill_connections

    @property
    def live(self) -> int:
        return len(self._live)

    # -- loop side ---------------------------------------------------------------------------

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(10)

    async def _accept(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            server = await asyncio.open_connection(*self.upstream)
        except OSError:
            client_w.transport.abort()
            return
        conn = _Connection(self, (client_r, client_w), server)
        with self._lock:
            self.connections += 1
        self._live.add(conn)
        await conn.run()

    def _forget(self, conn: _Connection) -> None:
        self._live.discard(conn)

    def _match(self, query: bytes) -> Trap | None:
        with self._lock:
            for trap in self._traps:
                if trap.take(query):
                    return trap
        return None

    def _record(self, cut: Cut) -> None:
        with self._lock:
            self._cuts.append(cut)
