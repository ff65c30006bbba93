"""The retention journal (docs/architecture.md, "Retention journal"): a lost or restored
catalog is rebuilt with exactly the owners, states and release times it had.

Every test runs on SQLite and on a real PostgreSQL server (the ``backend`` fixture); backups
are SQLite's online backup API and ``pg_dump``/``pg_restore``, as an operator takes them.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers import Backend, FakeClock, assert_loads, open_on, snapshot_pool, tiny_rollout
from sqlalchemy import select
from test_recovery import CatalogBackup, lose_catalog

from archive_manager import ArchiveManager
from archive_manager.catalog import archives_table, journal_table, retention_table
from archive_manager.errors import ArchiveReleasedError, GcAbortedError, PoolLayoutError
from archive_manager.pool import journal
from archive_manager.pool.journal import JOURNAL_DIR, Journal

REPO = Path(__file__).resolve().parents[2]


def facts(pool: ArchiveManager) -> dict[str, Any]:
    """What a rebuild must give back: per archive its state, times and owners."""
    a, r = archives_table, retention_table
    out: dict[str, Any] = {}
    with pool.catalog.read() as conn:
        for row in conn.execute(
            select(a.c.id, a.c.name, a.c.state, a.c.published_at, a.c.released_at)
        ):
            owners = conn.execute(
                select(r.c.owner, r.c.created_at).where(r.c.archive_id == row.id)
            ).all()
            out[row.name] = (row.state, row.published_at, row.released_at, sorted(owners))
    return out


def recover(backend: Backend, root: Path, **options: Any) -> ArchiveManager:
    url = lose_catalog(backend, root)
    pool = ArchiveManager.open(root, url, recover=True, **options)
    return pool


def journal_files(root: Path) -> list[Path]:
    return sorted((root / JOURNAL_DIR).glob("*.rec")) + sorted((root / JOURNAL_DIR).glob("*.ckpt"))


# --------------------------------------------------------------------------- the reproduction


def test_a_lost_catalog_loses_no_retention_decision(tmp_path: Path, backend: Backend) -> None:
    """The issue's sequence: a checkpoint's hold, a release, the catalog lost and rebuilt,
    then the archive's own release and a GC: the checkpoint's archive still loads, and the
    released archive stays released."""
    root = tmp_path / "pool"
    with open_on(backend, root) as pool:
        pool.save("a", tiny_rollout(seed=1), rollout_id=1)
        pool.save("b", tiny_rollout(seed=2), rollout_id=2)
        assert pool.retain("checkpoint:step-100", "a")
        assert pool.open_archive("b").release()
        before = facts(pool)
    with recover(backend, root) as pool:
        report = pool.rebuild_catalog()
        assert report.archives == ["a", "b"] and report.journal_applied
        assert not report.skipped and not report.unresolved
        assert facts(pool) == before
        pool.open_archive("a").release()
        pool.gc(grace=0)
        assert_loads(pool, "a", tiny_rollout(seed=1))
        assert pool.open_archive("b").state == "released"
        with pytest.raises(ArchiveReleasedError):
            pool.open_archive("b").load_samples()
        assert pool.verify(read_data=True).ok


def test_release_owner_and_reuse_survive_a_lost_catalog(tmp_path: Path, backend: Backend) -> None:
    root = tmp_path / "pool"
    with open_on(backend, root) as pool:
        for i in range(3):
            pool.save(f"r{i}", tiny_rollout(seed=i), rollout_id=i)
            pool.retain("queue:train", f"r{i}")
        pool.retain("checkpoint:1", "r0")
        assert pool.release_owner("queue:train") == 3
        pool.retain("queue:train", "r2")  # held again after the release_owner
        pool.open_archive("r1").release()
        before = facts(pool)
    with recover(backend, root) as pool:
        pool.rebuild_catalog()
        assert facts(pool) == before
        pool.gc(grace=0)  # r1 nobody holds: reclaimed
        with pytest.raises(ArchiveReleasedError):
            pool.open_archive("r1").load_samples()
        assert_loads(pool, "r0", tiny_rollout(seed=0))
        assert_loads(pool, "r2", tiny_rollout(seed=2))
        # Lost again, after GC reclaimed r1: it stays gone (reported), the rest as it was.
        before = facts(pool)
    with recover(backend, root) as pool:
        report = pool.rebuild_catalog()
        assert report.reclaimed == ["r1"] and not report.skipped
        after = facts(pool)
        assert after == {n: f for n, f in before.items() if n != "r1"}


def test_a_restored_backup_is_brought_forward(tmp_path: Path, backend: Backend) -> None:
    """A backup restored after decisions were made: GC refuses until the rebuild, which
    gives the catalog's archives the owners and states the journal recorded since."""
    root = tmp_path / "pool"
    backup = CatalogBackup(backend, root, backend.url(root), tmp_path / "catalog.backup")
    with open_on(backend, root) as pool:
        pool.save("a", tiny_rollout(seed=1), rollout_id=1)
        pool.save("b", tiny_rollout(seed=2), rollout_id=2)
        pool.retain("checkpoint:old", "b")
        backup.take()
        pool.retain("checkpoint:new", "a")
        pool.open_archive("b").release()
        pool.release_owner("checkpoint:old")
        pool.save("c", tiny_rollout(seed=3), rollout_id=3)
        before = facts(pool)
    backup.restore()
    with open_on(backend, root) as pool:
        snap = snapshot_pool(pool)
        with pytest.raises(GcAbortedError, match="behind"):
            pool.gc(grace=0)
        assert snapshot_pool(pool) == snap
        problems = {f.kind for f in pool.verify().problems}
        assert "journal-behind" in problems
        report = pool.rebuild_catalog()
        assert report.archives == ["c"]
        assert report.brought_forward == {
            "a": ["owner checkpoint:new restored"],
            "b": [
                "released (was published)",
                "owner archive:b dropped",
                "owner checkpoint:old dropped",
            ],
        }
        assert facts(pool) == before
        report = pool.gc(grace=0)
        assert report.per_archive.keys() == {"b"}  # nothing else was let go
        assert_loads(pool, "a", tiny_rollout(seed=1))
        assert_loads(pool, "c", tiny_rollout(seed=3))
        assert pool.verify(read_data=True).ok


