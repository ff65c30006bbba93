"""ArchiveManager: save and the streaming writer (publish, rollback), reference archives,
visibility of pending saves, bad input that must leave the pool as it was, lease fencing."""

from __future__ import annotations

import gc
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import blob_files, folder_store, local_store, run_at_exit
from sqlalchemy import exc as sa_exc
from sqlalchemy import select

from archive_manager import ArchiveManager, ArchiveWriter, Sample
from archive_manager.catalog import Catalog, blobs_table, leases_table
from archive_manager.catalog.engine import catalog_identity, make_engine, public_url, shown_url
from archive_manager.errors import (
    ArchiveError,
    ArchiveExistsError,
    ArchiveNotFoundError,
    CatalogError,
    InvalidInputError,
    InvalidNameError,
    LeaseExpiredError,
    PoolNotFoundError,
    UnencodableError,
)
from archive_manager.pool import opening as opening_module


def lease_rows(pool) -> list:
    with pool.catalog.read() as conn:
        return conn.execute(select(leases_table)).all()


def names(infos) -> list[str]:
    return [info.name for info in infos]


class Opaque:
    """An arbitrary object: not storable."""


# --------------------------------------------------------------------------- save


def test_save_publishes_and_open_archive_finds_it(pool, rollout, same_samples) -> None:
    samples = rollout(70, seed=1, rollout_id=5)
    arc = pool.save("run1-step5", samples, rollout_id=5, attrs={"lr": 1e-6})
    assert (arc.name, arc.rollout_id, arc.evaluation, arc.state) == (
        "run1-step5",
        5,
        False,
        "published",
    )
    assert arc.attrs == {"lr": 1e-6}
    again = pool.open_archive("run1-step5")
    assert (again.name, len(again), again.attrs) == ("run1-step5", 70, {"lr": 1e-6})
    same_samples(again.load_samples(), samples)
    assert lease_rows(pool) == []
    with pytest.raises(ArchiveNotFoundError):
        pool.open_archive("run1-step6")


def test_unicode_names_round_trip(pool, rollout) -> None:
    name = "rollout ünïcödé 漢字 #3"
    pool.save(name, rollout(3), rollout_id=0)
    assert pool.open_archive(name).name == name
    assert names(pool.find()) == [name]


def test_taken_name_raises_and_writes_nothing(pool, rollout, snapshot) -> None:
    pool.save("a", rollout(70), rollout_id=1)
    before = snapshot(pool)
    with pytest.raises(ArchiveExistsError):
        pool.save("a", rollout(70, seed=99), rollout_id=2)
    with pytest.raises(ArchiveExistsError):
        pool.writer("a", rollout_id=2)
    with pytest.raises(ArchiveExistsError):
        pool.save("a", None, rollout_id=2, reference="a")
    assert snapshot(pool) == before


def test_identical_content_is_stored_once(pool, rollout, blob_files_of) -> None:
    samples = rollout(70, seed=2)
    pool.save("a", samples, rollout_id=1)
    files = blob_files_of(pool)
    assert len(files.files()) == 3  # two chunks, one manifest
    pool.save("b", samples, rollout_id=1)
    assert len(files.files()) == 4  # only b's manifest is new
    assert files.chunks("a") == files.chunks("b")


# --------------------------------------------------------------------------- references


def test_reference_shares_chunks(pool, rollout, same_samples, blob_files_of) -> None:
    samples = rollout(70, seed=3, r3_layers=1)
    a = pool.save("a", samples, rollout_id=1)
    files = blob_files_of(pool)
    before = set(files.files())

    b = pool.save("b", None, rollout_id=2, reference="a", attrs={"why": "eval copy"})
    new = set(files.files()) - before
    assert len(new) == 1  # b's manifest, no chunk
    assert new == {str(local_store(pool).path(b.manifest_digest).relative_to(pool.root / "blobs"))}
    assert files.chunks("b") == files.chunks("a")
    assert files.digests("b", "chunk") == files.digests("a", "chunk")

    assert (b.rollout_id, b.reference, len(b), b.attrs) == (2, "a", 70, {"why": "eval copy"})
    assert b.keys() == a.keys()
    assert b.sample_metadata() == a.sample_metadata()
    same_samples(b.load_samples(), samples)
    same_samples(b.load_samples(task_key="rollout-0/group-8"), samples[64:])
    (info,) = pool.find(rollout_id=2)
    assert info.reference == "a"

    c = pool.save("c", None, rollout_id=3, reference=b)  # an Archive works too
    same_samples(c.load_samples(sample_key="sample:3"), [samples[3]])
    # The reference keeps its own owner: releasing the source does not affect it.
    assert a.release() is True
    same_samples(b.load_samples(), samples)


