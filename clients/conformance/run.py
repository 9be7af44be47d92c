#!/usr/bin/env python3
"""Conformance harness: one live sidecar, every language's runner, one table.

    .venv/bin/python clients/conformance/run.py --langs python,node,go

Starts ONE ``agent-sidecar serve`` on a temporary data dir (Unix socket and a
free 127.0.0.1 port, config from conformance.toml.tmpl with a fresh bearer
token), waits until it answers health checks on both listeners, runs each
language's runner (protocol: README.md beside this file), prints a table
scenario x language with the failure reasons below it, stops the sidecar with
SIGTERM, and exits non-zero if any cell failed or any runner crashed.

Why one sidecar for all languages: the scenarios use per-language chat ids,
tool namespaces and profiles, so runs cannot collide, and one server makes the
table a statement about the clients rather than about separate servers.
Runners run one after another so timing-sensitive scenarios (busy, queue)
are not disturbed by another language's load.

Only the standard library is used here; the health check uses grpcio when it
is importable (the project venv) and falls back to "socket accepts". The TLS
listeners' certificates are made with the ``openssl`` command by the test
suite's helper (tests/helpers/certs.py), which needs nothing else.
"""

from __future__ import annotations

import argparse
import json
import secrets
import shutil
import signal
import socket
import string
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
LANGS = ("python", "node", "go")

sys.path.insert(0, str(ROOT / "tests"))
from helpers.certs import available as openssl_available  # noqa: E402
from helpers.certs import make_certs  # noqa: E402


def runner_command(lang: str, python: str) -> list[str]:
    if lang == "python":
        return [python, str(ROOT / "clients/python/conformance_runner.py")]
    return [str(ROOT / f"clients/{lang}/run-conformance.sh")]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def healthy(target: str) -> bool:
    """One health probe: gRPC Health SERVING if grpcio is at hand, else a connect."""
    try:
        import grpc
        from grpc_health.v1 import health_pb2, health_pb2_grpc
    except ImportError:
        grpc = None
    if grpc is None:
        family = socket.AF_UNIX if target.startswith("unix:") else socket.AF_INET
        address = target[5:] if family == socket.AF_UNIX else (target.rsplit(":", 1)[0], int(target.rsplit(":", 1)[1]))
        try:
            with socket.socket(family) as s:
                s.settimeout(1)
                s.connect(address)
            return True
        except OSError:
            return False
    with grpc.insecure_channel(target) as channel:
        try:
            # The health service needs no token, even over TCP.
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=1)
            return reply.status == health_pb2.HealthCheckResponse.SERVING
        except grpc.RpcError as exc:
            # Reachable but guarded (auth on health): good enough to start.
            return exc.code() in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.UNIMPLEMENTED)


