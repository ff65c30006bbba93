"""Shared fixtures: an open pool (on SQLite and on PostgreSQL), a fake clock, small realistic
samples, deep sample equality and pool snapshots (blob files, temp files and every catalog
row) for "nothing changed".

The ``pool`` and ``open_pool`` fixtures, and every fixture that asks for ``backend``, run each
test twice: ``[sqlite]`` and ``[postgresql]``. The PostgreSQL runs use one throwaway server
per session (`pgserver.PgServer`) and a new database per pool; without the server binaries
they are skipped with the reason shown (``pytest -rs``), unless ``$ARCHIVE_MANAGER_REQUIRE_PG``
is set (CI sets it), which makes them fail instead.
"""

from __future__ import annotations

import ctypes.util
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import (
    BACKENDS,
    REQUIRE_PG_ENV,
    Backend,
    BlobFiles,
    FakeClock,
    PoolSnapshot,
    assert_same_samples,
    open_on,
    small_rollout,
    snapshot_pool,
)
from pgserver import (  # tests/pgserver.py: pytest puts tests/ on sys.path
    PgServer,
    PgServerUnavailable,
)

from archive_manager import ArchiveManager


@pytest.fixture
def clock() -> FakeClock:
    """A fake clock starting at `EPOCH`."""
    return FakeClock()


# --------------------------------------------------------------------------- backends


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
    """One throwaway PostgreSQL server for the session; skips when none can be started."""
    required = bool(os.environ.get(REQUIRE_PG_ENV))
    try:
        import psycopg  # noqa: F401
    except ModuleNotFoundError:
        reason = "psycopg is not installed (the postgres extra)"
        if required:
            pytest.fail(reason)
        pytest.skip(reason)
    try:
        server = PgServer.start()
    except PgServerUnavailable as exc:
        if required:
            pytest.fail(f"PostgreSQL server binaries not found: {exc}")
        pytest.skip(f"PostgreSQL server binaries not found: {exc}")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    """The test's catalog backend, once ``sqlite`` and once ``postgresql``."""
    server = request.getfixturevalue("pg_server") if request.param == "postgresql" else None
    chosen = Backend(request.param, server)
    try:
        yield chosen
    finally:
        chosen.close()


@pytest.fixture
def pool(tmp_path: Path, backend: Backend) -> Iterator[ArchiveManager]:
    """A new pool at ``tmp_path / "pool"`` on each backend, closed at teardown."""
    manager = open_on(backend, tmp_path / "pool")
    try:
        yield manager
    finally:
        manager.close()


@pytest.fixture
def open_pool(tmp_path: Path, backend: Backend) -> Iterator[Callable[..., ArchiveManager]]:
    """``open_pool(root=None, **options)``: open a pool (default ``tmp_path / "pool"``) with
    options such as ``clock``, ``lease_ttl``, ``chunk_size``, ``inline_limit``, on each
    backend (the same root gets the same catalog); every pool it opened is closed at
    teardown."""
    opened: list[ArchiveManager] = []

    def _open(root: str | os.PathLike[str] | None = None, **options: Any) -> ArchiveManager:
        manager = open_on(backend, tmp_path / "pool" if root is None else root, **options)
        opened.append(manager)
        return manager

    yield _open
    for manager in opened:
        manager.close()


@pytest.fixture
def rollout() -> Callable[..., list]:
    """The `small_rollout` factory: ``rollout(70, seed=1, r3_layers=2, as_dict=True)``."""
    return small_rollout


@pytest.fixture
def same_samples() -> Callable[[list, list], None]:
    """`assert_same_samples`: loaded samples equal the saved ones exactly."""
    return assert_same_samples


@pytest.fixture
def blob_files_of() -> Callable[[ArchiveManager], BlobFiles]:
    """``blob_files_of(pool)``: list, find and damage a pool's blob files."""
    return BlobFiles


@pytest.fixture
def snapshot() -> Callable[[ArchiveManager], PoolSnapshot]:
    """`snapshot_pool`: compare two snapshots with ``==`` to prove nothing changed."""
    return snapshot_pool


# --------------------------------------------------------------------------- the fast loop

