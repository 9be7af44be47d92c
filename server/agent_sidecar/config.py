"""Configuration: defaults < a TOML file < ``AGENT_SIDECAR_*`` environment
variables < command-line flags, every key checked for type and range.

The file carries the keys of seed 001's appendix under their own names
(``group_sessions_per_user``, ``[agent] gateway_timeout``,
``[agent.agent_cache] max_size`` …), the sidecar's own settings, auth tokens,
profiles — named agent configurations (DECISIONS.md, "Names and keys") — and
per-platform settings::

    group_sessions_per_user = true
    [agent]
    gateway_timeout = 1800
    [sidecar]
    workers = 2
    [profiles.main]
    model = "echo"
    system_prompt = "You are a helpful assistant."
    tools = ["local.*"]

Every key is declared once below, with its type, default, range and doc
(config_schema.py says how, and how to add a section); the loader
(config_loader.py) refuses unknown keys, wrong types and values out of range,
all of them in one ConfigError, and docs/configuration.md's key table is
generated from the same declarations. Worker processes never import this
module: they get plain settings dicts.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, fields
from importlib.util import find_spec
from typing import Any

from .config_limits import Limits
from .config_loader import Loader, read_toml
from .config_net import AuthToken, ClusterConfig, Listener, MetricsConfig, listen_address
from .config_schema import ConfigError, array, key, named, section
from .sessions.context import DEFAULT_PII_SAFE, NEVER_REDACTED

__all__ = ["AUTO_RESUME_MODES", "AgentCache", "AuthToken", "Config", "ConfigError", "DEFAULT_PROFILE",
           "Limits", "Listener", "PlatformConfig", "Profile", "load_config"]

DEFAULT_PROFILE = "main"
DEFAULT_SYSTEM_PROMPT = "You are a helpful assistant."
AUTO_RESUME_MODES = ("interrupted", "recent", "off")
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")


def _name(kind: str, fold: bool):
    def check(name: str) -> tuple[str, str | None]:
        if not name or ":" in name:
            return name, f"a {kind} name must be non-empty and have no ':'"
        return (name.lower() if fold else name), None
    return check


@dataclass
class Profile:
    name: str = key("", internal=True)
    model: str = key("echo", nonempty=True,
                     doc="model backend: `echo`, `scripted`, `openai` or an installed entry point")
    model_options: dict[str, Any] = key({}, doc="the backend's options (a built-in backend's are checked at "
                                                "load, a third-party one's when a worker builds it)")
    system_prompt: str = key(DEFAULT_SYSTEM_PROMPT, doc="the profile's system prompt")
    tools: list[str] = key([], nonempty=True, doc="tool subtrees the model may call, e.g. `[\"local.*\"]`")
    max_iterations: int = key(25, ge=1, doc="model calls per turn at most")
    timeout_s: float = key(0.0, ge=0, doc="the turn timeout in seconds (0: `agent.gateway_timeout`)")
    tool_timeout_s: float = key(60.0, gt=0, doc="how long one tool call waits for its result (s); past it "
                                                "the model gets an error result and the turn goes on")
    queue_cap: int = key(32, ge=0, doc="prompts waiting in one session's queue (0: no cap); past it QUEUE_FULL")

    @property
    def wire(self) -> dict[str, Any]:
        """The dict a worker receives with every turn (orjson-able); profiles
        do not change while the sidecar runs, so it is built once."""
        w = self.__dict__.get("_wire")
        if w is None:
            w = self.__dict__["_wire"] = {f.name: getattr(self, f.name) for f in fields(self)}
        return w


@dataclass
class AgentCache:
    max_size: int = key(128, ge=0, doc="warm agents per worker (LRU; 0: none kept)")
    idle_ttl_secs: float = key(3600.0, gt=0, doc="an idle agent is dropped after this many seconds")
    memory_high_mb: int | str = key("auto", ge=0, choices=("auto", "off"),
                                    doc="worker RSS budget in MB above which agents are shed "
                                        "(`auto`: the cgroup or RAM limit; `off` or 0: never)")
    max_evictions_per_pass: int = key(16, ge=1, doc="agents shed per pass at most")
    protect_recent: int = key(8, ge=0, doc="most recently used agents never shed")
    sweep_interval_secs: float = key(30.0, gt=0, doc="the worker's housekeeping tick (s)")


@dataclass
class PlatformConfig:
    """``[platforms.NAME]``: settings of one platform. ``pii_safe``: its ids
    may be hashed in the system prompt when ``redact_pii`` is on (seed 001
    §9); None keeps the built-in default (the known chat platforms are, a
    plugin platform is not)."""
    name: str = key("", internal=True)
    pii_safe: bool | None = key(None, shown="built-in",
                                doc="with `redact_pii`, whether its user and chat ids are hashed "
                                    "(default: true for the built-in chat platforms)")

    def _validate(self) -> Iterator[tuple[str, str, Any]]:
        if self.pii_safe and self.name in NEVER_REDACTED:
            yield "pii_safe", f"{self.name} ids are never redacted (mentions need them)", True


@dataclass
class StoreConfig:
    """Where the sidecar keeps everything (docs/cluster.md for PostgreSQL)."""
    backend: str = key("sqlite", choices=("sqlite", "postgres"),
                       doc="`sqlite`: one file in the data dir (the embedded default); "
                           "`postgres`: a database several sidecars share")
    dsn: str = key("", secret=True, doc="the PostgreSQL connection string (`backend = \"postgres\"`), "
                                      "e.g. `postgresql://sidecar@db/sidecar`")
    pool_size: int = key(4, ge=1, le=100, doc="PostgreSQL connections for reads (the writer has its own)")
    stall_not_serving_s: float = key(30.0, ge=0, le=86400,
                                     doc="health turns `NOT_SERVING` while the store has left writes "
                                         "unanswered this many seconds (a disk or database that hangs "
                                         "rather than fails), and `SERVING` once it answers; 0: never")


@dataclass
class StreamConfig:
    """How a turn's text reaches its streams ([stream])."""
    coalesce_ms: float = key(100.0, ge=0, le=1000,
                             doc="text deltas a turn's model produces within this many ms are "
                                 "persisted and sent as one `text_delta` frame (the first at once; "
                                 "0: one frame per model delta)")


