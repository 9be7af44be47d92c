import sys
from pathlib import Path

import pytest

# Every test folder imports the one shared helper set (tests/helpers/) and the
# sidecar process class (tests/sidecar_proc.py) from here.
sys.path.insert(0, str(Path(__file__).resolve().parent))

from helpers import pg  # noqa: E402
from sidecar_proc import Sidecar  # noqa: E402

pg.hide_settings()  # before any sidecar or pytest-xdist worker is started

BACKENDS = ("sqlite", "postgres")


def pytest_addoption(parser):
    parser.addoption("--backend", choices=BACKENDS, default="sqlite",
                     help="the store of every Sidecar of the tests: sqlite (a file in its data dir) or "
                          "postgres (a database of its own on a real PostgreSQL: the server "
                          f"${pg.DSN_ENV} names, else one started for the session)")


def pytest_configure(config):
    config.addinivalue_line("markers", "sqlite_only(reason): a test of the SQLite backend itself "
                                       "(its file, its SQL, doctor); skipped on --backend postgres")
    config.addinivalue_line("markers", "postgres_only(reason): a test of the PostgreSQL backend "
                                       "itself; skipped on --backend sqlite")
    config.addinivalue_line("markers", "runs_long(reason): a module of long tests (a soak, a crash "
                                       "loop); run first, so under pytest-xdist it never starts last")
    config.addinivalue_line("markers", "store_free(reason): a test that starts no sidecar and opens no "
                                       "store, so the backend changes nothing of it: run once, on "
                                       "the SQLite pass; skipped on --backend postgres")
    # An assert in a helper thread (a client loop, a stream reader) raises
    # there, not in the test: pytest only warns of it, and the test passed
    # without what that thread was to check. Such a test fails instead.
    config.addinivalue_line("filterwarnings", "error::pytest.PytestUnhandledThreadExceptionWarning")


def pytest_collection_modifyitems(config, items):
    """Skip, with the marker's reason, what is not about this run's backend
    (on PostgreSQL also what no backend changes: it ran on the SQLite pass);
    then order the modules, longest first."""
    backend = config.getoption("backend")
    others = {"sqlite": ("postgres_only",), "postgres": ("sqlite_only", "store_free")}[backend]
    for item in items:
        for other in others:
            mark = item.get_closest_marker(other)
            if mark is not None:
                why = mark.args[0] if mark.args else mark.kwargs.get("reason", "")
                item.add_marker(pytest.mark.skip(reason=f"{other}: {why}"))
                break
    _longest_first(items)


def _longest_first(items) -> None:
    """Modules marked runs_long first, then the others by how many tests they
    hold, most first (each module's own order kept). pytest-xdist's loadscope
    hands a worker whole modules in this order (the Makefile turns off its
    own reorder, by test count alone): a 1-test soak of a minute or more,
    last by count, used to start when the other workers were nearly done and
    end the run alone."""
    modules: dict[str, list] = {}
    for item in items:
        modules.setdefault(item.nodeid.split("::")[0], []).append(item)
    order = sorted(modules.values(), key=lambda its: (
        not any(it.get_closest_marker("runs_long") for it in its), -len(its)))
    items[:] = [it for its in order for it in its]


@pytest.fixture(autouse=True)
def _store_free_starts_no_sidecar(request):
    """A ``store_free`` test that starts a sidecar fails: the marker would
    keep it off the PostgreSQL pass, which that sidecar's store is for."""
    if request.node.get_closest_marker("store_free") is None:
        yield
        return
    before = Sidecar.starts
    yield
    assert Sidecar.starts == before, (f"{request.node.nodeid} is marked store_free but started a sidecar:"
                                      " drop the marker, it must run on both backends")


@pytest.fixture(scope="session")
def pg_server():
    """The tests' PostgreSQL server (helpers.pg): started for the session
    unless the environment names one; stopped (or its databases dropped) at the end."""
    server = pg.PgServer.from_env()
    pg.SERVER = server
    yield server
    pg.SERVER = None
    server.close()


@pytest.fixture(scope="session", autouse=True)
def store_backend(request):
    """This run's backend; on postgres every Sidecar gets a database of its data dir."""
    backend = request.config.getoption("backend")
    if backend == "postgres":
        pg.ACTIVE = request.getfixturevalue("pg_server")
    yield backend
    pg.ACTIVE = None


@pytest.fixture
def sidecar(tmp_path):
    """A fresh sidecar per test (echo model, Unix socket)."""
    sc = Sidecar(tmp_path / "data").start()
    yield sc
    sc.stop()


@pytest.fixture(scope="module")
def shared_sidecar(tmp_path_factory):
    """One sidecar for a whole module, for read-mostly tests."""
    sc = Sidecar(tmp_path_factory.mktemp("shared") / "data", tcp=True).start()
    yield sc
    sc.stop()


@pytest.fixture(scope="module")
def host(sc):
    """Tool host "test" (``test.add``) on the module's own ``sc`` sidecar."""
    from helpers.tools import AB_SCHEMA, ToolHost, answers
    with ToolHost(sc.tools(), "test", [("test.add", "test.add", AB_SCHEMA)],
                  answers({"test.add": lambda a: a["a"] + a["b"]})) as h:
        yield h
