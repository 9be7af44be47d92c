"""Configuration: a TOML file (stdlib ``tomllib``) overlaid by command-line flags.

The file carries the keys of seed 001's appendix under their own names
(``group_sessions_per_user``, ``[agent] gateway_timeout``,
``[agent.agent_cache] max_size`` …), the sidecar's own settings, auth tokens, and
profiles — named agent configurations (DECISIONS.md, "Names and keys")::

    group_sessions_per_user = true
    [agent]
    gateway_timeout = 1800
    [sidecar]
    workers = 2
    [profiles.main]
    model = "echo"
    system_prompt = "You are a helpful assistant."
    tools = ["local.*"]

Unknown keys are errors: a typo in a config file should stop the sidecar, not be
silently ignored.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field, fields
from typing import Any

from .sessions.context import DEFAULT_PII_SAFE, NEVER_REDACTED

DEFAULT_PROFILE = "main"
DEFAULT_SYSTEM_PROMPT = "You are a helpful assistant."


class ConfigError(ValueError):
    pass


@dataclass
class Profile:
    name: str
    model: str = "echo"
    model_options: dict[str, Any] = field(default_factory=dict)
    system_prompt: str = DEFAULT_SYSTEM_PROMPT
    tools: list[str] = field(default_factory=list)
    max_iterations: int = 25
    timeout_s: float = 0.0  # 0: use agent.gateway_timeout
    queue_cap: int = 32  # queued prompts per session (QUEUE_FULL past it); 0: no cap

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
    max_size: int = 128
    idle_ttl_secs: float = 3600.0
    memory_high_mb: int | str = "auto"
    max_evictions_per_pass: int = 16
    protect_recent: int = 8
    sweep_interval_secs: float = 30.0  # the worker's housekeeping tick


@dataclass
class AuthToken:
    token: str
    platforms: list[str] = field(default_factory=lambda: ["*"])
    admin: bool = False


@dataclass
class Limits:
    max_text_bytes: int = 256 * 1024
    max_attachment_bytes: int = 8 * 1024 * 1024
    max_attachments: int = 16
    max_messages_per_request: int = 1000
    max_page_size: int = 1000
    default_page_size: int = 100
    max_frames_per_turn: int = 20_000
    max_id_length: int = 256
    # Load limits (issue 14). A stream (Prompt, WatchActivity) whose reader
    # falls this far behind is ended with STREAM_TOO_SLOW (it resumes from the
    # store); prompts in flight or queued, and the bytes of their text and
    # attachments, are capped sidecar-wide (OVERLOADED; 0: no cap). The
    # defaults keep a hostile burst within a small (2 GB) host.
    stream_buffer_frames: int = 10_000
    stream_buffer_bytes: int = 8 * 1024 * 1024
    max_prompts_in_flight: int = 1000
    max_prompt_bytes_in_flight: int = 16 * 1024 * 1024
    # The largest request message accepted, whatever its fields' limits allow
    # (api/caps.py derives each RPC's own, smaller bound from the limits above).
    max_request_bytes: int = 32 * 1024 * 1024


@dataclass
class PlatformConfig:
    """``[platforms.NAME]``: settings of one platform. ``pii_safe``: its ids
    may be hashed in the system prompt when ``redact_pii`` is on (seed 001
    §9); None keeps the built-in default (the known chat platforms are, a
    plugin platform is not)."""
    pii_safe: bool | None = None


AUTO_RESUME_MODES = ("interrupted", "recent", "off")


@dataclass
class Config:
    data_dir: str = "./data"
    listen: list[str] = field(default_factory=list)  # empty: unix:<data_dir>/sidecar.sock
    log_format: str = "json"
    log_level: str = "info"
    # seed 001 appendix
    group_sessions_per_user: bool = True
    thread_sessions_per_user: bool = False
    session_store_max_age_days: int = 0
    gateway_auto_continue_freshness: float = 3600.0
    gateway_timeout: float = 1800.0
    agent_cache: AgentCache = field(default_factory=AgentCache)
    # the sidecar's own settings
    workers: int = 0  # 0: CPU count
    synchronous: str = "FULL"
    drain_timeout: float = 60.0
    retention_days: float = 7.0
    dedup_window_s: float = 300.0
    housekeeping_interval_s: float = 60.0
    keepalive_s: float = 15.0  # a silent stream gets a keepalive frame this often
    redact_pii: bool = False
    connected_platforms: list[str] = field(default_factory=list)
    home_channels: dict[str, Any] = field(default_factory=dict)
    limits: Limits = field(default_factory=Limits)
    tokens: list[AuthToken] = field(default_factory=list)
    profiles: dict[str, Profile] = field(default_factory=dict)
    # [platforms.NAME], names in lower case (platform names are case-insensitive)
    platforms: dict[str, PlatformConfig] = field(default_factory=dict)
    # [recovery] auto_resume: which lanes get a continue turn after a restart
    # (DECISIONS.md "Recovery"): "interrupted", "recent" or "off"
    auto_resume: str = "interrupted"

    @property
    def db_path(self) -> str:
        return os.path.join(self.data_dir, "sidecar.db")

    @property
    def default_socket(self) -> str:
        return "unix:" + os.path.join(os.path.abspath(self.data_dir), "sidecar.sock")

    def profile(self, name: str) -> Profile | None:
        return self.profiles.get(name or DEFAULT_PROFILE)

    def worker_count(self) -> int:
        return self.workers if self.workers > 0 else (os.cpu_count() or 1)

    def pii_safe_platforms(self) -> frozenset[str]:
        """The built-in pii-safe set with ``[platforms.*] pii_safe`` applied."""
        out = set(DEFAULT_PII_SAFE)
        for name, p in self.platforms.items():
            if p.pii_safe is True:
                out.add(name)
            elif p.pii_safe is False:
                out.discard(name)
        return frozenset(out)


def _take(table: dict, key: str, kind, where: str, default=None):
    if key not in table:
        return default
    value = table.pop(key)
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, kind):
        raise ConfigError(f"{where}{key}: expected {getattr(kind, '__name__', kind)}")
    return value


def _reject_rest(table: dict, where: str) -> None:
    if table:
        raise ConfigError(f"unknown config key(s): {', '.join(where + k for k in table)}")


def _fill(obj, table: dict, where: str) -> None:
    for f in fields(obj):
        if f.name in table:
            current = getattr(obj, f.name)
            kind = type(current) if current is not None else object
            if f.name == "memory_high_mb":
                kind = (int, str)
            setattr(obj, f.name, _take(table, f.name, kind, where))
    _reject_rest(table, where)


def _platform_names(names: list, where: str) -> list[str]:
    """Platform names as the sidecar compares them: lower case ("Telegram" and
    "telegram" are one platform)."""
    if not all(isinstance(n, str) and n for n in names):
        raise ConfigError(f"{where}: expected non-empty strings")
    return [n.lower() for n in names]


def _load_platforms(cfg: Config, tables: dict) -> None:
    """``[platforms.NAME]`` tables; two spellings of one name are an error."""
    for name, table in tables.items():
        key = name.lower()
        where = f"platforms.{name}."
        if not isinstance(table, dict):
            raise ConfigError(f"platforms.{name}: expected a table")
        if not key or ":" in key:
            raise ConfigError(f"platforms.{name}: a platform name must be non-empty and have no ':'")
        if key in cfg.platforms:
            raise ConfigError(f"platforms.{name}: the same platform as another [platforms] table"
                              " (names are case-insensitive)")
        p = PlatformConfig(pii_safe=_take(table, "pii_safe", bool, where))
        if p.pii_safe and key in NEVER_REDACTED:
            raise ConfigError(f"{where}pii_safe: {key} ids are never redacted (mentions need them)")
        _reject_rest(table, where)
        cfg.platforms[key] = p


def load_config(path: str | None = None, **overrides: Any) -> Config:
    """Read the TOML file (if any), then apply non-None ``overrides`` (CLI flags)."""
    cfg = Config()
    raw: dict[str, Any] = {}
    if path:
        try:
            with open(path, "rb") as f:
                raw = tomllib.load(f)
        except (OSError, tomllib.TOMLDecodeError) as e:
            raise ConfigError(f"cannot read config {path}: {e}") from e
    for key in ("group_sessions_per_user", "thread_sessions_per_user"):
        if key in raw:
            setattr(cfg, key, _take(raw, key, bool, ""))
    if "session_store_max_age_days" in raw:
        cfg.session_store_max_age_days = _take(raw, "session_store_max_age_days", int, "")
    agent = dict(raw.pop("agent", {}))
    if "agent_cache" in agent:
        _fill(cfg.agent_cache, dict(agent.pop("agent_cache")), "agent.agent_cache.")
    for key in ("gateway_timeout", "gateway_auto_continue_freshness"):
        if key in agent:
            setattr(cfg, key, _take(agent, key, float, "agent."))
    _reject_rest(agent, "agent.")
    sidecar = dict(raw.pop("sidecar", {}))
    limits = sidecar.pop("limits", None)
    if limits is not None:
        _fill(cfg.limits, dict(limits), "sidecar.limits.")
    for f in ("data_dir", "listen", "log_format", "log_level", "workers", "synchronous",
              "drain_timeout", "retention_days", "dedup_window_s", "housekeeping_interval_s",
              "keepalive_s", "redact_pii", "connected_platforms", "home_channels"):
        if f in sidecar:
            current = getattr(cfg, f)
            setattr(cfg, f, _take(sidecar, f, type(current), "sidecar."))
    _reject_rest(sidecar, "sidecar.")
    auth = dict(raw.pop("auth", {}))
    for i, t in enumerate(auth.pop("tokens", [])):
        t = dict(t)
        tok = AuthToken(token=_take(t, "token", str, f"auth.tokens[{i}]."))
        if not tok.token:
            raise ConfigError(f"auth.tokens[{i}].token: required")
        tok.platforms = _platform_names(_take(t, "platforms", list, f"auth.tokens[{i}].", ["*"]),
                                        f"auth.tokens[{i}].platforms")
        tok.admin = _take(t, "admin", bool, f"auth.tokens[{i}].", False)
        _reject_rest(t, f"auth.tokens[{i}].")
        cfg.tokens.append(tok)
    _reject_rest(auth, "auth.")
    for name, table in dict(raw.pop("profiles", {})).items():
        if not name or ":" in name:
            raise ConfigError(f"profiles.{name}: a profile name must be non-empty and have no ':'")
        p = Profile(name=name)
        _fill(p, dict(table), f"profiles.{name}.")
        cfg.profiles[name] = p
    _load_platforms(cfg, dict(raw.pop("platforms", {})))
    recovery = dict(raw.pop("recovery", {}))
    cfg.auto_resume = _take(recovery, "auto_resume", str, "recovery.", cfg.auto_resume)
    if cfg.auto_resume not in AUTO_RESUME_MODES:
        raise ConfigError(f"recovery.auto_resume: must be one of {', '.join(AUTO_RESUME_MODES)}")
    _reject_rest(recovery, "recovery.")
    _reject_rest(raw, "")
    cfg.profiles.setdefault(DEFAULT_PROFILE, Profile(name=DEFAULT_PROFILE))
    for key, value in overrides.items():
        if value is not None:
            setattr(cfg, key, value)
    if cfg.synchronous.upper() not in ("FULL", "NORMAL"):
        raise ConfigError("sidecar.synchronous: must be FULL or NORMAL")
    cfg.synchronous = cfg.synchronous.upper()
    if cfg.log_format not in ("json", "text"):
        raise ConfigError("log_format must be json or text")
    _check_load_limits(cfg)
    if not 0 < cfg.limits.max_request_bytes < 2**31:  # gRPC takes it as an int32
        raise ConfigError("sidecar.limits.max_request_bytes: must be between 1 and 2147483647")
    return cfg


def _check_load_limits(cfg: Config) -> None:
    """The load limits (issue 14): stream buffers need room for a frame;
    admission caps and queue caps may be 0 (no cap), never negative."""
    lim = cfg.limits
    for key in ("stream_buffer_frames", "stream_buffer_bytes"):
        if getattr(lim, key) < 1:
            raise ConfigError(f"sidecar.limits.{key}: must be at least 1")
    for key in ("max_prompts_in_flight", "max_prompt_bytes_in_flight"):
        if getattr(lim, key) < 0:
            raise ConfigError(f"sidecar.limits.{key}: must be 0 (no cap) or more")
    for p in cfg.profiles.values():
        if p.queue_cap < 0:
            raise ConfigError(f"profiles.{p.name}.queue_cap: must be 0 (no cap) or more")
