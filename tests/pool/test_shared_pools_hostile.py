"""Hostile review of issue 21 (read-only readers and group-shared writers): each test is a
claim of docs/architecture.md "Shared pools" / the README that the current code breaks."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from _sharing import child_env, tree
from click.testing import CliRunner
from helpers import TINY_ROLLOUT

from archive_manager import ArchiveManager
from archive_manager.cli import cli
from archive_manager.errors import CatalogError, PoolNotFoundError, ReadOnlyPoolError
from archive_manager.interop.synthetic import make_rollout

_CRASHING_WRITER = """
import os, sys
from archive_manager import ArchiveManager
from archive_manager.interop.synthetic import make_rollout
kw = dict(prompt_len=8, response_min=4, response_max=12, group_size=2)
pool = ArchiveManager.open(sys.argv[1])
pool.save("first", make_rollout(6, seed=1, **kw), rollout_id=1)
pool.save("second", make_rollout(6, seed=2, **kw), rollout_id=2)
os._exit(0)  # killed: the catalog's -wal (with commits) and -shm stay behind
"""


def _crashed_writer_pool(root: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", _CRASHING_WRITER, str(root)],
        env=child_env(),
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert (root / "catalog.db-wal").stat().st_size > 32
    assert (root / "catalog.db-shm").exists()


def test_read_only_reader_rewrites_the_shm_a_crashed_writer_left(tmp_path: Path) -> None:
    """Claim 1/2 (a read-only open writes nothing, the pool stays byte-identical): a writer
    that died (OOM-killed training job) leaves catalog.db-wal and catalog.db-shm.  A reader
    opened with ``read_only=True`` on the writable pool (an analyst who asked not to touch
    it, a ZFS/LVM snapshot mounted read-write, a backup being taken) uses ``mode=ro``, whose
    SQLite still opens the -shm read-write and rebuilds the wal-index in it (and writes its
    read marks): the pool's bytes change.  Matters because the docs promise "not even a
    -wal/-shm" and a backup tool comparing checksums sees the pool change under a reader.
    Fix: open the ``ro`` mode with ``readonly_shm=1`` (SQLite then keeps the index in
    heap memory when no writer is live) or use ``immutable=1`` when no process holds the
    -shm lock (probe with `sqlite_lock_holders`)."""
    root = tmp_path / "pool"
    _crashed_writer_pool(root)
    before = tree(root)
    with ArchiveManager.open(root, read_only=True) as pool:
        assert pool.read_only
        # Every commit is in the dead writer's -wal: the reader must see them all.
        assert sorted(i.name for i in pool.find()) == ["first", "second"]
        assert len(pool.open_archive("second").load_samples()) == 6
    after = tree(root)
    changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
    assert changed == [], f"a read-only open changed {changed}"
    # The writable open that comes later still recovers the log the reader left alone.
    with ArchiveManager.open(root, create=False) as pool:
        assert sorted(i.name for i in pool.find()) == ["first", "second"]


class _WalIndexBusyOnce:
    """A sqlite3 connection whose first read answers as a read-only wal-index does while a
    live writer rewrites it (SQLITE_READONLY_CANTINIT)."""

    def __init__(self, real: sqlite3.Connection, code: int) -> None:
        self.real, self.code, self.failures = real, code, 0

    @property
    def in_transaction(self) -> bool:
        return self.real.in_transaction

    def execute(self, sql: str) -> sqlite3.Cursor:
        if sql.startswith("PRAGMA") and self.failures == 0:
            self.failures += 1
            exc = sqlite3.OperationalError("attempt to write a readonly database")
            exc.sqlite_errorcode = self.code  # type: ignore[attr-defined]
            raise exc
        return self.real.execute(sql)


@pytest.mark.parametrize("code", [8 | (1 << 8), 8 | (5 << 8)])
def test_a_reader_retries_a_wal_index_a_live_writer_is_rewriting(tmp_path: Path, code: int) -> None:
    """A reader whose -shm is read-only (`reader_uri`) cannot fix the wal-index itself, and
    SQLite answers SQLITE_READONLY_RECOVERY / _CANTINIT when a read starts while a live writer
    rewrites it (measured: about 1 read in 30,000 beside a writer committing without pause).
    `begin_read_snapshot` retries at BEGIN, before the caller read anything; a persistent one
    is a CatalogError naming the -shm, never the ReadOnlyPoolError of a refused write."""
    from archive_manager.catalog.dialects.sqlite import begin_read_snapshot

    database = tmp_path / "c.db"
    sqlite3.connect(database).close()
    real = sqlite3.connect(database, isolation_level=None)
    flaky = _WalIndexBusyOnce(real, code)
    begin_read_snapshot(flaky, str(database), 1000)  # type: ignore[arg-type]
    assert flaky.failures == 1 and real.in_transaction
    real.execute("ROLLBACK")

    class Always(_WalIndexBusyOnce):
        def execute(self, sql: str) -> sqlite3.Cursor:
            self.failures = 0
            return super().execute(sql)

    with pytest.raises(CatalogError, match="-shm") as info:
        begin_read_snapshot(Always(real, code), str(database), 50)  # type: ignore[arg-type]
    assert not isinstance(info.value, ReadOnlyPoolError)
    assert not real.in_transaction
    real.close()


def test_a_reader_opens_again_when_the_last_writer_closed_meanwhile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The -wal and -shm seen when the reader chose ``mode=ro`` are deleted when the last
    writer closes; a read-only -shm is not created again, so SQLite answers CANTOPEN (seen
    with two threads creating one pool: test_compat's save race).  `connect_reader` chooses
    the mode anew (the main file now holds every commit).  Known residue of that instant:
    SQLite's WAL open creates an empty -wal in a writable folder before -shm fails (0 bytes,
    no commit: every open, a reader's included, takes it for none); never a -shm."""
    from archive_manager._util import sqlite_read as dialect

    database = tmp_path / "c.db"
    with sqlite3.connect(database) as conn:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("CREATE TABLE t (x)")
    conn.close()
    before = tree(tmp_path)
    real = dialect.sqlite_read_mode
    answers = iter(["ro"])  # as chosen while the writer still had its files open
    monkeypatch.setattr(dialect, "sqlite_read_mode", lambda p: next(answers, None) or real(p))
    reader = dialect.connect_reader(str(database), 1000)
    try:
        assert reader.read_mode == "immutable"
        assert reader.execute("SELECT count(*) FROM t").fetchone() == (0,)
    finally:
        reader.close()
    after = tree(tmp_path)
    assert {k: v for k, v in after.items() if k != "."} == {
        **{k: v for k, v in before.items() if k != "."},
        "c.db-wal": after["c.db-wal"],
    }
    assert (tmp_path / "c.db-wal").stat().st_size == 0


