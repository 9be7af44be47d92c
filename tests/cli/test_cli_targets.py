"""Every command that reaches a running sidecar (health, status, sessions,
bench) takes the same target forms, the clients' shared grammar
(clients/conformance/scenarios.json's ``target_forms``, the table the Go and
Node clients are held to), read by one function (agent_sidecar.targets).

Before, health, status and sessions passed ``--target`` to gRPC as it was:
a bare socket path (the form the bench, and every client, takes) was looked
up as a host name and failed UNAVAILABLE "Domain name not found", and
``tcp:HOST:PORT`` was refused; the bench took the client's forms. The real
commands in subprocesses against a real sidecar."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys

import pytest
from helpers.cli import CLEAN_ENV, cli
from sidecar_proc import ROOT, TOKEN, Sidecar

_TABLE = json.loads((ROOT / "clients" / "conformance" / "scenarios.json").read_text())
_FORMS = next(s for s in (_TABLE["scenarios"] if isinstance(_TABLE, dict) else _TABLE)
              if s["id"] == "target_forms")


@pytest.fixture(scope="module")
def sc(tmp_path_factory):
    s = Sidecar(tmp_path_factory.mktemp("targets") / "data", tcp=True, workers=1).start()
    yield s
    s.stop()


def _command(name: str, target: str) -> list[str]:
    token = [] if target.startswith(("unix:", "/")) else ["--token", TOKEN]
    return {"health": ["health", "--target", target, *token],
            "status": ["status", "--target", target, *token, "--json"],
            "sessions": ["sessions", "--target", target, *token, "list"]}[name]


@pytest.mark.parametrize("form", _FORMS["forms"])
def test_every_form_a_client_dials_reaches_the_sidecar_from_every_command(sc, form):
    target = form.format(path=sc.socket_path, tcp=sc.tcp_target)
    for name in ("health", "status", "sessions"):
        r = cli(*_command(name, target), timeout=30)
        assert r.returncode == 0 and "Traceback" not in r.stderr, (name, target, r.stderr)
        if name == "health":
            assert r.stdout == f"{target}: SERVING\n", r.stdout
        if name == "status":
            assert json.loads(r.stdout)["serving"] is True


def _refused(name: str, bad: str) -> None:
    r = cli(*_command(name, bad), timeout=30)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and r.stdout == "" and "Traceback" not in r.stderr, (bad, r.stderr)
    assert lines[-1].startswith(f"agent-sidecar {name}: error: argument --target: "), lines[-1]


@pytest.mark.parametrize("bad", _FORMS["invalid"] + ["ipv4:127.0.0.1:1", "ipv6:[::1]:1"])
def test_a_target_in_no_clients_form_is_refused_naming_it(bad):
    _refused("health", bad)


@pytest.mark.parametrize("bad, scheme", [("ipv4:127.0.0.1:1", "ipv4"), ("ipv6:[::1]:1", "ipv6")])
def test_grpcs_own_address_schemes_are_named_as_such(bad, scheme):
    """gRPC's ipv4:/ipv6: targets are named as a scheme no client dials; before,
    ipv4:127.0.0.1:1 (the host read as "ipv4") was told that an IPv6 address
    goes in brackets."""
    r = cli("health", "--target", bad, timeout=30)
    assert r.returncode == 2 and f"{bad!r} has gRPC's {scheme}: scheme, which no client dials: give the " \
        "address alone (HOST:PORT, [IPV6]:PORT)" in r.stderr, r.stderr


@pytest.mark.parametrize("name", ["status", "sessions"])
def test_the_other_commands_refuse_them_alike(name):
    for bad in ("127.0.0.1", "relative/sidecar.sock", "127.0.0.1:0", "unix:"):
        _refused(name, bad)


@pytest.mark.parametrize("bad", ["127.0.0.1", "relative/sidecar.sock", "unix:", "127.0.0.1:99999", "http://h:1"])
def test_the_bench_refuses_what_the_other_commands_refuse_with_the_same_line(bad):
    mine, theirs = cli("bench", "--target", bad, "--turns", "1"), cli("health", "--target", bad)
    assert mine.returncode == theirs.returncode == 2, (mine.stderr, theirs.stderr)
    assert mine.stderr.strip().splitlines()[-1].removeprefix("agent-sidecar bench: ") \
        == theirs.stderr.strip().splitlines()[-1].removeprefix("agent-sidecar health: ")


@pytest.mark.parametrize("form", _FORMS["accepted"])
def test_a_form_taken_without_a_sidecar_there_is_dialled_not_refused(form):
    """``target_forms``'s ``accepted`` ones (no sidecar listens there): taken,
    so the command dials and finds nothing (exit 1), never a bad option (2)."""
    r = cli("health", "--target", form, "--timeout", "1")
    assert r.returncode == 1 and r.stdout.startswith(f"{form}: "), (form, r.stdout, r.stderr)


@pytest.mark.parametrize("command", [["health", "--timeout", "60"], ["status", "--timeout", "60"],
                                     ["sessions", "list"]])
def test_ctrl_c_while_a_command_waits_for_its_answer_is_one_line_and_exit_130(command):
    """Ctrl-C while the command waits for a sidecar that took the connection
    and does not answer: one line and exit status 130; it was Python's
    traceback from inside gRPC's wait. The command starts with Ctrl-C's
    default handling (a test run may start it with SIGINT ignored)."""
    with socket.create_server(("127.0.0.1", 0)) as mute:
        target = f"127.0.0.1:{mute.getsockname()[1]}"
        with_ctrl_c = [sys.executable, "-c", "import signal, sys; signal.signal(signal.SIGINT, "
                       "signal.default_int_handler); from agent_sidecar.cli.main import main; sys.exit(main())"]
        name, rest = command[0], command[1:]
        proc = subprocess.Popen([*with_ctrl_c, name, "--target", target, *rest], cwd=ROOT, env=CLEAN_ENV,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            mute.settimeout(30)
            conn, _ = mute.accept()  # the command is connected, and waits for the answer it will not get
            proc.send_signal(signal.SIGINT)
            stdout, stderr = proc.communicate(timeout=30)
            conn.close()
        finally:
            proc.kill()
    assert proc.returncode == 130 and stdout == "", (proc.returncode, stdout, stderr)
    assert stderr.strip() == f"agent-sidecar {name}: interrupted", stderr
