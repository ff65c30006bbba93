"""The SQLite listing (`pool/sqlite_listing.py`, `read_listing`): ``ls`` read with sqlite3 gives exactly
what the full open's `ArchiveManager.find` and `payload_reclaimed` give, and answers nothing
(None: the full open decides) whenever the pool is not plainly as an open would leave it; it
never writes to the pool (docs/architecture/start-up.md, "Start-up").
"""

from __future__ import annotations

import json
import os
import random
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from _sharing import child_env, read_only_mount_command, require_mount_namespace, tree
from click.testing import CliRunner, Result
from helpers import small_rollout

from archive_manager import ArchiveManager
from archive_manager._util.constants import HEAD_REVISION, UNINDEXED_BLOBS, VERSION_TABLE
from archive_manager.cli import cli
from archive_manager.errors import ArchiveError
from archive_manager.pool import sqlite_listing as _sqlite_listing
from archive_manager.pool.sqlite_listing import read_listing

pytestmark = pytest.mark.timeout(600)

# A save killed after its ownership commit: a pending row, and a dead writer's -wal and -shm.
KILLED_SAVE = """
import sys
from archive_manager import ArchiveManager
from archive_manager.interop.synthetic import make_rollout
pool = ArchiveManager.open(sys.argv[1])
pool.save(sys.argv[2], make_rollout(2, seed=1, prompt_len=4, response_min=2, response_max=4),
          rollout_id=int(sys.argv[3]))
"""


