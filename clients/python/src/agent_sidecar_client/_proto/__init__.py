"""Generated protobuf and gRPC modules for agent_sidecar.v1 (see generate.sh).

Do not edit: `make clients` rewrites this folder from proto/.
"""
