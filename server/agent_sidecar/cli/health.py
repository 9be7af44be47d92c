"""``agent-sidecar health``: ask a sidecar's grpc.health.v1 service, for
container health checks and scripts.

Exit status 0 when the answer is SERVING, 1 for anything else (NOT_SERVING
while the startup restore runs or a drain is under way, no answer within the
timeout, no sidecar at all). One line on stdout says which.
"""

from __future__ import annotations


def run(args) -> int:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    metadata = [("authorization", f"Bearer {args.token}")] if args.token else None
    with grpc.insecure_channel(args.target) as channel:
        try:
            response = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=args.service), metadata=metadata,
                timeout=args.timeout, wait_for_ready=False)
        except grpc.RpcError as e:
            print(f"{args.target}: {e.code().name}: {e.details()}")
            return 1
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)
    print(f"{args.target}: {status}")
    return 0 if response.status == health_pb2.HealthCheckResponse.SERVING else 1
