"""The single SQLite store: one writer process with group commit, many readers.

``Store`` is the only way the rest of the sidecar touches the database. Writes are
module-level functions run in the writer process inside a shared transaction; reads run on
reader connections. DECISIONS.md ("One store, no side files") is the contract.
"""

from .store import Store, StoreClosed, StoreUnavailable

__all__ = ["Store", "StoreClosed", "StoreUnavailable"]
