"""The running sidecar, wired in one place: the store, the turn engine and its
workers, the services and the server, and the order they start and stop in.
``serve`` in cli/ builds one of these; tests run the real thing as a
subprocess. Nothing below this module builds another layer's objects: api/
gets its services' collaborators from here, turns/ its store and tools.

Start order matters (DECISIONS.md): workers are spawned and answering *before*
the gRPC server exists, so no fork/spawn ever happens while gRPC threads run.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import stat
from collections.abc import Iterable
from typing import TYPE_CHECKING, cast

from . import __version__, data_dir_lock
from . import errors as E
from .api.request_budget import RequestBudget
from .child import STOP_SIGNALS
from .children import start_together, tune_gc
from .clean_stop import final_index, leave_cluster, mark_clean, unsaved
from .config import Config
from .heap import return_large_blocks
from .obs import tracing
from .obs.live import Live
from .rlimits import raise_open_files
from .sdnotify import notify
from .store import Store, StoreUnavailable, open_store

if TYPE_CHECKING:  # imported where used: the gRPC layer loads after the workers spawn
    import grpc

    from .api.auth import Authenticator
    from .api.readiness import Readiness
    from .api.server import SidecarHealth
    from .cluster.forward import Forwarder
    from .cluster.tail import FrameTail
    from .obs.http import MetricsServer
    from .store.interface import SharedStore
    from .tools.registry import ToolRegistry
    from .turns.manager import TurnManager

log = logging.getLogger("agent_sidecar")
HURRIED_CLOSE_S = 2.0  # the store writer's time to confirm its close after a second stop signal

# Where the store jobs live: the writer process imports them while the workers
# start, not when the first job (the startup restore) arrives.
JOB_MODULES = ("agent_sidecar.recovery.housekeeping", "agent_sidecar.recovery.startup",
               "agent_sidecar.sessions.lifecycle", "agent_sidecar.sessions.transcripts",
               "agent_sidecar.turns.jobs", "agent_sidecar.turns.flush", "agent_sidecar.store.jobs",
               "agent_sidecar.cluster.jobs")


# The DSN's parameters that are secrets: the password, and the one of the
# client certificate's key (libpq's sslpassword).
_DSN_SECRETS = frozenset(("password", "sslpassword"))


class StoppedWhileStarting(Exception):
    """A stop signal came while the writer and the workers were being
    spawned: their starts were undone, and nothing was written or served."""


def store_description(cfg: Config) -> str:
    """What the store is, for the log: the SQLite file, or PostgreSQL and its
    DSN without its secrets (the log must never hold one)."""
    if cfg.store.backend != "postgres":
        return f"sqlite {cfg.db_path}"
    from psycopg import ProgrammingError
    from psycopg.conninfo import conninfo_to_dict, make_conninfo
    try:
        params = conninfo_to_dict(cfg.store.dsn)
    except ProgrammingError:  # not a DSN libpq reads (the store opened with it: not expected)
        return "postgres"
    return "postgres " + make_conninfo("", **{k: v for k, v in params.items() if k not in _DSN_SECRETS})


class Sidecar:
    def __init__(self, cfg: Config):
        self.cfg = cfg
        self.store: Store | None = None
        self.server: grpc.aio.Server | None = None
        self.health: SidecarHealth | None = None
        self.turns: TurnManager | None = None
        self.tail: FrameTail | None = None  # [cluster] the frame tail, when the store is shared (PostgreSQL)
        self._stopping = asyncio.Event()
        self._hurry = asyncio.Event()  # a second stop signal: the drain ends now
        self.exit_code = 0
        self._lock_fd: int | None = None
        self._forward: Forwarder | None = None  # cluster/forward.py, on a cluster
        self.readiness: Readiness | None = None  # health following the store (api/readiness.py)
        self.tools: ToolRegistry | None = None
        self.auth: Authenticator | None = None
        self.live = Live(self)  # what GetStatus and the metrics read (obs/)
        self.metrics: MetricsServer | None = None  # the [metrics] listener, when configured
        self.requests = RequestBudget(cfg.limits.max_request_bytes_in_flight)  # large requests being handled

    def _private_data_dir(self) -> None:
        """Transcripts are private to the sidecar's user: umask 077 for this
        process and the children it spawns (so the database and its WAL and
        SHM files, the lock, the marker are born 0600, a new data dir 0700),
        an existing store made 0600, and a warning when the data dir itself
        lets others in (its mode is the operator's; we do not change it)."""
        os.umask(0o077)
        os.makedirs(self.cfg.data_dir, mode=0o700, exist_ok=True)
        mode = stat.S_IMODE(os.stat(self.cfg.data_dir).st_mode)
        if mode & 0o077:
            log.warning("the data dir is readable by other users",
                        extra={"path": self.cfg.data_dir, "mode": f"{mode:04o}"})
        for path in (self.cfg.db_path, self.cfg.db_path + "-wal", self.cfg.db_path + "-shm"):
            try:
                if stat.S_IMODE(os.stat(path).st_mode) & 0o077:
                    os.chmod(path, 0o600)
                    log.warning("store file made private (0600)", extra={"path": path})
            except FileNotFoundError:
                pass

    def _lock_data_dir(self) -> None:
        self._lock_fd = data_dir_lock.take(self.cfg.data_dir)
        if self._lock_fd is None:
            raise RuntimeError(f"another sidecar is running on {self.cfg.data_dir}")

    async def start(self) -> list[str]:
        from .api.auth import Authenticator
        from .api.prompt_service import PromptService
        from .api.readiness import Readiness
        from .api.server import build_server, calm_grpc_threads
        from .api.session_service import SessionService
        from .api.status_service import StatusService
        from .api.tool_service import ToolService
        from .obs.status import snapshot

        if self._stopping.is_set():  # a stop signal before the start (stop_on_signals)
            raise StoppedWhileStarting("the sidecar was stopped before it started")
        self._private_data_dir()
        self._lock_data_dir()
        open_files = raise_open_files()  # every connection is a file: as many as the hard limit allows
        forward = await self._start_engine()
        assert self.store is not None and self.turns is not None  # _start_engine built them
        auth = self.auth = Authenticator(self.cfg.tokens)
        if self.cfg.metrics.listen:  # before the restore: a long one can be watched
            await self._start_metrics()
        self.server, self.health, bound = build_server(self.cfg, [
            SessionService(self.cfg, self.store, auth, self.turns, forward),
            PromptService(self.cfg, self.store, auth, self.turns, forward, tail=self.tail),
            ToolService(self.cfg, auth, self.tools),
            StatusService(self.cfg, auth, lambda: snapshot(self.live))], auth, self.requests,
            open_files[1] if open_files else None)
        if forward is not None:
            self._check_advertise()
        from grpc_health.v1 import health_pb2
        # grpc's servicer starts SERVING; we are not, until the restore is done.
        await self.health.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
        await self.server.start()
        calmed = calm_grpc_threads()
        await self.turns.start()
        self.readiness = Readiness(self.health, self.store, self.cfg.store.stall_not_serving_s, notify)
        await self.readiness.start()
        self.store.watch_faults(self.readiness.store_changed)
        # systemd Type=notify: the restore is done (a store that cannot write is health's to say).
        notify("READY=1\n" + self.readiness.status_line())
        tune_gc()
        log.info("serving", extra={"listen": bound, "db": store_description(self.cfg),
                                   "workers": self.cfg.worker_count(), "batch_threads": calmed,
                                   "open_files": open_files[1] if open_files else None})
        return bound

    async def _start_engine(self):
        """The store, the tool registry and the turn engine (on PostgreSQL also
        the cluster's leases, forwarder and frame tail), with the writer and
        the workers spawned. Returns the forwarder (None off a cluster)."""
        from .tools.registry import ToolRegistry
        from .turns.manager import TurnManager
        sc = self.cfg.store
        self.store = open_store(sc.backend, path=self.cfg.db_path, synchronous=self.cfg.synchronous,
                                dsn=sc.dsn, node_id=self.cfg.node_id(), pool_size=sc.pool_size,
                                preload=JOB_MODULES, log_format=self.cfg.log_format,
                                log_level=self.cfg.log_level, library_log_level=self.cfg.library_log_level,
                                on_lost=self._store_lost)
        tools = self.tools = ToolRegistry(max_result_bytes=self.cfg.limits.max_text_bytes)
        leases, forward = self._cluster()
        self.turns = TurnManager(self.cfg, self.store, tools, leases)
        if leases is not None:
            leases.attach(self.turns)
        # Spawned before any gRPC thread exists, the writer and the workers in parallel;
        # if one cannot start, the others' starts are undone before stop() runs.
        await self._unless_stopped(start_together(self.store.start(), self.turns.start_workers()))
        tracing.configure(__version__)  # after the spawns: its export thread is not theirs
        return_large_blocks()  # the memory of a large request goes back once it is gone
        if self.cfg.clustered:  # every node's frames to this node's watchers
            from .cluster.tail import FrameTail
            shared = cast("SharedStore", self.store)  # the PostgreSQL store is one
            self.tail = FrameTail(shared, self.turns, self.cfg.node_id())
            await self.tail.start()  # before the server: no watcher subscribes ahead of its cursor
        else:  # where a live watch starts before any frame is handed out (frames.py watch_head)
            self.turns.bus.watch_head = await self.store.last_frame_cursor()
        return forward

    async def _unless_stopped(self, starts) -> None:
        """Await ``starts`` unless a stop is requested first: then they are
        cancelled (their children killed and reaped) and StoppedWhileStarting
        is raised. Nothing is written before the restore that comes after
        them (the clean-shutdown marker of the last stop is still there), so
        a stop signal need not wait for a child that is slow to start (up to
        its 60 s hello timeout) before the supervisor's stop timeout kills us."""
        task = asyncio.ensure_future(starts)
        stop = asyncio.ensure_future(self._stopping.wait())
        try:
            await asyncio.wait((task, stop), return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
            if not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        if task.cancelled():
            raise StoppedWhileStarting("the sidecar was stopped while it started")
        task.result()

    def _check_advertise(self) -> None:
        """A node the others cannot reach where it advertises itself fails
        every call they forward to it: said at start, not only by them."""
        from .cluster.forward import advertise_problem
        problem = advertise_problem(self.cfg)
        if problem is not None:
            log.warning("the other nodes may not reach this one at [cluster] advertise",
                        extra={"advertise": self.cfg.cluster.advertise, "problem": problem})

    def _cluster(self):
        """Several sidecars on one PostgreSQL: lane leases and call forwarding
        (cluster/), when ``[cluster] advertise`` makes this sidecar a node."""
        if not self.cfg.clustered:
            return None, None
        from .cluster.forward import Forwarder
        from .cluster.leases import ClusterLeases
        self._forward = Forwarder(self.cfg, self.cfg.limits.max_request_bytes)
        assert self.store is not None  # opened just before
        return ClusterLeases(self.cfg, cast("SharedStore", self.store)), self._forward  # the PostgreSQL store

    async def _start_metrics(self) -> None:
        """The Prometheus endpoint (obs/): imported only when configured."""
        from .obs.http import MetricsServer
        from .obs.metrics import SidecarMetrics
        self.metrics = MetricsServer(SidecarMetrics(self.live).render)
        bound = await self.metrics.start(self.cfg.metrics.listen)
        log.info("metrics listening", extra={"listen": bound, "path": "/metrics"})

    def _store_lost(self) -> None:
        """Without its writer the sidecar cannot acknowledge anything: stop
        (not cleanly: no marker), and let the supervisor restart us. Calls in
        flight end UNAVAILABLE / STORE_UNAVAILABLE, not with the shutdown."""
        from .store import StoreClosed
        from .turns.supervision import end_streams
        self.exit_code = 1
        if self.turns is not None:
            end_streams(self.turns, StoreClosed("the store writer process exited"))
        self.request_stop()

    def request_stop(self) -> None:
        self._stopping.set()

    def stop_on_signals(self, held: Iterable[signal.Signals] = ()) -> None:
        """SIGTERM, SIGINT and SIGHUP stop the sidecar cleanly (drained, the
        marker written), from before ``start``: one that comes while its
        children start undoes their start (``_unless_stopped``), one during
        the startup restore stops it as soon as it is up. SIGHUP is a closed terminal or an
        operator's habit; there is no reload, and its default action would
        kill the process mid-turn. A second one during the drain cuts it short:
        the turns still running end as a drain timeout ends them (marked, and
        resumed at the next start), so an operator's repeated Ctrl-C stops the
        sidecar at once and loses nothing acknowledged. ``held``: the ones
        that came before (cli/serve.py held them), acted on now: ``start``
        then begins nothing."""
        loop = asyncio.get_running_loop()
        for sig in STOP_SIGNALS:
            loop.add_signal_handler(sig, self._on_signal, sig)
        for sig in held:
            self._on_signal(sig)

    def _on_signal(self, sig: signal.Signals) -> None:
        if not self._stopping.is_set():
            log.info("stop requested", extra={"signal": sig.name})
        elif not self._hurry.is_set():
            if self.turns is not None and self.turns.ready.is_set():
                log.warning("stop requested again: the drain is cut short, turns still running are resumed"
                            " at the next start", extra={"signal": sig.name})
            else:  # nothing to drain yet: the start (its restore) ends first, then the stop
                log.warning("stop requested again: the sidecar stops as soon as its start is done",
                            extra={"signal": sig.name})
            self._hurry.set()
        self.request_stop()

    async def run_until_stopped(self) -> None:
        await self._stopping.wait()
        await self.stop()

    async def stop(self) -> None:
        """The clean path: NOT_SERVING, refuse new prompts, drain in-flight
        turns (bounded), stop gRPC and workers, flush and checkpoint the store,
        and only then write the marker (seed 001 §7: at the end of any graceful
        shutdown). A drain that timed out has marked its lanes
        ``shutdown_timeout`` already; without the marker the next start would
        also mark every lane active in the last two minutes, idle ones too."""
        log.info("stopping")
        notify("STOPPING=1")
        drained = False
        # Graceful: startup restore finished and nothing failed under us.
        graceful = self.turns is not None and self.turns.ready.is_set() and not self.exit_code
        if self.readiness is not None:  # the drain has health from now on
            self.readiness.close()
        if self.health is not None:
            await self.health.enter_graceful_shutdown()
        if graceful and self.turns is not None:
            drained = await self.turns.drain(self.cfg.drain_timeout, self._hurry)
        if self.store is not None and self.store.fault is not None and self.turns is not None:
            from .turns.supervision import end_streams  # their ends cannot commit now
            end_streams(self.turns, StoreUnavailable(self.store.fault.message))
        if self.turns is not None:  # before gRPC's stop cancels the calls bare
            from .turns.supervision import end_queued_streams
            end_queued_streams(self.turns)
            self.turns.bus.end_watches(E.SidecarError(E.UNAVAILABLE, "the sidecar is shutting down; retry"))
        if self.server is not None:
            await self.server.stop(grace=1)
        if self.turns is not None:
            await self.turns.stop()
        if self.tail is not None:
            await self.tail.stop()
        if self.store is not None:
            await self._close_store(graceful)
        # The spans still buffered go out last: a collector that hangs (the exporter's
        # timeout, 10 s) must not hold back the store's last write and the marker.
        await asyncio.to_thread(tracing.shutdown)
        if self._lock_fd is not None:
            os.close(self._lock_fd)
        log.info("stopped", extra={"clean": graceful and not self.exit_code, "drained": drained})

    async def _close_store(self, graceful: bool) -> None:
        """The stop's last writes (the full-text index; on a cluster, leaving
        it), the store closed, and the marker when everything is saved
        (clean_stop.py). A write the store does not answer (its writer
        stalled) is given up after a while (supervision.answered): the stop
        then ends without the marker, exit status 1. After a second stop
        signal the writer has HURRIED_CLOSE_S to confirm its close."""
        assert self.store is not None  # stop() checked
        # Answered, the last write says every write before it is committed too.
        error = unsaved(self.store, self.turns, answered=graceful and await final_index(self.store))
        if graceful and not self.exit_code and error is None and self.turns is not None \
                and self.turns.leases is not None:
            await leave_cluster(self.turns.leases, self._forward)
        if self.metrics is not None:
            await self.metrics.close()
        await self.store.close(HURRIED_CLOSE_S if self._hurry.is_set() else 30.0)
        if graceful and not self.exit_code and not mark_clean(self.cfg.data_dir, error):
            self.exit_code = 1
