"""systemd's readiness protocol (sd_notify(3)) with the standard library only.

Under a ``Type=notify`` unit systemd sets ``NOTIFY_SOCKET``; the sidecar sends
``READY=1`` once the startup restore is done and the server answers (so units
ordered after it, and ``systemctl start`` itself, wait for a sidecar that can
serve), and ``STOPPING=1`` when a graceful stop begins. Without the variable
nothing is sent. A failure to notify is logged, never fatal: readiness is a
courtesy to the supervisor, not a reason to stop serving.
"""

from __future__ import annotations

import logging
import os
import socket

log = logging.getLogger("agent_sidecar")


def notify(state: str) -> bool:
    """Send ``state`` (e.g. ``"READY=1"``) to ``$NOTIFY_SOCKET``; True if sent.

    The address is a filesystem path or, starting with ``@``, a Linux
    abstract-namespace name (systemd uses both)."""
    address = os.environ.get("NOTIFY_SOCKET", "")
    if not address:
        return False
    if address.startswith("@"):
        address = "\0" + address[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(address)
            sock.sendall(state.encode())
        return True
    except OSError as e:
        log.warning("sd_notify failed", extra={"notify_socket": os.environ.get("NOTIFY_SOCKET"),
                                               "error": str(e)})
        return False
