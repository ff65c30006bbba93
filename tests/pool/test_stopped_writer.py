"""A process stopped (Ctrl-Z, SIGSTOP, a debugger) inside one of its write transactions.

On PostgreSQL the server ends its session after `idle_in_transaction_timeout_ms`, so other
writers go on within bounded time; the stopped save, resumed, fails cleanly and publishes
nothing, and every published archive is intact. On SQLite the lock cannot be taken from its
holder: the `CatalogLockedError` names the stopped process (pid, state, command line) and how
to resume it, and the save finishes once resumed.

The stopped process is real: a child saving through the library stops itself with SIGSTOP
inside the write transaction of its first chunk (``save.blobs``, before its commit).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import Backend, assert_loads, open_on, tiny_rollout
from sqlalchemy import select, text

from archive_manager import ArchiveManager
from archive_manager.catalog import Catalog, leases_table, pin_write_lock
from archive_manager.catalog.engine import (
    LockHolder,
    idle_in_transaction_timeout_ms,
    parse_lock_table,
    sqlite_locked_message,
)
from archive_manager.errors import ArchiveNotFoundError, CatalogError, CatalogLockedError

pytestmark = pytest.mark.timeout(120)

TESTS = Path(__file__).resolve().parents[1]

_STOPPING_CHILD = """
import os, signal, sys, threading
sys.path.insert(0, sys.argv[6])
from archive_manager import ArchiveManager
from archive_manager._util import failpoints as _failpoints
from helpers import tiny_rollout

root, url, job, point, seed = sys.argv[1], sys.argv[2] or None, sys.argv[3], sys.argv[4], sys.argv[5]
real_fire = _failpoints._fire
stopped = []


def fire(name):
    # Stop the whole process, as Ctrl-Z does, the first time it reaches the point. Sent to
    # this thread, not the process: a process-directed SIGSTOP may be taken by another thread
    # while this one, under load, runs on into its COMMIT before the group stop reaches it.
    if name == point and not stopped:
        stopped.append(name)
        print("stopping", flush=True)
        signal.pthread_kill(threading.get_ident(), signal.SIGSTOP)
    real_fire(name)


armed = f"{point}=sleep:0"  # armed, so that the library calls fire()
if job == "failed-save":  # a save that fails after its blobs, so it rolls them back
    armed += ";save.manifest.after_write=raise"
_failpoints.configure(armed)
_failpoints._fire = fire
try:
    with ArchiveManager.open(root, catalog_url=url, chunk_size=8) as pool:
        if job in ("save", "failed-save"):
            pool.save("b", tiny_rollout(24, seed=int(seed)), rollout_id=int(seed))
        else:
            pool.gc(grace=0)
except Exception as exc:
    print(f"failed {type(exc).__name__}: {exc}", flush=True)
    sys.exit(1)
