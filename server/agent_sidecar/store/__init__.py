"""The single SQLite store: one writer thread with group commit, many readers.

``Store`` is the only way the rest of the sidecar touches the database. Writes are
functions run on the writer thread inside a shared transaction; reads run on
reader connections. DECISIONS.md ("One store, no side files") is the contract.
"""

from .store import Store, StoreClosed

__all__ = ["Store", "StoreClosed"]