def test_verify_misses_an_identity_file_the_group_cannot_read(tmp_path: Path) -> None:
    """Claim 4 (verify notices what would lock a member out): in a group-shared pool, an
    identity file (archive-pool.json, or its spare under blobs/) the group cannot read locks
    every other member out (`read_identity` raises PoolIdentityError "cannot read the pool
    identity file"), e.g. after a member with umask 077 ran `rebind` or an open that wrote
    a lost identity back.  `shared_problems` only looks at folders and the catalog files, so
    `verify` says nothing.  Fix: check the identity file(s) (and any non-blob regular file
    a member must read) for the group and group-read in `shared_problems`."""
    root = tmp_path / "pool"
    with ArchiveManager.open(root) as pool:
        pool.save("first", make_rollout(6, seed=1, **TINY_ROLLOUT), rollout_id=1)  # type: ignore[arg-type]
        pool.share_with_group(os.getgid())
        assert pool.verify().notices == []
        (root / "archive-pool.json").chmod(0o600)  # the group may not read it
        notices = [n.message for n in pool.verify().notices if n.kind == "permissions"]
    assert any("archive-pool.json" in m for m in notices), notices
    result = CliRunner().invoke(cli, ["--root", str(root), "verify"])
    assert "archive-pool.json" in result.output, result.output
    assert "init --shared-group" in result.output, result.output  # the command that fixes it
    # The spare identity and the journal's files are read by every member too.
    records = sorted((root / "journal").iterdir())
    assert records, "the save wrote no journal record"
    for path in (root / "blobs" / ".archive-pool.json", records[0]):
        path.chmod(0o600)
    with ArchiveManager.open(root) as pool:
        notices = [n.message for n in pool.verify().notices if n.kind == "permissions"]
        assert len(notices) == 1 and "3 file(s)" in notices[0], notices
        assert ".archive-pool.json" in notices[0] and records[0].name in notices[0], notices
        # What the notice tells to run fixes it.
        pool.share_with_group(os.getgid())
        assert pool.verify().notices == []
        # Others may read but the group may not (0604): POSIX reads a member of the file's
        # group by the group bits alone, so members are locked out all the same.
        (root / "archive-pool.json").chmod(0o604)
        notices = [n.message for n in pool.verify().notices if n.kind == "permissions"]
        assert len(notices) == 1 and "archive-pool.json" in notices[0], notices


