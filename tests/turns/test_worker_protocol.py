"""A real spawned worker, driven over its real pipe: the edges of the
parent↔worker protocol that are hard to hit through gRPC timing."""

from __future__ import annotations

import asyncio
import os
import multiprocessing as mp

from agent_sidecar.sessions import transcripts as tx
from agent_sidecar.turns.wire import encode, open_stream, read_message
from agent_sidecar.turns.worker import worker_main
from helpers.store import local_store

PROFILE = {"name": "main", "model": "echo", "model_options": {}, "tools": [], "max_iterations": 25}


def _run(msg_rid: str, text: str = "hi") -> dict:
    return {"t": "run", "rid": msg_rid, "key": "agent:main:t:dm:1", "sid": "s1", "rev": 0,
            "base_seq": 1, "texts": [text], "profile": PROFILE, "system_prompt": "x", "tools": [],
            "timeout_s": 5}


async def _with_worker(tmp_path, body):
    db = str(tmp_path / "w.db")
    with local_store(db) as s:  # what the parent commits before a run: the incarnation and the user message
        s.job(lambda uow: uow.incarnations.insert("s1", "k", 0.0))
        s.job(tx.append, "s1", [tx.Message(role="user", content="still here")])
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe(duplex=True)
    proc = ctx.Process(target=worker_main, args=(child, 0, {"reader": ("agent_sidecar.store.sqlite.reader:open_reader", (db,)),
                                                                 "parent_pid": os.getpid()}), daemon=True)
    proc.start()
    child.close()
    reader, writer = await open_stream(parent.fileno())
    parent.close()
    try:
        hello = await asyncio.wait_for(read_message(reader), 30)
        assert hello["t"] == "hello" and hello["grpc_loaded"] is False
        await body(reader, writer)
    finally:
        writer.write(encode({"t": "stop"}))
        proc.join(10)
        if proc.is_alive():
            proc.kill()


async def _until_done(reader, rid: str) -> dict:
    while True:
        msg = await asyncio.wait_for(read_message(reader), 10)
        if msg["t"] == "done" and msg["rid"] == rid:
            return msg


def test_cancel_arriving_with_its_run_still_reports_done(tmp_path):
    async def body(reader, writer):
        # One write: the worker reads both before its turn task ever runs.
        writer.write(encode(_run("r1")) + encode({"t": "cancel", "rid": "r1", "reason": "CANCELLED"}))
        done = await _until_done(reader, "r1")
        assert done["ok"] is False and done["reason"] == "CANCELLED"
        # The worker goes on serving.
        writer.write(encode(_run("r2", "still here")))
        done = await _until_done(reader, "r2")
        assert done["ok"] is True and done["final_text"] == "still here"
    asyncio.run(_with_worker(tmp_path, body))


def test_steer_for_an_unknown_turn_is_refused(tmp_path):
    async def body(reader, writer):
        writer.write(encode({"t": "steer", "rid": "nope", "steer_rid": "s", "text": "x"}))
        msg = await asyncio.wait_for(read_message(reader), 10)
        assert msg == {"t": "steered", "rid": "nope", "steer_rid": "s", "ok": False}
    asyncio.run(_with_worker(tmp_path, body))
