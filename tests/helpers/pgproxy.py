"""A TCP proxy between the sidecar and PostgreSQL that can cut one
connection in the middle of its COMMIT, for tests of a commit whose outcome
the client cannot know.

It reads the frontend protocol the client sends (message type and length;
the statement names of Parse and Bind, since psycopg prepares what it runs
often) and, once armed by ``cut_commit``, cuts the next connection of the
given ``application_name`` that runs ``COMMIT``:

- ``deliver=True``: the COMMIT reaches the server (through the Sync after
  it), then both sides are closed before its answer comes back: the
  transaction committed, the client saw its connection drop. With
  ``terminated=True`` the client first gets the FATAL error a server sends
  a session it ends (``pg_terminate_backend``: admin_shutdown), as when its
  session is ended right after the commit.
- ``deliver=False``: the client's side is closed before the COMMIT is sent;
  the server's too, so it aborts the transaction at once, unless
  ``server_notices=False``: then the server's side stays open and silent,
  the transaction open on it (in progress, as behind a network cut), until
  the server ends that session or the proxy closes.

``hang()`` holds every byte in both directions, of every connection (new
ones too), until ``answer()``: the database as a stalled server or a network
that drops packets shows it, connections up and nothing answered.

Everything else passes through unchanged. Its DSN (``dsn``) turns TLS and
GSS encryption off, so the stream stays readable.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time
from dataclasses import dataclass, field

from psycopg.conninfo import conninfo_to_dict, make_conninfo

_SSL_REQUEST, _GSS_REQUEST = 80877103, 80877104


def _error_response(**fields: str) -> bytes:
    body = b"".join(k.encode() + v.encode() + b"\0" for k, v in fields.items()) + b"\0"
    return b"E" + struct.pack("!i", len(body) + 4) + body


# What a server sends a session it terminates, before it closes the socket.
_ADMIN_SHUTDOWN = _error_response(S="FATAL", V="FATAL", C="57P01",
                                  M="terminating connection due to administrator command")


@dataclass
class _Cut:
    application: str
    deliver: bool
    server_notices: bool
    refuse_s: float
    terminated: bool
    done: threading.Event = field(default_factory=threading.Event)


class PgProxy:
    def __init__(self, target_dsn: str):
        params = conninfo_to_dict(target_dsn)
        host, port = str(params.get("host") or "127.0.0.1"), int(params.get("port") or 5432)
        self._target = f"{host}/.s.PGSQL.{port}" if host.startswith("/") else (host, port)
        self.target_dsn = target_dsn
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._cuts: list[_Cut] = []
        self._lock = threading.Lock()
        self._closed = False
        self._refuse_until = 0.0  # monotonic
        self._sockets: set[socket.socket] = set()
        self._flowing = threading.Event()  # cleared while hung: nothing is passed on
        self._flowing.set()
        threading.Thread(target=self._accept, name="pgproxy-accept", daemon=True).start()

    @property
    def dsn(self) -> str:
        """The target's DSN, through this proxy."""
        return make_conninfo(self.target_dsn, host="127.0.0.1", port=self.port,
                             sslmode="disable", gssencmode="disable")

    def cut_commit(self, application: str, deliver: bool, server_notices: bool = True,
                   refuse_s: float = 0.0, terminated: bool = False) -> threading.Event:
        """Cut the next COMMIT of a connection named ``application``; the
        event is set once it was cut. ``refuse_s``: for that long after the
        cut every new connection is closed at once (the database out of
        reach)."""
        cut = _Cut(application, deliver, server_notices, refuse_s, terminated)
        with self._lock:
            self._cuts.append(cut)
        return cut.done

    def hang(self) -> None:
        """From now on nothing passes either way until ``answer()``."""
        self._flowing.clear()

    def answer(self) -> None:
        """What was held passes on, and everything after it."""
        self._flowing.set()

    def close(self) -> None:
        self._closed = True
        self._flowing.set()
        with contextlib.suppress(OSError):  # wakes the accept under way: no connection passes after this
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        with self._lock:
            sockets = list(self._sockets)
        for s in sockets:
            _close(s)

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if self._closed:
                _close(client)
                return
            if time.monotonic() < self._refuse_until:
                _close(client)
                continue
            try:
                server = _connect(self._target)
            except OSError:
                _close(client)
                continue
            with self._lock:
                self._sockets.update((client, server))
            muted = threading.Event()
            threading.Thread(target=_pipe, args=(server, client, muted, self._flowing), daemon=True).start()
            threading.Thread(target=self._frontend, args=(client, server, muted), daemon=True).start()

    def _take_cut(self, application: str) -> _Cut | None:
        with self._lock:
            for cut in self._cuts:
                if cut.application == application:
                    self._cuts.remove(cut)
                    return cut
        return None

    def _frontend(self, client: socket.socket, server: socket.socket, muted: threading.Event) -> None:
        """Client to server, message by message, watching for COMMIT."""
        reader = _Reader(client)
        server = _Held(server, self._flowing)
        try:
            application = _startup(reader, server)
            statements: dict[str, str] = {}
            cut: _Cut | None = None
            while True:
                kind, body = reader.message()
                if kind == b"P":
                    name, query = _cstrings(body, 2)
                    statements[name] = query
                elif kind in (b"B", b"Q"):
                    query = statements.get(_cstrings(body, 2)[1], "") if kind == b"B" else _cstrings(body, 1)[0]
                    if cut is None and query.strip().upper() == "COMMIT":
                        cut = self._take_cut(application)
                        if cut is not None:
                            muted.set()  # from here on the client hears nothing more
                        if cut is not None and not cut.deliver:
                            return self._cut(cut, client, server)
                server.sendall(kind + struct.pack("!i", len(body) + 4) + body)
                if cut is not None and kind in (b"S", b"Q"):
                    return self._cut_after(cut, client, server)
        except (OSError, EOFError):
            _close(client)
            _close(server)

    def _cut(self, cut: _Cut, client: socket.socket, server: socket.socket) -> None:
        self._refuse_until = time.monotonic() + cut.refuse_s
        if cut.server_notices:
            _close(server)
        _close(client)
        cut.done.set()

    def _cut_after(self, cut: _Cut, client: socket.socket, server: socket.socket) -> None:
        """The COMMIT went through: the client loses its connection now; the
        server's side only half-closes (its answer is read and dropped), so it
        reads everything sent before it sees the client gone."""
        self._refuse_until = time.monotonic() + cut.refuse_s
        if cut.terminated:
            with contextlib.suppress(OSError):
                client.sendall(_ADMIN_SHUTDOWN)
            time.sleep(0.2)  # the client reads the error before it sees the socket close
        _close(client)
        with contextlib.suppress(OSError):
            server.shutdown(socket.SHUT_WR)
        cut.done.set()


