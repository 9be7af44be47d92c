"""A real full filesystem: a small tmpfs that fills up and frees on demand."""

from __future__ import annotations

import errno
import subprocess

import pytest


class SmallDisk:
    """A tmpfs of ``size_mb`` at ``path``; ``fill()`` takes every free byte
    with one file, ``free()`` deletes it."""

    def __init__(self, path, size_mb: int):
        self.path = path
        self.filler = path / "filler"
        path.mkdir(parents=True, exist_ok=True)
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mb}m,mode=0755", "tmpfs",
                            str(path)], capture_output=True, text=True)
        if r.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs for the full-disk tests (needs root or "
                        f"CAP_SYS_ADMIN): {r.stderr.strip()}")

    def fill(self, leave: int = 0) -> None:
        """Take every free byte, then give ``leave`` bytes back."""
        with open(self.filler, "ab", buffering=0) as f:
            for chunk in (1 << 20, 1 << 12):
                block = b"\0" * chunk
                while True:
                    try:
                        f.write(block)
                    except OSError as e:
                        assert e.errno == errno.ENOSPC, e
                        break
            if leave:
                f.truncate(max(f.tell() - leave, 0))

    def free(self) -> None:
        self.filler.unlink(missing_ok=True)

    def unmount(self) -> None:
        subprocess.run(["umount", "-l", str(self.path)], capture_output=True)