def test_decisions_on_a_restored_catalog_are_kept_in_order(
    tmp_path: Path, backend: Backend
) -> None:
    """Decisions made on the restored catalog before anyone noticed are merged with the ones
    it lacks, in the order they were made."""
    root = tmp_path / "pool"
    backup = CatalogBackup(backend, root, backend.url(root), tmp_path / "catalog.backup")
    with open_on(backend, root) as pool:
        pool.save("a", tiny_rollout(seed=1), rollout_id=1)
        backup.take()
        pool.retain("job:x", "a")  # lost by the restore, known to the journal
    backup.restore()
    with open_on(backend, root) as pool:
        pool.retain("job:y", "a")  # made on the stale catalog
        # The stale catalog holds no job:x: the call drops nothing and records nothing, so
        # the journal's hold comes back with the rebuild (retention kept, never lost; run
        # the rebuild before letting owners go on a restored catalog).
        assert pool.release_owner("job:x") == 0
        pool.rebuild_catalog()
        owners = {o for o, _ in facts(pool)["a"][3]}
        assert owners == {"archive:a", "job:x", "job:y"}
        pool.gc(grace=0)
        assert pool.verify(read_data=True).ok


# --------------------------------------------------------------------------- what can go wrong


def test_a_damaged_record_is_reported_and_gc_waits_for_an_operator(
    tmp_path: Path, backend: Backend
) -> None:
    root = tmp_path / "pool"
    with open_on(backend, root) as pool:
        pool.save("a", tiny_rollout(), rollout_id=1)
        pool.retain("checkpoint:1", "a")
    record = max(journal_files(root)[:-1], key=lambda p: p.name)  # the retain's record
    data = bytearray(record.read_bytes())
    data[10] ^= 0x20
    record.chmod(0o644)
    record.write_bytes(bytes(data))
    with recover(backend, root) as pool:
        report = pool.rebuild_catalog()
        assert report.unresolved and list(report.journal_damaged) == [record.name]
        assert "damaged" in report.journal_damaged[record.name]
        # The hold the damaged record carried is unknown: the archive is self-owned only.
        assert {o for o, _ in facts(pool)["a"][3]} == {"archive:a"}
        with pytest.raises(GcAbortedError, match="--resolve"):
            pool.gc(grace=0)
        assert {f.kind for f in pool.verify().problems} >= {"journal-unresolved"}
        report = pool.rebuild_catalog(resolve=True)
        assert not report.unresolved
        pool.gc(grace=0)
        assert not record.exists()  # superseded by the checkpoint the resolve wrote
        assert pool.verify(read_data=True).ok