@dataclass
class Config:
    # seed 001 appendix: top-level keys
    group_sessions_per_user: bool = key(True, doc="groups and channels get one lane per participant")
    thread_sessions_per_user: bool = key(False, doc="threads get one lane per participant (default: shared)")
    session_store_max_age_days: int = key(0, ge=0, doc="sessions idle this many days are pruned (0: off)")
    # [agent]
    gateway_timeout: float = key(1800.0, gt=0, toml="agent.gateway_timeout",
                                 doc="a turn's timeout in seconds (a profile's `timeout_s` overrides)")
    gateway_auto_continue_freshness: float = key(
        3600.0, gt=0, toml="agent.gateway_auto_continue_freshness",
        doc="an interrupted lane is auto-resumed only if active this recently (s)")
    steer_timeout_s: float = key(
        5.0, gt=0, le=3600, toml="agent.steer_timeout_s",
        doc="a STEER prompt's text is taken into the running turn only this many seconds after it was "
            "asked; the prompt waits as long again for the worker's answer, then is placed as a "
            "FOLLOW_UP (a worker too busy to answer, e.g. a model backend blocking its loop)")
    cancel_grace_s: float = key(
        5.0, gt=0, le=3600, toml="agent.cancel_grace_s",
        doc="a cancelled turn's worker has this many seconds to stop it; past them the worker is taken "
            "for stuck (its loop blocked, stopped) and replaced, and every turn it was running ends "
            "(the cancelled one as its cancel said, the others `WORKER_CRASHED`)")
    agent_cache: AgentCache = section(AgentCache, toml="agent.agent_cache", doc="the workers' agent cache")
    # [sidecar]: the sidecar's own settings
    data_dir: str = key("./data", nonempty=True, toml="sidecar.data_dir", doc="as `--data-dir`")
    listen: list[str] = key([], check=listen_address, toml="sidecar.listen",
                            doc="as `--listen`: `unix:PATH` or `HOST:PORT` (empty: the data dir's socket)")
    log_format: str = key("json", choices=("json", "text"), toml="sidecar.log_format", doc="as `--log-format`")
    log_level: str = key("info", fold="lower", choices=LOG_LEVELS, toml="sidecar.log_level",
                         doc="as `--log-level`")
    library_log_level: str = key(
        "warning", fold="lower", choices=LOG_LEVELS, toml="sidecar.library_log_level",
        doc="the lines of the libraries the sidecar and its model backends use (httpx, gRPC, psycopg, "
            "a plugin's: every logger outside `agent_sidecar`) from this level, never below `log_level`")
    workers: int = key(0, ge=0, le=256, toml="sidecar.workers",
                       doc="worker processes (0: one per CPU the sidecar may use: its CPU affinity, "
                           "capped by its cgroup's CPU limit)")
    synchronous: str = key("FULL", fold="upper", choices=("FULL", "NORMAL"), toml="sidecar.synchronous",
                           doc="SQLite durability (a process crash loses nothing acknowledged either way)")
    drain_timeout: float = key(60.0, ge=0, toml="sidecar.drain_timeout",
                               doc="seconds in-flight turns get on SIGTERM; a supervisor's stop timeout "
                                   "must be longer ([deployment.md](deployment.md))")
    retention_days: float = key(7.0, gt=0, toml="sidecar.retention_days",
                                doc="frames and ledger rows are pruned after this (transcripts never)")
    dedup_window_s: float = key(300.0, gt=0, toml="sidecar.dedup_window_s",
                                doc="a request id within this window never starts a second turn "
                                    "(at most `retention_days`: its replay reads the frames)")
    housekeeping_interval_s: float = key(60.0, gt=0, toml="sidecar.housekeeping_interval_s",
                                         doc="retention and pruning tick")
    keepalive_s: float = key(15.0, gt=0, le=30, toml="sidecar.keepalive_s",
                             doc="a silent stream gets a keepalive frame this often (the clients take "
                                 "45 s without one for a dropped connection)")
    redact_pii: bool = key(False, toml="sidecar.redact_pii",
                           doc="redact ids in GetSessionContext's prompt section")
    connected_platforms: list[str] = key([], nonempty=True, toml="sidecar.connected_platforms",
                                         doc="platforms named in the session context")
    home_channels: dict[str, Any] = key({}, toml="sidecar.home_channels",
                                        doc="per-platform home channels for the session context")
    limits: Limits = section(Limits, toml="sidecar.limits",
                             doc="request size and load limits ([semantics.md](semantics.md#limits))")
    # [[auth.tokens]], [profiles.NAME], [platforms.NAME], [recovery]
    tokens: list[AuthToken] = array(AuthToken, toml="auth.tokens",
                                    doc="bearer tokens (TCP listeners need at least one)")
    # [[listen]]: listeners with settings of their own (TLS); bound after sidecar.listen.
    listeners: list[Listener] = array(Listener, toml="listen",
                                      doc="listeners with settings of their own: TLS and mTLS "
                                          "([security.md](security.md))")
    profiles: dict[str, Profile] = named(Profile, names=_name("profile", fold=False),
                                         doc="named agent configurations (`main` always exists)")
    platforms: dict[str, PlatformConfig] = named(PlatformConfig, names=_name("platform", fold=True),
                                                 doc="settings of one platform (names are case-insensitive)")
    auto_resume: str = key("interrupted", choices=AUTO_RESUME_MODES, toml="recovery.auto_resume",
                           doc="which lanes get a continue turn after a restart "
                               "([semantics.md](semantics.md#recovery))")
    store: StoreConfig = section(StoreConfig,
                                 doc="where the sessions, turns and frames are kept: an SQLite file in "
                                     "the data dir, or a PostgreSQL database ([cluster.md](cluster.md))")
    cluster: ClusterConfig = section(ClusterConfig, doc="several sidecars on one PostgreSQL "
                                                      "([cluster.md](cluster.md))")
    metrics: MetricsConfig = section(MetricsConfig, doc="Prometheus metrics over HTTP "
                                                           "([operations.md](operations.md#metrics))")
    stream: StreamConfig = section(StreamConfig, doc="text delta coalescing "
                                                         "([operations.md](operations.md#sizing-and-tuning))")

    def _validate(self) -> Iterator[tuple[str, str, Any]]:
        tcp = [t for t in self.listen if not t.startswith("unix:")]
        if tcp and not self.tokens:
            yield "sidecar.listen", "a TCP listener needs [[auth.tokens]] in the config", tcp[0]
        for i, entry in enumerate(self.listeners):
            if not entry.address.startswith("unix:") and not self.tokens:
                yield f"listen[{i}].address", "a TCP listener needs [[auth.tokens]] in the config", \
                    entry.address
        first: dict[str, int] = {}
        for i, t in enumerate(self.tokens):
            if t.token and first.setdefault(t.token, i) != i:  # one token, two sets of rights
                yield f"auth.tokens[{i}].token", f"the same token as auth.tokens[{first[t.token]}]", "***"
        if self.store.backend == "postgres" and not self.store.dsn:
            yield "store.dsn", "backend \"postgres\" needs a DSN (dsn, dsn_env or dsn_file)", ""
        # Found, not imported: commands that read the configuration never use the driver.
        if self.store.backend == "postgres" and None in (find_spec("psycopg"), find_spec("psycopg_pool")):
            yield "store.backend", ("\"postgres\" needs its driver, which is not installed:"
                                    " pip install 'agent-sidecar[postgres]'"), "postgres"
        if self.dedup_window_s > self.retention_days * 86400:  # a twin replays the ledger and frames
            yield "sidecar.dedup_window_s", (f"must be within retention_days ({self.retention_days * 86400:g} s):"
                                             " a retry in the window replays frames retention has pruned"), \
                self.dedup_window_s
        if self.cluster.advertise and self.store.backend != "postgres":
            yield "cluster.advertise", "a cluster needs [store] backend = \"postgres\"", self.cluster.advertise
        if self.cluster.advertise and not self.cluster.token:
            yield "cluster.token", "required with advertise (give token, token_env or token_file): the other" \
                " sidecars present it to call this one", ""
        elif self.cluster.advertise and not any(t.admin and "*" in t.platforms and t.token == self.cluster.token
                                                for t in self.tokens):
            yield "cluster.token", "must also be an admin token for every platform in [[auth.tokens]]: the" \
                " other sidecars present it here, as this one presents it to them", "***"

    @property
    def clustered(self) -> bool:
        """One of several sidecars on one PostgreSQL database (``[cluster]
        advertise`` set): lanes under leases (cluster/). Without it a sidecar
        on PostgreSQL runs alone on its database, as on SQLite."""
        return bool(self.cluster.advertise)

    def all_listeners(self) -> list[Listener]:
        """Every listener to bind: ``sidecar.listen`` (``--listen``), then
        ``[[listen]]``; the data dir's socket when there is none."""
        out = [Listener(address=a) for a in self.listen] + list(self.listeners)
        return out or [Listener(address=self.default_socket)]

    @property
    def db_path(self) -> str:
        return os.path.join(self.data_dir, "sidecar.db")

    @property
    def default_socket(self) -> str:
        return "unix:" + os.path.join(os.path.abspath(self.data_dir), "sidecar.sock")

    def profile(self, name: str) -> Profile | None:
        return self.profiles.get(name or DEFAULT_PROFILE)

    def node_id(self) -> str:
        """This sidecar's name in a cluster: as configured, else its host and data dir."""
        if self.cluster.node_id:
            return self.cluster.node_id
        import socket
        return f"{socket.gethostname()}:{os.path.abspath(self.data_dir)}"

    def worker_count(self) -> int:
        """``workers``, else one per CPU the sidecar may use (cgroup.py: its
        affinity and cgroup quota, not the host's count)."""
        from .cgroup import available_cpus
        return self.workers if self.workers > 0 else available_cpus()

    def pii_safe_platforms(self) -> frozenset[str]:
        """The built-in pii-safe set with ``[platforms.*] pii_safe`` applied."""
        out = set(DEFAULT_PII_SAFE)
        for name, p in self.platforms.items():
            if p.pii_safe is True:
                out.add(name)
            elif p.pii_safe is False:
                out.discard(name)
        return frozenset(out)


