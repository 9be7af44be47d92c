"""Which local processes hold a server's sockets: the one listening on a
target (to find a local sidecar's process tree from the address the bench
dials), and those serving the connections the server itself opened (its
PostgreSQL backends, so the bench counts their CPU as theirs and not as
"others", everything else on the machine).

The connections a server opened: every socket of its process tree whose
other end is a listening service on this host (the tree dialled it) is
followed to that end, and the processes holding the other end are the
peers. The ends are the kernel's own accounts: for TCP, /proc/net/tcp and
tcp6 (an established connection's two sockets are each other's local and
remote address, and the service's side has its listening port); for a Unix
socket, the peer inode the kernel's sock_diag netlink interface gives (``ss
-x`` reads the same), the service's side carrying its listening socket's
path in /proc/net/unix, the dialling side none. So the connections the
bench or an adapter opened to the sidecar (the sidecar holds the listening
side), and the sidecar's socket pairs to its workers (neither side has a
path), are not followed: a PostgreSQL backend serves exactly one sidecar
connection, and is found whether the DSN names a Unix socket directory or a
TCP address.

Like the rest of the /proc accounting (procs.py), everything here degrades
to "none found" where it cannot read (another user's processes, no
netlink): the database's CPU then stays in "others", as before.
"""

from __future__ import annotations

import os
import socket
import struct
from collections.abc import Collection

from .. import targets
from .procs import exists, parent_pid, proc_comm, proc_name, read_proc

_ESTABLISHED, _LISTEN = "01", "0A"  # /proc/net/tcp states
_SO_ACCEPTCON = 0x10000  # /proc/net/unix flags: a listening socket
_NETLINK_SOCK_DIAG, _SOCK_DIAG_BY_FAMILY = 4, 20
_NLM_F_REQUEST, _NLM_F_DUMP, _NLMSG_ERROR, _NLMSG_DONE = 0x1, 0x300, 2, 3
_UDIAG_SHOW_PEER, _UNIX_DIAG_PEER = 0x4, 2


def peers_of(tree: list[int], exclude: Collection[int] = (), among: Collection[int] | None = None
             ) -> list[tuple[str, int]]:
    """``(name, pid)`` of every process on this host (or of ``among``), not
    in ``tree`` nor ``exclude``, that holds the far end of a connection a
    process of ``tree`` opened (its ``comm``: ``postgres`` for a backend);
    by pid. Looking ``among`` a few processes (a database server's
    children) is cheap; looking everywhere reads every process's fds."""
    mine = _socket_inodes(tree)
    if not mine:
        return []
    far = _tcp_far_ends(mine) | _unix_far_ends(mine)
    holders = socket_holders(far, among) if far else set()
    return sorted(((proc_comm(pid), pid) for pid in holders - set(tree) - set(exclude)), key=lambda x: x[1])


def _socket_inodes(pids: list[int]) -> set[str]:
    """The inodes of every socket the processes hold (their fds)."""
    found = set()
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:["):
                found.add(link[len("socket:["):-1])
    return found


def _tcp_far_ends(mine: set[str]) -> set[str]:
    """The inodes of the service side of each established TCP connection
    one of ``mine`` dialled: its remote end, at a port that listens here."""
    rows = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in (read_proc(table) or "").splitlines()[1:]:
            parts = line.split()
            if len(parts) > 9:
                rows.append((parts[1], parts[2], parts[3], parts[9]))  # local, remote, state, inode
    listening = {local.rsplit(":", 1)[1] for local, _, state, _ in rows if state == _LISTEN}
    by_ends = {(local, remote): inode for local, remote, state, inode in rows if state == _ESTABLISHED}
    far = set()
    for local, remote, state, inode in rows:
        if inode in mine and state == _ESTABLISHED and remote.rsplit(":", 1)[1] in listening:
            other = by_ends.get((remote, local))
            if other is not None and other not in mine:
                far.add(other)
    return far


def _unix_far_ends(mine: set[str]) -> set[str]:
    """The inodes of the service side of each Unix socket connection one of
    ``mine`` dialled: ours has no path, its peer has the listener's."""
    paths = {}
    for line in (read_proc("/proc/net/unix") or "").splitlines()[1:]:
        parts = line.split()
        if len(parts) >= 7:
            paths[parts[6]] = len(parts) >= 8
    far = set()
    for inode, peer in _unix_peers().items():
        if inode in mine and not paths.get(inode, True) and paths.get(peer) and peer not in mine:
            far.add(peer)
    return far


def _unix_peers() -> dict[str, str]:
    """inode -> its peer's inode, for every connected Unix socket this user
    may see (sock_diag's dump); {} when netlink cannot be used."""
    request = struct.pack("=BBHIIIII", socket.AF_UNIX, 0, 0, 0xFFFFFFFF, 0, _UDIAG_SHOW_PEER, 0xFFFFFFFF, 0xFFFFFFFF)
    header = struct.pack("=IHHII", 16 + len(request), _SOCK_DIAG_BY_FAMILY, _NLM_F_REQUEST | _NLM_F_DUMP, 1, 0)
    peers: dict[str, str] = {}
    try:
        with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, _NETLINK_SOCK_DIAG) as nl:
            nl.settimeout(2.0)
            nl.send(header + request)
            while True:
                data = nl.recv(1 << 16)
                if not data or not _parse(data, peers):
                    return peers
    except OSError:  # no netlink here (a sandbox), or it timed out: no peers known
        return {}


