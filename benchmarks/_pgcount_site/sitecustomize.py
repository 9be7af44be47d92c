"""Loaded by every Python process of a counting run (cluster_bench.py
``--count`` puts this directory on PYTHONPATH with BENCH_PG_COUNT set to a
directory): counts the statements each process sends through psycopg's
synchronous cursors (the store writer's), by their first word. SIGUSR1
starts the count afresh, SIGUSR2 writes it to BENCH_PG_COUNT/<pid>.json."""

import os

if os.environ.get("BENCH_PG_COUNT"):
    import json
    import signal

    import psycopg

    _counts: dict[str, int] = {}
    _execute, _executemany = psycopg.Cursor.execute, psycopg.Cursor.executemany

    def _note(query, n: int) -> None:
        word = (query.split(None, 1)[0].upper() if isinstance(query, str) else type(query).__name__)
        _counts[word] = _counts.get(word, 0) + n

    def execute(self, query, params=None, **kw):
        _note(query, 1)
        return _execute(self, query, params, **kw)

    def executemany(self, query, params_seq, **kw):
        params_seq = list(params_seq)
        _note(query, len(params_seq))
        return _executemany(self, query, params_seq, **kw)

    psycopg.Cursor.execute, psycopg.Cursor.executemany = execute, executemany

    def _reset(*_):
        _counts.clear()

    def _dump(*_):
        path = os.path.join(os.environ["BENCH_PG_COUNT"], f"{os.getpid()}.json")
        with open(path, "w") as f:
            json.dump(_counts, f)

    signal.signal(signal.SIGUSR1, _reset)
    signal.signal(signal.SIGUSR2, _dump)
