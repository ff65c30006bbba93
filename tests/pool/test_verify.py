"""`pool.verify`: damage is a problem naming blob and archive; crash leftovers are notices;
verify never changes the pool; ``read_data`` subsets."""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from helpers import (
    CATALOG_TABLES,
    FakeClock,
    Killed,
    abandon_writer,
    die_before_publish,
    local_store,
    tiny_rollout,
    wall_clock,
)
from sqlalchemy import delete, func, insert, select, update

from archive_manager import ArchiveManager
from archive_manager.catalog import (
    archive_blobs_table,
    archives_table,
    blobs_table,
    entries_table,
    lease_blobs_table,
    leases_table,
)
from archive_manager.errors import InvalidInputError
from archive_manager.pool.verify import Finding, VerifyReport, parse_subset
from archive_manager.pool.writer import ArchiveWriter

LEASE_TTL = 60.0


def archive_blobs(pool: ArchiveManager, name: str, kind: str | None = None) -> list[str]:
    ab, a = archive_blobs_table, archives_table
    query = select(ab.c.digest).join(a, a.c.id == ab.c.archive_id).where(a.c.name == name)
    if kind is not None:
        query = query.where(ab.c.kind == kind)
    with pool.catalog.read() as conn:
        return sorted(conn.execute(query).scalars())


def live_blobs(pool: ArchiveManager) -> set[str]:
    with pool.catalog.read() as conn:
        return set(
            conn.execute(select(blobs_table.c.digest).where(blobs_table.c.state == "live"))
            .scalars()
            .all()
        )


def writable(pool: ArchiveManager, digest: str) -> Path:
    path = local_store(pool).path(digest)
    os.chmod(path, stat.S_IMODE(path.stat().st_mode) | stat.S_IWUSR)
    return path


def snapshot(pool: ArchiveManager) -> tuple[dict[str, Any], dict[str, list[str]]]:
    """Every file of the pool (but the catalog) with its bytes and metadata; every row."""
    files = {}
    for p in sorted(pool.root.rglob("*")):
        if p.is_file() and not p.name.startswith("catalog.db"):
            st = p.lstat()
            files[str(p.relative_to(pool.root))] = (
                st.st_size,
                st.st_mode,
                st.st_mtime_ns,
                hashlib.sha256(p.read_bytes()).hexdigest(),
            )
    with pool.catalog.read() as conn:
        rows = {
            t.name: sorted(repr(tuple(r)) for r in conn.execute(select(t))) for t in CATALOG_TABLES
        }
    return files, rows


def kinds(findings: list[Finding]) -> set[str]:
    return {f.kind for f in findings}


def names_blob_and_archive(report: VerifyReport, digest: str, archive: str) -> bool:
    return any(p.digest == digest and p.archive == archive for p in report.problems)


@pytest.fixture
def clock() -> FakeClock:
    return wall_clock()


@pytest.fixture
def pool(open_pool: Callable[..., ArchiveManager], clock: FakeClock) -> ArchiveManager:
    return open_pool(clock=clock, lease_ttl=LEASE_TTL, chunk_size=4, inline_limit=64)


# --- healthy ------------------------------------------------------------------------------


def test_healthy_pool_is_ok_with_nothing_to_say(pool: ArchiveManager) -> None:
    a = pool.save("a", tiny_rollout(seed=1), rollout_id=1)
    pool.save("b", None, rollout_id=1, reference=a)
    pool.save("c", tiny_rollout(seed=2), rollout_id=2)
    pool.retain("checkpoint:x", "c")
    pool.open_archive("c").release()  # released but retained: still healthy
    for read_data in (False, True):
        report = pool.verify(read_data=read_data)
        assert report.ok, report.problems
        assert report.problems == []
        assert report.notices == []
        assert report.read_data is read_data
    report = pool.verify(read_data=True)
    assert report.blobs_checked == len(live_blobs(pool))
    assert report.bytes_read == sum(pool.store.size(d) for d in live_blobs(pool))
    assert report.as_dict()["ok"] is True


def test_empty_pool_is_ok(pool: ArchiveManager) -> None:
    report = pool.verify(read_data=True)
    assert report.ok
    assert report.problems == report.notices == []


# --- damage -------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["chunk", "tensor", "manifest"])
def test_missing_blob_file_is_a_problem(pool: ArchiveManager, kind: str) -> None:
    pool.save("a", tiny_rollout(), rollout_id=1)
    digest = archive_blobs(pool, "a", kind)[0]
    local_store(pool).path(digest).unlink()
    report = pool.verify()
    assert not report.ok
    assert names_blob_and_archive(report, digest, "a"), report.problems
    assert all(digest in p.message for p in report.problems)


