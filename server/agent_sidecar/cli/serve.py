"""``agent-sidecar serve``: load config, start the sidecar on uvloop, run until
SIGTERM/SIGINT/SIGHUP, stop cleanly.

A stop signal is the sidecar's to act on from the command's first lines
(``hold_stop_signals``, which main.py calls before it imports anything
else), not only once the event loop's handlers are in: until then it is
held, and replayed to them (runtime.Sidecar.stop_on_signals), so one that
comes during the start's imports or its config ends the start as one
during the children's spawn does, with a log line and exit status 0;
SIGTERM or SIGHUP killed the process without a word (exit 143, 129), and
Ctrl-C was a KeyboardInterrupt wherever the start was (a traceback, exit
130). This module imports nothing heavy at module level for that reason.
"""

from __future__ import annotations

import logging
import os
import signal

from ..child import STOP_SIGNALS
from .report import error

_held: list[signal.Signals] = []  # stop signals that came before the sidecar's handlers


def _hold(signum: int, frame: object) -> None:
    _held.append(signal.Signals(signum))


def hold_stop_signals() -> None:
    """Keep the stop signals that come from now on (their default actions
    kill the process with no line, or raise KeyboardInterrupt) for the
    sidecar's handlers, which take them over (``held_stop_signals``)."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, _hold)


def held_stop_signals() -> list[signal.Signals]:
    """The stop signals held so far, taken (the list is empty after)."""
    held = _held[:]
    del _held[:len(held)]
    return held


def serve(args) -> int:
    hold_stop_signals()  # main() did already, when it knew the command in time
    from .. import logs
    from ..children import set_title
    from ..config import ConfigError, load_config
    from ..config_checks import unix_path
    try:
        cfg = load_config(args.config, data_dir=args.data_dir, listen=args.listen,
                          workers=args.workers, log_format=args.log_format,
                          log_level=args.log_level)
    except ConfigError as e:
        error("serve", e)
        return 2
    if os.path.exists(cfg.data_dir) and not os.path.isdir(cfg.data_dir):
        error("serve", f"--data-dir {cfg.data_dir} is not a directory")
        return 2
    socket_problem = unix_path(cfg.default_socket[5:])
    if socket_problem and not (cfg.listen or cfg.listeners):  # its socket would fail to bind, in gRPC's words
        error("serve", f"--data-dir {cfg.data_dir}: for its socket (sidecar.sock in it), {socket_problem};"
              " choose a shorter data dir, or --listen")
        return 2
    logs.setup(cfg.log_format, cfg.log_level, cfg.library_log_level)
    set_title(f"main (data {cfg.data_dir})")
    import uvloop
    return uvloop.run(_run(cfg))


async def _run(cfg) -> int:
    """The sidecar from its start to its stop; its exit status."""
    from ..errors import SidecarError
    from ..runtime import Sidecar, StoppedWhileStarting
    log = logging.getLogger("agent_sidecar")
    sidecar = Sidecar(cfg)
    sidecar.stop_on_signals(held_stop_signals())
    try:
        await sidecar.start()
    except StoppedWhileStarting:  # asked to: nothing was served, the last stop's marker stands
        log.info("start abandoned: stop requested before serving")
        await sidecar.stop()
        return 0
    except (RuntimeError, OSError, SidecarError) as e:  # e.g. another sidecar, a file that is no store, a full disk
        log.error("cannot start", extra={"error": str(e)})
        sidecar.exit_code = 1  # nothing was served: no final write, no marker
        await sidecar.stop()
        return 1
    await sidecar.run_until_stopped()
    return sidecar.exit_code
