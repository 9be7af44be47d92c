"""`agent-sidecar bench` against a live sidecar: the real command in a
subprocess, for a few seconds at small concurrency. The JSON has its fields,
its counts add up to what the sidecar holds (read back over gRPC), the PNG
decodes at its size, --compare-bare prints the ratios, tool-call load runs
through the bench's own tool host, TLS targets work, and a bad target is a
one-line error with a non-zero exit. No figure is asserted: speed is for
benchmarks/."""

from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import grpc
import pytest
from helpers.certs import available as certs_available
from helpers.certs import make_certs
from helpers.cli import CLEAN_ENV, COMMAND, cli
from helpers.config import echo, scripted
from helpers.sessions import get_session, held, rpc_error
from helpers.waiting import wait_until
from sidecar_proc import ROOT, TOKEN, Sidecar, free_port

from agent_sidecar.bench import procs, report, sockets, stats, text
from agent_sidecar.bench.plot import SIZE_PX
from agent_sidecar.v1 import session_service_pb2 as session_pb

WORDS = 8
TOOL_STEPS = [{"tool_calls": [{"name": "bench.echo", "arguments": {"text": "from the tool"}}]},
              {"text_from_last_tool_result": True}]
CONFIG = (echo("main", 5) + scripted("tooly", TOOL_STEPS, tools=["bench.*"])
          + "[stream]\ncoalesce_ms = 0\n")  # one text_delta per word, as the bare server sends


@pytest.fixture(scope="module")
def sc(tmp_path_factory):
    s = Sidecar(tmp_path_factory.mktemp("bench") / "data", config=CONFIG, tcp=True).start()
    yield s
    s.stop()