#: Test files that drive real engines or kill processes: minutes on 2 cores, with the reason.
_SLOW_FILES = {
    "crash": "kills processes mid-operation (the crash matrix, killed saves, GCs, exports, soak)",
    "test_s3.py": "a real S3 gateway (juicefs)",
    "test_s3_uploads.py": "a real S3 gateway (juicefs)",
    "test_s3_stalled.py": "a real S3 gateway (juicefs) and endpoints that stall past timeouts",
    "test_read_only_stores.py": "a real S3 gateway (juicefs) beside the folder store",
    "test_two_hosts.py": "two hosts on a JuiceFS volume through FUSE",
    "test_shared_pools.py": "throwaway accounts and mount namespaces",
    "test_web_browser.py": "a headless Chromium",
    "test_catalog_postgresql.py": "PostgreSQL only",
    "test_catalog_outage.py": "catalog servers stopped and restarted",
    "test_startup.py": "fresh interpreters, timed",
    "test_gc_race.py": "savers and GCs racing in processes",
    "test_state_machine.py": "a Hypothesis state machine over a pool",
    "test_concurrency.py": "concurrent processes",
    "test_stopped_writer.py": "processes stopped with SIGSTOP past timeouts",
    "test_lease_renewal.py": "leases lapsing in real time",
    "test_ddp_replay.py": "torch.distributed gloo ranks as processes",
    "test_export_progress.py": "progress bars drawn on a pseudo-terminal",
    "test_tools_bench.py": "the benchmarks' smoke runs",
}


#: Set to 1 to run the suite's processes with real fsyncs (debugging durability by hand).
REAL_FSYNC_ENV = "ARCHIVE_MANAGER_REAL_FSYNC"


def _cheap_processes(config: pytest.Config) -> None:
    """Make the suite's processes (xdist workers, and the hundreds of Pythons the tests start)
    cheap to start and free of fsync waits, as CI's (.ci/run) are.

    Set in the environment before xdist starts its workers, so it reaches them and every
    child.  Compiled modules: where bytecode writing is off (``PYTHONDONTWRITEBYTECODE``, as
    in many images), each process compiles the package, the test modules (pytest's assertion
    rewriting) and, under a ``PYTHONPYCACHEPREFIX``, every library from source again; they
    are written once to that prefix instead (``.pytest_cache/pycache`` when none is set),
    outside the tree.  fsync: libeatmydata, where installed, makes it a no-op; the suite
    never cuts power, the one crash an fsync protects against, and tests that check fsync is
    called or that its failure fails a save do so at the Python level.
    ``$ARCHIVE_MANAGER_REAL_FSYNC=1`` keeps real fsyncs."""
    if os.environ.pop("PYTHONDONTWRITEBYTECODE", None) is not None:
        os.environ.setdefault(
            "PYTHONPYCACHEPREFIX", str(config.rootpath / ".pytest_cache" / "pycache")
        )
    preload = os.environ.get("LD_PRELOAD", "")
    if os.environ.get(REAL_FSYNC_ENV) or "eatmydata" in preload:
        return
    library = ctypes.util.find_library("eatmydata")
    if library is not None:
        os.environ["LD_PRELOAD"] = f"{preload} {library}".strip()


def pytest_configure(config: pytest.Config) -> None:
    """Make the suite's processes cheap (`_cheap_processes`); under .ci/dist-check, refuse to
    test anything but the installed wheel.

    ``$ARCHIVE_MANAGER_EXPECT_INSTALLED`` names the environment the wheel went into; a checkout
    found first (an editable install, a stray sys.path entry) would make the smoke run test the
    source tree instead of the distribution.
    """
    _cheap_processes(config)
    expected = os.environ.get("ARCHIVE_MANAGER_EXPECT_INSTALLED")
    if not expected:
        return
    import archive_manager

    found = Path(archive_manager.__file__).resolve()
    if not found.is_relative_to(Path(expected).resolve()):
        raise pytest.UsageError(f"archive_manager was imported from {found}, not from {expected}")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark `slow` what the fast loop (``pytest -m "not slow"``, tests/README.md) leaves to
    the full run: the PostgreSQL twin of every test that also runs on SQLite, and the files
    of `_SLOW_FILES`.  The README's command still runs everything."""
    for item in items:
        path = item.path
        if path.name in _SLOW_FILES or path.parent.name in _SLOW_FILES:
            item.add_marker(pytest.mark.slow)
            continue
        callspec = getattr(item, "callspec", None)
        if callspec is not None and any(
            isinstance(v, str) and v == "postgresql" for v in callspec.params.values()
        ):
            item.add_marker(pytest.mark.slow)
