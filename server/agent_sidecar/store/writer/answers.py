"""A commit group's answer as it travels to the parent (client.py), and
errors that cannot travel as they are.

The parent learns whether a job committed only from this answer, so it must
always arrive and always be readable: a result that would not pickle, or
would pickle but not unpickle there (an exception whose class takes other
arguments than it keeps), must not turn a committed job's answer into a
failure, nor make the whole message unreadable (every job of the group would
then wait for ever). Jobs return plain records; what may not travel is an
exception, a failed job's or one inside a result (a frame flush's failed
writes, turns/flush.py), so those are checked, and one that cannot travel is
sent as ``JobError``, naming its type and saying its text.
"""

from __future__ import annotations

import pickle
from typing import Any


class JobError(Exception):
    """An error of a job in the writer process that could not be sent to the
    parent as it was: its type's name and its text."""


def sendable(e: BaseException) -> BaseException:
    """``e``, or a JobError in its words if it would not arrive whole."""
    try:
        pickle.loads(pickle.dumps(e, protocol=pickle.HIGHEST_PROTOCOL))
        return e
    except Exception as why:
        return JobError(f"{type(e).__name__}: {e} (it could not be sent from the store's writer: {why!r})")


def _checked(value: Any) -> Any:
    """``value`` with every exception in it (itself, or in its lists and
    tuples) sendable; the same object when nothing had to change."""
    if isinstance(value, BaseException):
        return sendable(value)
    if type(value) in (list, tuple):
        items = [_checked(v) for v in value]
        if any(a is not b for a, b in zip(items, value)):
            return type(value)(items)
    return value


def _errors_in(value: Any) -> bool:
    if isinstance(value, BaseException):
        return True
    return type(value) in (list, tuple) and any(_errors_in(v) for v in value)


def _apart(value: Any) -> Any:
    """``value`` with each part that will not pickle replaced: an exception
    by ``sendable``'s JobError, a list's or tuple's item part by part,
    anything else by a JobError saying it could not be sent."""
    try:
        pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
        return value
    except Exception as e:
        if isinstance(value, BaseException):
            return sendable(value)
        if type(value) in (list, tuple):
            return type(value)([_apart(v) for v in value])
        return JobError(f"a store job's result could not be sent from the store's writer: {e!r} ({value!r:.200})")


def encode_results(results: list[tuple[int, bool, Any]], seconds: float) -> bytes:
    """One group's answer: ``(seconds the group took to run and commit, results)``;
    the parent's metrics take the time (store/writer/client.py). Each result
    keeps its ``ok`` (a job that committed is answered committed), unless
    nothing of its result can be sent: then it fails with a JobError that
    says it committed."""
    if any(_errors_in(v) for _, _, v in results):
        results = [(jid, ok, _checked(v)) for jid, ok, v in results]
    try:
        return pickle.dumps((seconds, results), protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:
        safe = []
        for jid, ok, value in results:
            sent = _apart(value)
            if ok and sent is not value and isinstance(sent, JobError) and not isinstance(value, BaseException):
                ok, sent = False, JobError(f"the store job committed, but {sent}")
            safe.append((jid, ok, sent))
        return pickle.dumps((seconds, safe), protocol=pickle.HIGHEST_PROTOCOL)
