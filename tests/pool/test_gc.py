"""Garbage collection: grace, dry run, leases and dead pending saves, orphans, temp files,
failing closed, finishing a killed GC, and a save that takes back a ``deleting`` blob."""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from helpers import (
    CATALOG_TABLES,
    FakeClock,
    abandon_writer,
    assert_loads,
    blob_names,
    blob_sizes,
    die_before_publish,
    folder_store,
    local_store,
    owned_blobs,
    tiny_rollout,
    wall_clock,
)
from sqlalchemy import delete, select, update

from archive_manager import ArchiveManager
from archive_manager._util.digest import is_digest
from archive_manager.blobs.local import READ_RETRY_ENV, LocalBlobStore, local_pool_store
from archive_manager.catalog import (
    archive_blobs_table,
    archives_table,
    blobs_table,
    chunks_table,
    entries_table,
    lease_blobs_table,
    leases_table,
    retention_table,
    sample_metadata_table,
)
from archive_manager.errors import (
    ArchiveNotFoundError,
    GcAbortedError,
    InvalidInputError,
    LeaseExpiredError,
)
from archive_manager.pool import gc as gc_module
from archive_manager.pool.context import PoolContext

LEASE_TTL = 60.0
HOUR = 3600.0


def files_under(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` (relative path -> sha256), symlinks included, not followed."""
    out = {}
    for p in sorted(root.rglob("*")):
        if p.is_symlink():
            out[str(p.relative_to(root))] = b"symlink:" + os.readlink(p).encode()
        elif p.is_file():
            out[str(p.relative_to(root))] = hashlib.sha256(p.read_bytes()).digest()
    return out


def snapshot(pool: ArchiveManager) -> tuple[dict[str, bytes], dict[str, list[str]]]:
    files = {k: v for k, v in files_under(pool.root).items() if not k.startswith("catalog.db")}
    with pool.catalog.read() as conn:
        rows = {
            t.name: sorted(repr(tuple(r)) for r in conn.execute(select(t))) for t in CATALOG_TABLES
        }
    return files, rows


def archive_blobs(pool: ArchiveManager, name: str, kind: str | None = None) -> set[str]:
    ab, a = archive_blobs_table, archives_table
    query = select(ab.c.digest).join(a, a.c.id == ab.c.archive_id).where(a.c.name == name)
    if kind is not None:
        query = query.where(ab.c.kind == kind)
    with pool.catalog.read() as conn:
        return set(conn.execute(query).scalars())


def blob_states(pool: ArchiveManager) -> dict[str, str]:
    with pool.catalog.read() as conn:
        return dict(conn.execute(select(blobs_table.c.digest, blobs_table.c.state)).all())


def set_state(pool: ArchiveManager, digests: set[str], state: str) -> None:
    with pool.catalog.write() as conn:
        conn.execute(
            update(blobs_table).where(blobs_table.c.digest.in_(sorted(digests))).values(state=state)
        )


def age(path: Path, seconds: float, clock: FakeClock) -> None:
    then = clock.now - seconds
    os.utime(path, (then, then), follow_symlinks=False)


def busy_pool(pool: ArchiveManager, clock: FakeClock, monkeypatch: pytest.MonkeyPatch) -> None:
    """A pool where GC has every kind of work: released archives (one sharing chunks with a
    kept one), an expired lease, a dead pending save, orphans, stale temp files and a
    ``deleting`` row left by a killed GC."""
    kept = pool.save("kept", tiny_rollout(seed=1), rollout_id=1)
    pool.save("ref", None, rollout_id=1, reference=kept).release()
    pool.save("gone", tiny_rollout(seed=2), rollout_id=2).release()
    gone2 = pool.save("gone2", tiny_rollout(seed=3), rollout_id=3)
    gone2.release()
    set_state(pool, archive_blobs(pool, "gone2", "tensor"), "deleting")
    abandon_writer(pool, "abandoned", tiny_rollout(n=5, seed=4))
    die_before_publish(pool, "pending", tiny_rollout(seed=5), monkeypatch)
    clock.advance(LEASE_TTL + 1)
    age(local_store(pool).path(pool.store.put(b"orphan")), 2 * HOUR, clock)
    tmp = pool.root / "tmp" / "dead-writer.tmp"
    tmp.write_bytes(b"half a blob")
    age(tmp, 2 * HOUR, clock)


@pytest.fixture
def clock() -> FakeClock:
    return wall_clock()


@pytest.fixture
def pool(open_pool: Callable[..., ArchiveManager], clock: FakeClock) -> ArchiveManager:
    # inline_limit=64: routed-expert tensors become tensor blobs, so every kind of blob exists.
    return open_pool(clock=clock, lease_ttl=LEASE_TTL, chunk_size=4, inline_limit=64)


# --- grace --------------------------------------------------------------------------------


def test_grace_keeps_young_unowned_blobs(pool: ArchiveManager, clock: FakeClock) -> None:
    samples = tiny_rollout()
    pool.save("a", samples, rollout_id=1).release()
    digests = archive_blobs(pool, "a")
    clock.advance(HOUR - 1)
    report = pool.gc(grace=timedelta(hours=1))
    assert (report.blobs, report.bytes) == (0, 0)
    assert digests <= blob_names(pool)
    assert_loads(pool, "a", samples)  # released, not yet reclaimed: still readable

    clock.advance(1)
    size = sum(blob_sizes(pool).values())
    report = pool.gc(grace=timedelta(hours=1))
    assert (report.blobs, report.bytes) == (len(digests), size)
    assert not digests & blob_names(pool)
    assert blob_states(pool) == {}


def test_grace_is_measured_from_the_blob_not_the_release(
    pool: ArchiveManager, clock: FakeClock
) -> None:
    arc = pool.save("a", tiny_rollout(), rollout_id=1)
    clock.advance(2 * HOUR)
    arc.release()  # released just now, but its blobs are two hours old
    assert pool.gc(grace=HOUR).blobs == len(archive_blobs(pool, "a"))


def test_default_grace_is_an_hour(pool: ArchiveManager, clock: FakeClock) -> None:
    pool.save("a", tiny_rollout(), rollout_id=1).release()
    assert pool.gc().blobs == 0
    clock.advance(HOUR)
    assert pool.gc().blobs == len(archive_blobs(pool, "a"))


def test_negative_grace_is_refused(pool: ArchiveManager) -> None:
    with pytest.raises(InvalidInputError):
        pool.gc(grace=-1)
    with pytest.raises(InvalidInputError):
        pool.gc(grace=timedelta(seconds=-1))


def test_owned_blobs_are_kept_however_old(pool: ArchiveManager, clock: FakeClock) -> None:
    samples = tiny_rollout()
    a = pool.save("a", samples, rollout_id=1)
    pool.save("b", None, rollout_id=1, reference=a)
    pool.save("c", tiny_rollout(seed=9), rollout_id=1)
    pool.retain("checkpoint:x", "c")
    pool.open_archive("c").release()
    a.release()  # b still shares a's chunks and tensors
    clock.advance(100 * HOUR)
    report = pool.gc(grace=0)
    assert report.blobs == len(archive_blobs(pool, "a", "manifest")) == 1
    assert set(report.per_archive) == {"a"}
    assert owned_blobs(pool) == blob_names(pool)
    assert_loads(pool, "b", samples)
    assert_loads(pool, "c", tiny_rollout(seed=9))


# --- dry run ------------------------------------------------------------------------------


def test_dry_run_deletes_nothing_and_matches_the_real_run(
    pool: ArchiveManager, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    busy_pool(pool, clock, monkeypatch)
    before = snapshot(pool)
    files_before = blob_names(pool)
    dry = pool.gc(grace=0, dry_run=True)
    assert dry.dry_run is True
    assert snapshot(pool) == before
    assert dry.blobs > 0 and dry.bytes > 0
    assert set(dry.per_archive) >= {"ref", "gone", "gone2", "pending"}
    assert dry.rolled_back == ["pending"]
    assert dry.expired_leases == 2  # the abandoned writer's and the dead pending save's
    marked = len(archive_blobs(pool, "gone2", "tensor"))
    assert (dry.orphans, dry.temp_files, dry.finished_from_earlier) == (1, 1, marked)

    real = pool.gc(grace=0)
    assert real.dry_run is False
    fields = (
        "blobs",
        "bytes",
        "per_archive",
        "orphans",
        "orphan_bytes",
        "temp_files",
        "rolled_back",
        "expired_leases",
        "finished_from_earlier",
    )
    assert {f: getattr(dry, f) for f in fields} == {f: getattr(real, f) for f in fields}
    # What it reported is what it removed.
    assert len(files_before - blob_names(pool)) == real.blobs + real.orphans
    assert blob_names(pool) == owned_blobs(pool)
    assert list((pool.root / "tmp").iterdir()) == []
    assert pool.gc(grace=0, dry_run=True).blobs == 0
    assert pool.verify(read_data=True).notices == []


def test_dry_run_per_archive_counts_blobs_and_bytes(pool: ArchiveManager) -> None:
    a = pool.save("a", tiny_rollout(seed=1), rollout_id=1)
    pool.save("b", None, rollout_id=1, reference=a)
    a.release()
    pool.open_archive("b").release()
    sizes = blob_sizes(pool)
    report = pool.gc(grace=0, dry_run=True)
    for name in ("a", "b"):
        ds = archive_blobs(pool, name)
        assert report.per_archive[name] == {"blobs": len(ds), "bytes": sum(sizes[d] for d in ds)}
    assert report.blobs == len(sizes)
    assert report.bytes == sum(sizes.values())


# --- leases and pending saves -------------------------------------------------------------


def test_live_lease_protects_a_save_in_flight(pool: ArchiveManager, clock: FakeClock) -> None:
    samples = tiny_rollout(n=9)
    w = pool.writer("w", rollout_id=1)
    for s in samples:
        w.add(s)
    w.wait_stored()
    held = set(blob_states(pool))
    assert held
    clock.advance(LEASE_TTL / 2)
    report = pool.gc(grace=0)
    assert (report.blobs, report.expired_leases) == (0, 0)
    assert held <= blob_names(pool)
    w.commit()
    assert_loads(pool, "w", samples)
    assert pool.verify(read_data=True).ok


def test_expired_lease_is_dropped_and_its_blobs_reclaimed(
    pool: ArchiveManager, clock: FakeClock
) -> None:
    kept = tiny_rollout(seed=1)
    pool.save("kept", kept, rollout_id=1)
    w = abandon_writer(pool, "w", tiny_rollout(n=5, seed=2))
    held = set(blob_states(pool)) - archive_blobs(pool, "kept")
    assert held and held <= blob_names(pool)

    assert pool.gc(grace=0).blobs == 0  # still live
    clock.advance(LEASE_TTL + 1)
    report = pool.gc(grace=0)
    assert report.expired_leases == 1
    assert report.blobs == len(held)
    assert not held & blob_names(pool)
    with pool.catalog.read() as conn:
        assert conn.execute(select(leases_table)).all() == []
        assert conn.execute(select(lease_blobs_table)).all() == []
    assert_loads(pool, "kept", kept)
    with pytest.raises(ArchiveNotFoundError):
        pool.open_archive("w")
    assert w.lease


def test_writer_whose_lease_gc_dropped_cannot_publish(
    pool: ArchiveManager, clock: FakeClock
) -> None:
    w = abandon_writer(pool, "w", tiny_rollout(n=5), keep_io=True)
    clock.advance(LEASE_TTL + 1)
    assert pool.gc(grace=0).expired_leases == 1
    # The paused process wakes up and tries to finish: it must not publish over reclaimed blobs.
    with pytest.raises(LeaseExpiredError):
        w.commit()
    assert pool.find(state=None) == []
    assert pool.verify(read_data=True).ok


def test_dead_pending_save_is_rolled_back(
    pool: ArchiveManager, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    samples = tiny_rollout(seed=1)
    die_before_publish(pool, "p", samples, monkeypatch)
    pool.save("twin", samples, rollout_id=1)  # same samples: shares p's chunks and tensors
    mine = archive_blobs(pool, "p")
    shared = mine & archive_blobs(pool, "twin")
    assert shared and archive_blobs(pool, "p", "manifest") - shared
    assert [(i.name, i.state) for i in pool.find(state=None)] == [
        ("p", "pending"),
        ("twin", "published"),
    ]
    with pytest.raises(ArchiveNotFoundError):
        pool.open_archive("p")

    report = pool.gc(grace=0)  # its lease is live: the save may still publish
    assert (report.blobs, report.rolled_back) == (0, [])
    assert mine <= blob_names(pool)

    clock.advance(LEASE_TTL + 1)
    report = pool.gc(grace=0)
    assert report.rolled_back == ["p"]
    assert report.expired_leases == 1
    assert report.blobs == len(mine - shared) == 1  # its manifest
    assert not (mine - shared) & blob_names(pool)
    assert [i.name for i in pool.find(state=None)] == ["twin"]
    with pool.catalog.read() as conn:
        for t in (chunks_table, entries_table, sample_metadata_table, archive_blobs_table):
            ids = set(conn.execute(select(t.c.archive_id)).scalars())
            assert len(ids) == 1  # twin's rows only
        assert [r.owner for r in conn.execute(select(retention_table))] == ["archive:twin"]
    assert_loads(pool, "twin", samples)
    assert pool.verify(read_data=True).ok
    pool.save("p", samples, rollout_id=1)  # the name is free again
    assert_loads(pool, "p", samples)


# --- orphans, strays and temp files -------------------------------------------------------


def test_orphan_files_older_than_grace_are_removed(pool: ArchiveManager, clock: FakeClock) -> None:
    old = pool.store.put(b"old orphan")
    young = pool.store.put(b"young orphan")
    age(local_store(pool).path(old), 2 * HOUR, clock)
    age(local_store(pool).path(young), 10, clock)
    report = pool.gc(grace=HOUR)
    assert (report.orphans, report.orphan_bytes) == (1, len(b"old orphan"))
    assert not pool.store.has(old)
    assert pool.store.has(young)
    clock.advance(HOUR)
    assert pool.gc(grace=HOUR).orphans == 1
    assert not pool.store.has(young)


def test_orphan_whose_row_appears_is_not_removed(
    pool: ArchiveManager, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The listing saw a file with no row; by the time GC removes orphans, a save has
    # inserted the row (and owns the file): the re-check under the write lock must keep it.
    samples = tiny_rollout()
    digest = pool.store.put(b"soon a blob")
    age(local_store(pool).path(digest), 2 * HOUR, clock)
    real = gc_module._remove_orphans

    def late_save(p: PoolContext, digests: list[str]) -> None:

        with p.catalog.write() as conn:
            conn.execute(
                blobs_table.insert().values(
                    digest=digest, size=11, kind="chunk", state="writing", created_at=clock.now
                )
            )
        real(p, digests)

    monkeypatch.setattr(gc_module, "_remove_orphans", late_save)
    assert pool.gc(grace=HOUR).orphans == 1  # planned ...
    assert pool.store.has(digest)  # ... but not removed
    pool.save("a", samples, rollout_id=1)
    assert_loads(pool, "a", samples)


def test_stray_files_are_never_touched(
    pool: ArchiveManager, clock: FakeClock, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pool.save("a", tiny_rollout(), rollout_id=1).release()
    digest = pool.store.put(b"x")  # a real orphan, as a control
    blobs = pool.root / "blobs"
    outside = tmp_path / "outside"
    outside.write_bytes(b"not the pool's")
    other = "f" * 32
    strays = [
        blobs / "README",
        blobs / "ab" / "notes.txt",
        blobs / "ab" / "cd" / "not-a-digest",
        blobs / "ab" / "cd" / ("ab" + "c" * 30 + ".tmp"),
        blobs / "ab" / "cd" / ("AB" + "C" * 30),  # upper case is not canonical
        blobs / "ab" / "cd" / ("abcd" + "0" * 27),  # too short
        blobs / "ab" / "cd" / ("abcd" + "0" * 29),  # too long
        blobs / "00" / "00" / other,  # a digest in the wrong folder
        blobs / other,  # a digest at the wrong depth
        blobs / "ff" / other,
        blobs / "zz" / "ff" / other,
        pool.root / other,
        pool.root / "notes.txt",
    ]
    for p in strays:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(b"stray")
    link = blobs / "ff" / "ff" / other  # canonical name, but a symlink out of the pool
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(outside)
    for p in [*strays, local_store(pool).path(digest)]:
        age(p, 100 * HOUR, clock)
    age(link, 100 * HOUR, clock)
    clock.advance(100 * HOUR)

    deleted: list[str] = []
    real = folder_store(pool).delete

    def delete_(d: str) -> bool:
        deleted.append(d)
        return real(d)

    monkeypatch.setattr(folder_store(pool), "delete", delete_)
    before = files_under(pool.root)
    report = pool.gc(grace=0)
    assert report.orphans == 1
    assert report.blobs == len(archive_blobs(pool, "a"))
    assert all(is_digest(d) for d in deleted)
    assert set(deleted) == archive_blobs(pool, "a") | {digest}
    after = files_under(pool.root)
    removed = {k for k in before if k not in after}
    assert {Path(k).name for k in removed} == set(deleted)
    assert all(k.startswith("blobs/") for k in removed)
    for p in strays:
        assert p.read_bytes() == b"stray"
    assert link.is_symlink()
    assert outside.read_bytes() == b"not the pool's"


def test_stale_temp_files_are_removed(pool: ArchiveManager, clock: FakeClock) -> None:
    tmp = pool.root / "tmp"
    tmp.mkdir(exist_ok=True)
    old, young, middling = (tmp / f"{n}.tmp" for n in ("old", "young", "middling"))
    for p in (old, young, middling):
        p.write_bytes(b"partial")
    age(old, gc_module.TEMP_MIN_AGE + 10, clock)
    age(young, 10, clock)
    age(middling, gc_module.TEMP_MIN_AGE + 10, clock)
    os.utime(middling, (clock.now - 2 * HOUR + 100,) * 2)  # older than 1 h, younger than grace

    report = pool.gc(grace=2 * HOUR)
    assert report.temp_files == 0
    report = pool.gc(grace=0)  # the floor TEMP_MIN_AGE holds even with no grace
    assert report.temp_files == 2
    assert sorted(p.name for p in tmp.iterdir()) == ["young.tmp"]

    clock.advance(gc_module.TEMP_MIN_AGE)
    assert pool.gc(grace=0).temp_files == 1
    assert list(tmp.iterdir()) == []


def test_grace_longer_than_the_temp_floor_is_honoured(
    pool: ArchiveManager, clock: FakeClock
) -> None:
    tmp = pool.root / "tmp"
    tmp.mkdir(exist_ok=True)
    p = tmp / "slow-writer.tmp"
    p.write_bytes(b"partial")
    age(p, 3 * HOUR, clock)
    assert pool.gc(grace=4 * HOUR).temp_files == 0
    assert p.exists()
    clock.advance(HOUR)
    assert pool.gc(grace=4 * HOUR).temp_files == 1
    assert not p.exists()


class _GcBeforeRename(LocalBlobStore):
    """A folder store that calls ``hook`` before it renames each blob's temp file into place
    (while the save that writes it is in flight)."""

    hook: Callable[[], None] | None = None

    def _finish(self, pending: Any, **options: Any) -> None:
        if self.hook is not None:
            self.hook()
        super()._finish(pending, **options)


def test_gc_never_removes_a_temp_file_a_save_in_flight_writes(
    open_pool: Callable[..., ArchiveManager], tmp_path: Path, clock: FakeClock
) -> None:
    """Every temp file of a save (chunks, tensor blobs, the manifest after the ownership
    commit) looks two hours old to a GC that runs before it is renamed (the file server's
    clock is behind this host's, or the write took that long); the save's lease is live, so
    GC keeps them all, and the save publishes.  An age rule alone removed them and the save
    failed at its rename."""
    store = _GcBeforeRename(tmp_path / "pool")
    pool = open_pool(clock=clock, lease_ttl=LEASE_TTL, chunk_size=4, inline_limit=64, store=store)
    swept: list[int] = []
    one_at_a_time = threading.Lock()  # the store finishes a batch of blobs on several threads

    def collect_now() -> None:
        with one_at_a_time:
            for path, _ in store.temp_files():
                with contextlib.suppress(FileNotFoundError):  # renamed by another thread
                    age(path, 2 * HOUR, clock)
            swept.append(pool.gc(grace=0).temp_files)

    store.hook = collect_now
    samples = tiny_rollout(n=9)
    pool.save("a", samples, rollout_id=1)
    store.hook = None
    assert len(swept) >= 4 and set(swept) == {0}  # chunks, tensors and the manifest
    assert_loads(pool, "a", samples)
    assert pool.verify(read_data=True).ok


def test_temp_files_of_a_lapsed_save_are_removed(pool: ArchiveManager, clock: FakeClock) -> None:
    """The other side of the rule: the temp file of a blob that a save holds stays only as
    long as the save's lease is live."""
    w = abandon_writer(pool, "w", tiny_rollout(n=5))
    held = sorted(set(blob_states(pool)))
    tmp = pool.root / "tmp"
    tmp.mkdir(exist_ok=True)
    left = tmp / f"{held[0]}.4242.0123456789ab.tmp"
    left.write_bytes(b"half a blob")
    age(left, 2 * HOUR, clock)
    assert pool.gc(grace=0).temp_files == 0
    assert left.exists()
    clock.advance(LEASE_TTL + 1)
    assert pool.gc(grace=0).temp_files == 1
    assert not left.exists()
    assert w.lease


# --- failing closed -----------------------------------------------------------------------


def _broken_listing(pool: ArchiveManager, clock: FakeClock) -> Any:
    def iter_stat() -> Iterator[tuple[str, int, float]]:
        raise OSError(5, "Input/output error")

    return "iter_stat", iter_stat


def _listing_fails_midway(pool: ArchiveManager, clock: FakeClock) -> Any:
    real = folder_store(pool).iter_stat

    def iter_stat() -> Iterator[tuple[str, int, float]]:
        for i, item in enumerate(real()):
            if i == 2:
                raise PermissionError(13, "Permission denied")
            yield item

    return "iter_stat", iter_stat


def _broken_temp_listing(pool: ArchiveManager, clock: FakeClock) -> Any:
    def temp_files() -> list[tuple[Path, float]]:
        raise OSError(5, "Input/output error")

    return "temp_files", temp_files


@pytest.mark.parametrize("breakage", [_broken_listing, _listing_fails_midway, _broken_temp_listing])
def test_listing_error_aborts_before_anything_is_deleted(
    pool: ArchiveManager, clock: FakeClock, monkeypatch: pytest.MonkeyPatch, breakage: Any
) -> None:
    busy_pool(pool, clock, monkeypatch)
    before = snapshot(pool)
    name, broken = breakage(pool, clock)
    monkeypatch.setattr(folder_store(pool), name, broken)
    for dry_run in (True, False):
        with pytest.raises(GcAbortedError):
            pool.gc(grace=0, dry_run=dry_run)
    assert snapshot(pool) == before
    monkeypatch.undo()
    pool.gc(grace=0)
    assert blob_names(pool) == owned_blobs(pool)


@pytest.mark.parametrize("what", ["chunk", "manifest", "shared chunk"])
def test_broken_invariant_aborts_before_anything_is_deleted(
    pool: ArchiveManager, clock: FakeClock, monkeypatch: pytest.MonkeyPatch, what: str
) -> None:
    busy_pool(pool, clock, monkeypatch)
    victim = "ref" if what == "shared chunk" else "kept"
    if what == "shared chunk":
        # ref shares kept's chunks: ref is retained by a checkpoint (a row inserted directly,
        # since retain() refuses a released archive) and kept is released.
        with pool.catalog.write() as conn:
            ref_id = conn.execute(
                select(archives_table.c.id).where(archives_table.c.name == "ref")
            ).scalar_one()
            conn.execute(
                retention_table.insert().values(
                    owner="checkpoint:x", archive_id=ref_id, created_at=clock.now
                )
            )
        pool.open_archive("kept").release()
    kind = "manifest" if what == "manifest" else "chunk"
    digest = min(archive_blobs(pool, victim, kind))
    with pool.catalog.write() as conn:
        archive_id = conn.execute(
            select(archives_table.c.id).where(archives_table.c.name == victim)
        ).scalar_one()
        conn.execute(
            delete(archive_blobs_table).where(
                archive_blobs_table.c.archive_id == archive_id,
                archive_blobs_table.c.digest == digest,
            )
        )
    before = snapshot(pool)
    for dry_run in (True, False):
        with pytest.raises(GcAbortedError) as err:
            pool.gc(grace=0, dry_run=dry_run)
        assert digest in str(err.value)
        assert repr(victim) in str(err.value)
    assert snapshot(pool) == before
    assert not pool.verify().ok


@pytest.mark.parametrize("kind", ["chunk", "tensor", "manifest"])
def test_deleting_row_an_owned_archive_needs_aborts_gc(
    pool: ArchiveManager, clock: FakeClock, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    # No protocol marks a blob an owned archive needs 'deleting' (GC marks only unretained
    # blobs; a save takes a 'deleting' blob back before it holds it): such a row is a broken
    # invariant, and finishing it would destroy a published archive.
    samples = tiny_rollout(seed=11)
    busy_pool(pool, clock, monkeypatch)
    pool.save("victim", samples, rollout_id=9)
    digest = min(archive_blobs(pool, "victim", kind))
    set_state(pool, {digest}, "deleting")
    before = snapshot(pool)
    for dry_run in (True, False):
        with pytest.raises(GcAbortedError) as err:
            pool.gc(grace=0, dry_run=dry_run)
        assert digest in str(err.value)
        assert "'victim'" in str(err.value)
    assert snapshot(pool) == before
    set_state(pool, {digest}, "live")  # repaired by hand: GC goes on, the archive is intact
    pool.gc(grace=0)
    assert_loads(pool, "victim", samples)


def test_unlink_error_leaves_the_rest_for_the_next_gc(
    pool: ArchiveManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    samples = tiny_rollout(seed=1)
    pool.save("kept", samples, rollout_id=1)
    pool.save("a", tiny_rollout(seed=2), rollout_id=2).release()
    doomed = archive_blobs(pool, "a")

    def refuse(digest: str) -> bool:
        raise PermissionError(13, "Permission denied", str(local_store(pool).path(digest)))

    monkeypatch.setattr(folder_store(pool), "delete", refuse)
    with pytest.raises(GcAbortedError):
        pool.gc(grace=0)
    monkeypatch.undo()
    assert set(blob_states(pool).values()) >= {"deleting"}
    assert pool.verify(read_data=True).ok
    report = pool.gc(grace=0)
    assert report.finished_from_earlier == len(doomed)
    assert not doomed & blob_names(pool)
    assert set(blob_states(pool)) == archive_blobs(pool, "kept")
    assert_loads(pool, "kept", samples)


# --- a GC killed anywhere is finished by the next one ------------------------------------


@pytest.mark.parametrize("unlinked", [0, 1, "all"])
def test_deleting_rows_of_a_killed_gc_are_finished(
    pool: ArchiveManager, clock: FakeClock, unlinked: Any
) -> None:
    samples = tiny_rollout(seed=1)
    pool.save("kept", samples, rollout_id=1)
    pool.save("a", tiny_rollout(seed=2), rollout_id=2).release()
    doomed = sorted(archive_blobs(pool, "a"))
    set_state(pool, set(doomed), "deleting")  # GC died after its plan ...
    gone = doomed if unlinked == "all" else doomed[:unlinked]
    for d in gone:  # ... or after unlinking some files
        local_store(pool).path(d).unlink()
    report = pool.gc(grace=HOUR)  # grace does not hold back what is already 'deleting'
    assert report.finished_from_earlier == len(doomed)
    assert report.blobs == len(doomed)
    assert not set(doomed) & blob_names(pool)
    assert "deleting" not in blob_states(pool).values()
    assert_loads(pool, "kept", samples)
    assert pool.verify(read_data=True).notices == []


# --- the save protocol meets GC ----------------------------------------------------------


@pytest.mark.parametrize("file_left", [True, False])
def test_save_takes_back_a_deleting_blob(
    pool: ArchiveManager, clock: FakeClock, file_left: bool
) -> None:
    samples = tiny_rollout(seed=1)
    pool.save("a", samples, rollout_id=1).release()
    content = archive_blobs(pool, "a") - archive_blobs(pool, "a", "manifest")
    set_state(pool, archive_blobs(pool, "a"), "deleting")  # a GC died after marking
    if not file_left:
        for d in sorted(content)[: len(content) // 2]:
            local_store(pool).path(d).unlink()  # ... and after unlinking some of them

    b = pool.save("b", samples, rollout_id=1)  # same samples: the same chunk and tensor blobs
    assert archive_blobs(pool, "b") - archive_blobs(pool, "b", "manifest") == content
    states = blob_states(pool)
    assert {states[d] for d in archive_blobs(pool, "b")} == {"live"}
    assert_loads(pool, "b", samples)
    for d in content:
        pool.store.check(d)
    report = pool.gc(grace=0)
    assert report.blobs == 1  # a's manifest only
    assert_loads(pool, "b", samples)
    assert blob_names(pool) == archive_blobs(pool, "b")
    assert pool.verify(read_data=True).notices == []
    assert b.state == "published"


def test_reference_to_a_reclaimed_archive_fails_cleanly(pool: ArchiveManager) -> None:
    a = pool.save("a", tiny_rollout(), rollout_id=1)
    a.release()
    pool.gc(grace=0)
    with pytest.raises(Exception) as err:
        pool.save("b", None, rollout_id=1, reference="a")
    assert "'a'" in str(err.value)
    assert pool.find(state=None)[0].name == "a"
    assert [i.name for i in pool.find(state=None)] == ["a"]
    assert pool.verify().ok
    assert pool.owners().stale_leases == pool.owners().live_leases == []


def test_gc_deletes_only_canonical_digests(
    pool: ArchiveManager, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    busy_pool(pool, clock, monkeypatch)
    deleted: list[str] = []
    real = folder_store(pool).delete

    def delete_(d: str) -> bool:
        assert is_digest(d), d
        deleted.append(d)
        return real(d)

    removed_temps: list[Path] = []
    real_temp = folder_store(pool).remove_temp

    def remove_temp(p: Any) -> bool:
        removed_temps.append(Path(p))
        return real_temp(p)

    monkeypatch.setattr(folder_store(pool), "delete", delete_)
    monkeypatch.setattr(folder_store(pool), "remove_temp", remove_temp)
    report = pool.gc(grace=0)
    assert len(deleted) == len(set(deleted)) == report.blobs + report.orphans
    assert [p.parent for p in removed_temps] == [pool.root / "tmp"]


def test_report_as_dict(pool: ArchiveManager) -> None:
    import json

    pool.save("a", tiny_rollout(), rollout_id=1).release()
    doomed = archive_blobs(pool, "a")
    data = json.loads(json.dumps(pool.gc(grace=0).as_dict()))
    assert data["blobs"] == len(doomed)
    assert data["dry_run"] is False


def test_progress_is_reported(pool: ArchiveManager) -> None:
    pool.save("a", tiny_rollout(), rollout_id=1).release()
    calls: list[tuple[int, int]] = []
    report = pool.gc(grace=0, progress=lambda done, total: calls.append((done, total)))
    assert calls and calls[-1] == (report.bytes, report.bytes)  # bytes, not blobs


def test_gc_of_an_empty_pool(pool: ArchiveManager) -> None:
    report = pool.gc(grace=0)
    assert (report.blobs, report.bytes, report.orphans, report.temp_files) == (0, 0, 0, 0)


def test_read_only_blob_files_are_deleted(pool: ArchiveManager) -> None:
    pool.save("a", tiny_rollout(), rollout_id=1).release()
    for d in archive_blobs(pool, "a"):
        assert not local_store(pool).path(d).stat().st_mode & (stat.S_IWUSR | stat.S_IWGRP)
    pool.gc(grace=0)
    assert blob_names(pool) == set()


@pytest.mark.timeout(120)
def test_gc_does_not_wait_for_each_orphan_that_vanished(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Claim 2 (nothing else is misled: GC): GC reads the first bytes of every row-less file
    it lists (`gc._refuse_if_behind`, and `rebuild_catalog` likewise), skipping one that is
    gone, but through `read_range`, which waits `read_retry` for a missing blob: on a shared
    root (5 s) a GC that listed orphans another host then removed (a rolled-back save, a
    stale listing) waited 5 s for each, 3 orphans 2 s apart here took 6 s."""
    monkeypatch.delenv(READ_RETRY_ENV, raising=False)
    root = tmp_path / "pool"
    with ArchiveManager.open(root) as pool:
        pool.save("a", [{"x": 1}], rollout_id=1)
    ghosts = [f"{i:032x}" for i in range(1, 4)]
    with ArchiveManager.open(root, store=local_pool_store(root, read_retry=2.0)) as pool:
        listed = pool.store.iter_stat

        def with_ghosts() -> Iterator[tuple[str, int, float]]:
            yield from listed()
            yield from ((g, 10, time.time() - 86400) for g in ghosts)

        monkeypatch.setattr(pool.store, "iter_stat", with_ghosts)
        started = time.monotonic()
        pool.gc(dry_run=True)
        took = time.monotonic() - started
    assert took < 2.0, took
