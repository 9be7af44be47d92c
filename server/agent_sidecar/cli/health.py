"""``agent-sidecar health``: ask a sidecar's grpc.health.v1 service, for
container health checks and scripts.

Exit status 0 when the answer is SERVING, 1 for anything else (NOT_SERVING
while the startup restore runs, a drain is under way or the store cannot
write, no answer within the timeout, no sidecar at all). With ``--live``, 0
for any answer: the process is alive, for a liveness probe (restarting a
sidecar whose disk is full, or whose restore is running, would not help).
One line on stdout says which. Target options
that cannot work (``--cert`` without ``--key``, a token in cleartext to
another host) are exit status 2, as argparse's errors; the options are every
command's (connection.py).
"""

from __future__ import annotations

from .connection import TargetError, call_metadata, failure, open_channel
from .report import error


def run(args) -> int:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    try:
        channel = open_channel(args)
    except TargetError as e:
        error("health", e)
        return 2
    metadata = call_metadata(args)
    with channel:
        try:
            response = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=args.service), metadata=metadata,
                timeout=args.timeout, wait_for_ready=False)
        except grpc.RpcError as e:
            print(f"{args.target}: {failure(args, e)}")
            return 1
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)
    print(f"{args.target}: {status}")
    return 0 if args.live or response.status == health_pb2.HealthCheckResponse.SERVING else 1
