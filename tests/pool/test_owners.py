"""Retention owners: `retain`, `release_owner`, `Archive.release` and the `owners()` audit."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

import pytest
from helpers import (
    FakeClock,
    abandon_writer,
    assert_loads,
    blob_names,
    blob_sizes,
    die_before_publish,
    tiny_rollout,
    wall_clock,
)
from sqlalchemy import select

from archive_manager import ArchiveManager, ArchiveWriter
from archive_manager.catalog import (
    archive_blobs_table,
    archives_table,
    retention_table,
)
from archive_manager.errors import (
    ArchiveNotFoundError,
    ArchiveReleasedError,
    InvalidNameError,
)

LEASE_TTL = 60.0


def archive_blobs(pool: ArchiveManager, name: str) -> dict[str, str]:
    """digest -> kind of every blob the archive needs, from the catalog."""
    ab, a = archive_blobs_table, archives_table
    with pool.catalog.read() as conn:
        rows = conn.execute(
            select(ab.c.digest, ab.c.kind)
            .join(a, a.c.id == ab.c.archive_id)
            .where(a.c.name == name)
        ).all()
    return dict(rows)


def retention_rows(pool: ArchiveManager) -> list[tuple[str, str]]:
    r, a = retention_table, archives_table
    with pool.catalog.read() as conn:
        return sorted(
            conn.execute(select(r.c.owner, a.c.name).join(a, a.c.id == r.c.archive_id)).all()
        )


@pytest.fixture
def clock() -> FakeClock:
    return wall_clock()


@pytest.fixture
def pool(open_pool: Callable[..., ArchiveManager], clock: FakeClock) -> ArchiveManager:
    # inline_limit=64 turns every routed-expert tensor into its own blob, so archives have
    # chunk, tensor and manifest blobs.
    return open_pool(clock=clock, lease_ttl=LEASE_TTL, chunk_size=4, inline_limit=64)


# --- retain -----------------------------------------------------------------------------


def test_retain_adds_an_external_owner_once(pool: ArchiveManager) -> None:
    pool.save("a", tiny_rollout(), rollout_id=1)
    assert pool.retain("checkpoint:step-1", "a") is True
    assert pool.retain("checkpoint:step-1", "a") is False
    assert retention_rows(pool) == [("archive:a", "a"), ("checkpoint:step-1", "a")]
    usage = {u.owner: u for u in pool.owners().owners}
    assert usage["checkpoint:step-1"].archives == ["a"]
    assert usage["checkpoint:step-1"].blobs == len(archive_blobs(pool, "a"))


@pytest.mark.parametrize(
    "owner",
    [
        "lease:0123456789abcdef",
        "archive:a",
        "archive:other",
        "gc:run",
        "no-colon",
        ":rest",
        "kind:",
        "check\x00point:x",
        "checkpoint:x\x00",
        "checkpoint:\n",
        "checkpoint:" + "x" * 245,  # 256 bytes
        "checkpoint:" + "é" * 130,  # 141 characters, 271 bytes
        "",
        " checkpoint:x",
        None,
        42,
    ],
)
def test_reserved_and_malformed_owners_are_refused(pool: ArchiveManager, owner: Any) -> None:
    pool.save("a", tiny_rollout(), rollout_id=1)
    before = retention_rows(pool)
    with pytest.raises(InvalidNameError):
        pool.retain(owner, "a")
    with pytest.raises(InvalidNameError):
        pool.release_owner(owner)
    assert retention_rows(pool) == before


def test_owner_of_255_bytes_is_accepted(pool: ArchiveManager) -> None:
    pool.save("a", tiny_rollout(), rollout_id=1)
    owner = "checkpoint:" + "x" * 244
    assert len(owner.encode()) == 255
    assert pool.retain(owner, "a") is True
    assert pool.release_owner(owner) == 1


def test_retain_of_a_missing_archive(pool: ArchiveManager) -> None:
    with pytest.raises(ArchiveNotFoundError):
        pool.retain("checkpoint:x", "nope")
    with pytest.raises(InvalidNameError):
        pool.retain("checkpoint:x", "../escape")
    assert retention_rows(pool) == []


def test_retain_of_a_released_unowned_archive_is_refused(pool: ArchiveManager) -> None:
    arc = pool.save("a", tiny_rollout(), rollout_id=1)
    assert arc.release() is True
    with pytest.raises(ArchiveReleasedError):
        pool.retain("checkpoint:x", "a")
    assert retention_rows(pool) == []


# --- release ----------------------------------------------------------------------------


def test_release_owner_returns_how_many_archives_it_held(pool: ArchiveManager) -> None:
    for name in ("a", "b", "c"):
        pool.save(name, tiny_rollout(seed=ord(name)), rollout_id=1)
    pool.retain("checkpoint:x", "a")
    pool.retain("checkpoint:x", "b")
    pool.retain("queue:train", "c")
    assert pool.release_owner("checkpoint:x") == 2
    assert pool.release_owner("checkpoint:x") == 0
    assert pool.release_owner("checkpoint:never") == 0
    assert retention_rows(pool) == [
        ("archive:a", "a"),
        ("archive:b", "b"),
        ("archive:c", "c"),
        ("queue:train", "c"),
    ]
    # Releasing an external owner does not release the archives themselves.
    assert [i.name for i in pool.find()] == ["a", "b", "c"]


def test_release_is_idempotent(pool: ArchiveManager) -> None:
    arc = pool.save("a", tiny_rollout(), rollout_id=1)
    assert arc.release() is True
    assert arc.release() is False
    assert arc.state == "released"
    assert [i.name for i in pool.find(state="released")] == ["a"]


def test_external_owner_keeps_a_released_archive_until_it_lets_go(
    pool: ArchiveManager, clock: FakeClock
) -> None:
    samples = tiny_rollout()
    arc = pool.save("a", samples, rollout_id=1)
    digests = archive_blobs(pool, "a")
    assert set(digests.values()) == {"chunk", "tensor", "manifest"}
    assert pool.retain("checkpoint:x", "a") is True
    clock.advance(10)
    released_at = clock.now
    assert arc.release() is True

    report = pool.gc(grace=0)
    assert report.blobs == 0
    assert set(digests) <= blob_names(pool)
    assert_loads(pool, "a", samples)
    assert pool.open_archive("a").state == "released"
    assert pool.owners().released_with_payload == ["a"]

    clock.advance(10)
    assert pool.release_owner("checkpoint:x") == 1
    size = sum(blob_sizes(pool)[d] for d in digests)
    report = pool.gc(grace=0)
    assert (report.blobs, report.bytes) == (len(digests), size)
    assert report.per_archive == {"a": {"blobs": len(digests), "bytes": size}}
    # Nothing of it is left under blobs/: chunks, tensors and manifest alike.
    assert not set(digests) & blob_names(pool)
    assert blob_names(pool) == set()

    reopened = pool.open_archive("a")  # the rows stay for inspection
    assert reopened.state == "released"
    assert len(reopened.keys()) == len(samples)
    assert len(reopened.sample_metadata()) == len(samples)
    with pytest.raises(ArchiveReleasedError) as err:
        reopened.load_samples()
    message = str(err.value)
    assert "'a'" in message
    when = datetime.fromtimestamp(released_at, tz=timezone.utc)
    shown = {
        when.isoformat(timespec="seconds"),
        when.astimezone().isoformat(timespec="seconds"),
    }
    assert any(s in message for s in shown), message
    with pytest.raises(ArchiveReleasedError):
        reopened.load_samples(sample_key=reopened.keys()[0][0])
    with pytest.raises(ArchiveReleasedError):
        pool.retain("checkpoint:x", "a")


def test_archive_owner_and_external_owner_are_independent(pool: ArchiveManager) -> None:
    samples = tiny_rollout()
    arc = pool.save("a", samples, rollout_id=1)
    pool.retain("checkpoint:x", "a")
    # The external owner lets go first: the archive's own owner still keeps it.
    assert pool.release_owner("checkpoint:x") == 1
    assert pool.gc(grace=0).blobs == 0
    assert_loads(pool, "a", samples)
    assert arc.state == "published"


# --- the owners() audit -------------------------------------------------------------------


def test_owners_report_numbers(pool: ArchiveManager, clock: FakeClock) -> None:
    a = pool.save("a", tiny_rollout(seed=1), rollout_id=1)
    pool.save("b", None, rollout_id=1, reference=a)  # shares a's chunks and tensors
    pool.save("c", tiny_rollout(seed=2), rollout_id=1)
    sizes = blob_sizes(pool)
    da, db, dc = (set(archive_blobs(pool, n)) for n in "abc")
    shared = da & db
    assert {archive_blobs(pool, "a")[d] for d in da - db} == {"manifest"}
    assert {archive_blobs(pool, "a")[d] for d in shared} == {"chunk", "tensor"}
    assert not dc & (da | db)

    def total(ds: set[str]) -> int:
        return sum(sizes[d] for d in ds)

    report = pool.owners()
    usage = {u.owner: u for u in report.owners}
    assert set(usage) == {"archive:a", "archive:b", "archive:c"}
    for owner, ds, exclusive in (
        ("archive:a", da, da - db),
        ("archive:b", db, db - da),
        ("archive:c", dc, dc),
    ):
        u = usage[owner]
        assert u.archives == [owner.split(":", 1)[1]]
        assert (u.blobs, u.bytes) == (len(ds), total(ds))
        assert u.exclusive_bytes == total(exclusive)
        assert u.shared_bytes == total(ds - exclusive)
    assert report.unowned_blobs == 0
    assert report.unowned_bytes == 0
    assert report.stale_leases == report.live_leases == []
    assert report.released_with_payload == []

    # An external owner of a: a's manifest is now shared too.
    pool.retain("checkpoint:x", "a")
    usage = {u.owner: u for u in pool.owners().owners}
    assert usage["archive:a"].exclusive_bytes == 0
    assert usage["archive:a"].shared_bytes == total(da)
    assert usage["checkpoint:x"].archives == ["a"]
    assert (usage["checkpoint:x"].blobs, usage["checkpoint:x"].bytes) == (len(da), total(da))
    assert usage["archive:b"].exclusive_bytes == total(db - da)

    # c released: its blobs await GC and its payload is still there.
    pool.open_archive("c").release()
    report = pool.owners()
    assert "archive:c" not in {u.owner for u in report.owners}
    assert (report.unowned_blobs, report.unowned_bytes) == (len(dc), total(dc))
    assert report.released_with_payload == ["c"]
    # a released but retained by checkpoint:x: payload remains, nothing unowned.
    a.release()
    report = pool.owners()
    assert report.released_with_payload == ["a", "c"]
    assert report.unowned_blobs == len(dc)

    pool.gc(grace=0)
    report = pool.owners()
    assert (report.unowned_blobs, report.unowned_bytes) == (0, 0)
    assert report.released_with_payload == ["a"]

    # A save in flight holds its blobs under a live lease; once it lapses, they await GC.
    w = abandon_writer(pool, "w", tiny_rollout(n=5, seed=3))
    held = _lease_blobs(pool, w.lease)
    assert held
    report = pool.owners()
    assert report.live_leases == [w.lease]
    assert report.stale_leases == []
    usage = {u.owner: u for u in report.owners}
    assert usage[w.lease].blobs == len(held)
    assert report.unowned_blobs == 0
    clock.advance(LEASE_TTL + 1)
    report = pool.owners()
    assert report.live_leases == []
    assert report.stale_leases == [w.lease]
    sizes = blob_sizes(pool)
    assert (report.unowned_blobs, report.unowned_bytes) == (len(held), total(held))
    pool.gc(grace=0)
    report = pool.owners()
    assert report.stale_leases == []
    assert (report.unowned_blobs, report.unowned_bytes) == (0, 0)
    assert {u.owner for u in report.owners} == {"archive:b", "checkpoint:x"}


def test_owners_of_a_dead_pending_save(
    pool: ArchiveManager, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A save killed between committing ownership and publishing: while its lease lives, its
    # archive owner holds its blobs; once the lease lapsed, GC will roll it back, so the
    # audit counts them as unowned, as GC does.
    class Killed(BaseException):
        pass

    def publish(self: ArchiveWriter, archive_id: int, manifest: str) -> None:
        raise Killed

    with monkeypatch.context() as m:
        m.setattr(ArchiveWriter, "_publish", publish)
        m.setattr(ArchiveWriter, "abort", ArchiveWriter.abandon)
        with pytest.raises(Killed):
            pool.save("p", tiny_rollout(), rollout_id=1)
    digests = set(archive_blobs(pool, "p"))
    sizes = blob_sizes(pool)
    report = pool.owners()
    assert len(report.live_leases) == 1
    # The lease handed its blobs to the archive's owner at step 4; it stays until publication.
    assert sorted((u.owner, u.archives, u.blobs) for u in report.owners) == [
        ("archive:p", ["p"], len(digests)),
        (report.live_leases[0], [], 0),
    ]
    assert report.unowned_blobs == 0
    clock.advance(LEASE_TTL + 1)
    report = pool.owners()
    assert report.owners == []
    assert len(report.stale_leases) == 1
    assert (report.unowned_blobs, report.unowned_bytes) == (
        len(digests),
        sum(sizes[d] for d in digests),
    )
    assert pool.gc(grace=0).rolled_back == ["p"]
    report = pool.owners()
    assert (report.unowned_blobs, report.stale_leases, report.owners) == (0, [], [])


def test_release_plan_counts_what_a_dead_pending_save_shares(
    pool: ArchiveManager, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A dead pending save retains nothing (GC rolls it back before it deletes): a release
    # plan must not count it as a holder of the blobs it shares with the released archive,
    # or it under-reports what the next GC reclaims (docs/architecture/gc-protocol.md, "GC
    # protocol").
    samples = tiny_rollout()
    pool.save("a", samples, rollout_id=1)
    die_before_publish(pool, "p", samples, monkeypatch)  # same chunks and tensors: shared
    needed = archive_blobs(pool, "a")
    shared = set(needed) & set(archive_blobs(pool, "p"))
    assert shared and shared != set(needed)  # all but the manifests
    sizes = blob_sizes(pool)
    # While the save's lease lives, it holds the shared blobs: only "a"'s own ones are freed.
    plan = pool.release_plan(name="a")
    own = set(needed) - shared
    assert (plan.blobs, plan.bytes) == (len(own), sum(sizes[d] for d in own))
    clock.advance(LEASE_TTL + 1)
    plan = pool.release_plan(name="a")
    assert (plan.archives, plan.blobs, plan.bytes) == (
        ["a"],
        len(needed),
        sum(sizes[d] for d in needed),
    )
    # ... and that is what GC reclaims of "a" once it is released.
    pool.open_archive("a").release()
    pool.gc(grace=0)
    assert not set(needed) & blob_names(pool)


def _lease_blobs(pool: ArchiveManager, lease: str) -> set[str]:
    from archive_manager.catalog import lease_blobs_table as lb

    with pool.catalog.read() as conn:
        return set(conn.execute(select(lb.c.digest).where(lb.c.lease == lease)).scalars())


def test_owners_as_dict_is_json_friendly(pool: ArchiveManager) -> None:
    import json

    pool.save("a", tiny_rollout(), rollout_id=1)
    pool.retain("queue:train", "a")
    data = json.loads(json.dumps(pool.owners().as_dict()))
    assert {o["owner"] for o in data["owners"]} == {"archive:a", "queue:train"}