def _killed_save(root: Path, name: str, rollout_id: int) -> None:
    done = subprocess.run(
        [sys.executable, "-c", KILLED_SAVE, str(root), name, str(rollout_id)],
        env=child_env(ARCHIVE_MANAGER_FAILPOINTS="save.manifest.after_write=kill"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == -9, done.stderr


def _build(root: Path, seed: int) -> list[str]:
    """A pool of published archives, released ones with and without their payload (GC
    reclaimed it), several archives per rollout id, some without one, evaluation or not, and
    pending saves; plainly as an open leaves it.  Returns every archive's name."""
    rng = random.Random(seed)
    names = []
    with ArchiveManager.open(root) as pool:
        for i in range(24):
            rollout_id = rng.choice([None, 0, 1, 1, 2, 3, 3, 3, 5, 8, -2])
            name = rng.choice(["r", "eval", "B", "z"]) + f"-{i:02d}"
            pool.save(
                name,
                small_rollout(rng.randint(1, 3), seed=seed * 100 + i),
                rollout_id=rollout_id,
                evaluation=rng.random() < 0.3,
            )
            names.append(name)
        rng.shuffle(names)
        pool.release(names[:5])
        pool.gc(grace=0)  # these five lose their payload
        pool.release(names[5:9])  # these keep it until the next GC
        # Names saved again, their earlier archives superseded beside the current one: one
        # whose payload gc reclaimed (a plain save takes it back), one twice (supersede=True).
        pool.save(names[0], small_rollout(2, seed=seed * 100 + 50), rollout_id=3)
        for k in range(2):
            again = small_rollout(1, seed=seed * 100 + 60 + k)
            pool.save(names[6], again, rollout_id=3, supersede=True)
            if k == 0:
                pool.release([names[6]])
    for i in range(2):
        _killed_save(root, f"pending-{i}", rng.choice([1, 3]))
        names.append(f"pending-{i}")
    ArchiveManager.open(root).close()  # the dead writers' logs recovered: a plain pool
    # One released archive caught by a GC between marking a blob and unlinking it.
    _sql(
        root,
        "UPDATE blobs SET state = 'deleting' WHERE digest = (SELECT digest FROM archive_blobs "
        f"WHERE archive_id = (SELECT id FROM archives WHERE name = '{names[5]}') LIMIT 1)",
    )
    assert not (root / "catalog.db-wal").exists()
    return names


def _full(root: Path, **filters: Any) -> tuple[list[Any], set[str]]:
    with ArchiveManager.open(root, create=False) as pool:
        found = pool.find(**filters)
        return found, pool.payload_reclaimed([i.name for i in found if i.state == "released"])


def _random_filters(rng: random.Random, names: list[str]) -> dict[str, Any]:
    filters: dict[str, Any] = {}
    pick = rng.random
    if pick() < 0.5:
        low, high = rng.randint(-3, 9), rng.randint(-3, 9)
        filters["rollout_id"] = rng.choice(
            [low, (low, None), (None, high), (min(low, high), max(low, high)), range(low, 9)]
        )
    if pick() < 0.3:
        filters["evaluation"] = rng.random() < 0.5
    filters["state"] = rng.choice(["published", "released", "pending", "superseded", None])
    if pick() < 0.4:
        filters["limit"] = rng.randint(0, 6)
    if pick() < 0.4:
        filters["after"] = rng.choice(names)
    if pick() < 0.2:
        filters["task_key"] = rng.choice(["0", "1", "nope"])
    return filters


@pytest.fixture(scope="module")
def pools(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[Path, list[str]]]:
    made = []
    for seed in (1, 2, 3):
        root = tmp_path_factory.mktemp(f"listing-{seed}") / "pool"
        made.append((root, _build(root, seed)))
    return made


def test_the_listing_is_finds_over_random_pools(pools: list[tuple[Path, list[str]]]) -> None:
    rng = random.Random(7)
    answered = 0
    for root, names in pools:
        states = {i.state for i in _full(root, state=None)[0]}
        assert states == {"published", "released", "pending", "superseded"}
        reclaimed_somewhere = False
        for _ in range(60):
            filters = _random_filters(rng, names)
            before = tree(root)
            fast = read_listing(root, None, **filters)
            assert tree(root) == before  # the listing never writes
            try:
                full = _full(root, **filters)
            except ArchiveError:
                # A refused filter, an --after naming no archive: the open's error stands.
                assert fast is None, filters
                continue
            assert fast is not None, filters  # a plain pool: sqlite3 answers
            assert (fast.archives, fast.reclaimed) == full, filters
            reclaimed_somewhere |= bool(fast.reclaimed)
            answered += 1
        assert reclaimed_somewhere
    assert answered > 150


def _ls(root: Path, args: list[str], *, full: bool, monkeypatch: pytest.MonkeyPatch) -> Result:
    with monkeypatch.context() as patch:
        if full:
            patch.setattr(_sqlite_listing, "read_listing", lambda *a, **k: None)
        else:
            real = _sqlite_listing.read_listing

            def answering(*a: Any, **k: Any) -> Any:
                found = real(*a, **k)
                assert found is not None or "--after" in args or "--rollout-id" in args
                return found

            patch.setattr(_sqlite_listing, "read_listing", answering)
        return CliRunner().invoke(cli, ["--root", str(root), "ls", *args])


def _random_args(rng: random.Random, names: list[str]) -> list[str]:
    args: list[str] = []
    if rng.random() < 0.5:
        low, high = rng.randint(-3, 9), rng.randint(-3, 9)
        args += ["--rollout-id", rng.choice([f"{low}", f"{low}..{high}", f"{low}..", f"..{high}"])]
    if rng.random() < 0.3:
        args.append(rng.choice(["--evaluation", "--no-evaluation"]))
    args += ["--state", rng.choice(["published", "released", "pending", "superseded", "all"])]
    if rng.random() < 0.4:
        args += ["--limit", str(rng.randint(0, 6))]
    if rng.random() < 0.4:
        args += ["--after", rng.choice([*names, "r-O1"])]  # r-O1: no such archive
    if rng.random() < 0.2:
        args += ["--since", rng.choice(["1d", "2000-01-01", "2999-01-01"])]
    if rng.random() < 0.2:
        args += ["--task-key", rng.choice(["0", "nope"])]
    args += rng.choice([[], ["--json"], ["--format", "ndjson"], ["--format", "csv"]])
    return args


def test_ls_prints_byte_for_byte_what_the_full_path_prints(
    pools: list[tuple[Path, list[str]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = random.Random(11)
    for root, names in pools:
        for _ in range(40):
            args = _random_args(rng, names)
            fast = _ls(root, args, full=False, monkeypatch=monkeypatch)
            full = _ls(root, args, full=True, monkeypatch=monkeypatch)
            assert (fast.exit_code, fast.stdout, fast.stderr) == (
                full.exit_code,
                full.stdout,
                full.stderr,
            ), args


# --------------------------------------------------------------------------- hostile pools


@pytest.fixture
def plain(tmp_path: Path) -> Path:
    root = tmp_path / "pool"
    with ArchiveManager.open(root) as pool:
        for i in range(4):
            pool.save(f"r-{i}", small_rollout(2, seed=i), rollout_id=i)
    assert read_listing(root, None) is not None
    return root


def _refused(root: Path, catalog_url: str | None = None, **filters: Any) -> None:
    """The listing leaves the pool to the full open, and wrote nothing to it."""
    before = tree(root)
    assert read_listing(root, catalog_url, **filters) is None
    assert tree(root) == before


def _sql(root: Path, *statements: str) -> None:
    with sqlite3.connect(root / "catalog.db") as conn:
        for statement in statements:
            conn.execute(statement)
    conn.close()


def test_a_catalog_backup_restored_under_the_pool(plain: Path) -> None:
    backup = plain.parent / "backup.db"
    shutil.copy2(plain / "catalog.db", backup)
    with ArchiveManager.open(plain) as pool:
        pool.release(["r-1"])  # a decision the backup lacks: a journal record past it
    shutil.copy2(backup, plain / "catalog.db")
    _refused(plain)
    # The open's own answer then stands (it also moves the counter past the journal).
    assert [i.name for i in _full(plain)[0]] == ["r-0", "r-1", "r-2", "r-3"]


def test_a_catalog_of_another_pool(plain: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    with ArchiveManager.open(other) as pool:
        pool.save("x-0", small_rollout(2, seed=9), rollout_id=0)
    shutil.copy2(other / "catalog.db", plain / "catalog.db")
    _refused(plain)
    done = CliRunner().invoke(cli, ["--root", str(plain), "ls"])
    assert done.exit_code == 1 and "belongs to" in done.stderr and "x-0" not in done.stdout
    # And the other way round: a catalog URL naming that other pool's catalog.
    _refused(plain, f"sqlite:///{other / 'catalog.db'}")


def test_a_catalog_mid_migration_or_of_another_revision(plain: Path) -> None:
    _sql(plain, f"UPDATE {VERSION_TABLE} SET version_num = '0007'")
    _refused(plain)
    _sql(plain, f"UPDATE {VERSION_TABLE} SET version_num = '9999'")
    _refused(plain)
    done = CliRunner().invoke(cli, ["--root", str(plain), "ls"])
    assert done.exit_code == 1 and "9999" in done.stderr
    _sql(plain, f"UPDATE {VERSION_TABLE} SET version_num = '{HEAD_REVISION}'")
    _sql(plain, "UPDATE pool_info SET value = '2' WHERE key = 'format_version'")
    _refused(plain)


def test_a_migration_in_progress_is_not_seen_half_done(plain: Path) -> None:
    # A migration runs in one write transaction: until it commits, readers see the old
    # revision and tables; the listing reads one snapshot of the committed state.
    writer = sqlite3.connect(plain / "catalog.db", isolation_level=None)
    try:
        writer.execute("BEGIN IMMEDIATE")
        writer.execute(f"UPDATE {VERSION_TABLE} SET version_num = '9999'")
        writer.execute("DELETE FROM archives WHERE name = 'r-2'")
        found = read_listing(plain, None)
        assert found is not None and [i.name for i in found.archives] == [
            "r-0",
            "r-1",
            "r-2",
            "r-3",
        ]
        writer.execute("COMMIT")
    finally:
        writer.close()
    _refused(plain)  # committed: a revision this library does not know


def test_identity_files_moved_pools_and_rebuilds(plain: Path, tmp_path: Path) -> None:
    identity = plain / "archive-pool.json"
    saved = identity.read_bytes()
    identity.unlink()
    _refused(plain)  # the open would write it again
    identity.write_bytes(b"{not json")
    _refused(plain)  # the open refuses it, in its own words
    identity.write_bytes(saved)
    spare = plain / "blobs" / ".archive-pool.json"
    spare_bytes = spare.read_bytes()
    spare.unlink()
    _refused(plain)
    spare.write_bytes(spare_bytes)
    assert read_listing(plain, None) is not None
    moved = tmp_path / "moved"
    plain.rename(moved)
    _refused(moved)  # the catalog records the old root: the open follows the move
    moved.rename(plain)
    _sql(plain, f"INSERT INTO pool_info (key, value) VALUES ('{UNINDEXED_BLOBS}', '1')")
    _refused(plain)


def test_journal_ahead_or_not_a_folder(plain: Path) -> None:
    journal = plain / "journal"
    ahead = journal / f"{int(time.time() * 1e6) + 10**6:020d}-{'0' * 32}.rec"
    ahead.write_bytes(b"")
    _refused(plain)
    ahead.unlink()
    assert read_listing(plain, None) is not None
    journal.rename(plain / "journal-real")
    journal.symlink_to(plain / "journal-real")
    _refused(plain)


def test_catalogs_it_leaves_to_the_open(plain: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    catalog = plain / "catalog.db"
    _refused(plain, f"sqlite:///{catalog}?timeout=5")
    _refused(plain, "postgresql+psycopg://nobody@localhost/none")
    assert read_listing("s3://bucket/pool", f"sqlite:///{catalog}") is None
    assert read_listing(plain, f"sqlite:///{catalog}") is not None  # plain URL: answered
    _refused(plain, after="no-such-archive")  # the open's "not found; did you mean"
    _refused(plain, rollout_id="3")  # a refused filter: the open comes first, then its error
    # A hot rollback journal beside the file, and a file not in WAL mode.
    journal = plain / "catalog.db-journal"
    journal.write_bytes(b"\0" * 512)
    _refused(plain)
    journal.unlink()
    _sql(plain, "PRAGMA journal_mode = DELETE")
    _refused(plain)
    _sql(plain, "PRAGMA journal_mode = WAL")
    assert read_listing(plain, None) is not None
    # A catalog on a networked filesystem: the open refuses it.
    monkeypatch.setattr(
        _sqlite_listing,
        "read_mount_table",
        lambda: f"1 0 0:1 / {os.path.realpath(plain)} rw - nfs4 srv:/x rw\n",
    )
    _refused(plain)


def test_an_immutable_read_of_a_file_that_changed_meanwhile(
    plain: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No -wal: read as an unchanging file; a writer that opened it meanwhile voids the read.
    monkeypatch.setattr(_sqlite_listing, "file_stamp", lambda database: (0, 0, 0, 0))
    _refused(plain)


def test_a_dead_writers_log_is_read_without_writing(plain: Path) -> None:
    _killed_save(plain, "pending-0", 2)
    assert (plain / "catalog.db-wal").exists() and (plain / "catalog.db-shm").exists()
    before = tree(plain)
    found = read_listing(plain, None, state=None)
    assert tree(plain) == before  # not even the wal-index rebuilt
    assert found is not None
    assert [i.name for i in found.archives] == ["r-0", "r-1", "pending-0", "r-2", "r-3"]
    assert (found.archives, found.reclaimed) == _full(plain, state=None)
    # Its log without the -shm: only a writer can recover it, so the open decides.
    _killed_save(plain, "pending-1", 2)
    (plain / "catalog.db-shm").unlink()
    _refused(plain)


LIVE_WRITER = """
import sys
from archive_manager import ArchiveManager
from archive_manager.interop.synthetic import make_rollout
with ArchiveManager.open(sys.argv[1]) as pool:
    for i in range(int(sys.argv[2])):
        pool.save(f"w-{i:03d}", make_rollout(2, seed=i, prompt_len=4, response_min=2,
                  response_max=4), rollout_id=100 + i)
"""


def test_beside_a_live_writer_every_listing_is_one_committed_state(plain: Path) -> None:
    writer = subprocess.Popen(
        [sys.executable, "-c", LIVE_WRITER, str(plain), "60"], env=child_env()
    )
    seen = []
    try:
        while writer.poll() is None:
            found = read_listing(plain, None, rollout_id=(100, None))
            if found is not None:
                names = [i.name for i in found.archives]
                # Saves publish in order: a consistent state is a prefix of them.
                assert names == [f"w-{i:03d}" for i in range(len(names))]
                seen.append(len(names))
    finally:
        writer.wait(timeout=300)
    assert writer.returncode == 0
    assert seen and seen == sorted(seen)
    found = read_listing(plain, None, rollout_id=(100, None))
    assert found is not None and len(found.archives) == 60


READ_ON_MOUNT = """
import json, sys
from archive_manager.pool.sqlite_listing import read_listing
found = read_listing(sys.argv[1], None, state=None)
print(json.dumps(None if found is None else [i.name for i in found.archives]))
"""


@pytest.mark.parametrize("with_log", [False, True], ids=["clean", "dead-writer-log"])
def test_a_read_only_mount(plain: Path, with_log: bool) -> None:
    require_mount_namespace()
    if with_log:
        _killed_save(plain, "pending-0", 2)
    expected = [i.name for i in _full_names_without_writing(plain)]
    before = tree(plain)
    # The pool's own folder made read-only in place (the catalog records that path).
    done = subprocess.run(
        read_only_mount_command(plain, plain, [sys.executable, "-c", READ_ON_MOUNT, str(plain)]),
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == expected
    assert tree(plain) == before


def _full_names_without_writing(root: Path) -> list[Any]:
    found = read_listing(root, None, state=None)
    assert found is not None
    with ArchiveManager.open(root, create=False, read_only=True) as pool:
        assert found.archives == pool.find(state=None)
    return found.archives


def test_ls_never_writes_to_the_pool(plain: Path) -> None:
    before = tree(plain)
    done = subprocess.run(
        [sys.executable, "-m", "archive_manager", "--root", str(plain), "ls", "--json"],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert [r["name"] for r in json.loads(done.stdout)] == ["r-0", "r-1", "r-2", "r-3"]
    assert tree(plain) == before
    assert not os.path.exists(plain / "catalog.db-wal")
