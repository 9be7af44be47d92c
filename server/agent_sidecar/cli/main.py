"""``agent-sidecar``: serve, sessions, doctor, backup, health, status, config, bench; ``--version``.

It imports nothing heavy at module level (grpc and the server come in
inside the commands, the argument types when the parser is built), so
``agent-sidecar --help`` and the small commands start fast, and ``serve``
holds a stop signal from its first lines (cli/serve.py).
"""

from __future__ import annotations

import argparse
import os
import sys

from .. import __version__
from .report import error


def _serve(args) -> int:
    from .serve import serve
    return serve(args)


def _sessions(args) -> int:
    from .sessions_cmd import run
    return run(args)


def _doctor(args) -> int:
    from .doctor import run
    return run(args)


def _backup(args) -> int:
    from .backup import run
    return run(args)


def _health(args) -> int:
    from .health import run
    return run(args)


def _status(args) -> int:
    from .status import run
    return run(args)


def build_parser() -> argparse.ArgumentParser:
    from .argtypes import MAX_SECONDS, file_name, non_negative, positive, utf8
    from .connection import add_target_arguments  # no grpc: it comes in when a command runs
    p = argparse.ArgumentParser(prog="agent-sidecar",
                                description="A gRPC session runtime for chat-bot agents.")
    p.add_argument("--version", action="version", version=f"agent-sidecar {__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("serve", help="run the sidecar")
    s.add_argument("--data-dir", default=None, help="where sidecar.db and sidecar.sock live (default: the "
                                                   "config's [sidecar] data_dir, else ./data)")
    s.add_argument("--listen", action="append", default=None, metavar="unix:PATH|HOST:PORT",
                   help="listen address; repeat for several, in place of the config's [sidecar] listen "
                        "([[listen]] entries are bound too; with neither, unix:DATA_DIR/sidecar.sock)")
    s.add_argument("--config", type=file_name, default=None, help="TOML config file")
    s.add_argument("--workers", type=int, default=None,
                   help="worker processes (default: one per CPU it may use: affinity, cgroup limit)")
    s.add_argument("--log-format", choices=("json", "text"), default=None)
    s.add_argument("--log-level", default=None)
    s.set_defaults(func=_serve)

    ss = sub.add_parser("sessions", help="inspect sessions of a running sidecar")
    add_target_arguments(ss)
    ss_sub = ss.add_subparsers(dest="action", required=True)
    ls = ss_sub.add_parser("list", help="list sessions, most recently active first")
    ls.add_argument("--platform", type=utf8, default="")
    ls.add_argument("--limit", type=non_negative(int), default=50,
                    help="sessions to list (default 50; 0: the sidecar's default page; at most its max page)")
    show = ss_sub.add_parser("show", help="show one session and its transcript")
    show.add_argument("key", type=utf8)
    show.add_argument("--limit", type=non_negative(int), default=0,
                      help="messages of the transcript to show (default 0: all of them, a page at a time)")
    dl = ss_sub.add_parser("delete", help="delete one session and everything it owns")
    dl.add_argument("key", type=utf8)
    ss.set_defaults(func=_sessions)

    d = sub.add_parser("doctor", help="check and repair the store (sidecar may be stopped)")
    d.add_argument("--data-dir", default=None,
                   help="the sidecar's data dir (default: the config's [sidecar] data_dir, else ./data)")
    d.add_argument("--rebuild-fts", action="store_true", help="drop and rebuild the full-text index")
    d.add_argument("--config", type=file_name, default=None,
                   help="the sidecar's TOML config (its data_dir, [store] backend and dsn)")
    d.set_defaults(func=_doctor)

    b = sub.add_parser("backup", help="copy the SQLite store to FILE, safely while the sidecar runs")
    b.add_argument("file", metavar="FILE", type=file_name,
                   help="the copy (a new file; FILE.partial until it is complete)")
    b.add_argument("--data-dir", default=None,
                   help="the sidecar's data dir (default: the config's [sidecar] data_dir, else ./data)")
    b.add_argument("--config", type=file_name, default=None,
                   help="the sidecar's TOML config (its data_dir and [store] backend)")
    b.set_defaults(func=_backup)

    h = sub.add_parser("health", help="ask a running sidecar's health service (exit 0 when SERVING)")
    add_target_arguments(h)
    h.add_argument("--service", type=utf8, default="", help="the service name to ask about (default: the server)")
    h.add_argument("--timeout", type=positive(float, MAX_SECONDS), default=3.0,
                   help="seconds to wait for the answer (default 3)")
    h.add_argument("--live", action="store_true",
                   help="exit 0 for any answer, NOT_SERVING too (a liveness probe: the process answers)")
    h.set_defaults(func=_health)

    st = sub.add_parser("status", help="what a running sidecar is doing: workers, turns, queues, store")
    add_target_arguments(st)  # over TCP: an admin token
    st.add_argument("--json", action="store_true", help="one JSON object instead of the table")
    st.add_argument("--timeout", type=positive(float, MAX_SECONDS), default=5.0,
                    help="seconds to wait for the answer (default 5)")
    st.set_defaults(func=_status)

    from .config_cmd import add_arguments as add_config  # its imports: config, no grpc
    add_config(sub)
    from .bench_cmd import add_arguments as add_bench  # light: its imports come in when it runs
    add_bench(sub)
    return p


# A shell's status for a command killed by SIGPIPE (128 + 13): what `cmd | head -1` reports.
EXIT_BROKEN_PIPE = 141
EXIT_INTERRUPTED = 130  # 128 + SIGINT's 2: a command stopped by Ctrl-C


def main(argv: list[str] | None = None) -> int:
    if (sys.argv[1:] if argv is None else argv)[:1] == ["serve"]:  # before any slow import (cli/serve.py)
        from .serve import hold_stop_signals
        hold_stop_signals()
    args = build_parser().parse_args(argv)
    if getattr(args, "quiet_grpc", False):  # a command that talks to a running sidecar
        from .connection import quiet_grpc_core
        quiet_grpc_core()
    try:
        code = args.func(args) or 0
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's last flush
    except KeyboardInterrupt:
        # Ctrl-C while a command waits (a sidecar that does not answer, a long doctor or backup):
        # what the user asked for, so one line, not Python's traceback from inside gRPC's wait.
        # (What a command must undo it undoes as the exception passes: backup's FILE.partial.)
        error(args.command, "interrupted")
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # stdout's reader is gone (`agent-sidecar ... | head -1`): the rest is unwanted, not an
        # error; point stdout at /dev/null so nothing more (the exit's own flush) tries to write it.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return EXIT_BROKEN_PIPE
    return code


if __name__ == "__main__":
    sys.exit(main())
