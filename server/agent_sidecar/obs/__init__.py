"""What an operator sees of a running sidecar: traces (tracing.py, otel.py),
the per-RPC access log and RPC spans (rpc.py), the per-turn log line
(turnlog.py). Hooks elsewhere stay one line each and cost one attribute check
when tracing is off."""
