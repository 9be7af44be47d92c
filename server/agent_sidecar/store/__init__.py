"""The store: one typed interface (interface.py) over one backend per folder
(sqlite/, the embedded default). Nothing outside this package writes SQL or
imports a database driver; the domain writes through ``Store.write(job,
*args)`` with jobs over a ``UnitOfWork`` and reads through ``Store``'s typed
methods. See interface.py for what every backend guarantees.
"""

from .faults import StoreUnavailable
from .interface import Store, StoreOpenError, UnitOfWork, batched
from .writer.client import StoreClosed

__all__ = ["Store", "StoreOpenError", "StoreClosed", "StoreUnavailable", "UnitOfWork",
           "batched", "open_store"]


def open_store(db_path: str, synchronous: str = "FULL", *, preload: tuple[str, ...] = (),
               log_format: str = "json", log_level: str = "info", on_lost=None) -> Store:
    """The configured backend, not started yet (``await store.start()``)."""
    from .sqlite.store import SqliteStore
    return SqliteStore(db_path, synchronous, preload=preload, log_format=log_format,
                       log_level=log_level, on_lost=on_lost)