def test_a_read_only_postgresql_database_is_not_detected_as_read_only(
    tmp_path: Path, pg_server: Any
) -> None:
    """Claim 1 (a pool the process cannot write is detected and opened read-only, reported
    as such by ``info``/``pool.read_only``): analysts are pointed at a PostgreSQL hot standby
    (a read replica) or a database set ``default_transaction_read_only``; the role holds
    every privilege, so `_server_role_unwritable` answers "writable" and the pool opens as a
    writer (``read_only`` False, ``info`` says read-write).  A save there is still refused
    with ReadOnlyPoolError by the server-error translation and changes nothing (checked
    first below, passes); what fails is the detection, so a tool that picks read-only
    behaviour from ``pool.read_only`` (the viewer's controls, a CLI that hides write verbs)
    is misled.  Fix: also ask the server (``SHOW transaction_read_only``,
    ``pg_is_in_recovery()``) when deciding read-only in `Catalog.open`."""
    import psycopg

    url = pg_server.create_database()
    database = url.rsplit("/", 1)[-1]
    root = tmp_path / "pool"
    try:
        with ArchiveManager.open(root, url) as pool:
            pool.save("first", make_rollout(6, seed=1, **TINY_ROLLOUT), rollout_id=1)  # type: ignore[arg-type]
        with psycopg.connect(
            host=pg_server.host,
            port=pg_server.port,
            user="postgres",
            dbname="postgres",
            autocommit=True,
        ) as conn:
            conn.execute(f'ALTER DATABASE "{database}" SET default_transaction_read_only = on')  # type: ignore[arg-type]
        with ArchiveManager.open(root, url, create=False) as reader:
            assert len(reader.open_archive("first").load_samples()) == 6
            before = tree(root)
            try:
                reader.save("second", make_rollout(6, seed=2, **TINY_ROLLOUT), rollout_id=2)  # type: ignore[arg-type]
                refused: object = "NOT REFUSED"
            except Exception as exc:  # what the user gets is the point
                refused = exc
            changed = sorted(k for k, v in tree(root).items() if before.get(k) != v)
            assert isinstance(refused, ReadOnlyPoolError) and changed == [], (
                f"save on a read-only database: {refused!r}; the blob root changed: {changed}"
            )
            assert reader.read_only, "a read-only database opened as a writer"
            assert "default_transaction_read_only" in (reader.read_only_reason or "")
        # What 'archive-manager info' shows (the CLI opens the pool as detected).
        shown = CliRunner().invoke(cli, ["--root", str(root), "--catalog-url", url, "info"])
        assert shown.exit_code == 0, shown.output
        assert "read-only (the catalog database or role is set read-only" in shown.output
    finally:
        with psycopg.connect(
            host=pg_server.host,
            port=pg_server.port,
            user="postgres",
            dbname="postgres",
            autocommit=True,
        ) as conn:
            conn.execute(f'ALTER DATABASE "{database}" RESET default_transaction_read_only')  # type: ignore[arg-type]
        pg_server.drop_database(url)


