"""A real spawned worker, driven over its real pipe: the edges of the
parent↔worker protocol that are hard to hit through gRPC timing."""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import time

from helpers.store import local_store

from agent_sidecar.config import Limits
from agent_sidecar.sessions import transcripts as tx
from agent_sidecar.turns import wire
from agent_sidecar.turns.wire import encode, open_stream, read_message
from agent_sidecar.turns.worker import worker_main

PROFILE = {"name": "main", "model": "echo", "model_options": {}, "tools": [], "max_iterations": 25}


def _run(msg_rid: str, text: str = "hi") -> dict:
    return wire.run(msg_rid, "agent:main:t:dm:1", "s1", 0, 1, [text], PROFILE, "x", [], 5)


async def _with_worker(tmp_path, body):
    db = str(tmp_path / "w.db")
    with local_store(db) as s:  # what the parent commits before a run: the incarnation and the user message
        s.job(lambda uow: uow.incarnations.insert("s1", "k", 0.0))
        s.job(tx.append, "s1", [tx.Message(role="user", content="still here")])
        spec = s.reader_spec()
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe(duplex=True)
    settings = {"reader": spec, "parent_pid": os.getpid(), "max_reply_chars": Limits().max_reply_chars}
    proc = ctx.Process(target=worker_main, args=(child, 0, settings), daemon=True)
    proc.start()
    child.close()
    reader, writer = await open_stream(parent.fileno())
    parent.close()
    try:
        hello = await asyncio.wait_for(read_message(reader), 30)
        assert hello["type"] == "hello" and hello["grpc_loaded"] is False
        await body(reader, writer)
    finally:
        writer.write(encode(wire.STOP))
        proc.join(10)
        if proc.is_alive():
            proc.kill()


async def _until_done(reader, rid: str) -> dict:
    while True:
        msg = await asyncio.wait_for(read_message(reader), 10)
        if msg["type"] == "done" and msg["request_id"] == rid:
            return msg


def test_cancel_arriving_with_its_run_still_reports_done(tmp_path):
    async def body(reader, writer):
        # One write: the worker reads both before its turn task ever runs.
        writer.write(encode(_run("r1")) + encode(wire.cancel("r1", "CANCELLED")))
        done = await _until_done(reader, "r1")
        assert done["ok"] is False and done["reason"] == "CANCELLED"
        # The worker goes on serving.
        writer.write(encode(_run("r2", "still here")))
        done = await _until_done(reader, "r2")
        assert done["ok"] is True and done["final_text"] == "still here"
    asyncio.run(_with_worker(tmp_path, body))


def test_steer_for_an_unknown_turn_is_refused(tmp_path):
    async def body(reader, writer):
        writer.write(encode(wire.steer("nope", "s", "x", time.monotonic() + 60)))
        msg = await asyncio.wait_for(read_message(reader), 10)
        assert msg == wire.steered("nope", "s", False)
    asyncio.run(_with_worker(tmp_path, body))


def test_a_steer_arriving_with_its_run_is_taken_in(tmp_path):
    """A steer the worker reads in the same read as its turn's run (the turn
    task created, not yet started) was refused as if the turn were past its
    last model call, and the prompt fell back to a follow-up, though no model
    call had been made. Now it is taken in: the first call sees it."""
    async def body(reader, writer):
        # One write: the worker reads both before its turn task ever runs.
        writer.write(encode(_run("r1", "first")) + encode(wire.steer("r1", "s1", "and second",
                                                                      time.monotonic() + 60)))
        answer = None
        while True:
            msg = await asyncio.wait_for(read_message(reader), 10)
            if msg["type"] == "steered":
                answer = msg
            elif msg["type"] == "done" and msg["request_id"] == "r1":
                break
        assert answer == wire.steered("r1", "s1", True)
        assert msg["ok"] is True and msg["final_text"] == "and second", msg  # the echo of the last user text
    asyncio.run(_with_worker(tmp_path, body))
