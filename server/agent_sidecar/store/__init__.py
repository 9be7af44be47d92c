"""The store: one typed interface (interface.py) over one backend per folder
(sqlite/, the embedded default). Nothing outside this package writes SQL or
imports a database driver; the domain writes through ``Store.write(job,
*args)`` with jobs over a ``UnitOfWork`` and reads through ``Store``'s typed
methods. See interface.py for what every backend guarantees, and
unit_of_work.py for the repositories a job writes through.
"""

from .faults import StoreClosed, StoreUnavailable
from .interface import Store, StoreOpenError
from .unit_of_work import UnitOfWork, batched

__all__ = ["Store", "StoreOpenError", "StoreClosed", "StoreUnavailable", "UnitOfWork",
           "batched", "open_store"]


def open_store(backend: str = "sqlite", *, path: str = "", synchronous: str = "FULL",
               dsn: str = "", node_id: str = "", pool_size: int = 4, preload: tuple[str, ...] = (),
               log_format: str = "json", log_level: str = "info", library_log_level: str = "warning",
               on_lost=None) -> Store:
    """The configured backend, not started yet (``await store.start()``):
    ``sqlite`` on the file ``path``, or ``postgres`` on ``dsn`` (its driver is
    imported only then)."""
    common = dict(preload=preload, log_format=log_format, log_level=log_level,
                  library_log_level=library_log_level, on_lost=on_lost)
    if backend == "postgres":
        from .postgres.store import PostgresStore
        return PostgresStore(dsn, node_id=node_id, pool_size=pool_size, **common)
    from .sqlite.store import SqliteStore
    return SqliteStore(path, synchronous, **common)
