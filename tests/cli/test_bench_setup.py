"""`agent-sidecar bench` before its points: the calibration that sets the
ideal turn, and reaching the target. The real command in a subprocess
against a real sidecar; counts are checked against what the sidecar holds,
read back over gRPC. No figure is asserted: speed is for benchmarks/."""

from __future__ import annotations

import json
import subprocess

import pytest
from helpers.certs import available as certs_available
from helpers.certs import make_certs
from helpers.cli import CLEAN_ENV, COMMAND, cli
from helpers.config import echo, scripted
from helpers.sessions import get_session, held
from helpers.waiting import wait_until
from sidecar_proc import ROOT, TOKEN, Sidecar, free_port

from agent_sidecar.v1 import session_service_pb2 as session_pb

WORDS = 4
BROKEN = "the upstream refused the API key (401)"


@pytest.fixture(scope="module")
def sc(tmp_path_factory):
    config = (echo("main", 1) + echo("slow", 50)  # slow: a turn of WORDS words takes 200 ms
              + scripted("broken", [{"error": BROKEN}]))  # a model whose every call fails
    s = Sidecar(tmp_path_factory.mktemp("bench-setup") / "data", config=config, tcp=True).start()
    yield s
    s.stop()


def bench(*args: str, timeout: float = 120):
    return cli("bench", *args, timeout=timeout)


def test_the_calibration_runs_on_one_warm_session(sc, tmp_path):
    """The calibration's turns run one after another on one session, after
    a warm-up there that is in no figure but is in the totals: a
    session runs on one worker slot, and a worker's first turn is slower
    than its later ones, so calibration turns spread over fresh sessions
    measured cold workers and inflated the ideal turn (on a sidecar just
    started, up to seven times), and the SLO and the knee with it."""
    out = tmp_path / "calibration.json"
    r = bench("--target", sc.target, "--sessions", "6", "--concurrency", "1", "--turns", "1", "--warmup", "0",
              "--keep-sessions", "--calibrate", "4", "--prompt-words", str(WORDS), "--json", str(out))
    assert r.returncode == 0, r.stderr
    doc = json.loads(out.read_text())
    calibration = doc["calibration"]
    assert calibration["turn_ms"]["n"] == 4 and calibration["turns"] == 4  # the ideal: 4 warm turns
    assert calibration["warmup_s"] > 0
    sent = calibration["totals"]["started"]  # and the warm-up's, the first turn and the one started with it
    assert sent == calibration["totals"]["completed"] == 4 + 2
    assert doc["slo"]["ideal_s"] == pytest.approx(calibration["turn_ms"]["p50"] / 1e3)

    keys = doc["sessions"]["keys"]
    counts = [get_session(sc.sessions(), key).turn_count for key in keys]
    assert counts[0] >= sent, counts  # every calibration turn on the first session (the point's one anywhere)
    assert sum(counts) == doc["totals"]["completed"] == sent + 1
    assert held(sc.sessions(), keys) == (sent + 1, 2 * (sent + 1))


@pytest.fixture(scope="module")
def tls(tmp_path_factory):
    """A sidecar with a TLS listener (certificates of helpers.certs' CA, for
    localhost and 127.0.0.1) and one that asks for client certificates."""
    if not certs_available():
        pytest.skip("openssl not installed")
    certs = make_certs(tmp_path_factory.mktemp("certs"))
    plain, mutual = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    config = f'[[auth.tokens]]\ntoken = "{TOKEN}"\nadmin = true\n' + echo("main", 1)
    config += certs.listener(plain) + certs.listener(mutual, client_ca=True)
    s = Sidecar(tmp_path_factory.mktemp("bench-tls") / "data", config=config, workers=1).start()
    s.tls_target, s.mtls_target, s.certs = plain, mutual, certs
    yield s
    s.stop()