def test_a_record_of_another_pool_is_refused(tmp_path: Path, backend: Backend) -> None:
    """A record copied in from another pool is never applied (its pool id)."""
    root, other = tmp_path / "pool", tmp_path / "other"
    with open_on(backend, other) as pool:
        pool.save("a", tiny_rollout(), rollout_id=1)
        pool.retain("checkpoint:theirs", "a")
    with open_on(backend, root) as pool:
        pool.save("a", tiny_rollout(), rollout_id=1)
    foreign = max(journal_files(other)[:-1], key=lambda p: p.name)
    shutil.copy(foreign, root / JOURNAL_DIR / foreign.name)
    with open_on(backend, root) as pool, pytest.raises(GcAbortedError, match="behind"):
        pool.gc(grace=0)
    with recover(backend, root) as pool:
        report = pool.rebuild_catalog()
        assert report.journal_foreign == [foreign.name]
        assert {o for o, _ in facts(pool)["a"][3]} == {"archive:a"}
        pool.gc(grace=0)


def test_a_torn_or_unreadable_file_never_applies(tmp_path: Path) -> None:
    root = tmp_path / "pool"
    with ArchiveManager.open(root) as pool:
        pool.save("a", tiny_rollout(), rollout_id=1)
        pool_id = pool.identity.pool_id  # type: ignore[union-attr]
    j = Journal(root)
    entry = j.entries()[-1]
    path = root / JOURNAL_DIR / entry.name
    path.chmod(0o644)
    path.write_bytes(path.read_bytes()[:20])  # a torn write
    with pytest.raises(journal.JournalDamagedError, match="damaged"):
        j.read(entry, pool_id)
    replayed = journal.replay(j, pool_id)
    assert entry.name in replayed.damaged and entry not in replayed.applied


def test_a_process_killed_between_its_commit_and_its_record(
    tmp_path: Path, backend: Backend
) -> None:
    """kill -9 after the retain committed, before its record: a gap that verify notices and
    the next GC's checkpoint closes, so a catalog lost afterwards keeps the hold."""
    root = tmp_path / "pool"
    url = backend.url(root)
    with open_on(backend, root) as pool:
        pool.save("a", tiny_rollout(), rollout_id=1)
    env = {**os.environ, "ARCHIVE_MANAGER_FAILPOINTS": "journal.before_write=kill"}
    code = (
        "import sys; from archive_manager import ArchiveManager as M\n"
        "M.open(sys.argv[1], sys.argv[2] or None).retain('checkpoint:1', 'a')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(root), url or ""], env=env, cwd=REPO, check=False
    )
    assert done.returncode == -9
    with open_on(backend, root) as pool:
        assert {f.kind for f in pool.verify().notices} >= {"journal-gap"}
        assert pool.verify().ok
        pool.gc(grace=0)  # writes a checkpoint that covers the gap
        assert "journal-gap" not in {f.kind for f in pool.verify().notices}
        before = facts(pool)
    with recover(backend, root) as pool:
        pool.rebuild_catalog()
        assert facts(pool) == before