def _startup(reader: _Reader, server: socket.socket) -> str:
    """Forward the startup phase's first messages (no type byte); return the
    connection's application_name."""
    while True:
        (length,) = struct.unpack("!i", reader.exactly(4))
        body = reader.exactly(length - 4)
        server.sendall(struct.pack("!i", length) + body)
        (code,) = struct.unpack("!i", body[:4])
        if code in (_SSL_REQUEST, _GSS_REQUEST):
            continue  # refused by a server without them (the DSN turns them off anyway)
        parts = body[4:].split(b"\0")
        params = dict(zip(parts[0::2], parts[1::2]))
        return params.get(b"application_name", b"").decode()


def _cstrings(body: bytes, n: int) -> list[str]:
    return [p.decode("utf-8", "replace") for p in body.split(b"\0", n)[:n]]


class _Reader:
    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.buf = b""

    def exactly(self, n: int) -> bytes:
        while len(self.buf) < n:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise EOFError
            self.buf += chunk
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def message(self) -> tuple[bytes, bytes]:
        kind = self.exactly(1)
        (length,) = struct.unpack("!i", self.exactly(4))
        return kind, self.exactly(length - 4)


class _Held:
    """A socket whose sends wait while the proxy is hung (PgProxy.hang)."""

    def __init__(self, sock: socket.socket, flowing: threading.Event):
        self.sock, self.flowing = sock, flowing

    def sendall(self, data: bytes) -> None:
        self.flowing.wait()
        self.sock.sendall(data)

    def __getattr__(self, name: str):
        return getattr(self.sock, name)


def _pipe(src: socket.socket, dst: socket.socket, muted: threading.Event, flowing: threading.Event) -> None:
    """Server to client, unchanged (held while ``flowing`` is clear); dropped once ``muted``."""
    try:
        while chunk := src.recv(65536):
            flowing.wait()
            if not muted.is_set():
                dst.sendall(chunk)
    except OSError:
        pass
    _close(src)
    _close(dst)


def _connect(target: str | tuple[str, int]) -> socket.socket:
    """To a server on TCP or, for a directory host, on its Unix socket."""
    if isinstance(target, tuple):
        return socket.create_connection(target)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(target)
    return s


def _close(s: socket.socket) -> None:
    with contextlib.suppress(OSError):
        s.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        s.close()