@pytest.mark.parametrize("case, reason", [
    ("another CA", "CERTIFICATE_VERIFY_FAILED"),
    ("another name", "Hostname Verification Check failed"),
    ("no client certificate", "Socket closed"),  # the listener closes the handshake
    ("nothing listening", "Connection refused"),
])
def test_a_target_that_cannot_be_reached_says_why_in_one_line(tls, case, reason):
    """A TLS mistake (the wrong CA, a certificate for another name, no
    client certificate for an mTLS listener) and a port nothing listens on
    are each one line on stderr, exit 1, with gRPC's reason; before, every
    one read "no sidecar reachable" after the wait, as if the sidecar were
    down, under a dozen lines of the gRPC core's own handshake logs."""
    certs = tls.certs
    target, options = {
        "another CA": (tls.tls_target, ["--ca", str(certs.other_ca)]),
        "another name": (tls.tls_target, ["--ca", str(certs.ca), "--server-name", "elsewhere.example"]),
        "no client certificate": (tls.mtls_target, ["--ca", str(certs.ca)]),
        "nothing listening": (f"127.0.0.1:{free_port()}", []),
    }[case]
    r = bench("--target", target, "--token", TOKEN, *options, "--connect-timeout", "1", "--turns", "1")
    assert r.returncode == 1, r.stderr
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith(f"agent-sidecar bench: no sidecar reachable at {target} within 1s: "), line
    assert reason in line, line


def test_a_socket_that_does_not_exist_fails_at_once_in_one_line(tmp_path):
    """No file at the socket path: one line saying so, without waiting out
    --connect-timeout (an hour here, past the command's own timeout); before,
    the bench retried the connection until then and said "no sidecar
    reachable ... No such file or directory"."""
    target = f"unix:{tmp_path}/nobody.sock"
    r = bench("--target", target, "--connect-timeout", "3600", "--turns", "1")
    assert r.returncode == 1 and r.stderr.strip().splitlines() == [
        f"agent-sidecar bench: no sidecar at {target}: the socket {tmp_path}/nobody.sock does not exist"], r.stderr


def test_a_tls_target_with_its_ca_and_client_certificate_is_benched(tls, tmp_path):
    """The same mTLS listener, given what it asks for, runs the point."""
    certs, out = tls.certs, tmp_path / "mtls.json"
    r = bench("--target", tls.mtls_target, "--token", TOKEN, "--ca", str(certs.ca), "--cert", str(certs.client_cert),
              "--key", str(certs.client_key), "--concurrency", "2", "--turns", "4", "--calibrate", "1",
              "--keep-sessions", "--prompt-words", str(WORDS), "--json", str(out))
    assert r.returncode == 0, r.stderr
    doc = json.loads(out.read_text())
    assert doc["points"][0]["turns"] == 4 and doc["points"][0]["error_count"] == 0
    assert held(tls.sessions(), doc["sessions"]["keys"])[0] == doc["totals"]["completed"]


def test_a_turn_timeout_past_what_grpc_can_count_is_no_timeout(sc):
    """The Python client's ``prompt(timeout=1e10)`` (a user's "never"): the
    turn runs. gRPC counts a call's deadline in int64 nanoseconds since the
    epoch, which that wraps into the past: the turn failed DEADLINE_EXCEEDED
    at once (the bench's --turn-timeout 1e10 did; it now refuses past a week),
    and so did every unary call of a client given ``call_timeout=1e10``."""
    import asyncio
    import uuid

    from agent_sidecar_client import connect

    async def turn() -> tuple[list[str], int]:
        async with await connect(sc.target, call_timeout=1e10) as client:  # a unary call's "never" too
            src = {"platform": "telegram", "chat_type": "dm", "chat_id": uuid.uuid4().hex}
            kinds = [f.WhichOneof("event") async for f in client.prompt("hello", source=src, timeout=1e10)]
            return kinds, (await client.get_or_create_session(src)).turn_count

    kinds, turns = asyncio.run(turn())
    assert kinds[-1] == "completed" and turns == 1, (kinds, turns)
    with pytest.raises(ValueError, match="call_timeout"):
        asyncio.run(connect(sc.target, call_timeout=float("nan"), wait_ready=False))


