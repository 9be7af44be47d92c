"""``agent-sidecar bench``: drive a running sidecar with concurrent turns and
report throughput, latency, errors and (on this host) CPU and memory.

Imports nothing heavy at module level (main.py builds its parser from here);
the client, grpc and matplotlib come in when the command runs. A failure the
user can fix (no sidecar at the target, a refused token, a missing extra) is
one line on stderr and exit status 1; bad options are argparse's exit 2.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
from typing import TYPE_CHECKING

from ..config_loader import read_file
from .argtypes import MAX_SECONDS, file_name, non_negative, positive, target_list
from .bench_args import (
    DELIVERIES,
    MAX_CALIBRATE,
    MAX_CLIENTS,
    MAX_LANES,
    MAX_POINT_SECONDS,
    MAX_REPEAT,
    MAX_SESSIONS,
    MAX_TURNS,
    levels,
    prompt_of,
    prompt_words,
    seconds_or_auto,
)
from .bench_output import check_outputs, write_outputs
from .connection import DEFAULT_TARGET, TARGET_HELP, TargetError, add_target_arguments, tls_material
from .report import error

if TYPE_CHECKING:  # the bench is imported when the command runs
    from ..bench.target import Target

def add_arguments(sub) -> argparse.ArgumentParser:
    b = sub.add_parser("bench", help="load a running sidecar and report throughput, latency, CPU",
                       description="Drive a running sidecar with concurrent turns and report throughput, "
                                   "latency, errors and (on this host) CPU and memory.")
    t = b.add_argument_group("target")
    add_target_arguments(t, DEFAULT_TARGET, target_help=TARGET_HELP + "; or several, comma-separated (a "
                         "cluster's nodes, or separate sidecars: one client process or more each)",
                         target_type=target_list)
    t.add_argument("--connect-timeout", type=positive(float, MAX_SECONDS), default=5.0,
                   help="seconds a target may take to connect: at the start, before each point, and for a "
                        "turn whose stream broke to resume (default 5)")
    t.add_argument("--pid", type=positive(int), default=None,
                   help="the sidecar's pid for CPU/RSS figures (default: found from the listening socket); "
                        "refused unless it listens on the target (or wraps the agent-sidecar that does)")
    _load_arguments(b.add_argument_group("load"))
    _measure_arguments(b.add_argument_group("measure and compare"))
    o = b.add_argument_group("output")
    o.add_argument("--json", type=file_name, default=None, metavar="FILE", help="write every figure as JSON")
    o.add_argument("--plot", type=file_name, default=None, metavar="FILE.png",
                   help="write the plot: a PNG, or an SVG or PDF by the file name (needs matplotlib)")
    o.add_argument("--render", type=file_name, default=None, metavar="FILE.json",
                   help="run nothing: print the report of an earlier run's --json file, judged as this version "
                        "judges it (with --plot, draw it; on another machine, say, with matplotlib)")
    b.set_defaults(func=run, _parser=b)
    return b


def _load_arguments(ld) -> None:
    ld.add_argument("--profile", default=None, help="the profile of the sessions and prompts (default main)")
    ld.add_argument("--platform", default="bench", help="the SessionSource platform, and the tools' namespace")
    ld.add_argument("--sessions", type=positive(int, MAX_SESSIONS), default=None,
                    help="sessions to create (default: the largest concurrency, or --find-knee's MAX; "
                         f"at most {MAX_SESSIONS:,}); deleted when the run ends")
    ld.add_argument("--keep-sessions", action="store_true",
                    help="leave the run's sessions and their transcripts in the target's store")
    c = ld.add_mutually_exclusive_group()
    c.add_argument("--concurrency", type=positive(int, MAX_LANES), default=None,
                   help=f"concurrent turns (default 10; at most {MAX_LANES:,}, the streams a sidecar at its default "
                        "limits takes from one credential)")
    c.add_argument("--sweep", type=levels, default=None, metavar="N,N,...",
                   help="run one point per concurrency level, e.g. 25,50,100,200,400, and find the knee "
                        f"(each at most {MAX_LANES:,})")
    d = ld.add_mutually_exclusive_group()
    d.add_argument("--duration", type=positive(float, MAX_POINT_SECONDS), default=None,
                   help=f"seconds measured per point (default 10; at most {MAX_POINT_SECONDS:.0f})")
    d.add_argument("--turns", type=positive(int, MAX_TURNS), default=None,
                   help=f"turns measured per point (at most {MAX_TURNS:,})")
    p = ld.add_mutually_exclusive_group()
    p.add_argument("--prompt", default=None, help="the prompt text")
    p.add_argument("--prompt-words", type=prompt_words, default=None,
                   help="a prompt of N words (default 200; at most what fits the sidecar's default 256 KiB text cap)")
    ld.add_argument("--delivery", choices=DELIVERIES, default="queue", help="delivery mode (default queue)")
    ld.add_argument("--tools", action="store_true",
                    help="host <platform>.echo and <platform>.sleep tools here, for a profile that calls them")
    ld.add_argument("--warmup", type=seconds_or_auto, default=None, metavar="SECONDS|auto",
                    help="warm-up per point, with --duration at least until every lane has started (default auto: "
                         "until every lane has finished one turn)")
    ld.add_argument("--ramp", type=seconds_or_auto, default=None, metavar="SECONDS|auto",
                    help="spread the lanes' first turns over S seconds (default auto: one ideal turn, so "
                         "that turns start evenly over time, not in a burst per turn)")
    ld.add_argument("--turn-timeout", type=positive(float, MAX_SECONDS), default=300.0,
                    help="seconds per turn (default 300)")
    ld.add_argument("--clients", type=positive(int, MAX_CLIENTS), default=None, metavar="N",
                    help="drive the points from N client processes, each with its own connection and share "
                         "of the lanes and sessions, for servers faster than one Python client can read "
                         f"(default: this process alone; with several targets, one each; at most {MAX_CLIENTS})")
    ld.add_argument("--seed", type=int, default=1)


def _measure_arguments(m) -> None:
    m.add_argument("--slo", default="10%", help="allowed p99 turn excess over the ideal (default 10%%)")
    m.add_argument("--first-delta-slo", type=positive(float, MAX_SECONDS * 1000), default=None, metavar="MS",
                   help="also bound the p99 time to the first text delta, in ms (how soon a chat shows "
                        "text): a point, and so the knee, must meet both")
    m.add_argument("--find-knee", type=positive(int, MAX_LANES), default=None, metavar="MAX",
                   help="with --sweep: past its last level, add levels (each about 1.5x the last) for each "
                        "server that met the SLO at every point so far, until one fails or the next level "
                        "would pass MAX; sessions default to MAX")
    m.add_argument("--repeat", type=positive(int, MAX_REPEAT), default=1, metavar="N",
                   help="with --sweep: run the whole sweep N times, one after another, and report each "
                        "sweep's knee and their median (on a busy or noisy machine one sweep can put a knee "
                        f"a level off) (default 1; at most {MAX_REPEAT})")
    m.add_argument("--ideal", type=positive(float, MAX_SECONDS), default=None,
                   help="the ideal turn in seconds (default: the median calibration turn)")
    m.add_argument("--calibrate", type=non_negative(int, MAX_CALIBRATE), default=3,
                   help="turns run one at a time on one session (after a warm-up there) before the points, for the "
                        f"ideal and the bare timing (default 3; at most {MAX_CALIBRATE:,})")
    m.add_argument("--compare-bare", action="store_true",
                   help="run the same load against a built-in bare gRPC server and print the ratios")
    m.add_argument("--bare-latency-ms", type=non_negative(float, MAX_SECONDS * 1000), default=None,
                   help="the bare server's gap between deltas, e.g. the model's token latency for one frame per "
                        "token (default: the frames and gaps the calibration saw)")
    m.add_argument("--bare-first-delay-ms", type=non_negative(float, MAX_SECONDS * 1000), default=0.0,
                   help="with --bare-latency-ms: an extra delay before the first delta")


# What --render cannot use: options that shape a run, which it does not make.
_RUN_ONLY = {"sweep": None, "concurrency": None, "duration": None, "turns": None, "compare_bare": False,
             "find_knee": None, "repeat": 1, "clients": None, "tools": False, "keep_sessions": False}


def _check_render(args) -> None:
    """ValueError naming a run option given with --render (it would be ignored)."""
    for name, unset in _RUN_ONLY.items():
        if getattr(args, name) != unset:
            raise ValueError(f"--render reads an earlier run: --{name.replace('_', '-')} does not apply")
    check_outputs(args)


def options_from(args):
    """BenchOptions from parsed arguments; ValueError for combinations argparse cannot check."""
    from ..bench.options import BenchOptions
    from ..bench.stats import parse_slo

    if args.tools and args.compare_bare:
        raise ValueError("--tools and --compare-bare do not go together: the bare server has no tool host")
    if args.prompt is not None and not args.prompt.strip():
        raise ValueError("--prompt must not be empty")
    check_outputs(args)
    targets = _targets(args)
    levels = args.sweep or [args.concurrency or 10]
    if args.find_knee is not None and args.sweep is None:
        raise ValueError("--find-knee goes with --sweep: it extends a sweep")
    if args.find_knee is not None and args.find_knee <= max(levels):
        raise ValueError(f"--find-knee {args.find_knee} must be above the sweep's largest level ({max(levels)})")
    if args.repeat > 1 and args.sweep is None:
        raise ValueError("--repeat goes with --sweep: it repeats a sweep")
    clients = args.clients or len(targets)
    if clients < len(targets):
        raise ValueError(f"--clients {clients}: at least one client process per target ({len(targets)})")
    if args.pid is not None and len(targets) > 1:
        raise ValueError("--pid is for one target")
    opts = BenchOptions(
        targets=targets, text=args.prompt if args.prompt is not None else prompt_of(args.prompt_words or 200),
        levels=levels, sweep=args.sweep is not None and (len(levels) > 1 or args.find_knee is not None
                                                          or args.repeat > 1),
        find_knee=args.find_knee, repeat=args.repeat, clients=clients,
        profile=args.profile, platform=args.platform,
        sessions=args.sessions, duration_s=None if args.turns else (args.duration or 10.0), turns=args.turns,
        warmup_s=args.warmup, ramp_s=args.ramp, delivery=args.delivery, tools=args.tools,
        compare_bare=args.compare_bare, bare_latency_ms=args.bare_latency_ms,
        bare_first_delay_ms=args.bare_first_delay_ms, ideal_s=args.ideal, slo=parse_slo(args.slo),
        first_delta_slo_ms=args.first_delta_slo,
        calibrate=args.calibrate, pid=args.pid, turn_timeout_s=args.turn_timeout, seed=args.seed,
        keep_sessions=args.keep_sessions)
    if clients > opts.session_count:
        raise ValueError(f"--clients {clients} needs at least as many sessions (--sessions)")
    return opts


def _targets(args) -> tuple[Target, ...]:
    """A bench.target.Target per address of ``--target`` (argparse read each
    as every command reads one: argtypes.target_list), each with the token
    and TLS options, checked for each address where it connects: a tcp:
    target on loopback may carry the token, a socket path takes no TLS."""
    from ..bench.target import Target
    targets = []
    for address in args.target:
        try:
            tls, channel_options = tls_material(argparse.Namespace(**{**vars(args), "target": address}))
        except TargetError as e:
            raise ValueError(str(e)) from None
        targets.append(Target(address, args.token, tls, channel_options, args.insecure, args.connect_timeout))
    return tuple(targets)


def run(args) -> int:
    if args.render:
        try:
            _check_render(args)
        except ValueError as e:
            args._parser.error(str(e))
        return _render(args)
    problem = _missing_extras(args)  # first: the targets are read by the client's rules
    if problem:
        error("bench", problem)
        return 1
    try:
        opts = options_from(args)
    except ValueError as e:
        args._parser.error(str(e))
    if opts.pid is not None:
        from ..bench.sockets import pid_problem
        problem = pid_problem(opts.pid, opts.target.address)
        if problem:  # its CPU and memory would be reported as the sidecar's
            error("bench", f"--pid {opts.pid}: {problem}")
            return 2
    import uvloop

    from ..bench import text
    from ..bench.target import BenchError
    from .progress import LiveLine, StatusView

    line = LiveLine()
    try:
        doc = uvloop.run(_run_stoppable(opts, StatusView(line, opts.duration_s, opts.turns)))
    except BenchError as e:
        line.close()
        _say(str(e), *getattr(e, "__notes__", ()))
        return 1
    except (KeyboardInterrupt, asyncio.CancelledError) as e:  # before any point finished, or a second signal
        line.close()
        _say("interrupted", *getattr(e, "__notes__", ()))  # (asyncio.Runner's KeyboardInterrupt has none)
        return EXIT_BY_SIGNAL["SIGINT" if isinstance(e, KeyboardInterrupt) else "SIGTERM"]
    line.close()
    written = write_outputs(doc, args)  # first: stdout may be a pipe that is gone (`| head -1`)
    print(text.render(doc), flush=True)
    cut = doc["interrupted"]
    if written:
        return written
    signalled = cut["reason"] if cut and cut["reason"] in EXIT_BY_SIGNAL else doc["sessions"].get("signal")
    if signalled:  # a run, or the deletion of its sessions, stopped by a signal: a shell sees which
        return EXIT_BY_SIGNAL[signalled]
    if cut is None:
        return 0
    error("bench", f"{cut['message']} {cut.get('when', 'during')} {cut['at']}; the report holds the points "
          f"that finished")
    return 1


def _say(*lines: str) -> None:
    for text in lines:
        error("bench", text)


EXIT_BY_SIGNAL = {"SIGINT": 130, "SIGTERM": 143}  # 128 + the signal's number, as a shell reports it


async def _run_stoppable(opts, status):
    """run_bench, with SIGTERM (`timeout 60 agent-sidecar bench ...`, a CI
    job's end) stopping it as Ctrl-C does: asyncio.Runner cancels the run
    for SIGINT, this handler for SIGTERM, and the run keeps its finished
    points either way."""
    from ..bench.run import run_bench
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    by = ["SIGINT"]

    def on_sigterm() -> None:
        by[0] = "SIGTERM"
        task.cancel()

    loop.add_signal_handler(signal.SIGTERM, on_sigterm)
    try:
        return await run_bench(opts, status, lambda: by[0])
    finally:
        loop.remove_signal_handler(signal.SIGTERM)


# The largest --render document: a run at every bound (bench_args) stays well
# under it. Read with a cap, as the config is, so that a file given by mistake
# (a log, /dev/zero) is one line, not a read into memory that does not end;
# JSON nested past what the parser recurses into is one line too (RecursionError).
MAX_DOCUMENT_BYTES = 256 * 1024 * 1024


def _render(args) -> int:
    """``--render``: an earlier run's document, analysed again (report.analyse
    is pure: it judges the recorded points), printed, and plotted with --plot."""
    from ..bench import report, text
    problem = _missing_extras(args, client=False)  # nothing is run: no client needed
    if problem:
        error("bench", problem)
        return 1
    try:
        doc = json.loads(read_file(args.render, MAX_DOCUMENT_BYTES, regular=False))
        if not isinstance(doc, dict) or doc.get("version") != 1:
            raise ValueError("no version 1")
        out = text.render(report.analyse(doc))
    except OSError as e:
        error("bench", f"cannot read {args.render}: {e.strerror}" if e.strerror
              else f"{e}: no bench document is")
        return 1
    except (ValueError, KeyError, TypeError, AttributeError, IndexError, RecursionError) as e:
        error("bench", f"{args.render} is not an agent-sidecar bench --json document this version "
              f"can read ({type(e).__name__}: {e})")
        return 1
    try:
        written = write_outputs(doc, args)
    except (ValueError, KeyError, TypeError, AttributeError, IndexError) as e:  # the plot reads more of it
        error("bench", f"{args.render} is not an agent-sidecar bench --json document this version "
              f"can plot ({type(e).__name__}: {e})")
        return 1
    print(out, flush=True)
    return written


def _missing_extras(args, client: bool = True) -> str | None:
    """Why the bench cannot do what ``args`` ask (None: it can): the Python
    client, when ``client`` (a run), and matplotlib, for ``--plot``."""
    if client:
        try:
            import agent_sidecar_client  # noqa: F401
        except ImportError:
            return "needs the Python client; install the bench extra: pip install 'agent-sidecar[bench]'"
    if args.plot:
        from ..bench.plot import available
        return available()
    return None