class CutProxy:
    """A TCP proxy in front of the sidecar's Unix socket that a runner can break
    on purpose (README.md, "The cuttable proxy"): the scenarios that test
    resuming need a real connection to fail, not a local cancel.

    Clients connect to ``target`` (127.0.0.1:PORT; the sidecar sees a Unix
    socket peer, so no token is needed). A runner sends one command per line
    to ``control`` and reads ``ok N`` back (N = connections accepted so far):

    - ``cut``: close every live connection, both sides, at once;
    - ``stall``: stop forwarding on every live connection without closing it
      (a network black hole: bytes sent are swallowed); later connections
      are forwarded again;
    - ``down``: ``cut``, and close each new connection as soon as it is
      accepted (the sidecar is out of reach), until ``up``;
    - ``up``: forward new connections again;
    - ``count``: only report N.
    """

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.control_listener = socket.create_server(("127.0.0.1", 0))
        self.target = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.control = f"127.0.0.1:{self.control_listener.getsockname()[1]}"
        self.lock = threading.Lock()
        self.live: list[dict] = []  # {"socks": (down, up), "stalled": bool}
        self.stalled: list[dict] = []
        self.accepted = 0
        self.is_down = False
        self.closed = False

    def start(self) -> None:
        threading.Thread(target=self._accept, daemon=True).start()
        threading.Thread(target=self._control, daemon=True).start()

    def _accept(self) -> None:
        while not self.closed:
            try:
                down, _ = self.listener.accept()
            except OSError:
                return
            with self.lock:
                self.accepted += 1
                refuse = self.is_down
            if refuse:
                _close(down)
                continue
            up = socket.socket(socket.AF_UNIX)
            try:
                up.connect(self.upstream)
            except OSError:
                _close(down)
                _close(up)
                continue
            conn = {"socks": (down, up), "stalled": False}
            with self.lock:
                self.live.append(conn)
            threading.Thread(target=self._pump, args=(conn, down, up), daemon=True).start()
            threading.Thread(target=self._pump, args=(conn, up, down), daemon=True).start()

    def _pump(self, conn: dict, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                if not conn["stalled"]:  # a black hole swallows what it reads
                    dst.sendall(data)
        except OSError:
            pass
        if not conn["stalled"]:
            self._drop(conn)

    def _drop(self, conn: dict) -> None:
        with self.lock:
            if conn in self.live:
                self.live.remove(conn)
        for s in conn["socks"]:
            _close(s)

    def command(self, word: str) -> str:
        with self.lock:
            conns = list(self.live)
        if word in ("cut", "down"):
            with self.lock:
                self.is_down = self.is_down or word == "down"
            for conn in conns:
                self._drop(conn)
        elif word == "stall":
            with self.lock:
                for conn in conns:
                    conn["stalled"] = True
                    self.live.remove(conn)  # no longer counted; closed at stop()
                    self.stalled.append(conn)
        elif word == "up":
            with self.lock:
                self.is_down = False
        elif word != "count":
            return f"error unknown command {word!r}"
        with self.lock:
            return f"ok {self.accepted}"

    def _control(self) -> None:
        while not self.closed:
            try:
                sock, _ = self.control_listener.accept()
            except OSError:
                return
            threading.Thread(target=self._control_client, args=(sock,), daemon=True).start()

    def _control_client(self, sock: socket.socket) -> None:
        with sock, sock.makefile("rw", encoding="ascii", newline="\n") as f:
            for line in f:
                f.write(self.command(line.strip()) + "\n")
                f.flush()

    def stop(self) -> None:
        self.closed = True
        _close(self.listener)
        _close(self.control_listener)
        with self.lock:
            conns = self.live + self.stalled
        for conn in conns:
            for s in conn["socks"]:
                _close(s)


def _close(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    try:
        sock.close()
    except OSError:
        pass


class Sidecar:
    """The server process and its temporary directory."""

    def __init__(self, binary: str, keep: bool) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="conformance-"))
        self.keep = keep
        self.token = secrets.token_urlsafe(24)
        self.unix = f"unix:{self.dir}/sidecar.sock"
        self.tcp = f"127.0.0.1:{free_port()}"
        # TLS and mTLS listeners ([[listen]] entries), certificates of a fresh CA.
        self.tls, self.mtls = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
        self.certs = make_certs(self.dir / "certs")
        self.log = self.dir / "sidecar.log"
        config = self.dir / "conformance.toml"
        template = string.Template((HERE / "conformance.toml.tmpl").read_text(encoding="utf-8"))
        config.write_text(template.substitute(TOKEN=self.token) + self._tls_listeners(), encoding="utf-8")
        self.cmd = [binary, "serve", "--data-dir", str(self.dir), "--listen", self.unix, "--listen", self.tcp,
                    "--config", str(config), "--log-format", "text"]
        self.proc: subprocess.Popen | None = None
        self.proxy = CutProxy(str(self.dir / "sidecar.sock"))

    def _tls_listeners(self) -> str:
        c = self.certs
        entry = f'address = "{{}}"\ncert = "{c.server_cert}"\nkey = "{c.server_key}"\n'
        return (f"\n[[listen]]\n{entry.format(self.tls)}"
                f'\n[[listen]]\n{entry.format(self.mtls)}client_ca = "{c.ca}"\n')

    def tls_arguments(self) -> list[str]:
        """The runner's options for the TLS scenarios (README.md)."""
        c = self.certs
        return ["--proxy", self.proxy.target, "--proxy-control", self.proxy.control,
                "--tls", self.tls, "--mtls", self.mtls, "--ca", str(c.ca), "--wrong-ca", str(c.other_ca),
                "--client-cert", str(c.client_cert), "--client-key", str(c.client_key),
                "--foreign-cert", str(c.foreign_cert), "--foreign-key", str(c.foreign_key)]

    def start(self, timeout: float) -> None:
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(self.cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"sidecar exited with {self.proc.returncode} during startup")
            if all(healthy(t) for t in (self.unix, self.tcp)):
                self.proxy.start()
                return
            time.sleep(0.2)
        raise RuntimeError(f"sidecar not healthy on {self.unix} and {self.tcp} within {timeout:g}s")

    def stop(self) -> int | None:
        self.proxy.stop()
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def log_tail(self, lines: int = 60) -> str:
        try:
            return "\n".join(self.log.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def cleanup(self) -> None:
        if not self.keep:
            shutil.rmtree(self.dir, ignore_errors=True)


def run_runner(lang: str, cmd: list[str], sidecar: Sidecar, scenarios: Path, timeout: float,
               ids: list[str]) -> tuple[dict[str, dict], str | None]:
    """Run one language's runner; returns (results by scenario id, crash text or None)."""
    full = cmd + ["--lang", lang, "--unix", sidecar.unix, "--tcp", sidecar.tcp, "--token", sidecar.token,
                  *sidecar.tls_arguments(), "--scenarios", str(scenarios)]
    if not Path(cmd[0]).exists():
        return {}, f"runner not found: {cmd[0]}"
    try:
        proc = subprocess.run(full, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)
        stdout, stderr, code = proc.stdout, proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as exc:
        stdout = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        stderr = exc.stderr.decode() if isinstance(exc.stderr, bytes) else (exc.stderr or "")
        code = f"timeout after {timeout:g}s"
    results: dict[str, dict] = {}
    for line in stdout.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and record.get("scenario") in ids:
            results[record["scenario"]] = record
    crash = None
    if code != 0:
        tail = "\n".join(stderr.strip().splitlines()[-25:])
        crash = f"runner exited {code}" + (f"\n{tail}" if tail else "")
    elif stderr.strip() and len(results) < len(ids):
        crash = "runner did not report every scenario\n" + "\n".join(stderr.strip().splitlines()[-25:])
    return results, crash


def render(ids: list[str], langs: list[str], results: dict[str, dict[str, dict]],
           crashes: dict[str, str]) -> tuple[str, bool]:
    """The table and failure list; returns (text, all_passed)."""
    width = max(len(i) for i in ids + ["scenario"])
    cols = [max(len(lang), 3) for lang in langs]
    lines = ["scenario".ljust(width) + "  " + "  ".join(lang.ljust(w) for lang, w in zip(langs, cols))]
    lines.append("-" * len(lines[0]))
    failures: list[str] = []
    for sid in ids:
        cells = []
        for lang, w in zip(langs, cols):
            record = results.get(lang, {}).get(sid)
            ok = bool(record and record.get("ok") is True)
            cells.append(("✓" if ok else "✗").ljust(w))
            if not ok:
                reason = record.get("error", "failed") if record else "not reported"
                failures.append(f"  {sid} [{lang}]: {reason}")
        lines.append(sid.ljust(width) + "  " + "  ".join(cells))
    all_ok = not failures and not crashes
    for lang, text in crashes.items():
        failures.append(f"  runner {lang}: " + text.replace("\n", "\n      "))
    if failures:
        lines += ["", "failures:"] + failures
    passed = sum(1 for sid in ids for lang in langs if results.get(lang, {}).get(sid, {}).get("ok") is True)
    total = len(ids) * len(langs)
    # The last line in the plain form CI readers understand: "N passed, N failed".
    lines += ["", f"conformance: {passed} passed, {total - passed} failed"]
    return "\n".join(lines), all_ok


def run_suite(sidecar: Sidecar, args: argparse.Namespace, langs: list[str], scenarios: Path,
              ids: list[str]) -> int:
    """Start the sidecar, run the runners, stop it, print the table; the exit status."""
    results: dict[str, dict[str, dict]] = {}
    crashes: dict[str, str] = {}
    try:
        try:
            sidecar.start(args.startup_timeout)
        except (RuntimeError, OSError) as exc:
            print(f"conformance: {exc}\n--- sidecar log ---\n{sidecar.log_tail()}", file=sys.stderr)
            return 2
        for lang in langs:
            print(f"conformance: running {lang} ...", file=sys.stderr, flush=True)
            started = time.monotonic()
            results[lang], crash = run_runner(lang, runner_command(lang, args.python), sidecar, scenarios,
                                              args.runner_timeout, ids)
            print(f"conformance: {lang} done in {time.monotonic() - started:.1f}s", file=sys.stderr, flush=True)
            if crash:
                crashes[lang] = crash
            if sidecar.proc is not None and sidecar.proc.poll() is not None:
                crashes["sidecar"] = f"sidecar exited with {sidecar.proc.returncode} during the {lang} run"
                break
    finally:
        code = sidecar.stop()
    table, ok = render(ids, langs, results, crashes)
    print(table)
    if not ok:
        print(f"\n--- sidecar log (last lines; exit {code}) ---\n{sidecar.log_tail()}", file=sys.stderr)
    if args.json:
        Path(args.json).write_text(json.dumps({"results": results, "crashes": crashes}, indent=2), encoding="utf-8")
    return 0 if ok else 1


def python_grammar_disagrees(scenarios: Path) -> list[str]:
    """target_forms's ``accepted`` forms (taken, but no sidecar here listens on
    them: the Go and Node runners check them, the Python runner does not know
    the list) as the Python client's normalize_target reads them, the reference
    grammar: those it refuses."""
    from agent_sidecar_client._args import normalize_target

    wrong = []
    for s in json.loads(scenarios.read_text(encoding="utf-8"))["scenarios"]:
        for target in s.get("accepted", []):
            try:
                normalize_target(target)
            except ValueError as exc:
                wrong.append(f"{target!r} is listed as accepted; the Python client refuses it: {exc}")
    return wrong


def main() -> int:
    parser = argparse.ArgumentParser(description="Run the conformance suite against one live sidecar.")
    parser.add_argument("--langs", default=",".join(LANGS), help="comma-separated, from python,node,go")
    parser.add_argument("--scenarios", default=str(HERE / "scenarios.json"))
    parser.add_argument("--sidecar", default=str(ROOT / ".venv/bin/agent-sidecar"), help="agent-sidecar executable")
    parser.add_argument("--python", default=str(ROOT / ".venv/bin/python") if (ROOT / ".venv/bin/python").exists()
                        else sys.executable, help="interpreter for the Python runner")
    parser.add_argument("--runner-timeout", type=float, default=300.0, help="seconds per language runner")
    parser.add_argument("--startup-timeout", type=float, default=30.0)
    parser.add_argument("--json", help="also write {lang: {scenario: record}} and crashes here")
    parser.add_argument("--keep", action="store_true", help="keep the temporary data dir and log")
    args = parser.parse_args()

    langs = [lang.strip() for lang in args.langs.split(",") if lang.strip()]
    unknown = [lang for lang in langs if lang not in LANGS]
    if unknown:
        parser.error(f"unknown language(s) {unknown}; known: {', '.join(LANGS)}")
    scenarios = Path(args.scenarios).resolve()
    ids = [s["id"] for s in json.loads(scenarios.read_text(encoding="utf-8"))["scenarios"]]
    wrong = python_grammar_disagrees(scenarios)
    if wrong:
        print(f"conformance: scenarios.json is wrong about the target grammar: {wrong}", file=sys.stderr)
        return 2

    if not openssl_available():
        print("conformance: the TLS scenarios need the openssl command", file=sys.stderr)
        return 2
    sidecar = Sidecar(args.sidecar, args.keep)
    try:
        return run_suite(sidecar, args, langs, scenarios, ids)
    finally:
        if args.keep:
            print(f"conformance: data dir and log kept in {sidecar.dir}", file=sys.stderr)
        sidecar.cleanup()


if __name__ == "__main__":
    sys.exit(main())
