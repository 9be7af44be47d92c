#!/usr/bin/env python3
"""cluster_bench.py's client process: ``--in-flight`` Prompt calls kept going
over the nodes (grpc.aio on uvloop, one channel per node), each on a random
session with no turn in flight, sent to the next node in turn (or, with
``affinity``, always to the session's own node); a warm-up turn per session,
then, after the driver's "go", the timed turns. Run by the driver as
``python _cluster_client.py SPEC_JSON``; its result goes to ``spec["out"]``."""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time
from pathlib import Path

from _common import keep_in_flight
from turns_bench import DELIVERY_QUEUE, KINDS, TEXT


class Client:
    def __init__(self, spec: dict):
        self.spec, self.n = spec, len(spec["targets"])
        self.rng = random.Random(spec["seed"])
        self.home = {k: i % self.n for i, k in enumerate(spec["keys"])}  # --affinity: its node
        self.idle, self.warm = list(spec["keys"]), list(spec["keys"])
        self.count, self.errors = 0, []
        self.calls: dict[str, list[int]] = {}  # session -> timed calls per node

    async def turn(self, stubs: list, latencies: list | None) -> None:
        import grpc

        from agent_sidecar.v1 import prompt_service_pb2 as pb
        if latencies is None:  # warm-up: every session once, so each lane holds its lease
            key = self.warm.pop()
        else:
            i = self.rng.randrange(len(self.idle))
            self.idle[i], self.idle[-1] = self.idle[-1], self.idle[i]
            key = self.idle.pop()
        self.count += 1
        node = self.home[key] if self.spec["affinity"] else self.count % self.n
        req = pb.PromptRequest(request_id=f"{self.spec['run']}-{self.count}", session_key=key,
                               text=TEXT, delivery=DELIVERY_QUEUE)
        t0, kinds = time.monotonic(), []
        try:
            async for resp in stubs[node].Prompt(req, timeout=120):
                kinds.append(resp.frame.WhichOneof("event"))
        except grpc.aio.AioRpcError as e:
            self.errors.append(f"{e.code().name} after [{','.join(kinds)}]: {(e.details() or '')[:300]}")
            return
        finally:
            if latencies is not None:
                self.idle.append(key)
        if kinds != KINDS:
            self.errors.append("frames: " + ",".join(kinds))
        elif latencies is not None:
            latencies.append(time.monotonic() - t0)
            self.calls.setdefault(key, [0] * self.n)[node] += 1

    async def main(self) -> dict:
        import grpc

        from agent_sidecar.v1 import prompt_service_pb2_grpc as pb_grpc
        channels = [grpc.aio.insecure_channel(t) for t in self.spec["targets"]]
        for ch in channels:
            await asyncio.wait_for(ch.channel_ready(), 30)
        stubs = [pb_grpc.PromptServiceStub(ch) for ch in channels]
        await keep_in_flight(self.spec["warmup"], self.spec["in_flight"], lambda: self.turn(stubs, None))
        warm_errors, self.errors = len(self.errors), []
        print("ready", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        latencies: list[float] = []
        t0, t1 = await keep_in_flight(self.spec["turns"], self.spec["in_flight"],
                                      lambda: self.turn(stubs, latencies))
        for ch in channels:
            await ch.close()
        by_kind: dict = {}  # one example of each kind of error (its status and the frames before it)
        for e in self.errors:
            by_kind.setdefault(e.split(":")[0], [0, e])[0] += 1
        return {"start": t0, "end": t1, "latencies": latencies,
                "errors": [f"{n} x {e}" for n, e in by_kind.values()],
                "error_count": len(self.errors), "warmup_errors": warm_errors, "calls": self.calls}


def client_main(spec_json: str) -> int:
    import uvloop
    spec = json.loads(spec_json)
    result = uvloop.run(Client(spec).main())
    # Through a file, not the pipe: stdout may be left non-blocking by the event
    # loop, and a result larger than the pipe's buffer was then cut short.
    Path(spec["out"]).write_text(json.dumps(result))
    print("done", flush=True)
    sys.stdin.readline()  # stay alive until the driver has read our CPU time
    return 0


if __name__ == "__main__":
    sys.exit(client_main(sys.argv[1]))
