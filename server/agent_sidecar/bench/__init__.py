"""``agent-sidecar bench``: a load harness users point at their own sidecar.

Pieces, each importable on its own (none is on the server's import path, and
nothing here is imported by ``serve``):

* ``stats``  — percentiles, latency summaries, per-second series, the knee.
* ``procs``  — CPU and RSS per process from /proc, a server's process tree.
* ``sockets`` — which local processes hold a server's sockets: its listener
  (a local sidecar found from the target), its PostgreSQL backends.
* ``bare``   — the built-in bare gRPC server (``python -m agent_sidecar.bench.bare``):
  the same frames with the same timing as the echo model, no persistence.
* ``bare_process`` — starting it beside the target, and its timing.
* ``target`` — where the bench connects (picklable: token, TLS as bytes) and how.
* ``load``   — the load generator on the project's Python client
  (``agent_sidecar_client``, the ``bench`` extra).
* ``turns``  — a prompt sent, what became of it (a turn, absorbed, an error), a point's figures.
* ``fleet``  — the same load from N client processes (``--clients N``, several targets).
* ``tools``  — the bench's own tool host (``--tools``).
* ``sessions`` — the run's sessions: made at its start, deleted at its end (unless kept).
* ``run``    — one bench run: sessions, calibration, the sweep, sidecar vs bare.
* ``report`` — the JSON document's judgement: the SLO, the knees (of several
  sweeps, their median), the ratios, the totals.
* ``text``   — the document as the tables and the headline on stdout.
* ``plot``   — the PNG (matplotlib, the ``bench`` extra, imported only for ``--plot``).

``report``, ``text`` and ``plot`` read only the document, so ``--render``
prints and plots an earlier run's ``--json`` without running anything.
"""
