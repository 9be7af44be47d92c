"""RequestBudget: how many bytes of large requests the parent holds at once.

Every request is bounded on its own (``limits.max_request_bytes`` and each
RPC's field caps, api/caps.py), but not their sum. A large request is held
several times over while it is handled: gRPC's buffer, the bytes object, the
parsed message, its Python strings, the job pickled for the store writer and
the writer's copy. So a burst of large requests at once (an adapter
importing many long transcripts in parallel, or a hostile client) grows the
parent and the writer by a multiple of the burst, past what a small host
has, although each request is within its limits.

So a request of ``LARGE_BYTES`` or more takes its size from the budget
before it is parsed, and gives it back once its call has answered: a unary
call's answer, a stream's first message (a Prompt's first frame comes after
its accept, and from then on turns/admission.py counts its text and
attachments), or the call's end, however it ends (``Held`` also gives back
when it is dropped). While the requests held reach
``limits.max_request_bytes_in_flight``, another large one is refused
unparsed: RESOURCE_EXHAUSTED, reason OVERLOADED, with RetryInfo; nothing of
it was read into the store, so a retry is safe. As in turns/admission.py, the
cap is checked before a request is added, not with it: one large request is
admitted whenever none is held, so no request within ``max_request_bytes``
is refused on an idle sidecar. Small requests are not counted: their number
is bounded by what they ask for (prompts by admission, the rest answer at
once).
"""

from __future__ import annotations

from .. import errors as E
from ..heap import LARGE_BYTES
from ..turns.admission import RETRY_AFTER_S


class Held:
    """One large request's share of the budget, given back once (``release``),
    at the latest when the object is dropped: a call cancelled between its
    parse and its handler never reaches the handler's ``finally``."""

    __slots__ = ("_budget", "nbytes")

    def __init__(self, budget: RequestBudget, nbytes: int):
        self._budget, self.nbytes = budget, nbytes

    def release(self) -> None:
        if self.nbytes:
            self._budget.held -= self.nbytes
            self.nbytes = 0

    __del__ = release


class RequestBudget:
    """``cap`` bytes (0: no cap) for the large requests being handled; ``held``
    is what they hold now (the metrics endpoint shows it). Used on the event
    loop only, where gRPC parses and calls the handlers."""

    def __init__(self, cap: int):
        self.cap = cap
        self.held = 0

    def take(self, nbytes: int) -> Held | None:
        """The share of a request of ``nbytes``: None for a small one; a
        SidecarError OVERLOADED while the held bytes are at the cap."""
        if nbytes < LARGE_BYTES:
            return None
        if self.cap and self.held >= self.cap:
            raise E.SidecarError(
                E.OVERLOADED, f"the sidecar is already handling {self.held} bytes of large requests"
                f" (limits.max_request_bytes_in_flight = {self.cap}); retry later",
                retry_after_s=RETRY_AFTER_S)
        self.held += nbytes
        return Held(self, nbytes)
