"""Several real sidecars on ONE PostgreSQL database: a cluster for the tests.

``Cluster(root, dsn, n=3, config=...)`` makes ``n`` nodes, each a ``Node`` (a
``Sidecar`` subprocess) with its own data dir under ``root``, its Unix socket
(trusted: the tests' stubs use it) and a TCP listener on a free port that it
advertises to the others (``[cluster] advertise``), a ``node_id`` of its own
(``a``, ``b``, ``c``… unless ``names`` says otherwise), the shared cluster
``token`` (an admin token in every node's ``[[auth.tokens]]``, beside the
tests' usual TCP token) and a short ``lease_ttl_s``. ``cluster`` keys are
added to (or override) the ``[cluster]`` table. The store is put on the
database through the environment (``AGENT_SIDECAR_STORE__*``), whatever
backend the rest of the run uses.

Per node: ``start``/``stop`` (SIGTERM, clean), ``kill9`` (a crash),
``pause``/``resume`` (SIGSTOP/SIGCONT of the main process, or of its children
too), ``restart``; stubs with ``prompts()``, ``sessions()``, ``tools()`` (Unix
socket; ``tcp=True`` for the TCP listener, with ``metadata()`` as the call's
credentials). ``with Cluster(...) as cl:`` starts every node (in parallel)
and stops them all at the end, resuming paused ones first.

``FramesLock(dsn, key)``: the frames lock every node's writer takes first,
held by a transaction of the test's own (so the nodes' writes queue up behind
it), that may also move a lane to a new epoch; ``lock_waiters(dsn)`` counts
the sessions waiting for it."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import psycopg
from sidecar_proc import TOKEN, Sidecar

from .config import table
from .store import local_store

CLUSTER_TOKEN = "test-cluster-token"
NAMES = "abcdefghij"


def node_config(node_id: str, port: int, token: str, lease_ttl_s: float,
                cluster: dict[str, Any] | None = None) -> str:
    """The TOML a node needs to be one of the cluster: its ``[cluster]`` table
    and both admin tokens (the cluster's, the tests' TCP one)."""
    keys = {"node_id": node_id, "advertise": f"127.0.0.1:{port}", "token": token,
            "lease_ttl_s": lease_ttl_s, **(cluster or {})}
    tokens = "".join(f'[[auth.tokens]]\ntoken = "{t}"\nadmin = true\n\n' for t in (token, TOKEN))
    return table("cluster", **keys) + tokens


class Node(Sidecar):
    """One sidecar of a ``Cluster``."""

    def __init__(self, data_dir: Path, node_id: str, dsn: str, config: str = "", *,
                 token: str = CLUSTER_TOKEN, lease_ttl_s: float = 2.0, workers: int = 1,
                 cluster: dict[str, Any] | None = None, env: dict[str, str] | None = None):
        store_env = {"AGENT_SIDECAR_STORE__BACKEND": "postgres", "AGENT_SIDECAR_STORE__DSN": dsn}
        super().__init__(data_dir, config=config, tcp=True, workers=workers,
                         env={**store_env, **(env or {})}, dsn=dsn)  # dsn: StoreView(node) reads it
        self.node_id, self.dsn, self.token = node_id, dsn, token
        self.config_text = config + "\n" + node_config(node_id, self.tcp_port, token, lease_ttl_s, cluster)
        self.paused = False

    @property
    def address(self) -> str:
        """What the node advertises: where the others reach it."""
        return self.tcp_target

    def metadata(self) -> list[tuple[str, str]]:
        """The call credentials for the TCP listener (the cluster's token)."""
        return [("authorization", f"Bearer {self.token}")]

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def _signal(self, sig: signal.Signals, children: bool) -> None:
        from .procs import children as children_of
        pids = [self.proc.pid] + (list(children_of(self).values()) if children else [])
        for pid in pids:
            os.kill(pid, sig)

    def pause(self, children: bool = False) -> None:
        """SIGSTOP: the node stalls (its writer and workers too with ``children``)."""
        self._signal(signal.SIGSTOP, children)
        self.paused = True

    def resume(self, children: bool = True) -> None:
        """SIGCONT, to the children as well by default (harmless when they were not stopped)."""
        self._signal(signal.SIGCONT, children)
        self.paused = False

    def stop(self, timeout: float = 90.0) -> int:
        if self.paused and self.running:
            self.resume()
        return super().stop(timeout)

    def restart(self, timeout: float = 30.0) -> Node:
        """Start again on the same data dir, port and node id (after a stop or a kill -9)."""
        if self.running:
            self.stop()
        self.start(timeout)
        return self


class Cluster:
    def __init__(self, root: Path | str, dsn: str, n: int = 3, config: str = "", *,
                 names: list[str] | None = None, token: str = CLUSTER_TOKEN, lease_ttl_s: float = 2.0,
                 workers: int = 1, cluster: dict[str, Any] | None = None,
                 env: dict[str, str] | None = None):
        root = Path(root)
        names = names or list(NAMES[:n])
        self.dsn = dsn
        self.nodes = [Node(root / name, name, dsn, config, token=token, lease_ttl_s=lease_ttl_s,
                           workers=workers, cluster=cluster, env=env) for name in names]

    def __getitem__(self, i: int | str) -> Node:
        if isinstance(i, str):
            return next(n for n in self.nodes if n.node_id == i)
        return self.nodes[i]

    def __iter__(self) -> Iterator[Node]:
        return iter(self.nodes)

    def __len__(self) -> int:
        return len(self.nodes)

    def _each(self, fn, nodes: list[Node] | None = None) -> list:
        nodes = self.nodes if nodes is None else nodes
        with ThreadPoolExecutor(len(nodes) or 1) as pool:
            return list(pool.map(fn, nodes))

    def start(self, timeout: float = 60.0) -> Cluster:
        """Every node, at once (they migrate the database once between them)."""
        self._each(lambda node: node.start(timeout))
        return self

    def stop(self) -> None:
        """Every node still running, cleanly."""
        self._each(lambda node: node.stop(), [n for n in self.nodes if n.running])

    def logs(self) -> str:
        """The tail of every node's log, for an assertion's message."""
        return "\n".join(f"--- node {n.node_id}:\n{n.log()[-3000:]}" for n in self.nodes)

    def __enter__(self) -> Cluster:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class FramesLock:
    """A transaction of the test's own on the cluster's database that holds
    the frames lock every node's writer takes first (in each job that writes
    frames, fences or leases: the nodes' writes queue up behind it), until
    ``release()`` commits it; with ``key``, it also moves that lane's lease to
    a new epoch (as another node's take would; here a revoke, which needs no
    expiry), so the flushes held up that carry the lane are refused."""

    def __init__(self, dsn: str, key: str = ""):
        self.held, self.go = threading.Event(), threading.Event()
        self._thread = threading.Thread(target=self._run, args=(dsn, key), daemon=True)
        self._thread.start()
        assert self.held.wait(30), "the frames lock was not taken"

    def _run(self, dsn: str, key: str) -> None:
        def hold(uow) -> None:
            uow.leases.revoke([key] if key else [])  # the lock first, always
            self.held.set()
            self.go.wait(60)
        with local_store(SimpleNamespace(store_dsn=dsn)) as s:
            s.job(hold)

    def release(self) -> None:
        self.go.set()
        self._thread.join(30)


def lock_waiters(dsn: str) -> int:
    """Sessions of the database waiting for an advisory lock (the node's writer, behind ours)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
                            " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
                            ).fetchone()[0]