def test_a_wal_without_shm_is_reported_as_no_pool_to_a_reader(tmp_path: Path) -> None:
    """Claim 3 (a reader of a catalog with a -wal but no -shm is refused clearly, with
    `sqlite_read_mode`'s message): a killed writer whose -shm was then lost (a backup or
    rsync that skipped it, a tmp cleaner) leaves every commit in catalog.db-wal.  The read-only
    open first asks `exists`, whose probe opens the main file ``immutable=1`` (it picks
    ``immutable`` whenever -shm is missing, ignoring a -wal with commits), finds no tables
    there and answers PoolNotFoundError "no pool at ... (a read-only open never creates
    one)": the analyst is told the pool does not exist.  Fix: make `probe_sqlite_catalog` use
    `sqlite_read_mode` (raise its CatalogError) instead of its own ``wal and shm`` rule."""
    root = tmp_path / "pool"
    _crashed_writer_pool(root)
    (root / "catalog.db-shm").unlink()
    before = tree(root)
    try:
        ArchiveManager.open(root, read_only=True).close()
        got: object = "opened"
    except Exception as exc:  # which error the reader gets is the point
        got = exc
    assert not isinstance(got, PoolNotFoundError), f"the reader was told: {got}"
    assert isinstance(got, CatalogError) and "-shm" in str(got), repr(got)
    assert "write access" in str(got), str(got)  # what to do about it
    changed = sorted(k for k, v in tree(root).items() if before.get(k) != v)
    assert changed == [] and set(tree(root)) == set(before), f"the refused reader wrote {changed}"


def test_a_wal_without_shm_makes_a_writable_pool_vanish_for_the_cli(tmp_path: Path) -> None:
    """Claim 3 (same refusal, the writable side): on the writer's own, writable pool in that
    state, ``archive-manager ls`` (create=False, so `exists` asks the probe first) says
    "no pool at ...; create one with 'archive-manager init'", though a writable open would
    simply recover the WAL.  An operator told the pool is gone after a crash may re-init or
    delete it.  Fix: as above; the probe must read through (or refuse) a -wal with commits."""
    root = tmp_path / "pool"
    _crashed_writer_pool(root)
    (root / "catalog.db-shm").unlink()
    result = CliRunner().invoke(cli, ["--root", str(root), "ls"])
    assert "no pool" not in result.output, result.output
    assert result.exit_code == 0, result.output
    assert "first" in result.output and "second" in result.output, result.output
    # The writable open recovered the log: a reader reads the pool again.
    with ArchiveManager.open(root, read_only=True) as reader:
        assert sorted(i.name for i in reader.find()) == ["first", "second"]


def test_init_on_a_pool_whose_writer_died_and_lost_its_shm(tmp_path: Path) -> None:
    """'init' (which asks whether a pool exists before it opens one) on the same state: it
    finds the pool ("already exists"), never makes a second one over it; '--read-only ls'
    there is refused naming the -shm, and writes nothing."""
    root = tmp_path / "pool"
    _crashed_writer_pool(root)
    (root / "catalog.db-shm").unlink()
    before = tree(root)
    refused = CliRunner().invoke(cli, ["--root", str(root), "--read-only", "ls"])
    assert refused.exit_code != 0 and "-shm" in refused.output, refused.output
    assert "no pool" not in refused.output, refused.output
    assert tree(root) == before
    result = CliRunner().invoke(cli, ["--root", str(root), "init"])
    assert result.exit_code == 0, result.output
    assert "pool already exists" in result.output, result.output
    with ArchiveManager.open(root, create=False) as pool:
        assert sorted(i.name for i in pool.find()) == ["first", "second"]


_WRITER_WITH_A_READER = """
import os, subprocess, sys
from archive_manager import ArchiveManager
from archive_manager.interop.synthetic import make_rollout
kw = dict(prompt_len=8, response_min=4, response_max=12, group_size=2)
root = sys.argv[1]
writer = ArchiveManager.open(root)
writer.save("first", make_rollout(6, seed=1, **kw), rollout_id=1)
# The training job opens a read-only view of its own pool (an eval hook, a DataLoader).
ArchiveManager.open(root, read_only=True).close()
# An analyst's 'archive-manager ls' opens and closes the catalog meanwhile.
subprocess.run([sys.executable, "-m", "archive_manager.cli", "--root", root, "ls"],
               check=True, capture_output=True)
writer.save("second", make_rollout(6, seed=2, **kw), rollout_id=2)
print("saved", flush=True)
os._exit(0)  # the job is killed after its save returned
"""