def bench(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return cli("bench", *args, timeout=timeout)


def png_size(path: Path) -> tuple[int, int]:
    """Width and height of a PNG, after checking every chunk's CRC and that
    the image data inflates to exactly the rows the header announces."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, header = 8, b"", None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length:pos + 12 + length])
        assert zlib.crc32(kind + body) == crc, f"bad CRC in {kind!r}"
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
        if kind == b"IEND":
            break
    width, height, depth, color = header[:4]
    channels = {0: 1, 2: 3, 4: 2, 6: 4}[color]
    assert depth == 8
    assert len(zlib.decompress(idat)) == height * (1 + width * channels), "image data does not match IHDR"
    return width, height


def test_sweep_with_bare_writes_json_and_png_that_match_the_store(sc, tmp_path):
    out, png = tmp_path / "bench.json", tmp_path / "bench.png"
    r = bench("--target", sc.target, "--sweep", "1,2", "--duration", "1.5", "--prompt-words", str(WORDS),
              "--keep-sessions", "--calibrate", "2", "--compare-bare", "--first-delta-slo", "60000", "--json", str(out),
              "--plot", str(png))
    assert r.returncode == 0, r.stderr
    doc = json.loads(out.read_text())

    assert [(p["server"], p["concurrency"]) for p in doc["points"]] == [
        ("sidecar", 1), ("bare", 1), ("sidecar", 2), ("bare", 2)]
    for p in doc["points"]:
        assert p["turns"] > 0 and p["error_count"] == 0 and p["errors"] == {}
        assert p["turns_per_s"] > 0 and p["deltas_per_s"] > 0 and p["deltas_per_turn"] == WORDS
        assert p["words_per_turn"] == WORDS and p["first_delta_words"] == 1
        assert p["words_per_s"] == p["deltas_per_s"]  # one word a frame: per word is per delta
        assert p["server_cpu_us_per_word"] == p["server_cpu_us_per_delta"] > 0
        for key in ("first_delta_ms", "turn_ms"):
            assert set(p[key]) >= {"p50", "p90", "p99", "max"}
            assert 0 < p[key]["p50"] <= p[key]["p90"] <= p[key]["p99"] <= p[key]["max"]
        names = [x["name"] for x in p["procs"]["processes"]]
        assert all(x["rss_mb"] > 0 for x in p["procs"]["processes"])
        if p["server"] == "sidecar":
            assert names[0] == "sidecar" and "sidecar-writer" in names
            assert sum(n.startswith("sidecar-work-") for n in names) == 2
        else:
            assert names == ["bare"]
    assert doc["local"] and doc["sidecar_pid"] == sc.proc.pid
    assert doc["slo"]["ideal_s"] > 0 and doc["slo"]["limit_s"] == pytest.approx(1.1 * doc["slo"]["ideal_s"])
    assert doc["slo"]["first_delta_ms"] == 60000 and all(p["first_delta_ok"] for p in doc["points"])
    assert "first delta p99 <= 60000 ms with no errors" in r.stdout
    assert set(doc["knee"]) >= {"sidecar", "bare", "ratio"}
    for server in ("sidecar", "bare"):  # how soon text starts at the knee, beside it
        knee = doc["knee"][server]
        at_knee = [p for p in doc["points"] if p["server"] == server and p["concurrency"] == knee["concurrency"]]
        assert knee["first_delta_p99_ms"] == (at_knee[0]["first_delta_ms"]["p99"] if at_knee else None)
    assert doc["bare"]["source"] == "calibrated" and doc["bare"]["reply_deltas"] == 0
    assert doc["bare"]["first_delta_ms"] >= doc["bare"]["delta_gap_ms"] > 0  # one word a frame: never sooner than a gap
    # the lanes' first turns were spread over one calibration turn (--ramp auto)
    assert doc["ramp"]["s"] == pytest.approx(doc["calibration"]["turn_ms"]["p50"] / 1e3)
    assert "first turns spread over" in r.stdout

    # Every turn the bench sent (calibration, warm-up, drain included) is in the store.
    totals = doc["totals"]
    assert totals["failed"] == {} and totals["started"] == totals["completed"] > 0
    assert totals["deltas"] == WORDS * totals["completed"]
    assert doc["sessions"]["count"] == len(doc["sessions"]["keys"]) == 2
    assert held(sc.sessions(), doc["sessions"]["keys"]) == (totals["completed"], 2 * totals["completed"])

    assert "sidecar / bare" in r.stdout and "knee (" in r.stdout
    block = r.stdout.split("sidecar / bare", 1)[1].split("\n\n", 1)[0].splitlines()[3:]
    ratio_rows = [line.split() for line in block]
    assert [row[0] for row in ratio_rows] == ["1", "2"], r.stdout
    assert all(float(row[1]) > 0 for row in ratio_rows), r.stdout  # turns/s, sidecar over bare
    assert all(x["turns_per_s"] > 0 and x["cpu_per_word"] == x["cpu_per_delta"] > 0 for x in doc["ratios"])
    assert png_size(png) == SIZE_PX
    check_render(r.stdout, out, tmp_path / "again.png")
    check_first_delta_bound(json.loads(out.read_text()))
    check_client_bound_warning(doc)


def check_render(printed: str, doc: Path, png: Path) -> None:
    """--render: the same report from the run's JSON, and its plot, without
    a run (no target is given)."""
    r = bench("--render", str(doc), "--plot", str(png))
    assert r.returncode == 0, r.stderr
    assert r.stdout == printed
    assert png_size(png) == SIZE_PX


def check_first_delta_bound(doc: dict) -> None:
    """With a bound on the first delta, a point whose turns are on time but
    whose text starts late misses the SLO, and the knee stops below it."""
    doc["options"]["first_delta_slo_ms"] = 100.0
    for p in doc["points"]:  # every turn on time, all text starting at once ...
        p["turn_ms"]["p99"] = 1e3 * doc["slo"]["limit_s"] / 2
        p["first_delta_ms"]["p99"] = 10.0
    late = doc["points"][2]  # ... but the sidecar's at 2, 150 ms after its prompt
    assert (late["server"], late["concurrency"]) == ("sidecar", 2)
    late["first_delta_ms"]["p99"] = 150.0
    out = text.render(report.analyse(doc))
    assert [p["within_slo"] for p in doc["points"]] == [True, True, False, True]
    assert (late["first_delta_ok"], late["p99_over_ideal"]) == (False, pytest.approx(1.1 / 2))
    k = doc["knee"]["sidecar"]
    assert (k["concurrency"], k["first_failing"], k["interpolated"]) == (1, 2, None)  # not the turn's p99: no estimate
    assert doc["knee"]["bare"]["beyond_sweep"] is True
    assert "first delta p99 <= 100 ms" in out.split("knee (", 1)[1].splitlines()[0], out
    # beside it, the knee the turns alone set: every point's turns were on time
    assert doc["knee_by_turn"]["sidecar"]["beyond_sweep"] is True and doc["knee_by_turn"]["sidecar"]["concurrency"] == 2
    assert "by the turn alone (the first delta not bounded): sidecar >= 2" in out, out
    doc["options"]["sweep"] = False  # read as single points, the late one says why it missed
    verdicts = text.headline(report.analyse(doc))
    assert "sidecar c=2: p99 turn 0.55x ideal, first delta p99 150 ms, NOT within the SLO" in verdicts, verdicts
    assert "sidecar c=1: p99 turn 0.55x ideal, within the SLO" in verdicts, verdicts
    doc["options"].update(sweep=True, first_delta_slo_ms=None)  # no bound: one knee, the turns'
    assert report.analyse(doc)["knee_by_turn"] is None and doc["knee"]["sidecar"]["beyond_sweep"] is True


def check_client_bound_warning(doc: dict) -> None:
    """The document says whether the bench's own CPU paced each point; a
    point where it did is named in a warning, and so is a knee it sets."""
    for p in doc["points"]:
        assert p["procs"]["bench_processes"] == 1  # this one
        assert p["procs"]["bench_busiest_cpu_s"] == p["procs"]["bench_cpu_s"]
        share = p["procs"]["bench_cpu_s"] / p["procs"]["wall_s"]
        assert p["client_bound"] is (share >= stats.CLIENT_BOUND_SHARE)
    for p in doc["points"]:  # every point within the SLO, and the client idle, but ...
        p["turn_ms"]["p99"] = 1e3 * doc["slo"]["limit_s"] / 2
        p["procs"]["bench_cpu_s"] = p["procs"]["bench_busiest_cpu_s"] = 0.0
    bound = doc["points"][-1]  # ... bare at 2: as if this client had used a whole core there
    bound["procs"]["bench_cpu_s"] = bound["procs"]["bench_busiest_cpu_s"] = bound["procs"]["wall_s"]
    bound["turn_ms"]["p99"] = 1e3 * 10 * doc["slo"]["limit_s"]  # and missed the SLO there
    out = text.render(report.analyse(doc))
    warning = [line for line in out.splitlines() if line.startswith("warning: this bench client")]
    assert len(warning) == 1 and "bare c=2" in warning[0], out
    assert doc["knee"]["bare"]["first_failing"] == 2 and doc["knee"]["bare"]["client_bound"] is True
    assert "client-bound: see the warning" in out.split("knee (", 1)[1].splitlines()[0]


@pytest.mark.parametrize("clients", ["1", "2"])  # 2: the turns come from client processes, the tools from here
def test_tool_load_over_tcp_counts_every_tool_call(sc, tmp_path, clients):
    out, png = tmp_path / "tools.json", tmp_path / "tools.png"
    r = bench("--target", sc.tcp_target, "--token", TOKEN, "--profile", "tooly", "--tools", "--concurrency", "2",
              "--keep-sessions", "--turns", "6", "--warmup", "0", "--calibrate", "0", "--prompt", "call the tool",
              "--clients", clients, "--json", str(out), "--plot", str(png))
    assert r.returncode == 0, r.stderr
    doc = json.loads(out.read_text())
    (point,) = doc["points"]
    assert point["turns"] == 6 and point["error_count"] == 0
    assert doc["totals"]["completed"] == 6 and doc["totals"]["tool_calls"] == 6
    assert doc["tool_invocations"] == 6  # answered by the bench's own host
    assert doc["sidecar_pid"] == sc.proc.pid  # found from the TCP listener
    assert TOKEN not in out.read_text()
    turns, messages = held(sc.sessions(), doc["sessions"]["keys"])
    assert turns == 6 and messages == 4 * 6  # user, tool call, tool result, answer
    assert png_size(png) == SIZE_PX


def test_clients_spread_the_load_and_every_turn_reaches_the_store(sc, tmp_path):
    """--clients 2: the points run in two client processes (each with its own
    channel, over TCP with the token); their counts add up to what the
    sidecar holds, their CPU is the bench's, and --turns is shared out
    exactly."""
    out = tmp_path / "clients.json"
    r = bench("--target", sc.tcp_target, "--token", TOKEN, "--clients", "2", "--sweep", "1,3", "--duration", "1.5",
              "--keep-sessions", "--prompt-words", str(WORDS), "--calibrate", "1", "--compare-bare", "--json", str(out))
    assert r.returncode == 0, r.stderr
    doc = json.loads(out.read_text())
    assert doc["options"]["clients"] == 2 and "2 client processes" in r.stdout
    assert "this process and its 2 client processes" in r.stdout
    assert [(p["server"], p["concurrency"]) for p in doc["points"]] == [
        ("sidecar", 1), ("bare", 1), ("sidecar", 3), ("bare", 3)]
    for p in doc["points"]:
        assert p["turns"] > 0 and p["error_count"] == 0 and p["deltas_per_turn"] == WORDS
        assert 0 < p["first_delta_ms"]["p50"] <= p["turn_ms"]["p50"]
        assert p["procs"]["bench_processes"] == 3  # this one and two clients
        assert 0 < p["procs"]["bench_busiest_cpu_s"] <= p["procs"]["bench_cpu_s"]
        # every client's deltas counted once, in the second they came (one clock for all)
        assert sum(row["deltas"] for row in p["series"]) == p["totals"]["deltas"]
    totals = doc["totals"]
    assert totals["failed"] == {} and totals["started"] == totals["completed"] > 0
    assert held(sc.sessions(), doc["sessions"]["keys"]) == (totals["completed"], 2 * totals["completed"])

    r = bench("--target", sc.target, "--clients", "2", "--concurrency", "3", "--turns", "7", "--warmup", "0",
              "--calibrate", "0", "--prompt-words", str(WORDS), "--json", str(out))
    assert r.returncode == 0, r.stderr
    (point,) = json.loads(out.read_text())["points"]
    assert point["turns"] == 7 and point["totals"]["completed"] == 7  # 4 + 3, no more, no fewer


@pytest.mark.parametrize("delivery, how", [("steer", "steered"), ("follow_up", "merged")])
def test_prompts_absorbed_into_another_turn_are_no_turns(tmp_path, delivery, how):
    """Three lanes on one session, started together: one prompt runs a turn,
    the others arrive while it runs. Steered ones join it (their stream has
    no 'started'); of a follow-up burst the older waiting one is merged into
    the newer one's turn (superseded by it). Neither is a turn: they are
    counted apart ('absorbed'), in no rate, latency or error, and the totals
    are what the store holds."""
    slow = Sidecar(tmp_path / "data", config=echo("main", 40) + "[stream]\ncoalesce_ms = 0\n").start()
    out = tmp_path / "absorbed.json"
    try:
        r = bench("--target", slow.target, "--delivery", delivery, "--sessions", "1", "--concurrency", "3",
                  "--turns", "9", "--warmup", "0", "--ramp", "0", "--calibrate", "0", "--prompt-words", str(WORDS),
                  "--keep-sessions", "--json", str(out))
        assert r.returncode == 0, r.stderr
        doc = json.loads(out.read_text())
        (point,) = doc["points"]
        totals = doc["totals"]
        absorbed = point["absorbed_count"]
        # (a steer that comes after the turn's last model call is a follow-up: it may be merged)
        assert point["absorbed"].get(how, 0) > 0 and set(point["absorbed"]) <= {how, "merged"}, point["absorbed"]
        assert point["errors"] == {} and totals["failed"] == {}
        assert point["turns"] + absorbed == 9 and point["turn_ms"]["n"] == point["turns"]
        assert totals["started"] == totals["completed"] == point["turns"]
        assert totals["absorbed"] == point["absorbed"] and sum(point["absorbed"].values()) == absorbed
        turns, messages = held(slow.sessions(), doc["sessions"]["keys"])
        assert turns == totals["completed"]  # the store's turns: no more than the bench counts
        assert messages >= 2 * turns + absorbed  # every absorbed prompt's text is in the transcript
        assert point["turns_per_s"] * point["window_s"] == pytest.approx(point["turns"])
        assert sum(row["turns"] for row in point["series"]) == point["turns"]
        assert "absorbed" in r.stdout.split("Throughput and latency", 1)[1].splitlines()[1], r.stdout
        kinds = ", ".join(f"{n} {kind}" for kind, n in sorted(point["absorbed"].items()))
        assert f"{turns} turns ({turns} completed), {absorbed} prompts absorbed into them ({kinds})" in r.stdout
    finally:
        slow.stop()


def test_a_report_into_a_closed_pipe_still_writes_the_json_and_plot(sc, tmp_path):
    """`bench --json out.json --plot out.png | head -1`: the files are
    written before the report is printed, and the closed pipe ends the
    command as a shell's SIGPIPE would (141), with no traceback; --render too."""
    out, png = tmp_path / "piped.json", tmp_path / "piped.png"
    read, write = os.pipe()
    os.close(read)
    try:
        args = ["--target", sc.target, "--concurrency", "1", "--turns", "2", "--warmup", "0", "--calibrate", "0",
                "--prompt-words", str(WORDS), "--json", str(out), "--plot", str(png)]
        r = subprocess.run([*COMMAND, "bench", *args], stdout=write, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                           env=CLEAN_ENV, timeout=120)
        assert r.returncode == 141 and "Traceback" not in r.stderr, r.stderr
        assert json.loads(out.read_text())["points"][0]["turns"] == 2 and png_size(png) == SIZE_PX
        r = subprocess.run([*COMMAND, "bench", "--render", str(out), "--plot", str(tmp_path / "again.png")],
                           stdout=write, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=CLEAN_ENV, timeout=120)
        assert r.returncode == 141 and "Traceback" not in r.stderr, r.stderr
        assert png_size(tmp_path / "again.png") == SIZE_PX
    finally:
        os.close(write)


def test_a_worker_killed_in_the_window_counts_no_negative_cpu_and_its_replacement_counts(tmp_path):
    """kill -9 of a sidecar worker while the measure window runs: it read no
    CPU at the window's end, which made its delta (and the server's CPU %)
    negative. Now it counts what it had used, never less than 0, marked
    ``exited``, and the worker the sidecar started in its place is counted,
    marked ``new``."""
    victim = Sidecar(tmp_path / "data", config=CONFIG).start()
    out = tmp_path / "killed.json"
    proc = subprocess.Popen([*COMMAND, "bench", "--target", victim.target, "--concurrency", "2", "--duration", "8",
                             "--warmup", "0", "--calibrate", "0", "--prompt-words", str(WORDS), "--json", str(out)],
                            cwd=ROOT, env=CLEAN_ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: victim.status().turns_in_flight > 0, timeout=60, what="the window's turns")
        (worker,) = [w for w in victim.status().workers if w.index == 0]
        os.kill(worker.pid, signal.SIGKILL)
        wait_until(lambda: any(w.index == 0 and w.alive and w.pid != worker.pid for w in victim.status().workers),
                   timeout=30, what="the worker's replacement")
        assert proc.poll() is None, "the window ended before the replacement: make --duration longer"
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        proc.kill()
        victim.stop()
    assert proc.returncode == 0, stderr
    (point,) = json.loads(out.read_text())["points"]
    rows = point["procs"]["processes"]
    assert all(row["cpu_s"] >= 0 for row in rows) and point["procs"]["server_cpu_s"] > 0, rows
    assert all(seconds >= 0 for seconds in point["procs"]["threads"].values()), point["procs"]["threads"]
    (dead,) = [row for row in rows if row["pid"] == worker.pid]
    assert dead["exited"] is True and dead["name"] == "sidecar-work-0"
    (new,) = [row for row in rows if row.get("new")]
    assert new["name"] == "sidecar-work-0" and new["pid"] != worker.pid and new["cpu_s"] > 0, rows
    assert point["server_cpu_us_per_delta"] > 0
    assert "work-0 (exited)" in stdout and "work-0 (new)" in stdout, stdout


def test_a_client_process_killed_mid_point_ends_the_run_with_one_line(sc, tmp_path):
    """kill -9 of one of the --clients processes while its lanes stream: the
    bench stops at once with a one-line error and exit 1, writes no JSON,
    and leaves no client behind."""
    out = tmp_path / "killed.json"
    bench_proc = subprocess.Popen([*COMMAND, "bench", "--target", sc.target, "--clients", "2", "--concurrency", "4",
                                   "--duration", "60", "--warmup", "0", "--calibrate", "0", "--prompt-words",
                                   str(WORDS), "--json", str(out)], cwd=ROOT, env=CLEAN_ENV,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        clients = wait_until(lambda: sorted(pid for pid in procs.children_of(bench_proc.pid)
                                            if procs.proc_comm(pid).startswith("bench-client-")),
                             timeout=60, what="two bench client processes")
        wait_until(lambda: sc.status().turns_in_flight > 0, timeout=60, what="the clients' turns")
        os.kill(clients[0], signal.SIGKILL)
        stdout, stderr = bench_proc.communicate(timeout=60)
    finally:
        bench_proc.kill()
    assert bench_proc.returncode == 1, stderr
    lines = stderr.strip().splitlines()
    assert lines[-1].startswith("agent-sidecar bench: bench client ") and "exited" in lines[-1], stderr
    assert "Traceback" not in stderr and not out.exists()
    wait_until(lambda: all(procs.proc_comm(pid) == "?" for pid in clients), timeout=10, what="no client left")


def bench_acting_after_first_level(act, *args: str) -> tuple[int, str, str]:
    """The bench command with ``args``; ``act(proc)`` runs as soon as its
    stderr reports the sidecar's first level done (one line per finished
    point: stderr is no terminal). Its exit status, stdout and the rest of
    its stderr. The command starts with Ctrl-C's default handling: a shell
    starts a background job (CI's test run, say) with SIGINT ignored, which
    its children inherit, and a bench started so rightly ignores Ctrl-C."""
    with_ctrl_c = [sys.executable, "-c", "import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler);"
                   " from agent_sidecar.cli.main import main; sys.exit(main())"]
    proc = subprocess.Popen([*with_ctrl_c, "bench", *args], cwd=ROOT, env=CLEAN_ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        for line in proc.stderr:
            if line.startswith("done sidecar c=1 "):
                act(proc)
                break
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
    return proc.returncode, stdout, stderr


def test_ctrl_c_mid_sweep_keeps_the_points_that_finished(sc, tmp_path):
    """SIGINT (Ctrl-C) once the sweep's first level is done: the bench stops
    in the point under way, prints the report of the finished points with a
    line naming the point cut short, writes the JSON and the plot, and exits
    130. The store holds every turn the report counts."""
    out, png = tmp_path / "cut.json", tmp_path / "cut.png"
    code, stdout, stderr = bench_acting_after_first_level(
        lambda proc: proc.send_signal(signal.SIGINT), "--target", sc.target, "--sweep", "1,2,3,4", "--duration", "3",
        "--keep-sessions", "--calibrate", "1", "--prompt-words", str(WORDS), "--json", str(out), "--plot", str(png))
    assert code == 130, stderr
    assert "Traceback" not in stderr
    doc = json.loads(out.read_text())
    cut = doc["interrupted"]
    assert cut["reason"] == "SIGINT" and cut["at"].startswith("sidecar c="), cut
    cut_level = int(cut["at"].split()[1].removeprefix("c="))
    levels = [p["concurrency"] for p in doc["points"]]
    assert levels and levels == sorted(levels) and max(levels) < cut_level, (levels, cut)
    finished = f"{len(levels)} point{'s' if len(levels) > 1 else ''} that finished"
    assert f"INTERRUPTED at {cut['at']}, stopped by Ctrl-C (SIGINT): the figures above are the {finished}" \
        in stdout, stdout
    assert "Throughput and latency" in stdout and "knee (" in stdout, stdout
    assert png_size(png) == SIZE_PX
    check_render(stdout, out, tmp_path / "again.png")  # the same report, the cut included, from the JSON
    wait_until(lambda: sc.status().turns_in_flight == 0, timeout=30, what="the cut point's turns to end")
    assert held(sc.sessions(), doc["sessions"]["keys"])[0] >= doc["totals"]["completed"] > 0


def gone(sc: Sidecar, sessions: dict) -> bool:
    """Whether the run deleted every one of its sessions: the document says
    so, and the sidecar has none of them (GetSession: NOT_FOUND)."""
    assert sessions["kept"] is False and sessions["left"] == 0 and sessions["error"] is None, sessions
    assert sessions["deleted"] == sessions["count"] == len(sessions["keys"]) > 0, sessions
    for key in sessions["keys"]:
        with rpc_error(grpc.StatusCode.NOT_FOUND):
            get_session(sc.sessions(), key)
    return True


def test_a_run_deletes_its_sessions_at_its_end_unless_told_to_keep_them(sc, tmp_path):
    """The sessions a run made (and their transcripts) are deleted when it
    ends, with --clients too (through this process's connection); before,
    every run left its --sessions in the store, hundreds a sweep, in a
    sidecar that may be production's. --keep-sessions keeps them, and the
    header says which."""
    out = tmp_path / "tidy.json"
    r = bench("--target", sc.target, "--sessions", "5", "--concurrency", "2", "--turns", "4", "--calibrate", "1",
              "--clients", "2", "--prompt-words", str(WORDS), "--json", str(out))
    assert r.returncode == 0, r.stderr
    doc = json.loads(out.read_text())
    assert gone(sc, doc["sessions"]) and doc["totals"]["completed"] > 0
    assert "5 sessions (deleted after the run) · " in r.stdout, r.stdout
    assert bench("--render", str(out)).stdout == r.stdout

    r = bench("--target", sc.target, "--keep-sessions", "--sessions", "3", "--concurrency", "1", "--turns", "2",
              "--calibrate", "0", "--prompt-words", str(WORDS), "--json", str(out))
    assert r.returncode == 0, r.stderr
    doc = json.loads(out.read_text())
    assert doc["sessions"]["kept"] is True and "deleted" not in doc["sessions"]
    assert held(sc.sessions(), doc["sessions"]["keys"])[0] == doc["totals"]["completed"] > 0
    assert "3 sessions (kept: --keep-sessions) · " in r.stdout, r.stdout


def test_sessions_made_before_a_failed_setup_are_deleted_too(sc, tmp_path):
    """Two targets, the second of which refuses the token: the run ends in
    one line before its first point, and the sessions it had made on the
    first target are deleted all the same; before, they were left there
    (only sessions that made it into the run's shares were deleted)."""
    other = Sidecar(tmp_path / "other", config=CONFIG + '[[auth.tokens]]\ntoken = "another-token-0123456789"\n',
                    tcp=True).start()
    try:
        r = bench("--target", f"{sc.tcp_target},{other.tcp_target}", "--token", TOKEN, "--platform", "setupfail",
                  "--sessions", "6", "--concurrency", "2", "--turns", "2", "--calibrate", "0")
    finally:
        other.stop()
    assert r.returncode == 1 and f"cannot create sessions on {other.tcp_target}: UNAUTHENTICATED" in r.stderr, r
    left = sc.sessions().ListSessions(session_pb.ListSessionsRequest(platform="setupfail"), timeout=10).sessions
    assert list(left) == []


def test_sigterm_mid_sweep_keeps_the_points_that_finished_and_removes_the_bare_servers_dir(sc, tmp_path):
    """SIGTERM (`timeout 60 agent-sidecar bench ...`) stops the run as Ctrl-C
    does: the report, JSON and plot of the finished points, interrupted.reason
    SIGTERM, exit 143; the bare server's temporary directory is removed
    (before, SIGTERM killed the bench on the spot: nothing kept, the
    directory left behind). The JSON, without what the plot reads, is then a
    one-line error for --render --plot, not a traceback."""
    out, png = tmp_path / "term.json", tmp_path / "term.png"
    bare_dirs: list[Path] = []

    def terminate(proc: subprocess.Popen) -> None:
        (bare,) = [pid for pid in procs.children_of(proc.pid) if "agent_sidecar.bench.bare" in procs.proc_name(pid)]
        listen = procs.proc_name(bare).split("--listen ", 1)[1].split()[0]
        bare_dirs.append(Path(listen.removeprefix("unix:")).parent)
        assert bare_dirs[0].name.startswith("sidecar-bench-bare-") and bare_dirs[0].is_dir()
        proc.send_signal(signal.SIGTERM)

    code, stdout, stderr = bench_acting_after_first_level(
        terminate, "--target", sc.target, "--sweep", "1,2,3,4", "--duration", "3", "--calibrate", "1",
        "--compare-bare", "--prompt-words", str(WORDS), "--json", str(out), "--plot", str(png))
    assert code == 143, stderr
    assert "Traceback" not in stderr
    doc = json.loads(out.read_text())
    cut = doc["interrupted"]
    assert cut["reason"] == "SIGTERM" and cut["message"] == "stopped by SIGTERM", cut
    assert doc["points"] and doc["points"][0]["concurrency"] == 1, doc["points"]
    assert f"INTERRUPTED at {cut['at']}, stopped by SIGTERM" in stdout and png_size(png) == SIZE_PX
    assert not bare_dirs[0].exists()
    assert gone(sc, doc["sessions"]) and "sessions (deleted after the run)" in stdout  # the cut run's too

    for broken in ("series", "host"):
        doc = json.loads(out.read_text())
        if broken == "series":
            del doc["points"][0]["series"]
        else:
            del doc["machine"]["host"]
        bad = tmp_path / f"no-{broken}.json"
        bad.write_text(json.dumps(doc))
        r = bench("--render", str(bad), "--plot", str(tmp_path / "bad.png"))
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 1 and len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
        assert f"{bad} is not an agent-sidecar bench --json document this version can plot (KeyError: " in lines[0]


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_while_the_runs_sessions_are_deleted_exits_as_that_signal_says(sc, tmp_path, sig, code):
    """SIGTERM (or Ctrl-C) while the bench deletes its sessions, after every
    point finished: the deletion stops, the report and JSON say so (the
    sessions left, ``signal`` naming it) and the exit status is the
    signal's, 143 (130); it was 0, as if the run had ended by itself, so
    `timeout 600 agent-sidecar bench` in a script looked like a clean run.
    The sidecar is stopped (SIGSTOP) before the signal is sent: the
    deletion, which starts right after the last point's line, cannot end
    first."""
    out = tmp_path / "sig.json"

    def stop_sidecar_then_signal(proc: subprocess.Popen) -> None:
        os.kill(sc.proc.pid, signal.SIGSTOP)
        proc.send_signal(sig)

    try:
        got, stdout, stderr = bench_acting_after_first_level(
            stop_sidecar_then_signal, "--target", sc.target, "--platform", "sigdel", "--sessions", "600",
            "--concurrency", "1", "--turns", "2", "--calibrate", "0", "--prompt-words", str(WORDS), "--json", str(out))
    finally:
        os.kill(sc.proc.pid, signal.SIGCONT)
    assert got == code, stderr
    assert "Traceback" not in stderr
    doc = json.loads(out.read_text())
    name = signal.Signals(sig).name
    assert doc["interrupted"] is None and doc["points"], doc["interrupted"]
    fate = doc["sessions"]
    assert fate["signal"] == name and fate["error"] == f"stopped by {name}" and fate["left"] > 0, fate
    assert f"{fate['left']:,} of them left in the store: stopped by {name}" in stdout, stdout


def test_a_target_killed_mid_sweep_ends_the_run_with_the_points_that_finished(tmp_path):
    """kill -9 of the sidecar once the sweep's first level is done, in its
    last point: the point under way ends with its turns failed (each gives
    up resuming after the connect timeout); the bench then finds no
    connection, drops that point (its errors are the crash's) and ends the
    run with the report and JSON of the finished points, a one-line reason
    and exit 1, instead of reporting the crash as the last point, exit 0."""
    victim = Sidecar(tmp_path / "victim", config=CONFIG).start()
    out = tmp_path / "lost.json"
    try:
        code, stdout, stderr = bench_acting_after_first_level(
            lambda proc: victim.kill9(),  # a real crash, the workers and the writer with it
            "--target", victim.target, "--sweep", "1,2", "--duration", "3", "--calibrate", "1",
            "--connect-timeout", "1", "--prompt-words", str(WORDS), "--json", str(out))
    finally:
        victim.stop()
    assert code == 1, stderr
    assert "Traceback" not in stderr
    doc = json.loads(out.read_text())
    cut = doc["interrupted"]
    assert cut["reason"] == "TARGET_LOST" and cut["at"] == "sidecar c=2 [2/2]", cut
    last = stderr.strip().splitlines()[-1]
    lost = f"agent-sidecar bench: {victim.target} stopped answering (no connection within 1s: "
    assert last.startswith(lost) and last.endswith(
        f") {cut['when']} sidecar c=2 [2/2]; the report holds the points that finished"), stderr
    assert "Connection refused" in last, last  # why, as gRPC saw it: the socket is left, nothing listens
    assert [p["concurrency"] for p in doc["points"]] == [1] and doc["points"][0]["error_count"] == 0, doc["points"]
    assert f"INTERRUPTED at {cut['at']}, {victim.target} stopped answering" in stdout, stdout


@pytest.mark.parametrize("clients", ["1", "2"])
def test_a_target_killed_in_a_point_of_turns_ends_the_run_there(tmp_path, clients):
    """kill -9 of the sidecar in a point of --turns (here a million): the
    run ends within its connect timeout, one line naming the target lost,
    exit 1. The bench asked for the connection only before a point and after
    one with failed turns, so the point went on failing its turns one at a
    time against nothing until all million had: days."""
    victim = Sidecar(tmp_path / "victim", config=CONFIG).start()
    try:
        proc = subprocess.Popen([*COMMAND, "bench", "--target", victim.target, "--concurrency", "2",
                                 "--clients", clients, "--turns", "1000000", "--calibrate", "0",
                                 "--connect-timeout", "1", "--prompt-words", str(WORDS)],
                                cwd=ROOT, env=CLEAN_ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            wait_until(lambda: sum(w.turns_run for w in victim.status().workers) >= 10, timeout=60,
                       what="the point's turns")
            victim.kill9()
            stdout, stderr = proc.communicate(timeout=120)
        finally:
            proc.kill()
    finally:
        victim.stop()
    lines = stderr.strip().splitlines()
    assert proc.returncode == 1 and "Traceback" not in stderr, stderr
    lost = f"{victim.target} stopped answering (no connection within 1s"
    assert lines[-2].startswith(f"agent-sidecar bench: {lost}"), lines  # and its sessions, left there:
    assert lines[-1].startswith("agent-sidecar bench: 2 of the run's sessions (platform 'bench') are left in the "
                                f"target's store: {lost}"), lines


def test_a_client_process_killed_after_a_point_keeps_the_points_that_finished(sc, tmp_path):
    """kill -9 of a --clients process once the sweep's first level is done:
    the run ends in the next point, as for a target lost, with the report
    and the JSON of the finished points, interrupted.reason CLIENT_LOST, a
    one-line reason and exit 1 (before, a plain error: every point lost)."""
    out = tmp_path / "client.json"

    def kill_a_client(proc: subprocess.Popen) -> None:
        clients = [pid for pid in procs.children_of(proc.pid) if procs.proc_comm(pid).startswith("bench-client-")]
        os.kill(min(clients), signal.SIGKILL)

    code, stdout, stderr = bench_acting_after_first_level(
        kill_a_client, "--target", sc.target, "--clients", "2", "--sweep", "1,2,3", "--duration", "2",
        "--calibrate", "1", "--prompt-words", str(WORDS), "--json", str(out))
    assert code == 1, stderr
    assert "Traceback" not in stderr
    doc = json.loads(out.read_text())
    cut = doc["interrupted"]
    assert cut["reason"] == "CLIENT_LOST" and "exited during the point" in cut["message"], cut
    assert [p["concurrency"] for p in doc["points"]] == [1] and doc["points"][0]["error_count"] == 0
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("agent-sidecar bench: bench client ") and f"during {cut['at']}; the report holds" in last
    assert f"INTERRUPTED at {cut['at']}, {cut['message']}" in stdout, stdout


@pytest.mark.parametrize("flag", ["--json", "--plot"])
def test_an_output_that_cannot_be_written_is_refused_before_the_run(sc, tmp_path, flag):
    """A --json or --plot in a directory this user cannot write is refused
    up front (exit 2), not found after the whole run."""
    mine = locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        if os.access(locked, os.W_OK):  # root writes anywhere a mode allows nothing; not in /proc/sys
            locked = Path("/proc/sys/kernel")
            if not locked.is_dir() or os.access(locked, os.W_OK):
                pytest.skip("no directory this user cannot write in")
        r = bench("--target", sc.target, flag, str(locked / ("out.png" if flag == "--plot" else "out.json")))
        assert r.returncode == 2 and f"cannot create a file in {locked}" in r.stderr, r.stderr
    finally:
        mine.chmod(0o700)


def test_an_output_that_fails_at_the_end_does_not_keep_the_other_from_being_written(sc, tmp_path):
    """The --json's directory removed during the run: the JSON cannot be
    written, the plot still is, and the exit status says one failed."""
    gone, png = tmp_path / "gone", tmp_path / "kept.png"
    gone.mkdir()
    code, stdout, stderr = bench_acting_after_first_level(
        lambda proc: gone.rmdir(), "--target", sc.target, "--sweep", "1,2", "--duration", "1", "--calibrate", "0",
        "--prompt-words", str(WORDS), "--json", str(gone / "out.json"), "--plot", str(png))
    assert code == 1, stderr
    assert f"agent-sidecar bench: cannot write {gone / 'out.json'}: No such file or directory" in stderr, stderr
    assert png_size(png) == SIZE_PX and f"wrote {png}" in stderr and "Throughput and latency" in stdout


def test_the_listener_is_found_however_its_path_was_spelled(tmp_path):
    """A sidecar started with ``--listen unix:///abs/path`` binds the path
    with its slashes ("///abs/path" in /proc/net/unix): the bench still finds
    the listener, by any spelling of the target."""
    import socket
    path = tmp_path / "spelled.sock"
    listener = socket.socket(socket.AF_UNIX)
    try:
        listener.bind("//" + str(path))
        listener.listen()
        for target in (f"unix:{path}", f"unix://{path}"):  # the second: unix:///tmp/...
            assert sockets.listening_pid(target) == os.getpid(), target
    finally:
        listener.close()


def _own_address() -> str | None:
    """One of this host's non-loopback IPv4 addresses (the one a route out
    would use; no packet is sent), None without one."""
    import socket
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))
        except OSError:
            return None
        address = probe.getsockname()[0]
    return None if address.startswith("127.") else address


def test_a_target_at_one_of_this_hosts_own_addresses_is_local(tmp_path):
    """A sidecar reached at this host's LAN address (not loopback, not the
    address its host name resolves to) is this host's: the bench finds its
    process tree and reports CPU and memory (before: 'not on this host')."""
    address = _own_address()
    if address is None:
        pytest.skip("this host has no non-loopback address")
    assert sockets._is_local(address) and not sockets._is_local("203.0.113.7")  # TEST-NET-3: no host's own
    port = free_port()
    lan = Sidecar(tmp_path / "data", config=CONFIG, tcp=True, extra_args=["--listen", f"0.0.0.0:{port}"]).start()
    out = tmp_path / "lan.json"
    try:
        r = bench("--target", f"{address}:{port}", "--token", TOKEN, "--insecure", "--concurrency", "1", "--turns", "2",
                  "--warmup", "0", "--calibrate", "0", "--prompt-words", str(WORDS), "--json", str(out))
    finally:
        lan.stop()
    assert r.returncode == 0, r.stderr
    doc = json.loads(out.read_text())
    assert doc["local"] is True and doc["sidecar_pid"] == lan.proc.pid, (doc["local"], doc["sidecar_pid"])
    assert doc["points"][0]["procs"]["server_cpu_s"] > 0 and f"(local, pid {lan.proc.pid})" in r.stdout


@pytest.mark.parametrize("via", ["unix", "tcp"])
def test_a_sidecars_postgresql_backends_are_counted_as_theirs(pg_server, tmp_path, via):
    """A sidecar on a PostgreSQL of this host: the backends serving its
    connections, and only those (not another database's, not the bench's),
    are counted on their own (``peers``, a ``postgres %`` column), whether
    its DSN names the server's Unix socket directory or a TCP address;
    before, their CPU, a large share of such a sidecar's, was "others"."""
    import psycopg
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    dsn = pg_server.database(f"bench_peers_{via}_{os.getpid()}")
    host = conninfo_to_dict(dsn).get("host", "")
    if (via == "unix") != host.startswith("/"):
        dsn = make_conninfo(dsn, host="127.0.0.1") if via == "tcp" else None
        if dsn is None:
            pytest.skip("the tests' PostgreSQL is reached over TCP only")
    database = conninfo_to_dict(dsn)["dbname"]
    out = tmp_path / "pg.json"
    with Sidecar(tmp_path / "data", config=CONFIG, dsn=dsn, workers=1) as pgsc:
        r = bench("--target", pgsc.target, "--concurrency", "2", "--turns", "20", "--warmup", "0", "--calibrate", "0",
                  "--prompt-words", str(WORDS), "--json", str(out))
        assert r.returncode == 0, r.stderr
        with psycopg.connect(pg_server.dsn("postgres"), autocommit=True) as conn:
            backends = {row[0] for row in conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = %s", (database,))}
        tree = {pid for _, pid in procs.process_tree(pgsc.proc.pid)}
    used = json.loads(out.read_text())["points"][0]["procs"]
    peers = used["peers"]
    assert peers and {p["name"] for p in peers} == {"postgres"}, peers
    assert {p["pid"] for p in peers} <= backends and not tree & backends, (peers, backends)
    assert used["peers_cpu_s"] == sum(p["cpu_s"] for p in peers) > 0
    assert "postgres %" in r.stdout and "postgres = the processes serving the server's own connections" in r.stdout


def test_several_targets_each_get_their_share_and_hold_their_turns(sc, tmp_path):
    """--target A,B: two sidecars with stores of their own, one client
    process each (the default); each target's sessions were made on it, its
    turns are in its own store, and together they are what the bench sent."""
    other = Sidecar(tmp_path / "other", config=CONFIG).start()
    try:
        out = tmp_path / "two.json"
        r = bench("--target", f"{sc.target},{other.target}", "--concurrency", "4", "--duration", "1.5",
                  "--keep-sessions", "--prompt-words", str(WORDS), "--calibrate", "1", "--json", str(out))
        assert r.returncode == 0, r.stderr
        doc = json.loads(out.read_text())
        assert doc["options"]["targets"] == [sc.target, other.target] and doc["options"]["clients"] == 2
        assert "2 targets: no CPU/RSS figures" in r.stdout and not doc["local"]
        (point,) = doc["points"]
        assert point["turns"] > 0 and point["error_count"] == 0 and point["procs"] is None
        shares = point["by_target"]  # each target's share of the point, summarized alone
        assert sorted(shares) == sorted([sc.target, other.target]) and "Per target" in r.stdout
        assert sum(t["turns"] for t in shares.values()) == point["turns"]
        assert all(t["turns"] > 0 and t["error_count"] == 0 and t["turn_ms"]["p99"] > 0 for t in shares.values())
        by_target = doc["sessions"]["by_target"]
        assert sorted(by_target) == sorted([sc.target, other.target])
        assert all(len(keys) == 2 for keys in by_target.values())
        counts = [held(sc.sessions(), by_target[sc.target]), held(other.sessions(), by_target[other.target])]
        assert all(turns > 0 for turns, _ in counts)  # both targets ran turns
        totals = doc["totals"]
        assert totals["started"] == totals["completed"] == sum(turns for turns, _ in counts)
    finally:
        other.stop()


@pytest.mark.parametrize("content, error", [
    (None, "cannot read {path}: No such file or directory"),
    ("{not json", "document this version can read (JSONDecodeError"),
    ('{"version": 1, "points": []}', "document this version can read (KeyError: 'options')"),
    ("[1, 2]", "document this version can read (ValueError: no version 1)"),
    # nested past what the parser recurses into: it was a traceback
    ("[" * 100_000 + "]" * 100_000, "document this version can read (RecursionError: "),
    # larger than any run writes (a sparse file): it was read whole, /dev/zero into memory without end
    (256 * 1024 * 1024 + 1, "{path} is larger than 256 MiB: no bench document is"),
])
def test_render_of_what_is_not_a_bench_document_is_one_line_and_exit_1(tmp_path, content, error):
    path = tmp_path / "doc.json"
    if isinstance(content, int):
        with open(path, "wb") as f:
            f.truncate(content)
    elif content is not None:
        path.write_text(content)
    r = bench("--render", str(path))
    assert r.returncode == 1 and r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and error.format(path=path) in lines[0], r.stderr


@pytest.mark.parametrize("args, error", [
    (("--clients", "3", "--sessions", "2", "--concurrency", "2"), "--clients 3 needs at least as many sessions"),
    (("--target", "unix:/a.sock,unix:/b.sock", "--clients", "1"), "--clients 1: at least one client process per"),
    (("--target", "unix:/a.sock,,unix:/b.sock"), "an empty address"),
    (("--target", "unix:/a.sock,unix:/a.sock"), "an address given twice"),
    (("--target", "unix:/a.sock,unix:/b.sock", "--pid", "1"), "--pid is for one target"),
    (("--target", "unix:/a.sock,10.1.2.3:5000", "--token", "t"), "refusing to send --token in cleartext to 10.1.2.3"),
    (("--concurrency", "4", "--find-knee", "100"), "--find-knee goes with --sweep"),
    (("--sweep", "10,50", "--find-knee", "50"), "--find-knee 50 must be above the sweep's largest level (50)"),
    (("--concurrency", "4", "--repeat", "3"), "--repeat goes with --sweep"),
    (("--sweep", "1,2", "--repeat", "0"), "argument --repeat: '0' must be > 0"),
    (("--duration", "nan"), "argument --duration: 'nan' must be a finite number > 0"),
    (("--ramp", "inf"), "argument --ramp: 'inf' must be a finite number >= 0"),
    (("--duration", "1e300"), "argument --duration: '1e300' must be > 0 and <= 3600"),
    (("--warmup", "1e9"), "argument --warmup: '1e9' must be >= 0 and <= 3600"),
    # a typo's extra zeros: before, 100000000 lanes or sessions grew the bench past 20 GB before any turn
    (("--concurrency", "100000000"), "argument --concurrency: '100000000' must be > 0 and <= 10000"),
    (("--sweep", "10,100000000"), "argument --sweep: '10,100000000': every level must be >= 1 and <= 10000"),
    (("--sweep", "10", "--find-knee", "100000000"), "argument --find-knee: '100000000' must be > 0 and <= 10000"),
    (("--sessions", "100000000"), "argument --sessions: '100000000' must be > 0 and <= 100000"),
    (("--turns", "1000000000"), "argument --turns: '1000000000' must be > 0 and <= 1000000"),
    (("--duration", "100000"), "argument --duration: '100000' must be > 0 and <= 3600"),
    (("--clients", "100000"), "argument --clients: '100000' must be > 0 and <= 64"),
    (("--sweep", "1,2", "--repeat", "1000000"), "argument --repeat: '1000000' must be > 0 and <= 100"),
    (("--calibrate", "100000000"), "argument --calibrate: '100000000' must be >= 0 and <= 1000"),
    (("--compare-bare", "--bare-latency-ms", "1e300"), "argument --bare-latency-ms: '1e300' must be >= 0 and <= 6"),
    (("--warmup", "soon"), "argument --warmup: 'soon': seconds, or 'auto'"),
    (("--compare-bare", "--bare-latency-ms", "nan"), "argument --bare-latency-ms: 'nan' must be a finite number >= 0"),
    (("--calibrate", "-1"), "argument --calibrate: '-1' must be >= 0"),
    (("--slo", "1e400%"), "--slo: '1e400%' must be a finite number above 0"),  # it said "above 0" alone
    (("--slo", "0"), "--slo: '0' must be a finite number above 0"),
    (("--plot", "out.txt"), "--plot out.txt: name a .png file (or .svg, .pdf)"),
    (("--prompt-words", "300000"), "argument --prompt-words: 300000 words are more than a prompt carries: at most "
                                   "50517 (the sidecar's default text cap, limits.max_text_bytes, is 256 KiB"),
    (("--prompt-words", "100000000"), "argument --prompt-words: 100000000 words are more than a prompt carries"),
    (("--json", "/tmp"), "--json /tmp: is a directory (name a file)"),
    (("--json", "/tmp/same.png", "--plot", "/tmp/same.png"), "--json and --plot name the same file"),
    (("--render", "x.json", "--plot", str(ROOT)), f"--plot {ROOT}: is a directory"),
    (("--render", "x.json", "--plot", "out"), "--plot out: name a .png file"),
    (("--render", "x.json", "--sweep", "1,2"), "--render reads an earlier run: --sweep does not apply"),
    (("--render", "x.json", "--compare-bare"), "--render reads an earlier run: --compare-bare does not apply"),
])
def test_target_and_client_options_that_cannot_work_are_refused(args, error):
    r = bench(*args)
    assert r.returncode == 2 and error in r.stderr, r.stderr


@pytest.mark.parametrize("target", ["unix:/nonexistent/sidecar.sock", "127.0.0.1:{port}"])
def test_bad_target_is_one_line_and_exit_1(target, tmp_path):
    r = bench("--target", target.format(port=free_port()), "--connect-timeout", "1", "--duration", "1",
              "--json", str(tmp_path / "x.json"))
    assert r.returncode == 1
    assert r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("agent-sidecar bench: no sidecar "), r.stderr
    assert not (tmp_path / "x.json").exists()


def test_a_pid_that_is_no_process_is_one_line_and_exit_1(sc):
    """--pid names the process whose CPU and memory the bench reads: one that
    is not there would give a run of zeros, so the bench says so instead."""
    pid = 2**22 + 1  # above Linux's largest pid_max: no process has it
    r = bench("--target", sc.target, "--pid", str(pid), "--duration", "1")
    assert r.returncode == 1 and r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and f"--pid {pid}: no such process" in lines[0], r.stderr


@pytest.mark.parametrize("calibrate", ["2", "0"])
def test_a_prompt_the_sidecar_always_refuses_is_one_line_quoting_it_and_exit_1(tmp_path, calibrate):
    """A prompt past the sidecar's text cap is refused every time
    (INVALID_ARGUMENT): the calibration (or, without one, the first point)
    completes no turn, and the bench stops with the server's own message
    instead of exiting 0 with 'no completed turn'."""
    small = Sidecar(tmp_path / "data", config=echo("main") + "[sidecar.limits]\nmax_text_bytes = 100\n").start()
    try:
        r = bench("--target", small.target, "--prompt-words", "50", "--calibrate", calibrate, "--concurrency", "2",
                  "--duration", "1", "--json", str(tmp_path / "x.json"))
    finally:
        small.stop()
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 1 and r.stdout == "" and "Traceback" not in r.stderr, r.stderr
    where = "the calibration" if calibrate != "0" else "sidecar c=2"
    assert lines[-1].startswith(f"agent-sidecar bench: every prompt of {where}"), r.stderr
    assert "was refused (" in lines[-1] and "INVALID_ARGUMENT" in lines[-1] and "100" in lines[-1], r.stderr
    assert not (tmp_path / "x.json").exists()


def test_a_pid_that_is_not_the_targets_sidecar_is_refused(sc, tmp_path):
    """--pid names the process whose tree is reported as the sidecar's: pid 1
    (every process is below it) or this test's own process (the sidecar's
    parent, but not the sidecar) are refused with one line and exit 2; the
    sidecar's own pid is taken."""
    for pid in (1, os.getpid()):
        r = bench("--target", sc.target, "--pid", str(pid), "--turns", "1")
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and r.stdout == "" and len(lines) == 1, (pid, r.stderr)
        assert lines[0].startswith(f"agent-sidecar bench: --pid {pid}: process {pid} (") \
            and f"does not listen on {sc.target} (process {sc.proc.pid} does)" in lines[0], r.stderr
    out = tmp_path / "pid.json"
    r = bench("--target", sc.target, "--pid", str(sc.proc.pid), "--concurrency", "1", "--turns", "1", "--warmup", "0",
              "--calibrate", "0", "--prompt-words", str(WORDS), "--json", str(out))
    assert r.returncode == 0, r.stderr
    assert json.loads(out.read_text())["sidecar_pid"] == sc.proc.pid


def test_refused_token_is_one_line_and_exit_1(sc):
    r = bench("--target", sc.tcp_target, "--token", "not-the-token", "--duration", "1")
    assert r.returncode == 1
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "UNAUTHENTICATED" in lines[0] and "Traceback" not in r.stderr, r.stderr


def test_tls_target(tmp_path):
    """A TLS endpoint (here the bare server with a certificate of the test CA)
    is reached with --ca-cert (the old spelling of --ca)."""
    if not certs_available():
        pytest.skip("openssl not installed")
    certs = make_certs(tmp_path / "certs")
    cert, key, ca = certs.server_cert, certs.server_key, certs.ca
    port = free_port()
    bare = subprocess.Popen([sys.executable, "-m", "agent_sidecar.bench.bare", "--listen", f"127.0.0.1:{port}",
                             "--tls-cert", str(cert), "--tls-key", str(key)], stdout=subprocess.PIPE, text=True)
    try:
        assert bare.stdout.readline().startswith("serving ")
        r = bench("--target", f"127.0.0.1:{port}", "--ca-cert", str(ca), "--concurrency", "2", "--turns", "4",
                  "--calibrate", "0", "--prompt-words", "3", "--clients", "2")  # each client its own TLS channel
        assert r.returncode == 0, r.stderr
        assert "Throughput and latency" in r.stdout and "2 client processes" in r.stdout
        plain = bench("--target", f"127.0.0.1:{port}", "--connect-timeout", "1", "--turns", "1")
        assert plain.returncode == 1  # TLS-only endpoint, plain channel
    finally:
        bare.terminate()
        bare.wait(10)


def test_find_knee_goes_past_the_sweep_until_each_server_fails(tmp_path):
    """--find-knee: levels past the sweep (each ~1.5x the last) for each
    server that met the SLO at every point so far. The sidecar admits 30
    prompts in flight, so its first level past 30 fails (OVERLOADED), and
    it runs no more; the bare server has no such limit and goes on until
    the next level would pass the cap. The SLO's bound on the turn is wide
    (--ideal 1 --slo 100%), so only the refusals fail a point. Turns of a
    few hundred ms keep every session mid-turn nearly all the time, however
    slowly a busy machine runs the bench's client between turns."""
    slow = echo("main", 100) + "[sidecar.limits]\nmax_prompts_in_flight = 30\n"
    sc = Sidecar(tmp_path / "data", config=slow).start()
    try:
        out = tmp_path / "knee.json"
        r = bench("--target", sc.target, "--sweep", "4,8", "--find-knee", "60", "--duration", "1",
                  "--prompt-words", "4", "--ideal", "1", "--slo", "100%", "--ramp", "0", "--calibrate", "1",
                  "--compare-bare", "--json", str(out))
        assert r.returncode == 0, r.stderr
        doc = json.loads(out.read_text())
    finally:
        sc.stop()
    levels = {server: [p["concurrency"] for p in doc["points"] if p["server"] == server]
              for server in ("sidecar", "bare")}
    assert levels == {"sidecar": [4, 8, 12, 18, 27, 41], "bare": [4, 8, 12, 18, 27, 41]}
    assert doc["sessions"]["count"] == 60 and doc["options"]["find_knee"] == 60
    failed = [p for p in doc["points"] if not p["within_slo"]]
    assert [(p["server"], p["concurrency"]) for p in failed] == [("sidecar", 41)]
    assert set(failed[0]["errors"]) == {"OVERLOADED"}
    sidecar, bare = doc["knee"]["sidecar"], doc["knee"]["bare"]
    assert (sidecar["concurrency"], sidecar["first_failing"], sidecar["beyond_sweep"]) == (27, 41, False)
    assert (bare["concurrency"], bare["beyond_sweep"]) == (41, True)  # 62 would pass 60
    assert doc["knee"]["ratio"] is None  # a knee beyond the points is only a lower bound
    assert "bare >= 41 (every point met the SLO; the next level would pass --find-knee 60)" in r.stdout
    assert "OVERLOADED: the sidecar refused prompts past its admission limits" in r.stdout
    assert "c=12 [past the sweep, up to 60]" in r.stderr


def test_repeat_runs_the_sweep_again_and_reports_each_knee_and_the_median(sc, tmp_path):
    """--repeat 2: the whole sweep twice, one after the other, on the same
    sessions and bare server. Each point names its sweep, each sweep has its
    knee and ratios, the headline gives their median and every sweep's knee,
    the plot draws the median, and every turn is in the store."""
    out, png = tmp_path / "repeat.json", tmp_path / "repeat.png"
    r = bench("--target", sc.target, "--sweep", "1,2", "--repeat", "2", "--turns", "3", "--prompt-words", str(WORDS),
              "--calibrate", "1", "--ramp", "0", "--compare-bare", "--json", str(out), "--plot", str(png),
              "--keep-sessions")
    assert r.returncode == 0, r.stderr
    doc = json.loads(out.read_text())
    assert [(p["round"], p["server"], p["concurrency"]) for p in doc["points"]] == [
        (1, "sidecar", 1), (1, "bare", 1), (1, "sidecar", 2), (1, "bare", 2),
        (2, "sidecar", 1), (2, "bare", 1), (2, "sidecar", 2), (2, "bare", 2)]
    assert doc["options"]["repeat"] == 2 and [x["round"] for x in doc["rounds"]] == [1, 2]
    for server in ("sidecar", "bare"):  # the median's, beside each sweep's own
        assert doc["knee"][server]["by_round"] == [x["knee"][server]["concurrency"] for x in doc["rounds"]]
    assert doc["knee"]["ratio_by_round"] == [x["knee"]["ratio"] for x in doc["rounds"]]
    assert [(x["round"], x["concurrency"]) for x in doc["ratios"]] == [(1, 1), (1, 2), (2, 1), (2, 2)]
    assert "median of 2 sweeps: sidecar " in r.stdout, r.stdout
    assert "\n  sweep 1: sidecar " in r.stdout and "\n  sweep 2: sidecar " in r.stdout, r.stdout
    assert "c=1 [1/2, sweep 2/2]" in r.stderr, r.stderr  # the progress names the sweep
    table_head = r.stdout.split("Throughput and latency", 1)[1].splitlines()[1].split()
    assert table_head[:3] == ["server", "sweep", "conc"], r.stdout
    totals = doc["totals"]
    assert totals["failed"] == {} and held(sc.sessions(), doc["sessions"]["keys"])[0] == totals["completed"]
    assert png_size(png) == SIZE_PX


def _swept(r: int, server: str, conc: int, ok: bool) -> dict:
    """A point of a sweep as analyse reads it: its turns' p99 1 s (within an
    ideal of 1 s +10%) when ``ok``, else 2 s."""
    ms = {"p50": 1e3, "p90": 1e3, "p99": 1e3 if ok else 2e3, "max": 2e3}
    return {"round": r, "server": server, "concurrency": conc, "turn_ms": ms, "error_count": 0, "errors": {},
            "first_delta_ms": {"p50": 1.0, "p99": 1.0}, "turns_per_s": 1.0, "deltas_per_s": 1.0,
            "totals": {"started": 1, "completed": 1, "failed": {}, "deltas": 1, "tool_calls": 0}}


def _sweeps(knees: list[tuple[int | None, int | None]]) -> dict:
    """A document of one sweep per (sidecar knee, bare knee) over levels
    10, 20, 40: a knee of None fails every point, 40 passes every one."""
    points = [_swept(r, server, conc, knee is not None and conc <= knee)
              for r, pair in enumerate(knees, 1) for conc in (10, 20, 40)
              for server, knee in zip(("sidecar", "bare"), pair)]
    return report.analyse({"options": {"sweep": True, "slo": 0.1, "ideal_s": 1.0, "repeat": len(knees)},
                           "points": points})


def test_the_median_of_several_sweeps():
    """Each server's knee is the lower median of the sweeps' knees; a round
    with no passing point counts lowest; one whose every point passed is a
    lower bound, and so is the median when it lies at or below it. The ratio
    is the lower median of the sweeps' ratios, only when every sweep has one."""
    doc = _sweeps([(20, 10), (40, 20), (None, 10)])
    k = doc["knee"]
    assert [x["knee"]["sidecar"]["concurrency"] for x in doc["rounds"]] == [20, 40, None]
    assert (k["sidecar"]["concurrency"], k["sidecar"]["beyond_sweep"], k["sidecar"]["first_failing"]) == (20, False, 40)
    assert k["sidecar"]["by_round"] == [20, 40, None] and k["sidecar"]["beyond_sweep_by_round"] == [False, True, False]
    assert (k["bare"]["concurrency"], k["bare"]["by_round"]) == (10, [10, 20, 10])
    assert k["ratio_by_round"] == [2.0, None, None] and k["ratio"] is None
    line = text.headline(doc)
    assert line.startswith("knee (largest concurrency with p99 turn <= 1.100 s, no errors), median of 3 sweeps: "
                           "sidecar 20 (sweeps: 20, >= 40, < 10) · bare 10 (sweeps: 10, 20, 10) · "
                           "sidecar/bare: no median (a sweep's knee was only a bound)\n"), line
    assert "\n  sweep 2: sidecar >= 40 (every point met the SLO) · bare 20" in line, line

    doc = _sweeps([(20, 10), (20, 20), (10, 10)])
    assert doc["knee"]["ratio_by_round"] == [2.0, 1.0, 1.0] and doc["knee"]["ratio"] == 1.0
    assert "sidecar 20 (sweeps: 20, 20, 10) · bare 10 (sweeps: 10, 20, 10) · sidecar/bare 1.00x" in text.headline(doc)
    doc = _sweeps([(20, 10), (10, 10)])  # two sweeps: the lower of the middle two, for the ratio too
    assert (doc["knee"]["sidecar"]["concurrency"], doc["knee"]["ratio"]) == (10, 1.0)
    doc = _sweeps([(40, 10), (20, 10), (40, 10)])  # the median is a sweep that passed every point
    assert (doc["knee"]["sidecar"]["concurrency"], doc["knee"]["sidecar"]["beyond_sweep"]) == (40, True)
    assert "sidecar >= 40 (sweeps: >= 40, 20, >= 40)" in text.headline(doc)


def test_percentiles_are_nearest_rank():
    """p_q of n sorted values is the one at rank ceil(q*n/100): p99 of 100 is
    the 99th (not the max), of 300 the 297th, p50 of 10 the 5th (no
    banker's rounding up to the 6th); one value is every percentile."""
    def nth(n: int, q: float) -> float:
        return stats.percentile([float(i) for i in range(1, n + 1)], q)  # value i at rank i

    assert nth(100, 99) == 99 and nth(100, 50) == 50 and nth(100, 90) == 90 and nth(100, 100) == 100
    assert nth(300, 99) == 297 and nth(300, 50) == 150 and nth(300, 90) == 270
    assert nth(10, 50) == 5 and nth(10, 99) == 10 and nth(10, 90) == 9 and nth(10, 91) == 10
    assert nth(1, 50) == nth(1, 99) == nth(1, 0) == 1
    assert nth(2, 50) == 1 and nth(2, 51) == 2
    assert nth(1000, 99.9) == 999 and nth(7, 0) == 1
    assert stats.percentile([], 50) != stats.percentile([], 50)  # NaN
    assert stats.summarize([3.0, 1.0, 2.0, 4.0]) == {"n": 4, "p50": 2.0, "p90": 4.0, "p99": 4.0, "max": 4.0,
                                                     "mean": 2.5}


def test_the_progress_bar_follows_the_point_it_shows():
    """The calibration is a number of turns: its bar counts them, not the
    points' --duration (before: '0.3/10s' while calibrating 3 turns)."""
    import io

    from agent_sidecar.bench import load
    from agent_sidecar.cli.progress import LiveLine, StatusView

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    screen = Terminal()
    view = StatusView(LiveLine(screen), duration_s=10.0, turns=None)  # the points': --duration 10
    calibration = load.Point(load.LoadSpec(concurrency=1, text="x", duration_s=None, turns=3, warmup_s=0))
    calibration.measured_started = 2
    view("calibrating", calibration)
    assert "calibrating measure [#############-------] 2/3 turns" in screen.getvalue(), screen.getvalue()
    point = load.Point(load.LoadSpec(concurrency=1, text="x", duration_s=10.0, warmup_s=0))
    view("sidecar c=1", point)
    assert "/10s" in screen.getvalue().rsplit("\r", 1)[-1], screen.getvalue()


DOCS = [ROOT / "README.md", ROOT / "benchmarks" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _documented_bench_commands() -> list[tuple[str, str]]:
    """(file, command) of every `agent-sidecar bench` example in the docs: the
    lines of a fenced block (with their continuations), and inline ones
    (not those with a placeholder: '…', '...', '[')."""
    import re
    found = []
    for path in DOCS:
        text = path.read_text()
        fenced, inside = [], False
        for line in text.splitlines():
            if line.lstrip().startswith("```"):
                inside = not inside
            elif inside:
                fenced.append(line)
        for command in "\n".join(fenced).replace("\\\n", " ").splitlines():
            if command.strip().startswith("agent-sidecar bench"):
                found.append((path.name, command.strip()))
        for command in re.findall(r"`(agent-sidecar bench [^`]+)`", text):
            if not any(mark in command for mark in ("…", "...", "[")):
                found.append((path.name, " ".join(command.split())))
    return found


def test_every_bench_example_in_the_docs_is_accepted_as_written(tmp_path, monkeypatch):
    """Each `agent-sidecar bench` command the docs show passes the CLI's own
    parser and option checks, as written (before: README's sent --token to
    a remote TCP target without --tls, which the CLI refuses)."""
    import shlex

    from agent_sidecar.cli import bench_cmd
    from agent_sidecar.cli.main import build_parser

    monkeypatch.chdir(tmp_path)
    (tmp_path / "ca.pem").write_text("")  # what the examples' --ca names
    commands = _documented_bench_commands()
    assert len(commands) >= 5, commands
    for where, command in commands:
        argv = shlex.split(command)[1:]
        try:
            args = build_parser().parse_args(argv)
            bench_cmd._check_render(args) if args.render else bench_cmd.options_from(args)
        except (SystemExit, ValueError) as e:
            pytest.fail(f"{where}: {command!r} is refused: {e!r}")


def test_knee_rules():
    limit = 4.4
    k = stats.knee([(100, 4.6, True), (25, 4.0, True), (50, 4.2, True)], limit)
    assert {"concurrency": 50, "first_failing": 100, "beyond_sweep": False,
            "non_monotone": False}.items() <= k.items()
    assert k["interpolated"] == pytest.approx(75)  # 4.2 -> 4.6 between 50 and 100 crosses 4.4 halfway
    # a point that is not clean (errors, a late first delta) fails whatever its turns' p99;
    # a later pass does not raise the knee
    k = stats.knee([(25, 4.0, True), (50, 4.1, False), (100, 4.2, True)], limit)
    assert (k["concurrency"], k["interpolated"], k["non_monotone"]) == (25, None, True)
    assert stats.knee([(25, 4.0, True), (50, 4.1, True)], limit)["beyond_sweep"] is True
    assert stats.knee([(25, 5.0, True), (50, 6.0, True)], limit)["concurrency"] is None
    assert stats.parse_slo("10%") == pytest.approx(0.1) and stats.parse_slo("0.25") == 0.25
    with pytest.raises(ValueError):
        stats.parse_slo("ten")


def test_ramp_spreads_the_first_turns_over_one_ideal_turn():
    """--ramp auto (the default): one ideal turn, so each lane's turns keep an
    even place in the cycle; the ideal is --ideal, else the calibration's
    median turn; with neither, 1 s. A given --ramp wins."""
    from agent_sidecar.bench.options import DEFAULT_RAMP_S, BenchOptions, ramp_for
    from agent_sidecar.bench.target import Target

    calibration = {"turn_ms": {"p50": 4020.0, "n": 3}}  # as load.run_point summarizes it

    def opts(**kw) -> BenchOptions:
        return BenchOptions(targets=(Target("t"),), text="x", **kw)

    assert ramp_for(opts(), calibration)[0] == pytest.approx(4.02)
    assert ramp_for(opts(ideal_s=4.0), calibration)[0] == 4.0
    assert ramp_for(opts(ramp_s=0.5, ideal_s=4.0), calibration)[0] == 0.5
    assert ramp_for(opts(ramp_s=0.0), calibration)[0] == 0.0
    assert ramp_for(opts(), None)[0] == DEFAULT_RAMP_S
    assert ramp_for(opts(), {"turn_ms": {"p50": None, "n": 0}})[0] == DEFAULT_RAMP_S


def test_bare_timing_follows_the_frames_the_calibration_saw():
    """The bare server streams what the sidecar sent: one frame per word at
    the gap; a model's wait before its first token (25 ms or more beyond a
    gap) before the first; and, from a coalescing sidecar (frames of several
    words, the first sent at once), the first frame after its own words at
    the pace of the later frames' words, not one frame gap late."""
    from agent_sidecar.bench.bare_process import bare_timing
    from agent_sidecar.bench.run import BenchOptions
    from agent_sidecar.bench.target import Target

    def calibration(first: float, gap: float | None, frames: float, words: float, first_words: float) -> dict:
        return {"turns": 3, "first_delta_ms": {"p50": first}, "delta_gap_ms": {"p50": gap},
                "deltas_per_turn": frames, "words_per_turn": words, "first_delta_words": first_words}

    opts = BenchOptions(targets=(Target("t"),), text="w " * 200)
    per_token = bare_timing(opts, calibration(23.0, 20.0, 200, 200, 1), 200)
    assert (per_token["first_delta_ms"], per_token["delta_gap_ms"], per_token["reply_deltas"]) == (20.0, 20.0, 0)
    assert per_token["delta_words"] == 1
    slow_start = bare_timing(opts, calibration(520.0, 20.0, 200, 200, 1), 200)
    assert slow_start["first_delta_ms"] == 520.0
    # 200 words at 20 ms, coalesced into 100 ms windows: the first word alone, then 40 frames of ~5
    coalesced = bare_timing(opts, calibration(24.5, 99.5, 41, 200, 1), 200)
    assert coalesced["delta_gap_ms"] == 99.5 and (coalesced["reply_deltas"], coalesced["delta_words"]) == (41, 5)
    assert coalesced["first_delta_ms"] == pytest.approx(99.5 * 40 / 199, abs=1e-3)
    one_frame = bare_timing(opts, calibration(30.0, None, 1, 200, 200), 200)
    assert (one_frame["first_delta_ms"], one_frame["delta_gap_ms"], one_frame["reply_deltas"]) == (30.0, 30.0, 1)
    assert one_frame["delta_words"] == 200  # the whole reply in its one delta
    silent = bare_timing(opts, calibration(0.0, None, 0, 0, 0), 200)  # no text at all: no division by it
    assert (silent["reply_deltas"], silent["delta_words"]) == (1, 1)
    given = bare_timing(BenchOptions(targets=(Target("t"),), text="x", bare_latency_ms=20.0, bare_first_delay_ms=5.0),
                        calibration(24.5, 99.5, 41, 200, 1), 1)
    assert (given["first_delta_ms"], given["delta_gap_ms"], given["source"]) == (25.0, 20.0, "given")


def test_the_live_line_shows_progress_in_a_log_every_few_seconds():
    """Off a terminal (a log file, CI) a point of minutes still shows it is
    going on: its line at most every ``every_s``, not one per redraw."""
    import io

    from agent_sidecar.cli.progress import LiveLine

    now = [100.0]
    log = io.StringIO()
    line = LiveLine(log, every_s=10.0, clock=lambda: now[0])
    for t, said in [(100.0, "a"), (105.0, "b"), (109.9, "c"), (110.0, "d"), (119.0, "e"), (120.5, "f")]:
        now[0] = t
        line.show(said)
    line.log("done")
    assert log.getvalue().splitlines() == ["d", "f", "done"]