print("done", flush=True)
"""


class StoppedChild:
    """A child process that saves archive "b" (``job="save"``) or runs GC, and stops itself
    with SIGSTOP the first time it reaches failpoint ``point``."""

    def __init__(
        self,
        root: Path,
        url: str | None,
        *,
        job: str = "save",
        point: str = "save.blobs.before_commit",
        seed: int = 2,
        env: dict[str, str] | None = None,
    ) -> None:
        args = [str(root), url or "", job, point, str(seed), str(TESTS)]
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _STOPPING_CHILD, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **(env or {})},
        )
        self.pid = self.proc.pid

    def wait_stopped(self) -> None:
        """Wait until the child stopped itself inside its write transaction."""
        assert self.proc.stdout is not None and self.proc.stderr is not None
        line = self.proc.stdout.readline().strip()
        assert line == "stopping", (line, self.proc.stderr.read() if line == "" else "")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if all(state == "T" for state in self._thread_states()):
                return
            time.sleep(0.01)
        raise AssertionError("the child did not stop")

    def _thread_states(self) -> list[str]:
        states = []
        for stat in Path(f"/proc/{self.pid}/task").glob("*/stat"):
            try:
                states.append(stat.read_text().rpartition(")")[2].split()[0])
            except FileNotFoundError:  # a thread that just ended
                continue
        return states

    def resume(self) -> tuple[int, str]:
        """SIGCONT; wait for the child to end; its exit code and last line."""
        os.kill(self.pid, signal.SIGCONT)
        out, err = self.proc.communicate(timeout=60)
        lines = out.strip().splitlines()
        return self.proc.returncode, (lines[-1] if lines else err.strip()[-2000:])

    def close(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.pid, signal.SIGCONT)
            self.proc.kill()
            self.proc.communicate()


@pytest.fixture
def stoppers() -> Iterator[list[StoppedChild]]:
    started: list[StoppedChild] = []
    yield started
    for child in started:
        child.close()


def _leases(pool: ArchiveManager) -> list[Any]:
    with pool.catalog.read() as conn:
        return list(conn.execute(select(leases_table)).all())


def _saved_pool(backend: Backend, root: Path) -> None:
    with open_on(backend, root, chunk_size=8) as pool:
        pool.save("a", tiny_rollout(16, seed=1), rollout_id=1)


# --------------------------------------------------------------------------- PostgreSQL


@pytest.fixture
def pg_backend(pg_server) -> Iterator[Backend]:
    chosen = Backend("postgresql", pg_server)
    yield chosen
    chosen.close()


def test_a_stopped_postgresql_writer_is_cut_off_and_fenced(
    tmp_path: Path, pg_backend: Backend, stoppers: list[StoppedChild]
) -> None:
    """The child holds the write lock, stopped. Another process retains, saves and runs GC
    within its busy timeout (the server ends the child's idle session after 1 s). Resumed,
    the child's save fails with a clear error, publishes nothing and rolls itself back;
    everything published before and meanwhile loads."""
    root = tmp_path / "pool"
    _saved_pool(pg_backend, root)
    url = pg_backend.url(root)
    # The holder's busy timeout sets its own bound: 2 s -> its session may idle 1 s.
    child = StoppedChild(root, url, env={"ARCHIVE_MANAGER_BUSY_TIMEOUT_MS": "2000"})
    stoppers.append(child)
    child.wait_stopped()
    with open_on(pg_backend, root, busy_timeout_ms=20_000, chunk_size=8) as pool:
        pool.retain("checkpoint:1", "a")  # waited at most ~1 s, not until the child resumes
        pool.save("c", tiny_rollout(16, seed=3), rollout_id=3)
        code, line = child.resume()
        assert code == 1, line
        assert line.startswith("failed CatalogUnreachableError") and "idle" in line, line
        assert "nothing of it was committed" in line
        with pytest.raises(ArchiveNotFoundError):
            pool.open_archive("b")
        assert sorted(i.name for i in pool.find()) == ["a", "c"]
        assert _leases(pool) == []  # the resumed child rolled its save back itself
        assert pool.verify(read_data=True).ok
        pool.gc(grace=0)
        assert_loads(pool, "a", tiny_rollout(16, seed=1))
        assert_loads(pool, "c", tiny_rollout(16, seed=3))


@pytest.mark.parametrize(
    ("job", "point"), [("gc", "gc.after_unlink"), ("failed-save", "save.rollback.after_unlink")]
)
def test_a_writer_stopped_between_unlinks_keeps_the_lock(
    tmp_path: Path, pg_backend: Backend, stoppers: list[StoppedChild], job: str, point: str
) -> None:
    """A GC, or a failed save rolling its blobs back, stopped between two unlinks of its
    transaction is not cut off by the idle bound (it pinned the lock): were it, another
    writer could make a blob anew that the resumed process then unlinks. It blocks writers
    until it resumes, as on SQLite, then finishes; nothing published is lost."""
    root = tmp_path / "pool"
    with open_on(pg_backend, root, chunk_size=8) as pool:
        pool.save("keep", tiny_rollout(8, seed=1), rollout_id=1)
        pool.save("a", tiny_rollout(16, seed=4), rollout_id=4)
        pool.open_archive("a").release()  # GC has several blobs to unlink
    env = {"ARCHIVE_MANAGER_BUSY_TIMEOUT_MS": "2000"}  # an idle bound of 1 s
    child = StoppedChild(root, pg_backend.url(root), job=job, point=point, seed=5, env=env)
    stoppers.append(child)
    child.wait_stopped()
    time.sleep(idle_in_transaction_timeout_ms(2000) / 1000 * 2.5)
    with open_on(pg_backend, root, busy_timeout_ms=300, chunk_size=8) as pool:
        with pytest.raises(CatalogLockedError):
            pool.retain("checkpoint:1", "keep")
        code, line = child.resume()
        if job == "gc":
            assert (code, line) == (0, "done")
            assert pool.gc(grace=0).blobs == 0  # the resumed GC finished its work
        else:
            assert code == 1 and line.startswith("failed FailpointError"), line
            assert _leases(pool) == []
        pool.retain("checkpoint:1", "keep")
        assert pool.verify(read_data=True).ok
        assert_loads(pool, "keep", tiny_rollout(8, seed=1))


def test_pinned_write_lock_outlives_the_idle_bound(pg_backend: Backend, tmp_path: Path) -> None:
    """A write transaction idle past the bound is ended by the server; one that called
    `pin_write_lock` (as those that unlink blob files do) keeps its lock however long."""
    url = pg_backend.new_url()
    bound = idle_in_transaction_timeout_ms(0) / 1000
    with Catalog.open(url, busy_timeout_ms=0) as catalog:
        with pytest.raises(CatalogError, match="idle inside it") as info, catalog.write() as conn:
            time.sleep(bound + 0.6)
            conn.execute(text("SELECT 1"))
        assert "\n" not in str(info.value)
        with catalog.write() as conn:
            pin_write_lock(conn)
            time.sleep(bound + 0.6)
            assert conn.execute(text("SELECT 1")).scalar() == 1


def test_idle_bound_follows_the_busy_timeout() -> None:
    assert idle_in_transaction_timeout_ms(30_000) == 15_000  # waiters get the lock in time
    assert idle_in_transaction_timeout_ms(300) == 1000  # never below a second
    assert idle_in_transaction_timeout_ms(0) == 1000


# --------------------------------------------------------------------------- SQLite


def test_a_stopped_sqlite_writer_is_named_in_the_locked_error(
    tmp_path: Path, stoppers: list[StoppedChild]
) -> None:
    if not Path("/proc/locks").exists():
        pytest.skip("needs /proc/locks (Linux)")
    root = tmp_path / "pool"
    _saved_pool(Backend("sqlite", None), root)
    child = StoppedChild(root, None)
    stoppers.append(child)
    child.wait_stopped()
    with ArchiveManager.open(root, busy_timeout_ms=300) as pool:
        with pytest.raises(CatalogLockedError, match=r"busy timeout \(300 ms\)") as info:
            pool.retain("checkpoint:1", "a")
        message = str(info.value)
        assert f"held by pid {child.pid} (stopped; " in message, message
        assert f"kill -CONT {child.pid}" in message
        assert "\n" not in message and "python" in message  # its command line
        assert [i.name for i in pool.find()] == ["a"]  # reads go on
    cli = subprocess.run(
        [sys.executable, "-m", "archive_manager.cli", "--root", str(root), "retain", "x:1", "a"],
        capture_output=True,
        text=True,
        env={**os.environ, "ARCHIVE_MANAGER_BUSY_TIMEOUT_MS": "300"},
        timeout=60,
    )
    assert cli.returncode == 1
    lines = cli.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    assert f"pid {child.pid} (stopped; " in lines[0]
    code, line = child.resume()  # SQLite never took the lock away: the save finishes
    assert (code, line) == (0, "done")
    with ArchiveManager.open(root) as pool:
        pool.retain("checkpoint:1", "a")
        assert_loads(pool, "b", tiny_rollout(24, seed=2))
        assert pool.verify(read_data=True).ok


def test_lock_table_parsing() -> None:
    shm, db = (0xFE, 0x00, 2146994), (0xFE, 0x00, 2146962)
    table = "\n".join(
        [
            "1: POSIX  ADVISORY  WRITE 7323 fe:00:2146994 120 120",  # the WAL write lock
            "2: POSIX  ADVISORY  READ 7323 fe:00:2146994 124 124",
            "3: POSIX  ADVISORY  READ 7400 fe:00:2146994 128 128",  # a reader: holds nothing
            "4: POSIX  ADVISORY  WRITE 7401 fe:00:2146994 121 121",  # a checkpointer
            "4: -> POSIX  ADVISORY  WRITE 7402 fe:00:2146994 120 120",  # waiting: holds nothing
            "5: POSIX  ADVISORY  WRITE 7500 fe:00:999 120 120",  # another file
            "6: FLOCK  ADVISORY  WRITE 7600 fe:00:2146994 0 EOF",
            "7: POSIX  ADVISORY  WRITE 7700 fe:01:2146994 0 EOF",  # same inode, other device
            "8: POSIX  ADVISORY  WRITE 7800 fe:00:2146962 1073741825 1073741825",  # rollback mode
            "garbage",
        ]
    )
    assert parse_lock_table(table, shm, db) == [7323, 7800]
    assert parse_lock_table("1: POSIX  ADVISORY  WRITE 42 fe:00:2146994 0 EOF", shm, db) == [42]
    assert parse_lock_table(table, None, None) == []


def test_locked_message_without_a_named_holder_says_how_to_find_it() -> None:
    message = sqlite_locked_message("/p/catalog.db", 300, "database is locked", [])
    assert "busy timeout (300 ms)" in message
    assert "fuser -v /p/catalog.db-shm" in message and "lsof /p/catalog.db-shm" in message
    running = sqlite_locked_message(
        "/p/catalog.db", 300, "database is locked", [LockHolder(12, "gc --yes", stopped=False)]
    )
    assert "held by pid 12 (gc --yes); wait for it to finish" in running
    assert "kill -CONT" not in running