@pytest.mark.parametrize("spelling", ["dns:///127.0.0.1:{port}", "dns:127.0.0.1:{port}", "{path}",
                                      "tcp:127.0.0.1:{port}", "tcp://localhost:{port}"])
def test_a_local_sidecar_is_found_by_every_spelling_the_client_dials(sc, tmp_path, spelling):
    """A target the client dials as given (dns:[//authority/]host:port, a
    bare socket path, tcp:host:port) is the local sidecar's: the bench finds
    its process tree and reports CPU and memory; before, it read "not on
    this host" (and a tcp: target was refused by --target, which did not
    take every form the client dials)."""
    target = spelling.format(port=sc.tcp_port, path=sc.socket_path)
    out = tmp_path / "spelled.json"
    token = ["--token", TOKEN] if target.startswith(("dns:", "tcp:")) else []
    r = bench("--target", target, *token, "--concurrency", "1", "--turns", "2", "--warmup", "0", "--calibrate", "0",
              "--prompt-words", str(WORDS), "--json", str(out))
    assert r.returncode == 0, r.stderr
    doc = json.loads(out.read_text())
    assert doc["local"] is True and doc["sidecar_pid"] == sc.proc.pid, (doc["local"], doc["sidecar_pid"])
    assert f"(local, pid {sc.proc.pid})" in r.stdout and doc["points"][0]["procs"]["processes"][0]["pid"] == sc.proc.pid


@pytest.mark.parametrize("target", ["ipv4:127.0.0.1:1", "ipv6:[::1]:1", "unix-abstract:", "tcp:nohost"])
def test_a_target_the_client_cannot_dial_is_a_bad_option(target):
    """A --target in no form the Python client dials (gRPC's ipv4: and ipv6:
    schemes, say) is refused with the other bad options (exit 2, naming
    --target and the forms it takes) before anything runs; before, it
    passed the option's check and ended the run as a failure to connect
    (exit 1, "cannot connect to ...")."""
    r = bench("--target", target, "--turns", "1")
    assert r.returncode == 2 and r.stdout == "", r
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith(f"agent-sidecar bench: error: argument --target: {target!r} "), last
    assert "expected one of unix:PATH" in last and "tcp:HOST:PORT" in last, last


@pytest.mark.parametrize("calibrate", ["2", "0"])
def test_a_model_that_fails_every_turn_ends_the_run_in_one_line_quoting_it(sc, tmp_path, calibrate):
    """Every turn of the calibration (or, without one, of the first point)
    failed the same way (a ``failed`` frame: LLM_API_FAILURE from a model
    that refuses its key): the bench stops there with the sidecar's message
    and exit 1; before, it ran the whole sweep, every turn an error, and
    exited 0 with "no completed turn"."""
    out = tmp_path / "broken.json"
    r = bench("--target", sc.target, "--profile", "broken", "--sweep", "1,2", "--duration", "1",
              "--calibrate", calibrate, "--json", str(out))
    assert r.returncode == 1 and r.stdout == "" and "Traceback" not in r.stderr, r.stderr
    where = "the calibration" if calibrate != "0" else "sidecar c=1 [1/2]"
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith(f"agent-sidecar bench: every turn of {where} failed ("), last
    assert last.endswith(f"): LLM_API_FAILURE: {BROKEN}"), last
    assert "c=2" not in r.stderr and not out.exists()  # no later point ran