def test_a_record_file_never_written_comes_from_the_catalog(
    tmp_path: Path, backend: Backend
) -> None:
    """A restored catalog made a decision whose record file is gone (a process stopped before
    writing it, a full disk): the catalog holds the record's bytes, so the rebuild applies it
    in its place, and GC writes the file again."""
    root = tmp_path / "pool"
    backup = CatalogBackup(backend, root, backend.url(root), tmp_path / "catalog.backup")
    with open_on(backend, root) as pool:
        pool.save("a", tiny_rollout(), rollout_id=1)
        backup.take()
        pool.retain("job:journal-only", "a")
    backup.restore()
    with open_on(backend, root) as pool:
        pool.retain("job:catalog-only", "a")
        gap = journal_files(root)[:-1][-1]  # the newest record: that retain's
        gap.unlink()
        assert {f.kind for f in pool.verify().notices} >= {"journal-gap"}
        pool.rebuild_catalog()
        owners = {o for o, _ in facts(pool)["a"][3]}
        assert owners == {"archive:a", "job:journal-only", "job:catalog-only"}
        pool.gc(grace=0)
        assert "journal-gap" not in {f.kind for f in pool.verify().notices}


def test_checkpoints_bound_the_journal(
    tmp_path: Path, backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """GC checkpoints once records pile up, and removes what the checkpoint before the
    newest supersedes: the journal holds at most two checkpoints and the records since the
    older one, however many decisions were made."""
    monkeypatch.setattr(journal, "CHECKPOINT_EVERY", 5)
    root = tmp_path / "pool"
    with open_on(backend, root) as pool:
        pool.save("a", tiny_rollout(), rollout_id=1)
        for round_ in range(4):
            for i in range(6):
                pool.retain(f"job:{round_}-{i}", "a")
            pool.gc(grace=0)
            files = list((root / JOURNAL_DIR).iterdir())
            assert len([p for p in files if p.suffix == ".ckpt"]) <= 2
            assert len(files) <= 2 + 2 * 7
        with pool.catalog.read() as conn:
            assert conn.execute(select(journal_table)).all() == []
        before = facts(pool)
    with recover(backend, root) as pool:
        pool.rebuild_catalog()
        assert facts(pool) == before


def test_a_damaged_newest_checkpoint_falls_back_to_the_one_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(journal, "CHECKPOINT_EVERY", 2)
    root = tmp_path / "pool"
    with ArchiveManager.open(root) as pool:
        pool.save("a", tiny_rollout(), rollout_id=1)
        for i in range(3):
            pool.retain(f"job:{i}", "a")
        pool.gc(grace=0)
        pool.open_archive("a").release()
        pool.retain("job:late", "a")
        pool.gc(grace=0)
        before = facts(pool)
    newest = max((root / JOURNAL_DIR).glob("*.ckpt"))
    newest.chmod(0o644)
    data = bytearray(newest.read_bytes())
    data[-3] ^= 0xFF
    newest.write_bytes(bytes(data))
    for path in root.glob("catalog.db*"):
        path.unlink()
    with ArchiveManager.open(root, recover=True) as pool:
        report = pool.rebuild_catalog()
        assert list(report.journal_damaged) == [newest.name] and report.unresolved
        assert facts(pool) == before  # the checkpoint before it and the records since


def test_a_rebound_copy_rebuilds_with_its_own_identity(tmp_path: Path) -> None:
    root, copy = tmp_path / "pool", tmp_path / "copy"
    with ArchiveManager.open(root) as pool:
        pool.save("a", tiny_rollout(), rollout_id=1)
        pool.retain("checkpoint:1", "a")
    shutil.copytree(root, copy, symlinks=True)
    ArchiveManager.open(copy, rebind=True).close()
    for path in copy.glob("catalog.db*"):
        path.unlink()
    with ArchiveManager.open(copy, recover=True) as pool:
        report = pool.rebuild_catalog()
        assert not report.journal_foreign and not report.unresolved
        assert {o for o, _ in facts(pool)["a"][3]} == {"archive:a", "checkpoint:1"}


def test_a_symlinked_journal_folder_is_refused(tmp_path: Path) -> None:
    root, elsewhere = tmp_path / "pool", tmp_path / "elsewhere"
    with ArchiveManager.open(root) as pool:
        pool.save("a", tiny_rollout(), rollout_id=1)
    shutil.move(root / JOURNAL_DIR, elsewhere)
    (root / JOURNAL_DIR).symlink_to(elsewhere)
    with ArchiveManager.open(root) as pool:
        with pytest.raises(PoolLayoutError):
            pool.retain("job:1", "a")
        with pytest.raises(GcAbortedError):
            pool.gc(grace=0)
    assert sorted(p.name for p in elsewhere.iterdir()) == sorted(
        p.name for p in elsewhere.iterdir() if p.suffix in (".rec", ".ckpt")
    )


def test_a_pool_of_the_previous_release_gets_a_journal(tmp_path: Path) -> None:
    """Pools written before the journal get a checkpoint of their owners on first open."""
    import tarfile

    with tarfile.open(REPO / "tests" / "data" / "legacy-pool-r2.tar.gz") as tar:
        tar.extractall(tmp_path, filter="data")
    root = next(p.parent for p in tmp_path.rglob("catalog.db"))
    with ArchiveManager.open(root) as pool:
        names = [i.name for i in pool.find(state=None)]
        assert names
        pool.retain("checkpoint:legacy", names[0])
        before = facts(pool)
    assert [p.suffix for p in journal_files(root)] == [".rec", ".ckpt"]
    for path in root.glob("catalog.db*"):
        path.unlink()
    with ArchiveManager.open(root, recover=True) as pool:
        pool.rebuild_catalog()
        assert facts(pool) == before


def test_release_times_and_publication_times_come_back(tmp_path: Path, backend: Backend) -> None:
    root, clock = tmp_path / "pool", FakeClock()
    with open_on(backend, root, clock=clock) as pool:
        pool.save("a", tiny_rollout(), rollout_id=1)
        clock.advance(100)
        pool.open_archive("a").release()
        info = pool.open_archive("a").info()
        assert info.released_at is not None
        before = facts(pool)
    with recover(backend, root, clock=clock) as pool:
        pool.rebuild_catalog()
        assert facts(pool) == before


def test_the_cli_rebuilds_owners_and_resolves(tmp_path: Path) -> None:
    root = tmp_path / "pool"
    with ArchiveManager.open(root) as pool:
        pool.save("a", tiny_rollout(), rollout_id=1)
        pool.retain("checkpoint:1", "a")
    for path in root.glob("catalog.db*"):
        path.unlink()
    cli = [sys.executable, "-m", "archive_manager.cli", "--root", str(root)]
    done = subprocess.run(
        [*cli, "rebuild-catalog", "--yes", "--json"], cwd=REPO, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["archives"] == ["a"] and report["journal_applied"] is True
    done = subprocess.run([*cli, "owners", "--json"], cwd=REPO, capture_output=True, text=True)
    assert "checkpoint:1" in done.stdout


def test_the_counter_follows_the_journal_but_not_numbers_from_the_future(
    tmp_path: Path,
) -> None:
    """At open the pool's counter is raised past the newest journal number (a catalog
    restored on a host whose clock is behind keeps numbering after what it lacks); a number
    more than a day ahead of the clock is neither applied nor followed."""
    from archive_manager.catalog.queries import stored_save_seq

    root, clock = tmp_path / "pool", FakeClock()
    with ArchiveManager.open(root, clock=clock) as pool:
        pool.save("a", tiny_rollout(), rollout_id=1)
        pool.retain("job:1", "a")
    newest = max(journal_files(root)[:-1], key=lambda p: p.name)
    ahead = int(newest.name.split("-")[0]) + 3_600_000_000  # an hour ahead: plausible
    far = int(newest.name.split("-")[0]) + 2 * 86_400_000_000  # two days ahead
    newest.rename(newest.with_name(f"{ahead:020d}-{newest.name.split('-')[1]}"))
    (root / JOURNAL_DIR / f"{far:020d}-{'0' * 32}.rec").write_bytes(b"{}")
    with ArchiveManager.open(root, clock=clock) as pool, pool.catalog.read() as conn:
        counter = stored_save_seq(conn)
    assert ahead <= counter < far
    for path in root.glob("catalog.db*"):
        path.unlink()
    with ArchiveManager.open(root, recover=True, clock=clock) as pool:
        report = pool.rebuild_catalog()
        assert f"{far:020d}-{'0' * 32}.rec" in report.journal_damaged
        with pool.catalog.read() as conn:
            assert stored_save_seq(conn) < far