def test_a_read_only_open_beside_a_live_writer_loses_the_writers_commits(
    tmp_path: Path,
) -> None:
    """Claim 3 (a reader beside an active writer on the same machine never sees two states)
    and durability: opening the pool read-only in the writer's own process (an eval hook, a
    DataLoader in the training job) reads catalog.db with plain open()/close() (the probe
    behind `exists` and `_refuse_foreign_sqlite`); POSIX drops every fcntl lock the process
    holds on a file when any descriptor of it is closed (sqlite.org/howtocorrupt.html 2.2),
    so the writer's WAL SHARED lock is gone.  The next process that closes the catalog (any
    `ls`) believes it is the last, checkpoints and deletes -wal/-shm under the live writer,
    whose later commits land in an unlinked WAL: other processes never see them, and a
    crash loses a save that returned.  (A second writable open in one process does the same:
    the probe predates issue 21, the read-only path now runs it for every reader.)  Fix: read
    the header through the SQLite connection (or os.pread on a descriptor kept open for the
    process's lifetime, as SQLite's unixInodeInfo does), never open()/close() the catalog
    file beside a live connection."""
    root = tmp_path / "pool"
    done = subprocess.run(
        [sys.executable, "-c", _WRITER_WITH_A_READER, str(root)],
        env=child_env(),
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0 and "saved" in done.stdout, done.stderr
    with ArchiveManager.open(root, create=False) as pool:
        names = [i.name for i in pool.find()]
    assert names == ["first", "second"], f"a save that returned was lost: {names}"


_LIST_READ_ONLY = (
    "import sys; from archive_manager import ArchiveManager as A; "
    "p = A.open(sys.argv[1], read_only=True); print(sorted(i.name for i in p.find()))"
)


def test_a_symlinked_catalog_hides_a_live_writers_commits_from_readers(tmp_path: Path) -> None:
    """Claim 3 (a reader sees the last commit before its read began, through the writer's
    WAL; docs "Shared pools", `sqlite_read_mode`): operators put catalog.db on faster storage
    and leave a symlink in the pool.  SQLite follows the link and keeps -wal/-shm beside the
    target, but `sqlite_read_mode` (and the probe) look for ``<link>-wal``, find none and open
    the target ``immutable=1``: the reader ignores the live writer's WAL, so every commit
    since the last checkpoint is invisible (up to ~1000 pages), and as ``immutable`` it reads
    the main file while the writer checkpoints into it.  Fix: resolve the catalog path
    (os.path.realpath) before looking for its -wal/-shm, in the reader engine and the probe
    alike (or refuse a symlinked catalog)."""
    root, elsewhere = tmp_path / "pool", tmp_path / "fast"
    root.mkdir()
    elsewhere.mkdir()
    (root / "catalog.db").symlink_to(elsewhere / "catalog.db")
    with ArchiveManager.open(root) as pool:
        pool.save("first", make_rollout(6, seed=1, **TINY_ROLLOUT), rollout_id=1)  # type: ignore[arg-type]
    with ArchiveManager.open(root) as writer:  # the training job, live
        writer.save("second", make_rollout(6, seed=2, **TINY_ROLLOUT), rollout_id=2)  # type: ignore[arg-type]
        assert (elsewhere / "catalog.db-wal").exists()
        done = subprocess.run(
            [sys.executable, "-c", _LIST_READ_ONLY, str(root)],
            env=child_env(),
            capture_output=True,
            text=True,
            check=False,
        )
    assert done.returncode == 0, done.stderr[-500:]
    assert done.stdout.strip() == "['first', 'second']", (
        f"the reader missed a commit of the live writer: {done.stdout.strip()}"
    )


@pytest.mark.parametrize("verb", ["current", "upgrade"])
def test_db_verbs_recover_a_wal_without_shm_when_they_may_write(tmp_path: Path, verb: str) -> None:
    """'db current' and 'db upgrade' (what an operator runs first after upgrading) on a pool
    whose writer died and lost its -shm: with write access they recover the log as any
    writable verb does, instead of repeating the reader's refusal."""
    root = tmp_path / "pool"
    _crashed_writer_pool(root)
    (root / "catalog.db-shm").unlink()
    result = CliRunner().invoke(cli, ["--root", str(root), "db", verb])
    assert result.exit_code == 0, result.output
    assert "-shm" not in result.output, result.output
    with ArchiveManager.open(root, read_only=True) as reader:
        assert sorted(i.name for i in reader.find()) == ["first", "second"]