def test_compare_bare_against_a_tls_target_says_the_ratios_include_tls(tls, tmp_path):
    """The bare server always runs here with no TLS: against a TLS target
    the sidecar/bare ratios price TLS too, and the report says so (also
    for --render); before, they read as what the sidecar alone costs."""
    certs, out = tls.certs, tmp_path / "tls-bare.json"
    r = bench("--target", tls.tls_target, "--token", TOKEN, "--ca", str(certs.ca), "--concurrency", "1",
              "--turns", "2", "--calibrate", "1", "--prompt-words", str(WORDS), "--compare-bare", "--json", str(out))
    assert r.returncode == 0, r.stderr
    warning = [line for line in r.stdout.splitlines() if line.startswith("warning: the target is reached over TLS")]
    assert len(warning) == 1 and "ratios and added latencies include TLS," in warning[0], r.stdout
    assert [p["server"] for p in json.loads(out.read_text())["points"]] == ["sidecar", "bare"]
    assert bench("--render", str(out)).stdout == r.stdout


@pytest.mark.parametrize("clients", ["1", "2"])
def test_a_warmup_shorter_than_the_ramp_waits_for_every_lane_to_start(sc, tmp_path, clients):
    """--warmup 0 with the lanes' first turns spread over 2 s: the measure
    window opens once the last lane has started (at 2 s x 3/4), so its rates
    are those of every lane; before, it opened at once and a 1 s window
    measured the one or two lanes started by then as the point's four."""
    out = tmp_path / "ramp.json"
    r = bench("--target", sc.target, "--concurrency", "4", "--warmup", "0", "--ramp", "2", "--duration", "1",
              "--calibrate", "0", "--prompt-words", str(WORDS), "--clients", clients, "--json", str(out))
    assert r.returncode == 0, r.stderr
    (point,) = json.loads(out.read_text())["points"]
    # The ramp's clock starts a moment before the point's (t0): the last lane's
    # start falls a little under 1.5 s after t0. Before, the window opened at ~0.
    assert point["warmup_s"] >= 2 * 3 / 4 - 0.1, point["warmup_s"]
    assert "warm-up 0 s, and until every lane has started" in r.stdout


def test_a_refusal_that_says_when_to_come_back_is_waited_out(sc, tmp_path):
    """Three lanes on one session with reject_if_busy: the two that find it
    busy are refused AGENT_BUSY with RetryInfo (1 s), and wait that long
    before their next prompt, as an adapter does; each refusal is counted.
    Before, they sent the next at once: hundreds of refusals a second (and,
    past the admission limits, thousands of OVERLOADED), the sidecar busy
    refusing while its admitted turns were measured."""
    out = tmp_path / "busy.json"
    r = bench("--target", sc.target, "--keep-sessions", "--profile", "slow", "--sessions", "1", "--concurrency", "3",
              "--delivery", "reject_if_busy", "--duration", "1", "--warmup", "0", "--ramp", "0", "--calibrate", "0",
              "--prompt-words", str(WORDS), "--json", str(out))
    assert r.returncode == 0, r.stderr
    doc = json.loads(out.read_text())
    (point,) = doc["points"]
    refused = doc["totals"]["refused"].get("AGENT_BUSY", 0)
    seconds = len(point["series"])  # the point's whole length, rounded up to whole seconds
    assert 0 < refused <= 3 * (seconds + 1), (refused, seconds)  # at most one per lane per second
    assert set(doc["totals"]["refused"]) == {"AGENT_BUSY"} and doc["totals"]["failed"] == {}
    # The refused prompts are no turns: the totals' turns are the store's.
    turns = doc["totals"]["started"]
    assert held(sc.sessions(), doc["sessions"]["keys"])[0] == doc["totals"]["completed"] == turns > 0
    assert f"sent to the target: {turns:,} turns ({turns:,} completed), {refused:,} prompts refused " \
           f"({refused:,} AGENT_BUSY)" in r.stdout, r.stdout


