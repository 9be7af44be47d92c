"""The one helper set every test folder shares (tests/conftest.py puts tests/
on sys.path, so ``from helpers.streams import run`` works from any folder).

* ``ids``: request ids, chat ids, sources, filler words.
* ``config``: TOML for the sidecar: tables and profiles (echo, slow echo, scripted).
* ``waiting``: ``wait_until``, the one way a test waits for a condition.
* ``streams``: ``Stream``, the one result of a Prompt or WatchActivity call
  (``PromptRun``, ``run``, ``start``, ``watch``, ``collect``), ``Watcher``.
* ``sessions``: SessionService calls (create, seed, the transcript reader, errors).
* ``tools``: ``ToolHost``, a ServeTools stream in the test process.
* ``recovery``: health, the clean-shutdown marker, a restart that waits for the restore.
* ``store``: the store read through its typed interface (``StoreView``) and
  store jobs run on a real store (``LocalStore``), on the run's backend.
* ``pg``: the tests' PostgreSQL server and its databases (``--backend postgres``).
* ``logs``: the JSON log, only where a log line is itself what a test checks.
* ``metrics``: the ``/metrics`` endpoint scraped over HTTP (``scrape``, ``Samples``).
* ``key_cases``, ``fake_openai``: data and a fake OpenAI server.
* ``fuzz_sequences``: seeded random runs of calls of every RPC in odd orders,
  on one sidecar or the nodes of a cluster.

The sidecar process itself is tests/sidecar_proc.py (``Sidecar``), also used
by the Python client's tests.
"""
