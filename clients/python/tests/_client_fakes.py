"""Stand-ins for grpc.aio calls and channels, so stream logic is testable without a server."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
from google.protobuf import any_pb2
from google.rpc import error_details_pb2, status_pb2

from agent_sidecar_client._proto import prompt_service_pb2 as pb


def frame(seq: int, kind: str = "text_delta", request_id: str = "r1", **payload: Any) -> pb.ActivityFrame:
    f = pb.ActivityFrame(request_id=request_id, seq=seq)
    if kind == "text_delta":
        f.text_delta.text = payload.get("text", f"w{seq} ")
    elif kind == "failed":
        f.failed.reason = payload.get("reason", "CANCELLED")
        f.failed.message = payload.get("message", "")
    elif kind == "completed":
        f.completed.final_text = payload.get("final_text", "")
    else:
        getattr(f, kind).SetInParent()
    return f


def status_trailers(code: grpc.StatusCode, reason: str, message: str = "", *extra: Any) -> tuple:
    """The ``grpc-status-details-bin`` trailer the sidecar sends, built locally."""
    details = []
    for msg in (error_details_pb2.ErrorInfo(reason=reason, domain="agent-sidecar"), *extra):
        packed = any_pb2.Any()
        packed.Pack(msg)
        details.append(packed)
    status = status_pb2.Status(code=code.value[0], message=message, details=details)
    return (("grpc-status-details-bin", status.SerializeToString()),)


class FakeRpcError(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode, details: str = "", trailers: tuple = ()) -> None:
        super().__init__(details)
        self._code, self._details, self._trailers = code, details, trailers

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def trailing_metadata(self) -> tuple:
        return self._trailers


class FakeCall:
    """Yields PromptResponses for ``frames``, then ends with ``error`` (or OK).

    ``hang=True`` blocks after the frames until cancelled, like a live stream.
    """

    def __init__(self, frames: list[pb.ActivityFrame], error: FakeRpcError | None = None,
                 hang: bool = False) -> None:
        self.frames, self.error, self.hang = frames, error, hang
        self.cancelled = False
        self._wake = asyncio.Event()

    def __aiter__(self):
        return self._gen()

    async def read(self):
        """grpc.aio's UnaryStreamCall.read(): the next response, or grpc.aio.EOF."""
        if not hasattr(self, "_reader"):
            self._reader = self._gen()
        try:
            return await self._reader.__anext__()
        except StopAsyncIteration:
            return grpc.aio.EOF

    async def _gen(self):
        for f in self.frames:
            if self.cancelled:
                raise asyncio.CancelledError()
            yield pb.PromptResponse(frame=f)
            await asyncio.sleep(0)
        if self.hang:
            await self._wake.wait()
            raise asyncio.CancelledError()
        if self.error is not None:
            raise self.error

    def cancel(self) -> bool:
        self.cancelled = True
        self._wake.set()
        return True

    def done(self) -> bool:
        return self.cancelled

    async def code(self) -> grpc.StatusCode:
        return self.error.code() if self.error else grpc.StatusCode.OK

    async def trailing_metadata(self) -> tuple:
        return self.error.trailing_metadata() if self.error else ()


class FakeChannel:
    async def channel_ready(self) -> None:
        return None