def load_config(path: str | None = None, environ: Mapping[str, str] | None = None,
                **overrides: Any) -> Config:
    """The config of the TOML file ``path`` (if any), overlaid by the
    ``AGENT_SIDECAR_*`` variables of ``environ`` (default: os.environ), then by
    the non-None ``overrides`` (command-line flags, by Config attribute name).
    Raises ConfigError listing every problem found."""
    loader = Loader(os.environ if environ is None else environ)
    raw = read_toml(path)
    loader.overlay_env(Config, raw)
    loader.overlay_flags(Config, raw, overrides)
    cfg = loader.parse(Config, raw, "")
    cfg.profiles.setdefault(DEFAULT_PROFILE, Profile(name=DEFAULT_PROFILE))
    _check_models(cfg, loader)
    if loader.out.lines:
        raise ConfigError(loader.out.lines)
    return cfg


def _check_models(cfg: Config, loader: Loader) -> None:
    """Every profile's model names a backend this install has, and a built-in
    backend takes the profile's ``model_options``: it is built here once, as a
    worker builds it (its constructor checks them, and reads the variable an
    ``api_key_env`` names), so a missing ``model``, an unknown option or a value
    of the wrong kind is a config error at start, never an LLM_API_FAILURE of
    every turn of that profile. A third-party backend is built only in the
    workers: building one here could import into the parent what only a worker
    should hold."""
    from .models.registry import BUILTINS, backend_names, load_backend
    known = set(backend_names())
    for name, p in cfg.profiles.items():
        if p.model and p.model not in known:
            loader.out.add(f"profiles.{name}.model",
                           f"unknown model backend (known: {', '.join(sorted(known))})", p.model)
        elif p.model in BUILTINS and not loader.out.reported(f"profiles.{name}.model_options"):
            try:
                load_backend(p.model, p.model_options)
            except (ValueError, TypeError) as exc:  # the message names the option, never a header's value
                loader.out.add(f"profiles.{name}.model_options", str(exc))
