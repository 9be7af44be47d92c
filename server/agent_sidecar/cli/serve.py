"""``agent-sidecar serve``: load config, start the sidecar on uvloop, run until
SIGTERM/SIGINT/SIGHUP, stop cleanly."""

from __future__ import annotations

import logging
import os
import sys

from .. import logs
from ..children import set_title
from ..config import ConfigError, load_config
from ..config_checks import unix_path
from ..errors import SidecarError


def serve(args) -> int:
    try:
        cfg = load_config(args.config, data_dir=args.data_dir, listen=args.listen,
                          workers=args.workers, log_format=args.log_format,
                          log_level=args.log_level)
    except ConfigError as e:
        print(e, file=sys.stderr)
        return 2
    if os.path.exists(cfg.data_dir) and not os.path.isdir(cfg.data_dir):
        print(f"agent-sidecar: --data-dir {cfg.data_dir} is not a directory", file=sys.stderr)
        return 2
    socket_problem = unix_path(cfg.default_socket[5:])
    if socket_problem and not (cfg.listen or cfg.listeners):  # its socket would fail to bind, in gRPC's words
        print(f"agent-sidecar: --data-dir {cfg.data_dir}: for its socket (sidecar.sock in it), {socket_problem};"
              " choose a shorter data dir, or --listen", file=sys.stderr)
        return 2
    logs.setup(cfg.log_format, cfg.log_level, cfg.library_log_level)
    set_title(f"main (data {cfg.data_dir})")
    import uvloop

    from ..runtime import Sidecar, StoppedWhileStarting

    async def main() -> int:
        sidecar = Sidecar(cfg)
        sidecar.stop_on_signals()
        try:
            await sidecar.start()
        except StoppedWhileStarting:  # asked to: nothing was served, the last stop's marker stands
            logging.getLogger("agent_sidecar").info("start abandoned: stop requested before serving")
            await sidecar.stop()
            return 0
        except (RuntimeError, OSError, SidecarError) as e:  # e.g. another sidecar, a file that is no store, a full disk
            logging.getLogger("agent_sidecar").error("cannot start", extra={"error": str(e)})
            sidecar.exit_code = 1  # nothing was served: no final write, no marker
            await sidecar.stop()
            return 1
        await sidecar.run_until_stopped()
        return sidecar.exit_code

    return uvloop.run(main())
