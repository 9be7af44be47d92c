"""The `agent-sidecar` command line: `serve` (socket mode, store file, config
errors, SIGTERM) and `sessions list|show|delete` against a running sidecar."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import sqlite3
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from helpers import child_hooks, procs
from helpers.cli import CLEAN_ENV, cli
from helpers.ids import source as src
from helpers.sessions import create, rpc_error, seed, turns
from helpers.waiting import wait_until
from sidecar_proc import ROOT, TOKEN, Sidecar

from agent_sidecar.recovery.startup import MARKER
from agent_sidecar.v1 import session_service_pb2 as pb

EXE = ROOT / ".venv" / "bin" / "agent-sidecar"
CLI = [str(EXE)] if EXE.exists() else [sys.executable, "-m", "agent_sidecar"]



def run(*args: str, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run(CLI + list(args), capture_output=True, text=True, timeout=timeout,
                          cwd=ROOT)


def wait_socket_serving(sock: Path, proc: subprocess.Popen, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else proc.returncode
        if sock.exists():
            try:
                with grpc.insecure_channel(f"unix:{sock}") as ch:
                    r = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(),
                                                            timeout=1)
                    if r.status == health_pb2.HealthCheckResponse.SERVING:
                        return
            except grpc.RpcError:
                pass
        time.sleep(0.05)
    raise TimeoutError("sidecar did not start")


# -- serve -----------------------------------------------------------------------------

@contextlib.contextmanager
def serving(*args: str, env: dict[str, str] | None = None, stdout=subprocess.DEVNULL) -> Iterator[subprocess.Popen]:
    """``agent-sidecar serve ARGS`` as a process (stderr piped, as text), killed
    at the end if the test left it running."""
    proc = subprocess.Popen(CLI + ["serve", *args], cwd=ROOT, stdout=stdout, stderr=subprocess.PIPE, text=True,
                            env=env)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_serve_default_socket_0600_db_and_sigterm(tmp_path):
    data = tmp_path / "data"
    with serving("--data-dir", str(data), "--workers", "1", stdout=subprocess.PIPE) as proc:
        sock = data / "sidecar.sock"
        wait_socket_serving(sock, proc)
        st = os.stat(sock)
        assert stat.S_ISSOCK(st.st_mode)
        assert stat.S_IMODE(st.st_mode) == 0o600
        assert (data / "sidecar.db").is_file()
        with grpc.insecure_channel(f"unix:{sock}") as ch:
            from agent_sidecar.v1 import session_service_pb2_grpc as pb_grpc
            s, created = create(pb_grpc.SessionServiceStub(ch))
            assert created
        # A second sidecar on the same data dir refuses to start.
        second = run("serve", "--data-dir", str(data), "--listen", f"unix:{tmp_path}/other.sock",
                     "--workers", "1")
        assert second.returncode != 0
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
    # Structured logs: one JSON object a line on stderr.
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines
    records = [json.loads(line) for line in lines]
    assert all({"ts", "level", "msg"} <= r.keys() for r in records)
    assert any(r["msg"] == "serving" for r in records)
    assert records[-1]["msg"] == "stopped"


def test_serve_text_logs_and_sigterm(tmp_path):
    sock = tmp_path / "s.sock"
    with serving("--data-dir", str(tmp_path / "d"), "--listen", f"unix:{sock}", "--log-format", "text",
                 "--workers", "1", stdout=subprocess.PIPE) as proc:
        wait_socket_serving(sock, proc)
        assert stat.S_IMODE(os.stat(sock).st_mode) == 0o600
        assert (tmp_path / "d" / "sidecar.db").is_file()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
    assert err.strip() and not err.lstrip().startswith("{")


def test_sigterm_while_a_worker_is_slow_to_start_stops_at_once_and_keeps_the_last_marker(tmp_path):
    """SIGTERM while a worker takes long to start (here it never would): the
    starts are undone and the sidecar exits 0 at once, its children gone,
    the last clean stop's marker still there (nothing was restored or
    served). The signal used to wait for the start, up to the worker's 60 s
    hello timeout (past a supervisor's stop timeout), then exit 1 "cannot
    start"."""
    data, pidfile = tmp_path / "data", tmp_path / "worker.pid"
    with Sidecar(data, workers=1) as sc:  # a clean stop leaves the marker
        pass
    assert (data / MARKER).exists()
    hooks = child_hooks.env(held="agent_sidecar.turns.worker", pidfile=pidfile)
    with serving("--data-dir", str(data), "--workers", "1", env={**CLEAN_ENV, **sc.store_env(), **hooks}) as proc:
        wait_until(lambda: pidfile.exists() and pidfile.read_text(), what="the worker in its held import")
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0 and "Traceback" not in err, err
    assert not procs.alive(int(pidfile.read_text())), "the worker outlived its sidecar"
    assert (data / MARKER).exists(), err


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_a_stop_signal_before_the_sidecar_has_its_handlers_abandons_the_start(tmp_path, sig):
    """A stop signal in the start's first moments (here: while it reads its
    config, a FIFO that has no writer yet) ends the start as one during the
    children's spawn does: exit 0, nothing begun, the last stop's marker kept.
    SIGTERM and SIGHUP killed the process there without a word (exit 143,
    129), Ctrl-C was 'agent-sidecar serve: interrupted' (exit 130)."""
    data, fifo = tmp_path / "data", tmp_path / "config.toml"
    with Sidecar(data, workers=1) as sc:  # a clean stop leaves the marker
        pass
    os.mkfifo(fifo)
    with serving("--data-dir", str(data), "--config", str(fifo), "--workers", "1",
                 env={**CLEAN_ENV, **sc.store_env()}) as proc:
        writer = wait_until(lambda: _fifo_writer(fifo), 30, what="the sidecar reading its config")
        proc.send_signal(sig)
        with os.fdopen(writer, "w") as f:  # the config, once the signal is on its way
            f.write("[sidecar]\n")
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0 and "Traceback" not in err, (proc.returncode, err)
    assert (data / MARKER).exists(), err


def _fifo_writer(fifo: Path) -> int | None:
    """The FIFO opened for writing once a reader has it open, else None."""
    try:
        return os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    except OSError:  # ENXIO: no reader yet
        return None


def test_a_stop_signal_a_child_gets_while_it_starts_leaves_it_starting(tmp_path):
    """Ctrl-C (SIGINT), a closed terminal's SIGHUP and ``timeout``'s SIGTERM
    reach the whole process group: a child that gets one while it starts
    goes on starting, and the parent alone decides when its children stop
    (here it was not asked to: the sidecar comes up with that worker). A
    child that got one before its start was done died, and the sidecar
    with it ('cannot start', exit 1), which made a Ctrl-C at start exit 0
    or 1 by which process acted first."""
    data, pidfile, hold = tmp_path / "data", tmp_path / "worker.pid", tmp_path / "hold"
    hold.touch()
    hooks = child_hooks.env(held="agent_sidecar.turns.worker", pidfile=pidfile, held_while=hold)
    with serving("--data-dir", str(data), "--workers", "1", env={**CLEAN_ENV, **hooks}) as proc:
        wait_until(lambda: pidfile.exists() and pidfile.read_text(), what="the worker in its held import")
        worker = int(pidfile.read_text())
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            os.kill(worker, sig)
        hold.unlink()
        wait_socket_serving(data / "sidecar.sock", proc)
        assert procs.alive(worker), "the worker that got the signals is the one serving"
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert (data / MARKER).exists(), err


@pytest.mark.parametrize("text,key", [
    ("bogus_key = 1\n", "bogus_key"),
    ("[sidecar]\nredact_pi = true\n", "sidecar.redact_pi"),
    ("[agent]\ngateway_timout = 5\n", "agent.gateway_timout"),
    ('[profiles.main]\nmodel = "echo"\nmodle = "x"\n', "profiles.main.modle"),
    ('group_sessions_per_user = "yes"\n', "group_sessions_per_user"),
    ('[profiles.main]\nmodel = "ecoh"\n', "profiles.main.model"),
    ('[platforms.myplugin]\npii_safe = "yes"\n', "platforms.myplugin.pii_safe"),
    ('[platforms.myplugin]\npii_sfe = true\n', "platforms.myplugin.pii_sfe"),
    ('[platforms.discord]\npii_safe = true\n', "platforms.discord.pii_safe"),
    ('[platforms.Telegram]\npii_safe = true\n[platforms.telegram]\npii_safe = false\n',
     "platforms.telegram"),
    ('[recovery]\nauto_resume = "always"\n', "recovery.auto_resume"),
    ('[recovery]\nauto_resum = "off"\n', "recovery.auto_resum"),
])
def test_serve_bad_config_exit_2(tmp_path, text, key):
    cfg = tmp_path / "config.toml"
    cfg.write_text(text)
    r = run("serve", "--data-dir", str(tmp_path / "d"), "--config", str(cfg),
            "--listen", f"unix:{tmp_path}/x.sock")
    assert r.returncode == 2, r.stderr
    assert key in r.stderr
    assert not (tmp_path / "x.sock").exists()


def test_every_command_says_each_config_problem_after_its_name(tmp_path):
    """One convention (cli/report.py): every line a command prints about its
    failure starts "agent-sidecar COMMAND: ". Before, serve and config check
    printed a config's problems bare ("config error: ..."), doctor and backup
    prefixed the first line only, and sessions said "agent-sidecar:"."""
    cfg = tmp_path / "config.toml"
    cfg.write_text("[sidecar]\nbogus = 1\n[agent]\nbogus_too = 2\n")
    d = str(tmp_path / "d")
    for name, args in (("serve", ["serve", "--data-dir", d, "--config", str(cfg)]),
                       ("config", ["config", "check", str(cfg)]),
                       ("doctor", ["doctor", "--data-dir", d, "--config", str(cfg)]),
                       ("backup", ["backup", str(tmp_path / "copy.db"), "--data-dir", d, "--config", str(cfg)])):
        r = run(*args)
        lines = r.stderr.splitlines()
        assert r.returncode == 2 and len(lines) == 2, (name, r.stderr)
        assert all(line.startswith(f"agent-sidecar {name}: config error: ") for line in lines), (name, lines)
    r = run("sessions", "--target", "10.1.2.3:50051", "--token", "t", "list")
    assert r.returncode == 2 and r.stderr.startswith("agent-sidecar sessions: refusing to send --token"), r.stderr


def test_serve_unreadable_config_exit_2(tmp_path):
    r = run("serve", "--data-dir", str(tmp_path / "d"), "--config", str(tmp_path / "missing.toml"))
    assert r.returncode == 2 and "missing.toml" in r.stderr
    bad = tmp_path / "bad.toml"
    bad.write_text("this is = = not toml")
    r = run("serve", "--data-dir", str(tmp_path / "d"), "--config", str(bad))
    assert r.returncode == 2 and "bad.toml" in r.stderr
    # A directory: the reason in words, not "[Errno 21] Is a directory: 3" (the fd it was read through).
    r = run("serve", "--data-dir", str(tmp_path / "d"), "--config", str(tmp_path))
    assert r.returncode == 2 and r.stderr == \
        f"agent-sidecar serve: config error: cannot read config {tmp_path}: Is a directory\n", r.stderr


def test_serve_tcp_needs_tokens(tmp_path):
    r = run("serve", "--data-dir", str(tmp_path / "d"), "--listen", "127.0.0.1:0", "--workers", "1")
    assert r.returncode != 0
    assert "auth.tokens" in r.stderr


# -- sessions list / show / delete ---------------------------------------------------------------

def test_sessions_list(sidecar):
    stub = sidecar.sessions()
    a = seed(stub, src("telegram"), turns("hello", "hi"))
    b, _ = create(stub, src("discord", chat_type="group", user_id="u1"))
    r = run("sessions", "--target", sidecar.target, "list")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert "KEY" in lines[0]
    # Most recently active first.
    assert lines[1].endswith(b.session_key) and b.session_id in lines[1]
    assert lines[2].endswith(a.session_key) and a.session_id in lines[2]
    r = run("sessions", "--target", sidecar.target, "list", "--platform", "telegram")
    assert r.returncode == 0 and a.session_key in r.stdout and b.session_key not in r.stdout
    stub.SuspendSession(pb.SuspendSessionRequest(session_key=a.session_key), timeout=10)
    r = run("sessions", "--target", sidecar.target, "list", "--platform", "telegram")
    assert "suspended" in r.stdout


def test_sessions_list_limit_past_int32_is_capped_by_the_sidecar(sidecar):
    """--limit is a page size (an int32 on the wire): a huge one is the
    sidecar's largest page, not a traceback from the request's encoder."""
    stub = sidecar.sessions()
    a = seed(stub, src("telegram"), turns("hello", "hi"))
    r = run("sessions", "--target", sidecar.target, "list", "--limit", "99999999999")
    assert r.returncode == 0 and a.session_key in r.stdout, r.stderr


@pytest.mark.parametrize("args, error", [
    (("sessions", "--target", "unix:/x.sock", "list", "--limit", "-1"), "argument --limit: '-1' must be >= 0"),
    (("health", "--target", "unix:/x.sock", "--timeout", "nan"),
     "argument --timeout: 'nan' must be a finite number > 0"),
    (("health", "--target", "unix:/x.sock", "--timeout", "0"), "argument --timeout: '0' must be > 0"),
    (("status", "--target", "unix:/x.sock", "--timeout", "inf"),
     "argument --timeout: 'inf' must be a finite number > 0"),
    (("status", "--target", "unix:/x.sock", "--timeout", "soon"), "argument --timeout: 'soon' is not a number"),
    # past what gRPC can count as a deadline: it failed at once, DEADLINE_EXCEEDED, as a sidecar that did not answer
    (("health", "--target", "unix:/x.sock", "--timeout", "1e10"), "argument --timeout: '1e10' must be > 0 and <= 6048"),
    (("status", "--target", "unix:/x.sock", "--timeout", "1e300"), "argument --timeout: '1e300' must be > 0 and <= 60"),
    (("sessions", "--target", "unix:/x.sock", "show", "k\udcff"), "argument key: not valid UTF-8"),
    (("health", "--target", "unix:/tmp/\udcff"), "argument --target: not valid UTF-8"),
    (("health", "--target", "unix:/x.sock", "--service", "s\udcff"), "argument --service: not valid UTF-8"),
    (("status", "--target", "127.0.0.1:1", "--tls", "--server-name", "h\udcff"),
     "argument --server-name/--tls-server-name: not valid UTF-8"),
    (("health", "--target", "127.0.0.1:99999"), "argument --target: '127.0.0.1:99999' has port '99999'; a port is 1"),
    (("status", "--target", "unix:"), "argument --target: 'unix:' has no socket path; expected one of unix:PATH"),
    (("health", "--target", "unix:/tmp/" + "s" * 103), "a Unix socket path may be at most 107 bytes; this one is 108"),
    (("sessions", "--target", "unix:/x.sock", "--token", "se\ncret", "list"),
     "argument --token: a bearer token is printable ASCII"),
    (("status", "--target", "unix:/x.sock", "--token", "sécret"), "argument --token: a bearer token is printable"),
    # an empty file name read as none: backup '' was a traceback, serve ran on the defaults, config check said ok,
    # bench --render '' ran a bench, --json '' wrote nothing, --ca '' dropped TLS
    (("backup", "", "--data-dir", "/nonexistent"), "argument FILE: an empty file name"),
    (("serve", "--config", "", "--data-dir", "/dev/null"), "argument --config: an empty file name"),
    (("config", "check", ""), "argument file: an empty file name"),
    (("bench", "--render", ""), "argument --render: an empty file name"),
    (("bench", "--target", "unix:/x.sock", "--json", ""), "argument --json: an empty file name"),
    (("health", "--target", "127.0.0.1:1", "--ca", ""), "argument --ca/--ca-cert: an empty file name"),
])
def test_an_argument_the_option_cannot_mean_is_refused_with_its_name(args, error):
    """Before, NaN, 0 or 1e10 (past what a gRPC deadline can count) became a deadline and came back
    as DEADLINE_EXCEEDED; bytes that are not
    UTF-8 (Python keeps them as surrogates) were tracebacks from the encoder; a token gRPC
    metadata cannot carry was INTERNAL "Invalid metadata". A token is never echoed."""
    r = run(*args)
    assert r.returncode == 2 and error in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert "cret" not in r.stderr


def test_sessions_show(sidecar):
    stub = sidecar.sessions()
    a = seed(stub, src("telegram"), turns("hello there", "general kenobi"))
    r = run("sessions", "--target", sidecar.target, "show", a.session_key)
    assert r.returncode == 0, r.stderr
    assert a.session_id in r.stdout and a.session_key in r.stdout
    assert "[1] user: hello there" in r.stdout
    assert "[2] assistant: general kenobi" in r.stdout
    r = run("sessions", "--target", sidecar.target, "show", "agent:main:telegram:dm:nobody")
    assert r.returncode != 0 and "NOT_FOUND" in r.stderr


def run_into_a_closed_pipe(*args: str, timeout: float = 30) -> subprocess.CompletedProcess:
    """The command with its stdout a pipe nobody reads any more, as in
    ``agent-sidecar ... | head -1`` once head has exited."""
    read, write = os.pipe()
    os.close(read)
    try:
        return subprocess.run(CLI + list(args), stdout=write, stderr=subprocess.PIPE, text=True, timeout=timeout,
                              cwd=ROOT)
    finally:
        os.close(write)


def test_output_into_a_closed_pipe_is_exit_141_without_a_traceback(sidecar):
    """`sessions list | head -2`, `status --json | head -1`: the reader has
    gone, so the rest of the output is unwanted; the command ends as a shell
    command killed by SIGPIPE does (141), silently, instead of a
    BrokenPipeError traceback and exit 1 (or 120 from the last flush)."""
    stub = sidecar.sessions()
    keys = [seed(stub, src("telegram"), turns("hello", "hi")).session_key for _ in range(3)]
    for args in (("sessions", "--target", sidecar.target, "list"),
                 ("sessions", "--target", sidecar.target, "show", keys[0]),
                 ("status", "--target", sidecar.target, "--json"),
                 ("status", "--target", sidecar.target)):
        r = run_into_a_closed_pipe(*args)
        assert r.returncode == 141 and r.stderr == "", (args, r.returncode, r.stderr)


def test_sessions_show_pages_through_the_whole_transcript(sidecar):
    """A transcript longer than a page (here 130 messages, the sidecar's
    default page is 100) is shown whole; before, it was cut at 50 without a
    word. --limit N shows the first N and says there are more."""
    stub = sidecar.sessions()
    texts = [f"message {i}" for i in range(1, 131)]
    a = seed(stub, src("telegram"), turns(*texts))
    r = run("sessions", "--target", sidecar.target, "show", a.session_key)
    assert r.returncode == 0, r.stderr
    shown = [line for line in r.stdout.splitlines() if line.startswith("[")]
    assert shown == [f"[{i}] {'user' if i % 2 else 'assistant'}: message {i}" for i in range(1, 131)], shown[-3:]
    r = run("sessions", "--target", sidecar.target, "show", a.session_key, "--limit", "7")
    assert r.returncode == 0, r.stderr
    assert [line for line in r.stdout.splitlines() if line.startswith("[")][-1] == "[7] user: message 7"
    assert r.stdout.rstrip().endswith("… more (showing the first 7; --limit 0 shows all)"), r.stdout


def test_sessions_delete(sidecar):
    stub = sidecar.sessions()
    a = seed(stub, src("telegram"), turns("bye"))
    r = run("sessions", "--target", sidecar.target, "delete", a.session_key)
    assert r.returncode == 0, r.stderr
    assert "deleted" in r.stdout
    with rpc_error(grpc.StatusCode.NOT_FOUND, "SESSION_NOT_FOUND"):
        stub.GetSession(pb.GetSessionRequest(session_key=a.session_key), timeout=10)
    r = run("sessions", "--target", sidecar.target, "delete", a.session_key)
    assert r.returncode != 0 and "not found" in r.stdout


def test_sessions_over_tcp_with_token(shared_sidecar):
    stub = shared_sidecar.sessions()
    a, _ = create(stub, src("telegram"))
    r = run("sessions", "--target", shared_sidecar.tcp_target, "list")
    assert r.returncode != 0 and "UNAUTHENTICATED" in r.stderr
    r = run("sessions", "--target", shared_sidecar.tcp_target, "--token", TOKEN, "list")
    assert r.returncode == 0, r.stderr
    assert a.session_key in r.stdout


def test_a_token_from_a_file_stays_out_of_the_command_line(shared_sidecar, tmp_path):
    secret = tmp_path / "token"
    secret.write_text(TOKEN + "\n")
    r = run("sessions", "--target", shared_sidecar.tcp_target, "--token-file", str(secret), "list")
    assert r.returncode == 0, r.stderr
    (tmp_path / "empty").write_text("\n")
    for args, error in (((str(tmp_path / "none"),), "cannot read"), ((str(tmp_path / "empty"),), "holds no token"),
                        ((str(secret), "--token", TOKEN), "not allowed with argument")):
        r = run("status", "--target", shared_sidecar.tcp_target, "--token-file", *args)
        assert r.returncode == 2 and error in r.stderr and TOKEN not in r.stderr, r.stderr


def test_a_token_file_past_64_kib_is_refused_as_the_configs_is(tmp_path):
    """A --token-file larger than a config's token_file may be (64 KiB) is a
    bad option; it was read whole for its first line, so /dev/zero, a line
    that never ends, grew the command by a GB a second until it was killed."""
    big = tmp_path / "big"
    big.write_text("x" * (64 * 1024 + 1))
    r = run("health", "--target", "unix:/x.sock", "--token-file", str(big))
    assert r.returncode == 2 and f"argument --token-file: {big} is larger than 64 KiB" in r.stderr, r.stderr


# -- bad data dirs and stores: one clear line and a non-zero exit, never a traceback -------------

@pytest.mark.parametrize("kind", ["file", "symlink"])
def test_serve_never_deletes_what_its_listen_path_names_unless_it_is_a_socket(tmp_path, kind):
    """Before, a `--listen unix:PATH` naming a regular file (or a symlink) deleted it to put
    the socket there. Now serve refuses, and the file is intact."""
    precious = tmp_path / "precious.txt"
    precious.write_text("keep me")
    path = precious if kind == "file" else tmp_path / "link"
    if kind == "symlink":
        path.symlink_to(precious)
    r = run("serve", "--data-dir", str(tmp_path / "data"), "--listen", f"unix:{path}")
    assert r.returncode != 0 and "is not a socket" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert path.exists() and precious.read_text() == "keep me"


def _garbage_store(tmp_path) -> Path:
    data = tmp_path / "garbage"
    data.mkdir()
    (data / "sidecar.db").write_bytes(b"this is not a database, just bytes " * 200)
    return data


def test_doctor_on_a_file_that_is_no_store(tmp_path):
    data = _garbage_store(tmp_path)
    r = run("doctor", "--data-dir", str(data))
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert "cannot open" in r.stderr and "sidecar.db" in r.stderr, r.stderr


def test_serve_on_a_file_that_is_no_store(tmp_path):
    data = _garbage_store(tmp_path)
    r = run("serve", "--data-dir", str(data), "--workers", "1", "--log-format", "text")
    out = r.stdout + r.stderr
    assert r.returncode == 1 and "Traceback" not in out, out
    assert "cannot start" in out and "cannot open the store" in out and "retry" not in out, out


@pytest.mark.parametrize("fmt", ["json", "text"])
def test_a_worker_that_cannot_start_says_why_in_one_line_and_the_start_names_it(tmp_path, fmt):
    """A worker process whose import fails (a broken install) before its pipe
    to the parent opens: its one line says which child failed and why, in the
    configured format, and the start ends "cannot start" naming the worker
    and its error. The child used to print a bare Python traceback, and the
    parent said only that it "exited before saying hello"."""
    r = cli("serve", "--data-dir", str(tmp_path / "data"), "--workers", "2", "--log-format", fmt,
            env=child_hooks.env(broken="agent_sidecar.turns.worker"))
    out = r.stdout + r.stderr
    assert r.returncode == 1 and "Traceback" not in out, out
    error = "ImportError: agent_sidecar.turns.worker is broken (test hook)"
    if fmt == "json":
        lines = [json.loads(line) for line in out.splitlines()]  # every line is one JSON object
        failed = [d for d in lines if d["msg"] == "child process failed"]
        assert failed and all(d["error"] == error and d["child"].startswith("agent-sidecar-worker-")
                              for d in failed), out
        (start,) = [d for d in lines if d["msg"] == "cannot start"]
        assert start["error"].startswith("agent-sidecar-worker-") and start["error"].endswith(
            "ended before saying hello: " + error), start
    else:
        assert "agent_sidecar.children: child process failed child=agent-sidecar-worker-" in out, out
        assert re.search(r"cannot start error=agent-sidecar-worker-\d \(pid \d+\) ended before saying hello: "
                         + re.escape(error), out), out


def test_a_start_that_fails_undoes_the_starts_still_going_on(tmp_path):
    """The workers cannot start while the store writer's start is still
    going on (here it never ends): the writer's start is undone (its process
    killed and reaped) before the sidecar stops, and the stop has nothing of
    it to close or write. The writer's start used to go on in the background
    while stop() found no writer ("store writer closing", "final full-text
    indexing skipped"), its process alive after the sidecar's "stopped"."""
    pidfile = tmp_path / "writer.pid"
    r = cli("serve", "--data-dir", str(tmp_path / "data"), "--workers", "2", "--log-format", "json",
            env=child_hooks.env(broken="agent_sidecar.turns.worker", held="agent_sidecar.store.writer.process",
                                pidfile=pidfile))
    lines = [json.loads(line) for line in (r.stdout + r.stderr).splitlines()]
    said = [d["msg"] for d in lines if d["logger"] != "agent_sidecar.children"]
    assert r.returncode == 1 and said[-3:] == ["cannot start", "stopping", "stopped"], lines
    assert not any(d["level"] == "warning" or "store writer" in d["msg"] for d in lines), lines
    if pidfile.exists():  # the writer got as far as its held import before its start was undone
        assert not procs.alive(int(pidfile.read_text())), "the writer outlived its sidecar"


def test_a_listener_whose_port_another_process_holds_says_why_it_cannot_listen(tmp_path):
    """The port of ``--listen`` is taken: the start ends "cannot start" saying
    which address and why. It said gRPC's words alone, "Failed to bind to
    address ...; set GRPC_VERBOSITY=debug environment variable to see
    detailed error message", the reason only in a line of gRPC's format."""
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[[auth.tokens]]\ntoken = "{TOKEN}"\nadmin = true\n')
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r = run("serve", "--data-dir", str(tmp_path / "data"), "--config", str(cfg), "--workers", "1",
                "--listen", f"127.0.0.1:{port}", "--log-format", "text")
    out = r.stdout + r.stderr
    assert r.returncode == 1 and "Traceback" not in out, out
    assert f"cannot start error=cannot listen on 127.0.0.1:{port}: Address already in use" in out, out


def test_serve_with_a_data_dir_that_is_a_file(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("x")
    r = run("serve", "--data-dir", str(afile), "--workers", "1")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "is not a directory" in r.stderr, r.stderr


def test_serve_with_a_data_dir_too_deep_for_its_socket(tmp_path):
    """Its socket's path would be past the 107 bytes a Unix socket takes: the
    start used to get as far as binding (workers spawned, the store created)
    and end in gRPC's words; now it is refused at once, creating nothing."""
    data = tmp_path / ("d" * (120 - len(str(tmp_path))))
    r = run("serve", "--data-dir", str(data), "--workers", "1")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "choose a shorter data dir, or --listen" in r.stderr and "at most 107 bytes" in r.stderr, r.stderr
    assert not data.exists()


def test_doctor_on_a_locked_store_says_so(tmp_path):
    """Another writer holds the store past the busy timeout: doctor says the
    store is locked (not that the index is broken) and changes nothing."""
    data = tmp_path / "d"
    data.mkdir()
    conn = sqlite3.connect(data / "sidecar.db", isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("CREATE TABLE held (x)")
        conn.execute("BEGIN EXCLUSIVE")
        r = run("doctor", "--data-dir", str(data), timeout=60)
    finally:
        conn.execute("ROLLBACK")
        conn.close()
    assert r.returncode == 1 and "Traceback" not in r.stdout + r.stderr, r.stderr
    assert "locked by another writer" in r.stderr and "INCONSISTENT" not in r.stdout, (r.stdout, r.stderr)
