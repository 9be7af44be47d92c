"""What an operator sees of a running sidecar: metrics (metrics.py, served by
http.py) and the status snapshot behind GetStatus (status.py), both read from
the live state (live.py)."""
