"""Random faults against running sidecars, for the chaos soak
(helpers/chaos.py): one at a time, every 2 to 6 s.

* On a node: killed -9 (down a while, started again); its writer killed -9
  (the node exits; started again); one of its workers killed -9 or stopped
  (SIGSTOP) a while; the whole node stopped a while; a clean stop (SIGTERM,
  which must exit 0) and start; its tool host's stream cut (``drop_host``).
* With ``server``, a PostgreSQL server of the soak's own: stopped (``pg_ctl
  -m fast`` or ``immediate``) a while, or every connection to it cut.
* With ``disk``, the small filesystem a SQLite store is on: filled up a while.

A fault that takes a node out strikes only while another node is up, so
adapters always have one to call (on one sidecar: they retry until it is
back). ``live()`` says which nodes are not taken out now.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from collections.abc import Callable

from sidecar_proc import Sidecar

from . import pg, procs
from .disk import SmallDisk

NODE_FAULTS = ("kill", "writer", "worker", "worker_stop", "node_stop", "term", "host_drop")
SERVER_FAULTS = ("pg_down", "pg_kick")
DISK_FAULTS = ("disk_full",)


class Faults:
    """Faults against ``nodes``; ``note(what)`` hears of each one as it
    strikes, ``violation(what)`` of a node that misbehaves under one (a clean
    stop that does not exit 0, a node that does not start again)."""

    def __init__(self, nodes: list[Sidecar], rng: random.Random, *, note: Callable[[str], None],
                 violation: Callable[[str], None], drop_host: Callable[[int], None],
                 server: pg.PgServer | None = None, disk: SmallDisk | None = None):
        self.nodes, self.rng, self.server, self.disk = nodes, rng, server, disk
        self.note, self.violation, self.drop_host = note, violation, drop_host
        self.down: set[int] = set()  # nodes taken out now
        self.lock = threading.Lock()

    def live(self) -> list[int]:
        with self.lock:
            return [i for i in range(len(self.nodes)) if i not in self.down]

    def run(self, stop: threading.Event) -> None:
        """Strike every 2 to 6 s until ``stop`` is set."""
        kinds = NODE_FAULTS + (SERVER_FAULTS if self.server is not None else ()) + (
            DISK_FAULTS if self.disk is not None else ())
        while not stop.wait(self.rng.uniform(2, 6)):
            kind, i = self.rng.choice(kinds), self.rng.randrange(len(self.nodes))
            if kind in SERVER_FAULTS:
                self._server_fault(kind)
            elif kind in DISK_FAULTS:
                self._disk_full()
            elif i not in self.down and (len(self.nodes) == 1 or len(self.live()) > 1):
                self._node_fault(kind, i)

    def _node_fault(self, kind: str, i: int) -> None:
        node, kids = self.nodes[i], procs.children(self.nodes[i])
        workers = [pid for name, pid in kids.items() if name.startswith("sidecar-work-")]
        self.note(f"{kind} node {i}")
        if kind in ("worker", "worker_stop") and workers:
            pid = self.rng.choice(workers)
            if kind == "worker":
                os.kill(pid, signal.SIGKILL)
            else:
                self._stopped_a_while(pid)
        elif kind == "node_stop":
            self._stopped_a_while(node.proc.pid, *kids.values())
        elif kind == "host_drop":
            self.drop_host(i)
        elif kind in ("kill", "term") or (kind == "writer" and "sidecar-writer" in kids):
            self._take_out(kind, i, kids.get("sidecar-writer", 0))

    def _stopped_a_while(self, *pids: int) -> None:
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        time.sleep(self.rng.uniform(0.3, 3))
        for pid in pids:
            os.kill(pid, signal.SIGCONT)

    def _take_out(self, kind: str, i: int, writer: int) -> None:
        """The node down (killed, its writer killed, or stopped cleanly), then started again."""
        node = self.nodes[i]
        with self.lock:
            self.down.add(i)
        if kind == "kill":
            node.kill9()
        elif kind == "writer":
            os.kill(writer, signal.SIGKILL)
            try:
                node.proc.wait(30)
            except Exception:
                self.violation(f"node {i} still running 30 s after its writer was killed")
                node.kill9()
        else:
            code = node.stop()
            if code != 0:
                self.violation(f"node {i}: a clean stop exited {code}")
        time.sleep(self.rng.uniform(0.2, 3))
        self._start(i)

    def _start(self, i: int) -> None:
        node = self.nodes[i]
        for attempt in range(5):  # a start may meet the database down: it ends, and is tried again
            try:
                node.start(60)
                break
            except (RuntimeError, TimeoutError) as e:
                if attempt == 4:
                    self.violation(f"node {i} did not start again: {str(e)[-500:]}")
                time.sleep(2)
        with self.lock:
            self.down.discard(i)

    def _server_fault(self, kind: str) -> None:
        assert self.server is not None and self.server.root is not None
        if kind == "pg_down":
            mode, seconds = self.rng.choice(["fast", "immediate"]), self.rng.uniform(0.5, 8)
            self.note(f"pg_down {mode} {seconds:.1f}s")
            pg.stop_server(self.server.root, mode)
            time.sleep(seconds)
            pg.start_again(self.server.root)
        else:
            self.note("pg_kick")
            self.server.terminate_connections()

    def _disk_full(self) -> None:
        assert self.disk is not None
        seconds = self.rng.uniform(0.5, 4)
        self.note(f"disk_full {seconds:.1f}s")
        self.disk.fill()
        time.sleep(seconds)
        self.disk.free()

    def all_up(self) -> None:
        """Every node that is not running started again (the soak is over)."""
        for i, node in enumerate(self.nodes):
            if node.proc.poll() is not None:
                self._start(i)
