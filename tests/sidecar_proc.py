"""A real sidecar in a subprocess, for tests: temp data dir, Unix socket (and
optionally TCP), generated stubs. No mocks: this is the program users run.

Its store follows the backend the tests run on (``pytest --backend``): the
SQLite file in its data dir, or on PostgreSQL the database of its data dir
(helpers.pg: the same one again after a restart). ``database="name"`` puts
several sidecars on one PostgreSQL database (on either backend run: the test
then needs the ``pg_server`` fixture), ``dsn=`` on a database of one's own."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc
from helpers.pg import free_port  # noqa: F401 - the tests' one free port, taken from here too

from agent_sidecar.v1 import (
    prompt_service_pb2_grpc,
    session_service_pb2_grpc,
    status_service_pb2,
    status_service_pb2_grpc,
    tool_service_pb2_grpc,
)

ROOT = Path(__file__).resolve().parent.parent
TOKEN = "test-admin-token"


class Sidecar:
    """Start with ``Sidecar(tmp_path, config="...toml text...").start()``."""

    starts = 0  # every start in this process (tests/conftest.py: a store_free test makes none)

    def __init__(self, data_dir: Path | str | None = None, config: str = "", tcp: bool = False,
                 workers: int = 2, extra_args: list[str] | None = None,
                 env: dict[str, str] | None = None, dsn: str | None = None,
                 database: str | None = None, wrapper: list[str] | None = None):
        self.data_dir = Path(data_dir or tempfile.mkdtemp(prefix="sidecar-"))
        self.config_text = config
        self.tcp_port = free_port() if tcp else None
        self.workers = workers
        self.extra_args = extra_args or []
        self.env = env  # extra environment for the sidecar (and so its workers)
        self.wrapper = wrapper or []  # a command that execs the sidecar's, e.g. prlimit: the same pid
        self._dsn, self.database = dsn, database
        self.proc: subprocess.Popen | None = None
        self._channels: list[grpc.Channel] = []
        self.log_path = self.data_dir / "sidecar.log"

    @property
    def store_dsn(self) -> str | None:
        """The PostgreSQL database this sidecar's store is on, None for SQLite."""
        if self._dsn is None:
            from helpers import pg
            if self.database is not None:
                server = pg.active() or pg.SERVER
                if server is None:
                    raise RuntimeError("Sidecar(database=...) needs a PostgreSQL: use the pg_server fixture")
                self._dsn = server.database(self.database)
            elif pg.active() is not None:
                self._dsn = pg.active().database_for(self.data_dir)
        return self._dsn

    @property
    def backend(self) -> str:
        return "postgres" if self.store_dsn else "sqlite"

    def store_env(self) -> dict[str, str]:
        """The environment that puts the sidecar on its store's backend."""
        dsn = self.store_dsn
        if not dsn:
            return {}
        return {"AGENT_SIDECAR_STORE__BACKEND": "postgres", "AGENT_SIDECAR_STORE__DSN": dsn}

    @property
    def socket_path(self) -> Path:
        return self.data_dir / "sidecar.sock"

    @property
    def target(self) -> str:
        return f"unix:{self.socket_path}"

    @property
    def tcp_target(self) -> str:
        return f"127.0.0.1:{self.tcp_port}"

    def start(self, timeout: float = 30.0) -> Sidecar:
        Sidecar.starts += 1
        self.data_dir.mkdir(parents=True, exist_ok=True)
        cfg_path = self.data_dir / "config.toml"
        text = self.config_text
        if self.tcp_port and "[[auth.tokens]]" not in text:
            text += f'\n[[auth.tokens]]\ntoken = "{TOKEN}"\nadmin = true\n'
        cfg_path.write_text(text)
        args = [sys.executable, "-m", "agent_sidecar", "serve", "--data-dir", str(self.data_dir),
                "--config", str(cfg_path), "--workers", str(self.workers), "--log-format", "json",
                "--log-level", "debug",
                "--listen", self.target]
        if self.tcp_port:
            args += ["--listen", self.tcp_target]
        args += self.extra_args
        self._log = open(self.log_path, "ab")
        env = {**os.environ, **self.store_env(), **(self.env or {})}
        self.proc = subprocess.Popen(self.wrapper + args, stdout=self._log, stderr=subprocess.STDOUT,
                                     cwd=ROOT, env=env)
        self.wait_serving(timeout)
        return self

    def wait_serving(self, timeout: float = 30.0) -> None:
        from grpc_health.v1 import health_pb2, health_pb2_grpc
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"sidecar exited with {self.proc.returncode}:\n{self.log()}")
            if self.socket_path.exists():
                try:
                    with grpc.insecure_channel(self.target) as ch:
                        r = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=1)
                        if r.status == health_pb2.HealthCheckResponse.SERVING:
                            return
                except grpc.RpcError:
                    pass
            time.sleep(0.05)
        raise TimeoutError(f"sidecar not serving after {timeout}s:\n{self.log()}")

    def log(self) -> str:
        try:
            return self.log_path.read_text()[-6000:]
        except OSError:
            return ""

    def channel(self, tcp: bool = False) -> grpc.Channel:
        ch = grpc.insecure_channel(self.tcp_target if tcp else self.target)
        self._channels.append(ch)
        return ch

    def sessions(self, tcp: bool = False):
        return session_service_pb2_grpc.SessionServiceStub(self.channel(tcp))

    def prompts(self, tcp: bool = False):
        return prompt_service_pb2_grpc.PromptServiceStub(self.channel(tcp))

    def tools(self, tcp: bool = False):
        return tool_service_pb2_grpc.ToolServiceStub(self.channel(tcp))

    def status(self) -> status_service_pb2.GetStatusResponse:
        """GetStatus over the Unix socket (trusted: admin)."""
        stub = status_service_pb2_grpc.StatusServiceStub(self.channel())
        return stub.GetStatus(status_service_pb2.GetStatusRequest(), timeout=10)

    def kill9(self) -> None:
        """A real crash: SIGKILL, no cleanup. Returns once its children (the
        writer, the workers: killed by their parent-death signal) are gone too,
        so nothing of this sidecar writes after it returns."""
        from helpers import procs
        from helpers.waiting import wait_until
        doomed = list(procs.children(self).values()) if self.proc.poll() is None else []
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)
        wait_until(lambda: not any(procs.alive(pid) for pid in doomed), 10, interval=0.01,
                   what="the killed sidecar's children to die")
        self._close_channels()

    def stop(self, timeout: float = 90.0) -> int:
        """SIGTERM and wait: the clean shutdown path."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._close_channels()
        return self.proc.returncode if self.proc else 0

    def restart(self, timeout: float = 30.0) -> Sidecar:
        return self.start(timeout)

    def _close_channels(self) -> None:
        for ch in self._channels:
            ch.close()
        self._channels.clear()

    def __enter__(self):
        return self.start() if self.proc is None else self

    def __exit__(self, *exc):
        self.stop()


def error_info(err: grpc.RpcError):
    """(reason, field) from a call's google.rpc.Status details."""
    from google.rpc import error_details_pb2
    from grpc_status import rpc_status
    st = rpc_status.from_call(err)
    reason, field = None, None
    if st is None:
        return None, None
    for d in st.details:
        if d.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            d.Unpack(info)
            reason = info.reason
        elif d.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            br = error_details_pb2.BadRequest()
            d.Unpack(br)
            if br.field_violations:
                field = br.field_violations[0].field
    return reason, field


def error_metadata(err: grpc.RpcError) -> dict[str, str]:
    """The metadata of a call's ErrorInfo ({} without one)."""
    from google.rpc import error_details_pb2
    from grpc_status import rpc_status
    st = rpc_status.from_call(err)
    for d in st.details if st is not None else ():
        if d.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            d.Unpack(info)
            return dict(info.metadata)
    return {}


def retry_delay(err: grpc.RpcError) -> float | None:
    """The seconds a call's RetryInfo says to wait, None without one."""
    from google.rpc import error_details_pb2
    from grpc_status import rpc_status
    st = rpc_status.from_call(err)
    for d in st.details if st is not None else ():
        if d.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
            info = error_details_pb2.RetryInfo()
            d.Unpack(info)
            return info.retry_delay.ToMilliseconds() / 1000
    return None