def test_reference_to_missing_archive_changes_nothing(pool, rollout, snapshot) -> None:
    pool.save("a", rollout(10), rollout_id=1)
    before = snapshot(pool)
    with pytest.raises(ArchiveNotFoundError):
        pool.save("b", None, rollout_id=1, reference="missing")
    assert snapshot(pool) == before
    with pytest.raises(ArchiveNotFoundError):
        pool.open_archive("b")


@pytest.mark.parametrize(("with_samples", "task_keys"), [(True, None), (False, ["x"] * 10)])
def test_reference_refuses_samples_and_task_keys(
    pool, rollout, snapshot, with_samples, task_keys
) -> None:
    samples = rollout(10)
    pool.save("a", samples, rollout_id=1)
    before = snapshot(pool)
    with pytest.raises(InvalidInputError):
        pool.save(
            "b",
            samples if with_samples else None,
            rollout_id=1,
            reference="a",
            task_keys=task_keys,
        )
    assert snapshot(pool) == before


# --------------------------------------------------------------------------- streaming writer


def test_writer_publishes_on_clean_exit(pool, rollout, same_samples) -> None:
    samples = rollout(150, seed=4)
    with pool.writer("w", rollout_id=7, evaluation=True, attrs={"k": 1}) as w:
        for i, sample in enumerate(samples):
            if i == 3:
                w.add(sample, task_key="special")
            elif i == 4:
                w.add(sample, task_key=None)
            else:
                w.add(sample)
        assert len(w) == 150
        with pytest.raises(ArchiveNotFoundError):  # nothing is visible before the exit
            pool.open_archive("w")
        assert pool.find(state=None) == []
    assert w.archive is not None
    assert (w.archive.name, w.archive.rollout_id, w.archive.evaluation) == ("w", 7, True)
    arc = pool.open_archive("w")
    assert arc.keys()[3] == ("sample:3", "special")
    assert arc.keys()[4] == ("sample:4", None)
    assert arc.keys()[5] == ("sample:5", "rollout-0/group-0")
    same_samples(arc.load_samples(), samples)
    assert lease_rows(pool) == []
    with pytest.raises(ArchiveError):
        w.add(samples[0])  # a committed writer takes no more samples


def test_writer_rolls_back_on_exception(pool, rollout, snapshot, blob_files_of, same_samples):
    pool.save("other", rollout(70, seed=5), rollout_id=0)
    before = snapshot(pool)
    samples = rollout(200, seed=6, rollout_id=1)
    files = blob_files_of(pool)
    with pytest.raises(RuntimeError, match="producer died"), pool.writer("w", rollout_id=1) as w:
        for sample in samples:
            w.add(sample)
        # Stores run in the background (two pairs may be in flight): wait for them, so the
        # rollback has written blobs to remove.
        w.wait_stored()
        assert len(files.files()) > len(before.blobs)
        assert len(lease_rows(pool)) == 1
        raise RuntimeError("producer died")
    assert snapshot(pool) == before  # blobs removed, lease dropped, no rows
    assert lease_rows(pool) == []
    with pytest.raises(ArchiveNotFoundError):
        pool.open_archive("w")
    assert pool.find(state=None) == pool.find()
    # The name is free again.
    same_samples(pool.save("w", samples, rollout_id=1).load_samples(), samples)


