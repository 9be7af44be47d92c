"""Give the memory of large requests back to the system once they are gone.

A request of many megabytes passes through gRPC's buffers and a Python bytes
object; once the call ends both are freed, but glibc's allocator keeps freed
memory for reuse, and the process's RSS stays at its peak. Two things undo that:

* ``return_large_blocks()``, once at startup: a block of ``LARGE_BYTES`` or more
  is mapped on its own and unmapped when freed. By default glibc raises that
  threshold to the size of every large block freed, so after the first large
  request the next ones land in the heap and its arenas, whose freed pages
  stay resident and fragmented;
* ``Trimmer``: ``malloc_trim(0)`` returns the free pages of every arena, of the
  smaller buffers a large request was read through. It walks the heap, so it
  runs in a thread, at most once per ``delay``, and only when ``after_large()``
  was called: by the API boundary after a large or refused request.

Elsewhere than glibc both do nothing.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging

log = logging.getLogger("agent_sidecar")

LARGE_BYTES = 1024 * 1024  # a request this large is worth a trim afterwards


M_MMAP_THRESHOLD = -3  # glibc's malloc.h


def _libc(name: str):
    try:
        return getattr(ctypes.CDLL(None), name)  # the C library this process runs on
    except (OSError, AttributeError):
        return None


def return_large_blocks() -> bool:
    """Map blocks of ``LARGE_BYTES`` or more on their own, for good (a fixed
    threshold also stops glibc from raising it). True where that took effect."""
    fn = _libc("mallopt")
    if fn is None:
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn(M_MMAP_THRESHOLD, LARGE_BYTES) == 1


def _malloc_trim():
    fn = _libc("malloc_trim")
    if fn is None:
        return None
    fn.argtypes = [ctypes.c_size_t]
    fn.restype = ctypes.c_int
    return fn


class Trimmer:
    """Trims ``delay`` after the last of a burst of asks, so that what the
    burst freed is given back in one trim, not only what its first call freed."""

    def __init__(self, delay: float = 1.0):
        self.delay = delay
        self._trim = _malloc_trim()
        self._last = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._task: asyncio.Task | None = None  # held: the loop keeps only a weak reference

    def after_large(self) -> None:
        """Ask for a trim once no ask came for ``delay``. Call on the event loop."""
        if self._trim is None:
            return
        loop = asyncio.get_running_loop()
        self._last = loop.time()
        if self._timer is None:
            self._timer = loop.call_later(self.delay, self._due)

    def _due(self) -> None:
        loop = asyncio.get_running_loop()
        wait = self._last + self.delay - loop.time()
        if wait > 0 or (self._task is not None and not self._task.done()):
            self._timer = loop.call_later(max(wait, self.delay / 10), self._due)
            return
        self._timer = None
        self._task = loop.create_task(self._run())

    async def _run(self) -> None:
        try:
            await asyncio.to_thread(self._trim, 0)
        except Exception:  # a missed trim costs memory, never a call
            log.exception("malloc_trim failed")
