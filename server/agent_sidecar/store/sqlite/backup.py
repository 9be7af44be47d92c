"""An online backup of an SQLite store (``agent-sidecar backup``), sidecar
running or not.

Copying ``sidecar.db`` with ``cp`` is no backup: in WAL mode the commits since
the last checkpoint are in ``sidecar.db-wal``, so the copy lacks acknowledged
turns (or is torn, when a checkpoint writes the file while it is read). This
copies the store through SQLite's backup API in one step, inside one read
transaction: the copy is the store as of one commit, WAL included, while the
writer goes on committing (in WAL mode a reader never blocks it). The copy is
written next to the destination as ``FILE.partial`` (mode 0600: it holds every
conversation), checked (``PRAGMA quick_check``), fsynced and renamed into
place, so ``FILE`` is either a whole, checked store or absent. It is a
self-contained file (rollback journal mode; the sidecar turns WAL back on when
it opens it) and never migrated: it is the schema version of the store it
copies.
"""

from __future__ import annotations

import os

import apsw

from ..statements import one
from .connection import BUSY_TIMEOUT_MS


class BackupError(RuntimeError):
    """The backup could not be made; nothing was left at the destination."""


def backup(db_path: str, dest: str) -> dict[str, int]:
    """Copy the store at ``db_path`` to ``dest`` (which must not exist);
    returns what the copy holds (sessions, messages, frames, bytes)."""
    if not os.path.isfile(db_path):
        raise BackupError(f"no store at {db_path}")
    if not dest or dest.endswith(os.sep):
        raise BackupError(f"{dest!r} names no file: give the copy's file name")
    if os.path.lexists(dest):
        raise BackupError(f"{dest} exists; give a new file name")
    partial = dest + ".partial"
    try:
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    except OSError as e:
        raise BackupError(f"cannot write {partial}: {e.strerror}") from None
    os.fchmod(fd, 0o600)  # a stale .partial of another mode is reused with this one
    os.close(fd)
    renamed = False
    try:
        counts = _copy(db_path, partial)
        _fsync(partial)
        os.rename(partial, dest)
        renamed = True
        _fsync(os.path.dirname(os.path.abspath(dest)))
    except BaseException as e:
        _unlink(dest if renamed else partial)  # nothing left at FILE: a copy whose rename is not durable
        if isinstance(e, OSError):  # an fsync's EIO, a rename refused: the command's one line, exit 1
            raise BackupError(f"cannot write {dest}: {e.strerror or e}") from None
        raise
    counts["bytes"] = os.path.getsize(dest)
    return counts


def _copy(db_path: str, partial: str) -> dict[str, int]:
    try:
        src = apsw.Connection(db_path, flags=apsw.SQLITE_OPEN_READWRITE)
    except apsw.Error as e:
        raise BackupError(f"cannot open {db_path}: {e}") from None
    try:
        src.setbusytimeout(BUSY_TIMEOUT_MS)
        dst = apsw.Connection(partial)
        try:
            with dst.backup("main", src, "main") as b:
                b.step(-1)  # every page in one step: one read transaction, one commit's state
            dst.execute("PRAGMA journal_mode=DELETE")
            check = [r[0] for r in dst.execute("PRAGMA quick_check")]
            if check != ["ok"]:
                raise BackupError(f"the copy fails its check: {'; '.join(check[:5])}")
            return {t: one(dst.execute(f"SELECT count(*) FROM {t}").fetchone())[0]
                    for t in ("routing", "messages", "frames")}
        except apsw.Error as e:
            raise BackupError(f"cannot copy {db_path}: {e}") from None
        finally:
            dst.close()
    finally:
        src.close()


def _fsync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