def test_a_save_whose_rollback_fails_says_what_it_left(
    pool, rollout, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A catalog that fails a save (`ulimit -f`, a full disk) fails its rollback too; the
    error said "nothing was committed" while the save's lease and pending archive stayed
    committed until the lease lapsed.  It now says what is left and what reclaims it."""
    write = pool.catalog.write

    def failing_write(step: str | None = None, **options: object):  # type: ignore[no-untyped-def]
        if step == "save.rollback":
            raise CatalogError("the catalog file could not be written (disk I/O error)")
        return write(step, **options)

    with pytest.raises(CatalogError) as info, pool.writer("w", rollout_id=1) as w:
        w.add(rollout(5, seed=8)[0])
        w.wait_stored()
        monkeypatch.setattr(pool.catalog, "write", failing_write)
        raise CatalogError("the catalog file could not be written (disk I/O error)")
    message = str(info.value)
    assert "could not be rolled back" in message and "'archive-manager gc'" in message
    monkeypatch.undo()
    assert len(lease_rows(pool)) == 1  # what the message says is left


def test_writer_rollback_keeps_blobs_others_need(pool, rollout, same_samples, blob_files_of):
    samples = rollout(70, seed=7)
    pool.save("a", samples, rollout_id=0)
    files_before = blob_files_of(pool).files()
    with pytest.raises(KeyboardInterrupt), pool.writer("b", rollout_id=0) as w:
        for sample in samples:  # same chunks as "a": deduplicated, not owned by b
            w.add(sample)
        raise KeyboardInterrupt
    assert blob_files_of(pool).files() == files_before
    same_samples(pool.open_archive("a").load_samples(), samples)


def test_writer_abort_is_explicit_and_idempotent(pool, rollout, snapshot) -> None:
    before = snapshot(pool)
    w = pool.writer("w", rollout_id=0)
    for sample in rollout(70):
        w.add(sample)
    w.abort()
    w.abort()
    assert snapshot(pool) == before
    with pytest.raises(ArchiveError):
        w.commit()


def test_same_name_saved_twice_at_once(pool, rollout, same_samples, blob_files_of) -> None:
    first, second = rollout(70, seed=8), rollout(70, seed=9)
    w1 = pool.writer("x", rollout_id=0)
    w2 = pool.writer("x", rollout_id=0)  # both pass the up-front name check
    for a, b in zip(first, second, strict=True):
        w1.add(a)
        w2.add(b)
    w1.commit()
    with pytest.raises(ArchiveExistsError):
        w2.commit()
    # Only the published archive's blobs are left: w2's chunks and lease are gone.
    files = blob_files_of(pool)
    kept = files.digests("x")
    assert files.files() == sorted(
        str(local_store(pool).path(d).relative_to(pool.root / "blobs")) for d in kept
    )
    with pool.catalog.read() as conn:
        assert sorted(conn.execute(select(blobs_table.c.digest)).scalars()) == kept
    assert lease_rows(pool) == []
    same_samples(pool.open_archive("x").load_samples(), first)


@pytest.fixture
def paused_publish(monkeypatch) -> Iterator[tuple[threading.Event, threading.Event]]:
    """Hold every save between step 4 (ownership, state pending) and step 5 (publish)."""
    reached, go = threading.Event(), threading.Event()
    real = ArchiveWriter._publish

    def paused(self: ArchiveWriter, archive_id: int, manifest: str) -> None:
        reached.set()
        assert go.wait(60)
        real(self, archive_id, manifest)

    monkeypatch.setattr(ArchiveWriter, "_publish", paused)
    yield reached, go
    go.set()


def test_pending_archives_are_invisible(pool, rollout, paused_publish, same_samples) -> None:
    reached, go = paused_publish
    samples = rollout(70, seed=10, rollout_id=1)
    done: list = []
    saver = threading.Thread(target=lambda: done.append(pool.save("p", samples, rollout_id=1)))
    saver.start()
    try:
        assert reached.wait(60)
        # Pending: ownership is committed, but the archive is not visible.
        with pytest.raises(ArchiveNotFoundError):
            pool.open_archive("p")
        assert pool.find() == []
        assert pool.find(rollout_id=1) == []
        assert pool.find(task_key="rollout-1/group-0") == []
        (info,) = pool.find(state=None)
        assert (info.name, info.state, info.published_at) == ("p", "pending", None)
        assert names(pool.find(state="pending")) == ["p"]
        with pytest.raises(ArchiveNotFoundError):
            pool.retain("checkpoint:step-1", "p")
        with pytest.raises(ArchiveExistsError):  # the name is taken by the save in flight
            pool.writer("p", rollout_id=1)
    finally:
        go.set()
        saver.join(60)
    (arc,) = done
    assert pool.open_archive("p").state == "published"
    assert names(pool.find(task_key="rollout-1/group-0")) == ["p"]
    same_samples(arc.load_samples(), samples)


# --------------------------------------------------------------------------- bad input


BAD_NAMES = [
    "a/b",
    "/abs",
    "a\\b",
    "..",
    "../escape",
    "a..b",
    ".",
    "nul\x00byte",
    "tab\tname",
    "é" * 128,  # 256 bytes of UTF-8
    "x" * 256,
    "",
    " padded",
    123,
    None,
]


@pytest.mark.parametrize("name", BAD_NAMES, ids=repr)
def test_bad_names_are_refused(pool, rollout, snapshot, name) -> None:
    samples = rollout(3)
    pool.save("a", samples, rollout_id=0)
    before = snapshot(pool)
    with pytest.raises(InvalidNameError):
        pool.save(name, samples, rollout_id=0)
    with pytest.raises(InvalidNameError):
        pool.writer(name, rollout_id=0)
    with pytest.raises(InvalidNameError):
        pool.save(name, None, rollout_id=0, reference="a")
    with pytest.raises(InvalidNameError):
        pool.open_archive(name)
    assert snapshot(pool) == before
    assert issubclass(InvalidNameError, ValueError)


def test_longest_name_is_accepted(pool, rollout) -> None:
    name = "é" * 127 + "x"  # 255 bytes
    pool.save(name, rollout(1), rollout_id=0)
    assert pool.open_archive(name).name == name


def _generator(samples):
    yield from samples


BAD_CALLS: dict[str, Callable[[list[Any]], dict[str, Any]]] = {
    "task_keys too short": lambda s: {"task_keys": ["k"] * (len(s) - 1)},
    "task_keys too long": lambda s: {"task_keys": ["k"] * (len(s) + 1)},
    "task_keys a str": lambda s: {"task_keys": "k" * len(s)},
    "task_keys a generator": lambda s: {"task_keys": (f"k{i}" for i in range(len(s)))},
    "task_key of a bad type": lambda s: {"task_keys": ["k"] * (len(s) - 1) + [1.5]},
    "rollout_id a str": lambda s: {"rollout_id": "3"},
    "rollout_id a float": lambda s: {"rollout_id": 3.0},
    "rollout_id a bool": lambda s: {"rollout_id": True},
    "evaluation not a bool": lambda s: {"evaluation": "yes"},
    "attrs not JSON": lambda s: {"attrs": {"x": Opaque()}},
    "attrs with int keys": lambda s: {"attrs": {1: "x"}},
    "samples a generator": lambda s: {"samples": _generator(s)},
    "samples one sample": lambda s: {"samples": s[0]},
    "samples a dict": lambda s: {"samples": {"tokens": [1]}},
    "samples a str": lambda s: {"samples": "samples"},
    "samples None": lambda s: {"samples": None},
    "samples and reference": lambda s: {"reference": "a"},
}


@pytest.mark.parametrize("case", list(BAD_CALLS))
def test_bad_input_is_refused_and_changes_nothing(pool, rollout, snapshot, case) -> None:
    samples = rollout(70, seed=11)
    pool.save("a", samples, rollout_id=0)
    before = snapshot(pool)
    kwargs = {"samples": samples, "rollout_id": 1, **BAD_CALLS[case](samples)}
    with pytest.raises(InvalidInputError):
        pool.save("b", kwargs.pop("samples"), **kwargs)
    assert snapshot(pool) == before


@pytest.mark.parametrize("as_dict", [False, True])
def test_unencodable_sample_late_in_the_rollout_cleans_up(
    pool, rollout, snapshot, same_samples, as_dict
) -> None:
    pool.save("a", rollout(70, seed=12), rollout_id=0)
    before = snapshot(pool)
    samples = rollout(130, seed=13, rollout_id=1, as_dict=as_dict)  # 64 + 64 + 2
    bad = samples[99]
    (bad if as_dict else bad.metadata)["handle"] = Opaque()
    with pytest.raises(UnencodableError, match="Opaque"):
        pool.save("b", samples, rollout_id=1)
    # Chunk 0 was written before chunk 1 failed to encode: it is gone again.
    assert snapshot(pool) == before
    # Nothing blocks a corrected save under the same name.
    del (bad if as_dict else bad.metadata)["handle"]
    same_samples(pool.save("b", samples, rollout_id=1).load_samples(), samples)


def test_unencodable_sample_in_writer_rolls_back(pool, rollout, snapshot) -> None:
    before = snapshot(pool)
    samples = rollout(70, seed=14)
    samples[5].rollout_routed_experts = [Opaque()]
    with pytest.raises(UnencodableError), pool.writer("w", rollout_id=0) as w:
        for sample in samples:
            w.add(sample)
    assert snapshot(pool) == before


def test_unregistered_sample_class_is_refused(pool, snapshot) -> None:
    before = snapshot(pool)
    with pytest.raises(UnencodableError):
        pool.save("w", [Sample(index=0), Opaque()], rollout_id=0)
    assert snapshot(pool) == before


@pytest.mark.parametrize(("n_samples", "failing_put"), [(200, 1), (320, 1), (448, 2)])
def test_failed_chunk_write_poisons_the_writer(
    pool, rollout, snapshot, monkeypatch, n_samples, failing_put
) -> None:
    """A writer whose chunk failed to store must never publish an archive missing it.

    Chunks of 64 are stored in pairs, two pairs in flight: with 320 samples and the first
    pair failing, or 448 and the second, the writer waits for the failed store at chunk 4
    (or 6) and the failure surfaces in `add` whatever the timing; with 200 it surfaces in
    `add` if the store ended before chunk 2 was flushed, else at commit.  The chunks built
    after it are lost; a writer that went on would publish entries without chunks.
    """
    before = snapshot(pool)
    samples = rollout(n_samples, seed=15)
    real_put_many = folder_store(pool).put_many
    calls = {"n": 0}

    def flaky_put_many(items, **options):
        calls["n"] += 1
        if calls["n"] == failing_put:
            raise OSError(28, "No space left on device")
        return real_put_many(items, **options)

    monkeypatch.setattr(folder_store(pool), "put_many", flaky_put_many)
    w = pool.writer("w", rollout_id=0)
    failures = []
    for sample in samples:  # a producer that logs errors and carries on
        try:
            w.add(sample)
        except OSError as exc:
            failures.append(exc)
    assert failures or n_samples == 200
    with pytest.raises(OSError, match="No space"):
        w.commit()
    assert snapshot(pool) == before
    with pytest.raises(ArchiveNotFoundError):
        pool.open_archive("w")


def test_a_store_queued_behind_a_failed_one_claims_nothing(
    pool, rollout, snapshot, monkeypatch
) -> None:
    """Two stores in flight: the first pair's upload fails while the second pair waits queued
    behind it; the second claims no rows and writes nothing, and the save rolls back whole."""
    from archive_manager.pool import writer as writer_mod

    before = snapshot(pool)
    queued = threading.Event()
    real_put_many = folder_store(pool).put_many
    calls = {"put_many": 0, "claims": 0}

    def failing_first(items, **options):
        calls["put_many"] += 1
        if calls["put_many"] == 1:
            assert queued.wait(30)  # the second pair is queued behind this one
            raise OSError(28, "No space left on device")
        return real_put_many(items, **options)

    real_submit = writer_mod.ArchiveWriter._submit_batch
    submitted = {"n": 0}

    def submit(self):
        real_submit(self)
        submitted["n"] += 1
        if submitted["n"] == 2:
            queued.set()

    real_claim = writer_mod.ArchiveWriter._claim_rows

    def claim(self, conn, blobs, now):
        calls["claims"] += 1
        return real_claim(self, conn, blobs, now)

    monkeypatch.setattr(folder_store(pool), "put_many", failing_first)
    monkeypatch.setattr(writer_mod.ArchiveWriter, "_submit_batch", submit)
    monkeypatch.setattr(writer_mod.ArchiveWriter, "_claim_rows", claim)
    with pytest.raises(OSError, match="No space"), pool.writer("w", rollout_id=0) as w:
        for sample in rollout(256, seed=17):  # four chunks: two pairs
            w.add(sample)
    assert submitted["n"] == 2 and calls == {"put_many": 1, "claims": 1}
    assert snapshot(pool) == before


# --------------------------------------------------------------------------- leases


def test_lapsed_lease_fails_at_commit(open_pool, clock, rollout, snapshot) -> None:
    # A long ttl: the heartbeat thread never runs during the test, only the clock moves.
    pool = open_pool(clock=clock, lease_ttl=3600)
    pool.save("a", rollout(10), rollout_id=0)
    before = snapshot(pool)
    samples = rollout(130, seed=16)
    with pytest.raises(LeaseExpiredError), pool.writer("w", rollout_id=0) as w:
        for sample in samples[:100]:
            w.add(sample)
        clock.advance(3601)  # the process was paused for longer than its lease
        for sample in samples[100:]:
            w.add(sample)
    with pytest.raises(ArchiveNotFoundError):
        pool.open_archive("w")
    assert pool.find(state=None) == pool.find()
    assert lease_rows(pool) == []
    assert snapshot(pool) == before


def test_lease_that_heartbeat_could_not_renew_fails(open_pool, clock, rollout, snapshot):
    # A short ttl: the heartbeat runs every 0.1 s (real time) and renews with the fake clock.
    pool = open_pool(clock=clock, lease_ttl=0.3)
    before = snapshot(pool)
    samples = rollout(70, seed=17)
    with pytest.raises(LeaseExpiredError), pool.writer("w", rollout_id=0) as w:
        for sample in samples:
            w.add(sample)
        clock.advance(10)  # the clock jumps: the next renewal finds the lease lapsed
        w.join_renewal(timeout=30)
        assert not w.renewing, "the heartbeat should have given up"
    with pytest.raises(ArchiveNotFoundError):
        pool.open_archive("w")
    assert lease_rows(pool) == []
    assert snapshot(pool) == before


def _wait_for_renewal(pool, clock, ttl: float) -> None:
    """Wait (real time) until the heartbeat renewed the one lease at the clock's current time."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        (lease,) = lease_rows(pool)
        if lease.expires_at >= clock.now + ttl:
            return
        time.sleep(0.01)
    raise AssertionError("the heartbeat did not renew the lease")


def test_heartbeat_keeps_a_slow_writer_alive(open_pool, clock, rollout, same_samples) -> None:
    pool = open_pool(clock=clock, lease_ttl=0.3)
    samples = rollout(70, seed=18)
    start = clock.now
    with pool.writer("slow", rollout_id=0) as w:
        for i, sample in enumerate(samples):
            w.add(sample)
            if i % 10 == 0:
                clock.advance(0.2)  # slow, but within the lease: renewals keep up
                _wait_for_renewal(pool, clock, 0.3)
    assert clock.now - start > 4 * 0.3  # far more than one ttl passed in all
    same_samples(pool.open_archive("slow").load_samples(), samples)
    assert lease_rows(pool) == []


def test_abandoned_writer_stops_renewing_and_gc_reclaims(open_pool, clock, rollout) -> None:
    # A writer dropped without commit or abort must not keep its lease alive forever.
    pool = open_pool(clock=clock, lease_ttl=0.3)
    earlier = set(threading.enumerate())  # other tests' writers may still be winding down
    w = pool.writer("dropped", rollout_id=0)
    for sample in rollout(70, seed=19):
        w.add(sample)
    w.wait_stored()  # its first chunk is written and held by the lease
    (heartbeat,) = [
        t for t in threading.enumerate() if t.name == "archive-lease" and t not in earlier
    ]
    del w
    gc.collect()
    heartbeat.join(timeout=30)
    assert not heartbeat.is_alive()
    clock.advance(1)
    report = pool.gc(grace=0)
    assert report.expired_leases == 1
    assert report.blobs >= 1
    assert lease_rows(pool) == []
    assert blob_files(pool.root) == []


def test_int_task_keys_are_strings_everywhere(pool, rollout) -> None:
    samples = rollout(3)
    pool.save("ints", samples, rollout_id=0, task_keys=[7, 7, None])
    arc = pool.open_archive("ints")
    assert [k for _, k in arc.keys()] == ["7", "7", None]
    assert len(arc.load_samples(task_key=7)) == 2
    assert [i.name for i in pool.find(task_key=7)] == ["ints"]


# --------------------------------------------------------------------------- catalog URLs


SECRET_URLS = [
    "postgresql+psycopg://team:s3cret@db-host:5432/rollouts",
    "postgresql+psycopg://team@db-host/rollouts?password=s3cret&application_name=train",
    "postgresql://team:s3cret@db-host/rollouts?sslpassword=s3cret",
    "mysql+pymysql://team@db-host/rollouts?passwd=s3cret",
]


@pytest.mark.parametrize("url", SECRET_URLS)
def test_shown_and_public_urls_hold_no_password(url: str) -> None:
    shown, public = shown_url(url), public_url(url)
    assert "s3cret" not in shown and "s3cret" not in public
    assert "db-host" in shown and "rollouts" in public and "team@" in public
    assert catalog_identity(public) == catalog_identity(url)  # the same database
    assert "application_name=train" in public or "application_name" not in url
    if ":s3cret@" in url:
        assert "team:***@" in shown  # says a password was given, not which


def test_catalog_identity_tells_databases_apart() -> None:
    same = [
        "postgresql+psycopg://a:x@DB-Host:5432/pool",
        "postgresql://b@db-host/pool",
        "postgresql+psycopg2://db-host/pool?password=y",
    ]
    assert len({catalog_identity(u) for u in same}) == 1
    others = [
        "postgresql://db-host:5433/pool",
        "postgresql://db-host/other",
        "postgresql://db-host2/pool",
        "sqlite:////pool/catalog.db",
    ]
    assert len({catalog_identity(u) for u in [same[0], *others]}) == 5
    assert catalog_identity("sqlite:////a/../b/c.db") == catalog_identity("sqlite:////b/c.db")


def test_an_unparsable_url_is_never_echoed() -> None:
    assert "s3cret" not in shown_url("::team:s3cret@nowhere")


def test_repr_and_errors_of_a_pool_hide_the_password(tmp_path, monkeypatch) -> None:
    url = SECRET_URLS[1]
    catalog = Catalog(make_engine(url), url)  # never connects: nothing is run on it
    pool = ArchiveManager(tmp_path / "pool", catalog)
    try:
        assert "s3cret" not in repr(pool) and "db-host" in repr(pool)
        assert "s3cret" not in repr(catalog)
    finally:
        catalog.close()

    def broken(engine):
        raise sa_exc.OperationalError("SELECT version_num", {}, Exception("boom"))

    monkeypatch.setattr(opening_module, "current_revision", broken)
    with pytest.raises(CatalogError, match="boom") as info:
        ArchiveManager.catalog_status(tmp_path / "pool", SECRET_URLS[0])
    assert "s3cret" not in str(info.value) and "db-host" in str(info.value)


def test_asking_about_a_foreign_sqlite_file_leaves_it_as_it_was(tmp_path) -> None:
    theirs = tmp_path / "theirs.db"
    conn = sqlite3.connect(theirs)
    conn.execute("CREATE TABLE blobs (digest TEXT PRIMARY KEY)")  # a catalog's table name
    conn.commit()
    conn.close()
    before = theirs.read_bytes()
    url = f"sqlite:///{theirs}"
    assert ArchiveManager.exists(tmp_path / "pool", url) is False
    assert ArchiveManager.catalog_status(tmp_path / "pool", url).current is None
    with pytest.raises(PoolNotFoundError):
        ArchiveManager.open(tmp_path / "pool", url, create=False)
    with pytest.raises(CatalogError, match="no revision stamp"):
        ArchiveManager.open(tmp_path / "pool", url)
    with pytest.raises(CatalogError, match="no revision stamp"):
        Catalog.open(url)
    assert theirs.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("theirs")) == [
        "theirs.db"
    ]
    # An empty file (or a new one) is where a new catalog may be made.
    (tmp_path / "empty.db").touch()
    with ArchiveManager.open(tmp_path / "pool", f"sqlite:///{tmp_path / 'empty.db'}") as pool:
        assert ArchiveManager.exists(pool.root, pool.catalog_url)


REPO = Path(__file__).resolve().parents[2]


def test_a_save_a_read_and_an_export_made_at_exit_work(tmp_path: Path) -> None:
    """In an `atexit` function (a script saving its last rollout on the way out) a save of
    several chunks, a background save, a streamed read, an Arrow table and an export failed
    halfway with "RuntimeError: cannot schedule new futures after interpreter shutdown"
    (`concurrent.futures` refuses work by then); the background save was lost without a
    word. They now run on the calling thread (`_util.threads.Helpers`, `PastExit`)."""
    env = {"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}
    run_at_exit(tmp_path, str(tmp_path / "pool"), None, env)
