"""The bare server: a grpc.aio server that streams the sidecar's frames with
the echo model's timing and does nothing else (no store, no workers, no
lanes, no commit before a frame is sent).

    python -m agent_sidecar.bench.bare --listen unix:/tmp/bare.sock --token-latency-ms 20

Why it exists: "how much does the sidecar cost" only has an answer against
something that streams the same bytes at the same pace; this is that
something, on the user's own machine, so ``agent-sidecar bench
--compare-bare`` prices persistence and the worker hop and nothing else.

``Prompt`` yields ``accepted``, ``started``, then one ``text_delta`` per word
of the reply: the first ``first_delta_ms`` after ``started`` (default one
``token_latency_ms``), each later one ``token_latency_ms`` after the one
before it, as the echo model paces them (models/_text.paced: a write that
takes long does not push the next delta back) — then ``usage`` and
``completed``, with every field the sidecar fills (timestamps, seq, cursor).
To stand in for a sidecar that coalesces deltas, the bench gives it the
frames' gap and a first delta sooner than that gap (a coalescing window sends
its first delta at once).
The reply is the prompt's own words (echo) unless ``--reply-deltas N`` asks
for N fixed deltas (``--delta-words K`` words each, default 1), to mimic a
model whose answer is not an echo, or a sidecar's coalesced frames.
``GetOrCreateSession`` answers with a key built from the source, so the
bench drives both servers the same way. Unless ``--plain`` it gets the
sidecar's gRPC settings: its helper threads the scheduler policy
(``calm_grpc_threads``), its handlers registered as generic ones only
(``GenericOnly``), so a comparison prices the sidecar's work, not a setting
only one side has.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import time

REPLY_WORD = "lorem "


def _servicers(token_latency_s: float, first_delta_s: float | None, reply_deltas: int, delta_words: int = 1):
    from ..models._text import paced, split_words
    from ..v1 import common_pb2
    from ..v1 import prompt_service_pb2 as pb
    from ..v1 import prompt_service_pb2_grpc as pb_grpc
    from ..v1 import session_service_pb2 as spb
    from ..v1 import session_service_pb2_grpc as spb_grpc

    cursor = [0]
    fixed = [REPLY_WORD * delta_words] * reply_deltas

    def frame(req, sid: str, seq: int, kind: str, **body):
        cursor[0] += 1
        f = pb.ActivityFrame(request_id=req.request_id, session_key=req.session_key,
                             session_id=sid, seq=seq, cursor=cursor[0])
        f.at.FromNanoseconds(time.time_ns())
        sub = getattr(f, kind)
        sub.SetInParent()
        for k, v in body.items():
            setattr(sub, k, v)
        return pb.PromptResponse(frame=f)

    class Prompts(pb_grpc.PromptServiceServicer):
        async def Prompt(self, request, context):
            sid = "bare-" + request.session_key[-12:]
            texts = fixed if reply_deltas else split_words(request.text)  # one per text_delta
            yield frame(request, sid, 1, "accepted", queue_position=0)
            yield frame(request, sid, 2, "started")
            seq = 2
            async for text in paced(texts, token_latency_s, first_delta_s):  # the echo model's pace
                seq += 1
                yield frame(request, sid, seq, "text_delta", text=text)
            yield frame(request, sid, seq + 1, "usage", input_tokens=len(request.text.split()) + 5,
                        output_tokens=len(texts) * (delta_words if reply_deltas else 1), cache_read_tokens=0,
                        cache_write_tokens=0, cost_usd=0.0)
            yield frame(request, sid, seq + 2, "completed", final_text="".join(texts))

    class Sessions(spb_grpc.SessionServiceServicer):
        async def GetOrCreateSession(self, request, context):
            s = request.source
            profile = request.profile or "main"
            key = f"agent:{profile}:{s.platform}:{s.chat_type or 'dm'}:{s.chat_id}"
            return spb.GetOrCreateSessionResponse(session=common_pb2.Session(
                session_key=key, session_id="bare-" + key[-12:], profile=profile), created=True)

    return ((pb_grpc.add_PromptServiceServicer_to_server, Prompts()),
            (spb_grpc.add_SessionServiceServicer_to_server, Sessions()))


async def serve(listen: str, token_latency_ms: float = 0.0, first_delta_ms: float | None = None,
                reply_deltas: int = 0, calm: bool = True, tls: tuple[bytes, bytes] | None = None,
                delta_words: int = 1) -> None:
    """Serve until SIGTERM or SIGINT; prints ``serving <address>`` once bound
    (the bound port replaces ``:0``)."""
    import grpc

    from ..api.server import SERVER_OPTIONS, GenericOnly, calm_grpc_threads

    server = grpc.aio.server(options=SERVER_OPTIONS)
    first_delta_s = None if first_delta_ms is None else first_delta_ms / 1000
    for add, servicer in _servicers(token_latency_ms / 1000, first_delta_s, reply_deltas, delta_words):
        add(servicer, GenericOnly(server) if calm else server)
    if tls:
        port = server.add_secure_port(listen, grpc.ssl_server_credentials([(tls[1], tls[0])]))
    else:
        port = server.add_insecure_port(listen)
    await server.start()
    if calm:
        calm_grpc_threads()
    address = listen if listen.startswith("unix:") else f"{listen.rsplit(':', 1)[0]}:{port}"
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"serving {address}", flush=True)
    await stop.wait()
    await server.stop(grace=1)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m agent_sidecar.bench.bare", description=__doc__.split("\n\n")[0])
    ap.add_argument("--listen", required=True, metavar="unix:PATH|HOST:PORT")
    ap.add_argument("--token-latency-ms", type=float, default=0.0,
                    help="the gap between text deltas, as the echo model's token_latency_ms")
    ap.add_argument("--first-delta-ms", type=float, default=None,
                    help="when the first text delta is due after started (default: one --token-latency-ms)")
    ap.add_argument("--reply-deltas", type=int, default=0,
                    help="reply with N fixed deltas instead of echoing the prompt (0: echo)")
    ap.add_argument("--delta-words", type=int, default=1, help="with --reply-deltas: the words of each (default 1)")
    ap.add_argument("--plain", action="store_true", help="leave gRPC's threads at the default scheduler policy")
    ap.add_argument("--tls-cert", default=None, help="PEM certificate chain: serve TLS (with --tls-key)")
    ap.add_argument("--tls-key", default=None, help="PEM private key")
    args = ap.parse_args(argv)
    if args.token_latency_ms < 0 or (args.first_delta_ms or 0) < 0 or args.reply_deltas < 0 or args.delta_words < 1:
        ap.error("latencies and --reply-deltas must be >= 0, --delta-words >= 1")
    if bool(args.tls_cert) != bool(args.tls_key):
        ap.error("--tls-cert and --tls-key go together")
    tls = None
    if args.tls_cert:
        with open(args.tls_cert, "rb") as c, open(args.tls_key, "rb") as k:
            tls = (c.read(), k.read())
    import uvloop
    uvloop.run(serve(args.listen, args.token_latency_ms, args.first_delta_ms, args.reply_deltas,
                     calm=not args.plain, tls=tls, delta_words=args.delta_words))
    return 0


if __name__ == "__main__":
    sys.exit(main())
