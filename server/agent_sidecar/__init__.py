"""agent-sidecar: a gRPC session runtime for chat-bot agents.

This package is imported by worker processes too, so it must stay free of grpc:
nothing here may import grpc at module level (see turns/worker.py).
"""

__version__ = "0.1.0"
