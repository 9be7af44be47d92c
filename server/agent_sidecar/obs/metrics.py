"""The sidecar's Prometheus metrics: one registry whose collector reads the
live state when scraped (docs/operations.md, "Metrics", lists every name).

Nothing is recorded through prometheus_client as it happens: the turn
engine, the frame bus, the writer client and the authenticator count in
plain numbers (meters.py), and ``SidecarCollector.collect`` turns those into
samples at scrape time, on the event loop. The writer and the workers are
other processes: the writer times each commit and returns the time with its
results, the workers time each model call and report it with the turn's end
(turns/wire.py TurnReport), and their memory is read from /proc here. So one
scrape of the parent covers every process, and only this module (imported
by runtime.py when ``[metrics] listen`` is set) imports prometheus_client.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import generate_latest
from prometheus_client.utils import floatToGoString

from ..delivery import MODE_NAMES
from .live import Live

PREFIX = "agent_sidecar_"


def _histogram(name: str, doc: str, labels: list[str], by: dict[Any, Any]) -> HistogramMetricFamily:
    """A family from meters.Histogram objects, ``by`` label value (a str, or
    a tuple for several labels; ``{(): h}`` for none)."""
    fam = HistogramMetricFamily(PREFIX + name, doc, labels=labels)
    for label, h in sorted(by.items(), key=lambda kv: str(kv[0])):
        values = list(label) if isinstance(label, tuple) else [label]
        fam.add_metric(values, [(floatToGoString(b), n) for b, n in h.cumulative()], h.sum)
    return fam


def _counter(name: str, doc: str, labels: list[str], by: dict[Any, int]) -> CounterMetricFamily:
    fam = CounterMetricFamily(PREFIX + name, doc, labels=labels)
    for label, n in sorted(by.items(), key=lambda kv: str(kv[0])):
        fam.add_metric(list(label) if isinstance(label, tuple) else [label], n)
    return fam


def _gauge(name: str, doc: str, labels: list[str], by: dict[Any, float]) -> GaugeMetricFamily:
    fam = GaugeMetricFamily(PREFIX + name, doc, labels=labels)
    for label, n in sorted(by.items(), key=lambda kv: str(kv[0])):
        fam.add_metric(list(label) if isinstance(label, tuple) else [label], n)
    return fam


class SidecarCollector:
    """Reads ``live`` at each scrape; ``store_stats`` is what the last
    ``SidecarMetrics.render`` read of the store (a read that awaits)."""

    def __init__(self, live: Live):
        self.live = live
        self.store_stats: Any = None

    def collect(self) -> Iterator[Metric]:
        live = self.live
        yield _gauge("info", "The running sidecar: its version and node id (always 1).",
                     ["version", "node_id"], {(live.version, live.node_id()): 1})
        yield _gauge("start_time_seconds", "When the sidecar started (Unix time).", [],
                     {(): live.started_at})
        yield _gauge("large_requests_bytes", "Bytes of the large requests (1 MiB or more) being handled: "
                     "what limits.max_request_bytes_in_flight caps.", [], {(): live.large_request_bytes()})
        turns = live.turns
        if turns is not None:
            yield from self._turns(turns)
            yield from self._workers()
        yield from self._store()
        cluster = live.cluster()
        if cluster is not None:
            yield from self._cluster(cluster)
        runtime = live.runtime
        if runtime.tools is not None:
            yield from self._tools(runtime.tools, turns.stats if turns is not None else None)
        if runtime.auth is not None:
            yield _counter("auth_failures_total", "Refused credentials, by reason (UNAUTHENTICATED: no or "
                           "an unknown token; PERMISSION_DENIED: a token without the right).",
                           ["reason"], {r: runtime.auth.failures[r]
                                        for r in ("UNAUTHENTICATED", "PERMISSION_DENIED")})

    def _turns(self, turns: Any) -> Iterator[Metric]:
        s = turns.stats
        yield _counter("turns_total", "Turns ended (their terminal frame committed), by outcome "
                       "(completed, failed, superseded) and failure reason.",
                       ["outcome", "reason"], dict(s.ended))
        yield _histogram("turn_duration_seconds", "From a turn's start to its end, by outcome "
                         "(turns that started).", ["outcome"], dict(s.duration))
        yield _histogram("turn_first_token_seconds", "From a turn's start to its first text delta.",
                         [], {(): s.first_token})
        yield _gauge("turns_in_flight", "Turns started whose end has not committed.", [],
                     {(): self.live.in_flight()})
        yield _gauge("queued_prompts", "Prompts waiting in their session's lane, by delivery mode.",
                     ["delivery"], {MODE_NAMES[m]: n for m, n in self.live.queue_depths().items()
                                    if m in MODE_NAMES})
        yield _gauge("prompts_admitted", "Prompts accepted and not ended (running, queued, steering): "
                     "what limits.max_prompts_in_flight caps.", [], {(): len(turns.live)})
        yield _gauge("prompts_admitted_bytes", "Their text and attachments: what "
                     "limits.max_prompt_bytes_in_flight caps.", [], {(): turns.live.held_bytes})
        yield _counter("frames_persisted_total", "Activity frames committed to the store.", [],
                       {(): s.frames})
        yield _counter("frames_persisted_bytes_total", "Their encoded size.", [], {(): s.frame_bytes})
        yield _histogram("model_call_duration_seconds", "Model calls (timed in the worker), by backend.",
                         ["backend"], dict(s.model_calls))
        yield _counter("model_call_errors_total", "Model calls that failed, by backend.", ["backend"],
                       {b: s.model_errors[b] for b in s.model_calls})
        yield _counter("agent_cache_hits_total", "Turns whose session's agent was warm in its worker.",
                       [], {(): s.cache_hits})
        yield _counter("agent_cache_misses_total", "Turns whose agent was rebuilt from the store.",
                       [], {(): s.cache_misses})
        yield _counter("agent_cache_evictions_total", "Warm agents shed, by why (lru, ttl, pressure).",
                       ["why"], {w: s.evictions[w] for w in ("lru", "ttl", "pressure")})

    def _workers(self) -> Iterator[Metric]:
        workers = self.live.workers()
        yield _counter("worker_turns_total", "Turns dispatched to each worker slot.", ["worker"],
                       {str(w.index): w.turns_run for w in workers})
        yield _counter("worker_restarts_total", "Workers that died and were replaced, by slot.",
                       ["worker"], {str(w.index): w.restarts for w in workers})
        yield _gauge("worker_resident_memory_bytes", "Each worker process's resident memory "
                     "(read from /proc).", ["worker"], {str(w.index): w.rss_bytes for w in workers
                                                         if w.alive})

    def _store(self) -> Iterator[Metric]:
        writer = self.live.writer()
        if writer is None:
            return
        c = self.live.runtime.store.commit_stats
        yield _histogram("store_commit_duration_seconds", "Each group commit of the writer process, "
                         "its jobs and COMMIT (timed in the writer).", [], {(): c.seconds})
        yield _histogram("store_commit_batch_jobs", "Jobs per group commit.", [], {(): c.jobs})
        yield _gauge("store_writer_backlog_jobs", "Jobs submitted to the writer and not answered yet.",
                     [], {(): writer.backlog})
        yield _gauge("store_writer_stalled_seconds", "Seconds jobs have waited with no answer from the "
                     "writer (0 when none waits): a hung writer, disk or database.", [],
                     {(): writer.stalled_seconds})
        yield _gauge("store_writer_resident_memory_bytes", "The writer process's resident memory.",
                     [], {(): writer.rss_bytes})
        yield _gauge("store_writable", "1 while the store can write, 0 while it fails (health "
                     "NOT_SERVING).", [], {(): 1 if self.live.store_writable() else 0})
        st = self.store_stats
        if st is not None:
            yield _gauge("store_size_bytes", "What the store takes on disk (SQLite: the database and "
                         "its WAL; PostgreSQL: the database).", [], {(): st.size_bytes})
            yield _gauge("store_fts_backlog_messages", "Messages not in the full-text index yet.", [],
                         {(): st.fts_backlog})

    def _cluster(self, c: Any) -> Iterator[Metric]:
        yield _gauge("cluster_lanes_held", "Lanes whose lease this node holds now.", [], {(): c.lanes_held})
        yield _counter("cluster_lanes_taken_over_total", "Lanes taken with work their last holder left "
                       "(interrupted turns closed, queued prompts rerun).", [], {(): c.lanes_taken_over})
        yield _counter("cluster_leases_lost_total", "Lanes this node stopped running because their lease "
                       "moved on.", [], {(): c.leases_lost})
        yield _counter("cluster_fenced_writes_total", "Writes the store refused because their lane's epoch "
                       "had moved on (the fence).", [], {(): c.fenced_writes})

    def _tools(self, tools: Any, s: Any) -> Iterator[Metric]:
        yield _gauge("tool_hosts", "Tool hosts connected (ServeTools streams), by namespace.",
                     ["namespace"], tools.hosts_by_namespace())
        if s is not None:
            yield _histogram("tool_call_duration_seconds", "Tool calls, by namespace (local: in-process "
                             "tools; unknown: a name no host serves).", ["namespace"], dict(s.tool_calls))
            yield _counter("tool_call_errors_total", "Tool calls that failed or were refused, by namespace.",
                           ["namespace"], {n: s.tool_errors[n] for n in {*s.tool_calls, *s.tool_errors}})


class SidecarMetrics:
    """The registry ``/metrics`` serves: the sidecar's collector and the
    standard process and Python collectors (of the parent process)."""

    def __init__(self, live: Live):
        self.registry = CollectorRegistry(auto_describe=False)
        self.collector = SidecarCollector(live)
        self.registry.register(self.collector)
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        GCCollector(registry=self.registry)

    async def render(self) -> bytes:
        """The text exposition format of every metric now."""
        self.collector.store_stats = await self.collector.live.store_stats()
        return generate_latest(self.registry)