def test_a_turn_timeout_shorter_than_every_turn_ends_the_run_in_one_line(sc, tmp_path):
    """--turn-timeout 0.05 against 200 ms turns: every turn of the
    calibration (or of the first point, should one of those turns end
    otherwise) runs past it; the bench says so, exit 1, instead of running
    the sweep with every turn DEADLINE_EXCEEDED and exiting 0."""
    out = tmp_path / "short.json"
    r = bench("--target", sc.target, "--profile", "slow", "--sweep", "1,2", "--duration", "1", "--turn-timeout", "0.05",
              "--prompt-words", str(WORDS), "--json", str(out))
    assert r.returncode == 1 and r.stdout == "" and "Traceback" not in r.stderr, r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("agent-sidecar bench: every turn of ") and "ran past --turn-timeout" in last, last
    assert "c=2" not in r.stderr and not out.exists()


@pytest.mark.parametrize("clients", ["1", "2"])
def test_a_prompt_the_client_refuses_to_send_is_one_line_and_exit_1(sc, clients):
    """A --prompt the Python client will not send (bytes that are not UTF-8:
    a lone surrogate in Python's argv) ends the run in one line naming why.
    Before, each refusal was counted as a turn that failed with no await in
    between, so the lane sent the next at once, forever: the event loop
    never ran again (Ctrl-C and timeouts included) and the turns it held
    took the machine's memory (19 GB in a minute)."""
    r = subprocess.run([*COMMAND, "bench", "--target", sc.target, "--prompt", "bad \udcff text", "--concurrency", "2",
                        "--turns", "2", "--clients", clients], capture_output=True, timeout=60, cwd=ROOT, env=CLEAN_ENV)
    stderr = r.stderr.decode(errors="replace")
    assert r.returncode == 1 and "Traceback" not in stderr, stderr
    (line,) = stderr.strip().splitlines()
    assert "the client refuses to send the prompt: INVALID_ARGUMENT: text: has a lone surrogate" in line, line


def _sessions_of(sc: Sidecar, platform: str) -> int:
    """How many sessions of ``platform`` the sidecar holds (ListSessions, page by page)."""
    n, token = 0, ""
    while True:
        page = sc.sessions().ListSessions(session_pb.ListSessionsRequest(platform=platform, page_size=1000,
                                                                          page_token=token), timeout=30)
        n += len(page.sessions)
        token = page.next_page_token
        if not token:
            return n


def test_sessions_a_target_lost_while_they_were_made_kept_are_named(tmp_path):
    """kill -9 of the sidecar while the run makes its sessions: the run ends
    in one line saying why, and a last line saying how many of its sessions
    its teardown could not delete and on which platform (the sidecar, back,
    holds them); before, nothing said so, as no report follows such an end."""
    victim = Sidecar(tmp_path / "victim", config=echo("main", 1)).start()
    try:
        proc = subprocess.Popen([*COMMAND, "bench", "--target", victim.target, "--platform", "lost", "--sessions",
                                 "20000", "--concurrency", "1", "--turns", "1", "--calibrate", "0",
                                 "--connect-timeout", "1"],
                                cwd=ROOT, env=CLEAN_ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            wait_until(lambda: _sessions_of(victim, "lost") >= 100, timeout=60, what="the run's first sessions")
            victim.kill9()
            _, stderr = proc.communicate(timeout=120)
        finally:
            proc.kill()
        kept = _sessions_of(victim.restart(), "lost")
    finally:
        victim.stop()
    lines = stderr.strip().splitlines()
    assert proc.returncode == 1 and "Traceback" not in stderr, stderr
    assert lines[-2].startswith(f"agent-sidecar bench: cannot create sessions on {victim.target}: "), lines
    note = lines[-1].removeprefix("agent-sidecar bench: ")
    left = int(note.split(" ", 1)[0].replace(",", ""))
    assert note.startswith(f"{left:,} of the run's sessions (platform 'lost') are left in the target's store: "
                           f"{victim.target} stopped answering"), note
    assert left <= kept <= left + 32, (left, kept)  # and the creations in flight when it died, answered or not
