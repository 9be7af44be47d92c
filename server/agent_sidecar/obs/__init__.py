"""What an operator sees of a running sidecar: metrics (metrics.py, served by
http.py) and the status snapshot behind GetStatus (status.py), both read from
the live state (live.py); traces (tracing.py, otel.py), the per-RPC access log
and RPC spans (rpc.py), the per-turn log line (turnlog.py). Hooks elsewhere
stay one line each and cost one attribute check when tracing is off."""
