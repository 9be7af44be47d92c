"""The sidecar's own process limits, raised where the system lets it.

Open files: every client connection is a file descriptor, and so are the
store's files, the children's pipes and gRPC's own. A service manager often
starts a process with a soft limit of 1024 and a much higher hard limit
(systemd's default is 1024:524288), leaving it to the program to ask for
more. At the soft limit gRPC stops accepting connections ("File descriptor
limit reached. Retrying.") while everything else still runs, so a burst of
adapters, or one client that opens connections and never closes them, makes
the sidecar unreachable for everyone else. Raising the soft limit to the hard
one at startup (as Go's runtime does for every program) moves that point as
far as the operator allows. The hard limit itself is the operator's: never
touched.
"""

from __future__ import annotations

try:
    import resource
except ImportError:  # not a POSIX system: nothing to raise
    resource = None  # type: ignore[assignment]


def raise_open_files() -> tuple[int, int] | None:
    """Raise the soft RLIMIT_NOFILE to the hard one; (before, after), or None
    when there is no such limit here or it cannot be changed."""
    if resource is None:
        return None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft == hard:
        return soft, soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ValueError, OSError):
        return soft, soft
    return soft, hard