def test_wrong_size_is_a_problem(pool: ArchiveManager) -> None:
    pool.save("a", tiny_rollout(), rollout_id=1)
    digest = archive_blobs(pool, "a", "chunk")[0]
    with writable(pool, digest).open("ab") as f:
        f.write(b"extra")
    report = pool.verify()
    assert not report.ok
    assert "wrong-size" in kinds(report.problems)
    assert names_blob_and_archive(report, digest, "a"), report.problems


@pytest.mark.parametrize("kind", ["chunk", "tensor", "manifest"])
def test_corrupt_blob_is_found_only_by_reading_data(pool: ArchiveManager, kind: str) -> None:
    pool.save("a", tiny_rollout(), rollout_id=1)
    digest = archive_blobs(pool, "a", kind)[0]
    path = writable(pool, digest)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    assert pool.verify().ok  # same size: the listing cannot tell
    report = pool.verify(read_data=True)
    assert not report.ok
    assert kinds(report.problems) == {"corrupt-blob"}
    assert names_blob_and_archive(report, digest, "a"), report.problems


def test_damage_names_every_kind_of_archive_that_needs_it(pool: ArchiveManager) -> None:
    # The blob of a released, unowned archive is still named (it awaits GC, but it is read
    # by anyone who opens the archive before that).
    arc = pool.save("a", tiny_rollout(), rollout_id=1)
    arc.release()
    digest = archive_blobs(pool, "a", "chunk")[0]
    with writable(pool, digest).open("ab") as f:
        f.write(b"x")
    report = pool.verify()
    assert names_blob_and_archive(report, digest, "a"), report.problems


def test_archive_needing_a_blob_with_no_row_is_a_problem(pool: ArchiveManager) -> None:
    pool.save("a", tiny_rollout(), rollout_id=1)
    digest = archive_blobs(pool, "a", "chunk")[0]
    with pool.catalog.write() as conn:
        conn.execute(delete(blobs_table).where(blobs_table.c.digest == digest))
    report = pool.verify()
    assert not report.ok
    assert names_blob_and_archive(report, digest, "a"), report.problems
    assert "orphan-file" in kinds(report.notices)  # its file is still there, with no row


def test_archive_needing_a_deleting_blob_is_a_problem(pool: ArchiveManager) -> None:
    pool.save("a", tiny_rollout(), rollout_id=1)
    digest = archive_blobs(pool, "a", "tensor")[0]
    with pool.catalog.write() as conn:
        conn.execute(
            update(blobs_table).where(blobs_table.c.digest == digest).values(state="deleting")
        )
    report = pool.verify()
    assert not report.ok
    assert names_blob_and_archive(report, digest, "a"), report.problems


def test_archive_not_retaining_its_chunk_is_a_problem(pool: ArchiveManager) -> None:
    pool.save("a", tiny_rollout(), rollout_id=1)
    digest = archive_blobs(pool, "a", "chunk")[0]
    with pool.catalog.write() as conn:
        conn.execute(delete(archive_blobs_table).where(archive_blobs_table.c.digest == digest))
    report = pool.verify()
    assert not report.ok
    assert names_blob_and_archive(report, digest, "a"), report.problems


def test_missing_entries_are_a_problem(pool: ArchiveManager) -> None:
    pool.save("a", tiny_rollout(), rollout_id=1)
    with pool.catalog.write() as conn:
        conn.execute(delete(entries_table).where(entries_table.c.position == 0))
    report = pool.verify()
    assert not report.ok
    assert any(p.archive == "a" for p in report.problems)


# --- notices ------------------------------------------------------------------------------


def test_stale_lease_is_a_notice(pool: ArchiveManager, clock: FakeClock) -> None:
    w = abandon_writer(pool, "w", tiny_rollout(n=5))
    assert "stale-lease" not in kinds(pool.verify().notices)
    clock.advance(LEASE_TTL + 1)
    report = pool.verify(read_data=True)
    assert report.ok, report.problems
    stale = [n for n in report.notices if n.kind == "stale-lease"]
    assert len(stale) == 1
    assert w.lease in stale[0].message


