"""A STEER waiting for its host's worker when the store's writer dies: the
sidecar stops (it can acknowledge nothing more), and the STEER's call must end
with a status the API promises (UNAVAILABLE, STORE_UNAVAILABLE, retryable),
not be cut by the server's stop as CANCELLED with no ErrorInfo, which an
adapter takes for its own cancel (the soak saw it)."""

from __future__ import annotations

import os
import signal

import grpc
from helpers.config import scripted, table
from helpers.ids import source, words
from helpers.procs import children, worker_pid
from helpers.streams import D, PromptRun, start
from helpers.waiting import wait_until
from sidecar_proc import Sidecar

CONFIG = (scripted("longhost", [{"text": words(10), "token_latency_ms": 100}, {"echo_input": True}])
          + table("agent", steer_timeout_s=600))  # the steer waits for its answer as long as it takes


def test_a_steer_waiting_for_its_worker_when_the_writer_dies_ends_unavailable(tmp_path):
    sc = Sidecar(tmp_path / "data", config=CONFIG, workers=1).start()
    stopped = None
    try:
        prompts = sc.prompts()
        host = start(prompts, text="go", src=source(), profile="longhost")
        host.wait_for("text_delta")
        stopped = worker_pid(sc, 0)
        os.kill(stopped, signal.SIGSTOP)  # the steer cannot be answered
        admitted = sc.status().prompts_admitted
        steer = PromptRun(prompts, text="steered", key=host.key, delivery=D.DELIVERY_MODE_STEER)
        wait_until(lambda: sc.status().prompts_admitted > admitted, timeout=15, what="the steer to be asked")
        os.kill(children(sc)["sidecar-writer"], signal.SIGKILL)
        steer.result(30)
        assert steer.code == grpc.StatusCode.UNAVAILABLE, (steer.code, steer.reason, steer.details)
        assert steer.reason == "STORE_UNAVAILABLE", (steer.code, steer.reason, steer.details)
    finally:
        if stopped is not None:
            try:
                os.kill(stopped, signal.SIGCONT)
            except ProcessLookupError:
                pass
        sc.stop()