def _parse(data: bytes, peers: dict[str, str]) -> bool:
    """Add one recv's messages to ``peers``; False at the dump's end."""
    at = 0
    while at + 16 <= len(data):
        length, kind = struct.unpack_from("=IH", data, at)
        if kind in (_NLMSG_DONE, _NLMSG_ERROR) or length < 16:
            return False
        inode = struct.unpack_from("=I", data, at + 20)[0]  # unix_diag_msg: family, type, state, pad, ino
        attr = at + 16 + 16
        while attr + 4 <= at + length:
            size, kind = struct.unpack_from("=HH", data, attr)
            if kind == _UNIX_DIAG_PEER and size >= 8:
                peers[str(inode)] = str(struct.unpack_from("=I", data, attr + 4)[0])
            if size < 4:
                break
            attr += (size + 3) & ~3
        at += (length + 3) & ~3
    return True


# -- which local process listens on a target -------------------------------------------

def listening_pid(target: str) -> int | None:
    """The pid of the local process listening on a gRPC target
    (``unix:PATH``, ``unix:///PATH``, ``HOST:PORT`` on a local address), the
    topmost one when a process and its children share the socket; None when
    the listener is remote, another user's, or not found."""
    inodes = _listening_inodes(target)
    if not inodes:
        return None
    holders = socket_holders(inodes)
    top = [pid for pid in holders if parent_pid(pid) not in holders]
    return min(top) if top else None


def pid_problem(pid: int, target: str) -> str | None:
    """Why ``pid`` is not the sidecar at ``target`` (None: it is, or /proc
    cannot tell). It is when it holds the target's listening socket, or is
    the parent of the process that does and runs agent-sidecar (a wrapper:
    tini, a shell, prlimit); when the listener is not found here (another
    user's, or another host's), when its command line is agent-sidecar's.
    Not any ancestor: pid 1 has every process below it."""
    if not exists(pid):
        return None  # the run says so (run._Run.setup)
    name = proc_name(pid)
    runs_sidecar = "agent-sidecar" in name or "agent_sidecar" in name
    inodes = _listening_inodes(target)
    holders = socket_holders(inodes) if inodes else set()
    if pid in holders or (runs_sidecar and any(parent_pid(h) == pid for h in holders)):
        return None
    if not holders and runs_sidecar:
        return None
    what = f"process {pid} ({name[:60] or proc_comm(pid)})"
    if holders:
        return f"{what} does not listen on {target} (process {min(holders)} does)"
    return f"{what} is not an agent-sidecar process"


def unix_path(target: str) -> str | None:
    """The absolute socket path of a ``unix:PATH`` target (targets.address's form), else None."""
    return os.path.abspath(target[len("unix:"):]) if target.startswith("unix:") else None


def _listening_inodes(target: str) -> set[str]:
    """The inodes of the sockets listening where ``target`` connects, read
    as every command reads a target (targets.address: a bare socket path is
    ``unix:``, ``tcp:`` and ``dns:[//AUTHORITY/]`` forms are HOST:PORT);
    read any other way, those were "not on this host", and a local sidecar
    got no CPU figures."""
    target = targets.address(target)
    path = unix_path(target)
    if path is not None:
        data = read_proc("/proc/net/unix") or ""
        found = set()
        for line in data.splitlines()[1:]:
            parts = line.split()
            # the path as bound: `unix:///p` binds "///p", which is /p
            if len(parts) >= 8 and os.path.normpath(parts[7]) == path and int(parts[3], 16) & _SO_ACCEPTCON:
                found.add(parts[6])
        return found
    host, _, port = target.rpartition(":")
    host = host.strip("[]")
    if not port.isdigit() or not _is_local(host):
        return set()
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in (read_proc(table) or "").splitlines()[1:]:
            parts = line.split()
            if len(parts) > 9 and parts[3] == _LISTEN and int(parts[1].rsplit(":", 1)[1], 16) == int(port):
                found.add(parts[9])
    return found


def _is_local(host: str) -> bool:
    """Whether ``host`` is this machine: a loopback or wildcard name, or an
    address this host can bind (any of its own, not only the one its name
    resolves to: a target at the host's LAN address is local too)."""
    if host in ("", "localhost", "0.0.0.0", "::", "::1") or host.startswith("127."):
        return True
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return False
    for family, _, _, _, address in infos:
        try:
            with socket.socket(family, socket.SOCK_STREAM) as probe:
                probe.bind((address[0], 0, *address[2:]))  # port 0: nothing is taken from anyone
            return True
        except OSError:  # EADDRNOTAVAIL: another host's address
            continue
    return False


def socket_holders(inodes: set[str], among: Collection[int] | None = None) -> set[int]:
    """The processes (of ``among``, else every one this user may read) that
    hold a socket of ``inodes``."""
    wanted = {f"socket:[{i}]" for i in inodes}
    holders = set()
    for entry in os.listdir("/proc") if among is None else map(str, among):
        if not entry.isdigit():
            continue
        try:
            fds = os.listdir(f"/proc/{entry}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{entry}/fd/{fd}") in wanted:
                    holders.add(int(entry))
                    break
            except OSError:
                continue
    return holders