def test_pending_save_is_a_notice(
    pool: ArchiveManager, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    die_before_publish(pool, "p", tiny_rollout(), monkeypatch)
    report = pool.verify(read_data=True)
    assert report.ok, report.problems
    pending = [n for n in report.notices if n.kind == "pending-save"]
    assert [n.archive for n in pending] == ["p"]
    assert "expired" not in pending[0].message
    clock.advance(LEASE_TTL + 1)
    report = pool.verify(read_data=True)
    assert report.ok, report.problems
    assert "pending-save" in kinds(report.notices)
    assert "stale-lease" in kinds(report.notices)


def test_save_in_flight_before_its_manifest_is_written_is_no_problem(
    pool: ArchiveManager, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between the ownership commit (archive pending, manifest row 'writing') and the manifest
    write, the archive needs a blob whose file does not exist yet: a save in flight, not
    damage (the dedup race's verify met exactly this)."""
    real_put_new = pool.store.put_new

    def put_new(items: Any, **kwargs: Any) -> Any:
        items = list(items)
        if any(blob_kind(pool, digest) == "manifest" for _, digest in items):
            raise Killed
        return real_put_new(items, **kwargs)

    def abort(self: ArchiveWriter) -> None:
        self.abandon()  # a dead process renews nothing and rolls nothing back

    monkeypatch.setattr(pool.store, "put_new", put_new)
    monkeypatch.setattr(ArchiveWriter, "abort", abort)
    with pytest.raises(Killed):
        pool.save("p", tiny_rollout(), rollout_id=0)
    monkeypatch.undo()
    report = pool.verify(read_data=True)
    assert report.ok, report.problems
    assert "pending-save" in kinds(report.notices)
    assert "unwritten-blob" in kinds(report.notices)
    clock.advance(LEASE_TTL + 1)  # the save died: still no damage, GC rolls it back
    report = pool.verify(read_data=True)
    assert report.ok, report.problems
    pool.gc(grace=0)
    report = pool.verify(read_data=True)
    assert report.ok, report.problems
    assert "pending-save" not in kinds(report.notices)


def blob_kind(pool: ArchiveManager, digest: str) -> str | None:
    with pool.catalog.read() as conn:
        return conn.execute(
            select(blobs_table.c.kind).where(blobs_table.c.digest == digest)
        ).scalar_one_or_none()


def test_writing_row_without_a_file_is_a_notice(pool: ArchiveManager) -> None:
    w = abandon_writer(pool, "w", tiny_rollout(n=5))
    with pool.catalog.read() as conn:
        writing = sorted(
            conn.execute(select(blobs_table.c.digest).where(blobs_table.c.state == "writing"))
            .scalars()
            .all()
        )
    assert writing
    for digest in writing:  # killed before its files reached their names
        local_store(pool).path(digest).unlink()
    report = pool.verify(read_data=True)
    assert report.ok, report.problems
    unwritten = {n.digest for n in report.notices if n.kind == "unwritten-blob"}
    assert unwritten == set(writing)
    assert w.lease


def test_orphan_file_is_a_notice(pool: ArchiveManager) -> None:
    digest = pool.store.put(b"no row names me")
    report = pool.verify(read_data=True)
    assert report.ok, report.problems
    assert [(n.kind, n.digest) for n in report.notices] == [("orphan-file", digest)]


def test_unowned_blobs_are_a_notice(pool: ArchiveManager) -> None:
    pool.save("a", tiny_rollout(), rollout_id=1).release()
    report = pool.verify(read_data=True)
    assert report.ok, report.problems
    unowned = [n for n in report.notices if n.kind == "unowned-blobs"]
    assert len(unowned) == 1
    assert str(len(archive_blobs(pool, "a"))) in unowned[0].message
    pool.gc(grace=0)
    assert pool.verify().notices == []


def test_deleting_rows_are_notices(pool: ArchiveManager) -> None:
    pool.save("a", tiny_rollout(), rollout_id=1).release()
    digests = archive_blobs(pool, "a")
    with pool.catalog.write() as conn:  # a GC that died after marking
        conn.execute(update(blobs_table).values(state="deleting"))
    local_store(pool).path(digests[0]).unlink()  # ... and after unlinking one file
    report = pool.verify(read_data=True)
    assert report.ok, report.problems
    assert {n.digest for n in report.notices if n.kind == "deleting-blob"} == set(digests)


# --- verify only reads --------------------------------------------------------------------


def test_verify_changes_nothing(
    pool: ArchiveManager, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    a = pool.save("a", tiny_rollout(seed=1), rollout_id=1)
    pool.save("b", None, rollout_id=1, reference=a)
    pool.save("c", tiny_rollout(seed=2), rollout_id=1).release()
    pool.save("d", tiny_rollout(seed=3), rollout_id=1)
    die_before_publish(pool, "p", tiny_rollout(seed=4), monkeypatch)
    abandon_writer(pool, "w", tiny_rollout(n=5, seed=5))
    pool.store.put(b"orphan")
    old = clock.now - 7200
    os.utime(local_store(pool).path(pool.store.put(b"old orphan")), (old, old))
    (pool.root / "tmp").mkdir(exist_ok=True)
    (pool.root / "tmp" / "dead.tmp").write_bytes(b"x")
    # damage: a missing chunk, a corrupt tensor, a deleting row
    local_store(pool).path(archive_blobs(pool, "d", "chunk")[0]).unlink()
    path = writable(pool, archive_blobs(pool, "a", "tensor")[0])
    data = bytearray(path.read_bytes())
    data[0] ^= 0xFF
    path.write_bytes(bytes(data))
    with pool.catalog.write() as conn:
        conn.execute(
            update(blobs_table)
            .where(blobs_table.c.digest.in_(archive_blobs(pool, "c")))
            .values(state="deleting")
        )
    clock.advance(LEASE_TTL + 1)

    before = snapshot(pool)
    reports = [pool.verify(), pool.verify(read_data=True), pool.verify(True, subset="1/3")]
    assert snapshot(pool) == before
    assert all(not r.ok for r in reports)
    assert kinds(reports[1].notices) >= {
        "stale-lease",
        "pending-save",
        "orphan-file",
        "deleting-blob",
    }


def test_verify_reads_only_when_asked(
    pool: ArchiveManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    pool.save("a", tiny_rollout(), rollout_id=1)

    def forbidden(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("verify(read_data=False) read a blob")

    for method in ("check", "get", "get_view", "open"):
        monkeypatch.setattr(pool.store, method, forbidden)
    assert pool.verify().ok


# --- subsets ------------------------------------------------------------------------------


def _checked(pool: ArchiveManager, monkeypatch: pytest.MonkeyPatch, subset: str) -> list[str]:
    seen: list[str] = []
    real = pool.store.check

    def check(digest: str) -> None:
        seen.append(digest)
        real(digest)

    monkeypatch.setattr(pool.store, "check", check)
    report = pool.verify(read_data=True, subset=subset)
    monkeypatch.undo()
    assert report.ok
    assert report.blobs_checked == len(seen)
    return seen


@pytest.mark.parametrize("parts", [2, 3, 7])
def test_subsets_cover_every_blob_exactly_once(
    pool: ArchiveManager, monkeypatch: pytest.MonkeyPatch, parts: int
) -> None:
    for seed in range(4):
        pool.save(f"a{seed}", tiny_rollout(n=8, seed=seed), rollout_id=seed)
    every = live_blobs(pool)
    assert len(every) > parts
    seen: list[str] = []
    for n in range(1, parts + 1):
        seen += _checked(pool, monkeypatch, f"{n}/{parts}")
    assert sorted(seen) == sorted(every)  # each exactly once


def test_subset_is_stable_across_runs(
    pool: ArchiveManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    for seed in range(3):
        pool.save(f"a{seed}", tiny_rollout(n=8, seed=seed), rollout_id=seed)
    assert _checked(pool, monkeypatch, "1/2") == _checked(pool, monkeypatch, " 1 / 2 ")


def test_subset_finds_the_corrupt_blob_in_its_part(pool: ArchiveManager) -> None:
    pool.save("a", tiny_rollout(n=8), rollout_id=1)
    digest = archive_blobs(pool, "a", "chunk")[0]
    path = writable(pool, digest)
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x10
    path.write_bytes(bytes(data))
    found = [not pool.verify(read_data=True, subset=f"{n}/3").ok for n in (1, 2, 3)]
    assert found.count(True) == 1


def test_percent_subset(pool: ArchiveManager, monkeypatch: pytest.MonkeyPatch) -> None:
    for seed in range(3):
        pool.save(f"a{seed}", tiny_rollout(n=8, seed=seed), rollout_id=seed)
    every = live_blobs(pool)
    assert callable(parse_subset("10%"))
    assert callable(parse_subset("2.5 %"))
    assert sorted(_checked(pool, monkeypatch, "100%")) == sorted(every)
    some = _checked(pool, monkeypatch, "10%")
    assert len(some) == len(set(some)) and set(some) <= every


def test_no_subset_means_every_blob() -> None:
    choose = parse_subset(None)
    assert all(choose(c * 32) for c in "0123456789abcdef")


@pytest.mark.parametrize(
    "subset",
    ["", "x", "10", "0/2", "3/2", "1/0", "0/0", "-1/2", "1/-2", "1/2/3", "a/b", "1.5/2",
     "%", "0%", "101%", "-5%", "10%%", "ten%", "1/2 x"],
)  # fmt: skip
def test_malformed_subsets_are_refused(pool: ArchiveManager, subset: str) -> None:
    with pytest.raises(InvalidInputError):
        parse_subset(subset)
    with pytest.raises(InvalidInputError):
        pool.verify(read_data=True, subset=subset)


def test_row_counts_unchanged_by_verify(pool: ArchiveManager) -> None:
    pool.save("a", tiny_rollout(), rollout_id=1)
    with pool.catalog.read() as conn:
        before = [
            conn.execute(select(func.count()).select_from(t)).scalar() for t in CATALOG_TABLES
        ]
    pool.verify(read_data=True)
    with pool.catalog.read() as conn:
        after = [conn.execute(select(func.count()).select_from(t)).scalar() for t in CATALOG_TABLES]
    assert before == after


def test_unowned_lease_blob_counts(pool: ArchiveManager, clock: FakeClock) -> None:
    # A blob row a live lease holds is neither damage nor unowned.
    digest = pool.store.put(b"held by a lease")
    with pool.catalog.write() as conn:
        conn.execute(
            insert(blobs_table).values(
                digest=digest, size=15, kind="chunk", state="live", created_at=clock.now
            )
        )
        conn.execute(
            insert(leases_table).values(
                owner="lease:x", expires_at=clock.now + 10, generation=1, created_at=clock.now
            )
        )
        conn.execute(insert(lease_blobs_table).values(lease="lease:x", digest=digest))
    assert pool.verify(read_data=True).notices == []
    clock.advance(11)
    report = pool.verify(read_data=True)
    assert report.ok
    assert kinds(report.notices) == {"stale-lease", "unowned-blobs"}


# --- verify beside saves and GC -------------------------------------------------------------
# The listing of blobs/ and the catalog snapshot are not one moment; a busy pool must not be
# reported damaged.  (tests/pool/test_gc_race.py runs verify inside the real race.)


def _gc_takes(pool: ArchiveManager, digest: str) -> None:
    """What a GC does to a blob: mark it deleting, then unlink it."""
    with pool.catalog.write() as conn:
        conn.execute(
            update(blobs_table).where(blobs_table.c.digest == digest).values(state="deleting")
        )
    local_store(pool).path(digest).unlink()


def test_blob_written_after_the_listing_is_no_damage(
    pool: ArchiveManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    pool.save("a", tiny_rollout(), rollout_id=1)
    late = archive_blobs(pool, "a", "manifest")[0]  # renamed into place after the listing
    listing = [t for t in pool.store.iter_stat() if t[0] != late]
    monkeypatch.setattr(pool.store, "iter_stat", lambda: iter(listing))
    report = pool.verify(read_data=True)
    assert report.ok, report.problems
    assert report.notices == []


def test_blob_gc_unlinks_after_the_snapshot_is_no_damage(
    pool: ArchiveManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    pool.save("a", tiny_rollout(), rollout_id=1).release()
    pool.save("b", tiny_rollout(seed=1), rollout_id=1)
    doomed = archive_blobs(pool, "a", "chunk")[0]
    listing = [t for t in pool.store.iter_stat() if t[0] != doomed]
    monkeypatch.setattr(pool.store, "iter_stat", lambda: iter(listing))
    real_size = pool.store.size

    def size(digest: str) -> int:
        if digest == doomed:
            _gc_takes(pool, digest)  # between verify's snapshot and its second look
        return real_size(digest)

    monkeypatch.setattr(pool.store, "size", size)
    report = pool.verify()
    assert report.ok, report.problems


def test_blob_gc_unlinks_while_data_is_read_is_no_damage(
    pool: ArchiveManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    pool.save("a", tiny_rollout(), rollout_id=1).release()
    doomed = archive_blobs(pool, "a", "tensor")[0]
    real_check = pool.store.check

    def check(digest: str) -> None:
        if digest == doomed:
            _gc_takes(pool, digest)
        real_check(digest)

    monkeypatch.setattr(pool.store, "check", check)
    report = pool.verify(read_data=True)
    assert report.ok, report.problems


def test_blob_that_vanishes_while_live_is_damage(
    pool: ArchiveManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    pool.save("a", tiny_rollout(), rollout_id=1)
    victim = archive_blobs(pool, "a", "chunk")[0]
    real_check = pool.store.check

    def check(digest: str) -> None:
        if digest == victim:
            local_store(pool).path(digest).unlink()  # not GC: its row stays live
        real_check(digest)

    monkeypatch.setattr(pool.store, "check", check)
    report = pool.verify(read_data=True)
    assert not report.ok
    assert names_blob_and_archive(report, victim, "a"), report.problems
