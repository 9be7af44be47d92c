"""The sessions of a bench run: made for it at the start, deleted at its end.

A run makes its own sessions (``--sessions``, platform ``--platform``, chat
ids of the run's id), and each holds the transcript of every turn the bench
sent it. Left behind, they piled up in the target's store run after run
(hundreds of sessions and their messages per sweep, in ``sessions list``,
in the store's size, in its backups), in a sidecar that may be production's.
So the run deletes them when it ends, however it ends (a finished sweep,
Ctrl-C, a target lost mid-run, a calibration that failed): ``--keep-sessions``
keeps them, to read their transcripts or count their turns afterwards.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .target import BenchError, Target, TargetLost, check_answers

if TYPE_CHECKING:  # the client is the bench extra's: imported where used
    from agent_sidecar_client import SidecarClient

PARALLEL = 32  # calls at a time: enough to hide a round trip, few enough not to queue up in the sidecar
PROGRESS_EVERY_S = 0.5  # how often the deletion's progress is reported (the live line redraws it)


async def create(client: SidecarClient, platform: str, profile: str | None, n: int, prefix: str,
                 where: str, made: list[str] | None = None) -> list[str]:
    """``n`` fresh sessions (GetOrCreateSession with chat ids ``<prefix>-<i>``),
    PARALLEL calls at a time; their keys in order. BenchError (one line)
    when ``where`` refuses. Each key is also added to ``made`` as soon as
    its session exists, so a run that fails part way still knows (and
    deletes) the sessions it made."""
    from agent_sidecar_client import SidecarError
    sem = asyncio.Semaphore(PARALLEL)

    async def one(i: int) -> str:
        async with sem:
            session = await client.get_or_create_session(
                {"platform": platform, "chat_type": "dm", "chat_id": f"{prefix}-{i}", "user_id": f"{prefix}-u{i}"},
                profile=profile)
            if made is not None:
                made.append(session.session_key)
            return session.session_key

    keys = await asyncio.gather(*(one(i) for i in range(n)), return_exceptions=True)  # all in ``made`` first
    for key in keys:
        if isinstance(key, SidecarError):
            raise BenchError(f"cannot create sessions on {where}: {key}") from None
        if isinstance(key, BaseException):
            raise key
    return [key for key in keys if isinstance(key, str)]


async def delete(targets: list[tuple[Target, SidecarClient, list[str]]],
                 status: Callable[[str], None], stopped_by: Callable[[], str]) -> dict[str, Any]:
    """Delete every target's sessions (DeleteSession, PARALLEL at a time),
    reporting progress through ``status``; what became of them, for the
    run's document: ``deleted``, ``left`` (not deleted) and why (``error``:
    the first failure; a target that does not answer within its connect
    timeout is not asked at all, where every call would wait out its own
    timeout). A session already gone counts as deleted. Never raises for
    the sidecar's sake: the run's figures are worth more than its
    tidying. Cancelled (SIGTERM, or a signal during the deletion), it stops
    and says so, ``signal`` naming it (``stopped_by()``): the report still
    follows, and the command exits as that signal says (130, 143), not 0
    as a run that ended by itself."""
    total = sum(len(keys) for _, _, keys in targets)
    done, errors = [0], []
    last = [0.0]

    def tick() -> None:
        if time.monotonic() - last[0] >= PROGRESS_EVERY_S:
            last[0] = time.monotonic()
            status(f"deleting the run's sessions: {done[0]:,}/{total:,}")

    tick()
    try:
        for target, client, keys in targets:
            error = await _delete_on(target, client, keys, done, tick)
            if error:
                errors.append(error)
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if task is not None:
            task.uncancel()
        by = stopped_by()
        return {"deleted": done[0], "left": total - done[0], "error": f"stopped by {by}", "signal": by}
    return {"deleted": done[0], "left": total - done[0], "error": errors[0] if errors else None}


async def _delete_on(target: Target, client: SidecarClient, keys: list[str], done: list[int],
                     tick: Callable[[], None]) -> str | None:
    """Delete ``keys`` through ``client``; the first failure (its sessions
    after it are left: the others in flight end first), or None."""
    from agent_sidecar_client import SidecarError
    try:
        await check_answers(target, client)
    except TargetLost as e:
        return str(e)
    sem = asyncio.Semaphore(PARALLEL)
    failed: list[str] = []

    async def one(key: str) -> None:
        async with sem:
            if failed:
                return
            try:
                await client.delete_session(key)
            except SidecarError as e:
                failed.append(f"{target.address}: {e}")
                return
            done[0] += 1
            tick()

    await asyncio.gather(*(one(key) for key in keys))
    return failed[0] if failed else None
