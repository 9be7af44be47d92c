"""A session operation waiting on its lane's turns when the store's writer
dies: a RewriteTranscript riding the frame bus (the lane's frames were still
on their way to the store: turns/lane_admin.py ``under_lease``), a
DeleteSession waiting for the ends of the turns it cancelled
(supervision.until_ended). The sidecar stops, and the call must end with a
status the API promises (UNAVAILABLE, STORE_UNAVAILABLE, retryable), as a job
written to the store directly does, not be cut by the server's stop with no
ErrorInfo."""

from __future__ import annotations

import os
import signal
import threading
import time

import grpc
import pytest
from helpers.config import slow_echo
from helpers.ids import source, words
from helpers.procs import children
from helpers.sessions import turns
from helpers.streams import start
from sidecar_proc import Sidecar, error_info

from agent_sidecar.v1 import session_service_pb2 as spb

OPERATIONS = {
    "rewrite": lambda stub, busy: stub.RewriteTranscript(spb.RewriteTranscriptRequest(
        session_id=busy.session_id, messages=turns("u", "a")), timeout=30),
    "delete": lambda stub, busy: stub.DeleteSession(spb.DeleteSessionRequest(session_key=busy.key), timeout=30),
}


@pytest.mark.parametrize("operation", sorted(OPERATIONS))
def test_an_operation_waiting_on_its_lane_when_the_writer_dies_ends_store_unavailable(tmp_path, operation):
    sc = Sidecar(tmp_path / "data", config=slow_echo("main", 100), workers=1).start()
    try:
        prompts, sessions = sc.prompts(), sc.sessions()
        busy = start(prompts, text=words(50, "busy"), src=source())
        busy.wait_for("text_delta")
        writer = children(sc)["sidecar-writer"]
        os.kill(writer, signal.SIGSTOP)  # the turn's next frames stay in flight
        time.sleep(0.3)
        answer: list = []

        def call_it() -> None:
            try:
                answer.append(OPERATIONS[operation](sessions, busy))
            except grpc.RpcError as e:
                answer.append(e)
        call = threading.Thread(target=call_it)
        call.start()
        time.sleep(0.5)  # it waits behind those frames
        os.kill(writer, signal.SIGKILL)
        call.join(40)
        assert answer and isinstance(answer[0], grpc.RpcError), answer
        err = answer[0]
        assert (err.code(), error_info(err)[0]) == (grpc.StatusCode.UNAVAILABLE, "STORE_UNAVAILABLE"), (
            err.code(), err.details())
    finally:
        sc.stop()
