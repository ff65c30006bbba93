"""The lease heartbeat against a failing catalog: renewals that fail for a passing reason
(server unreachable, lock held past the busy timeout) are retried until the lease would
really lapse; a lease found lapsed or taken over is final and never retried.

Faults are injected into the heartbeat's renewal (``archive_manager.pool.writer.renew_lease``), on
both catalogs, with a fake clock, so that no test waits for a lease in real time. A real
catalog server stopped and started in the middle of a save is tests/catalog/test_catalog_outage.py.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest
from helpers import FakeClock, assert_loads, small_rollout
from sqlalchemy import select
from sqlalchemy.engine import Connection

from archive_manager import ArchiveManager
from archive_manager.catalog import CatalogUnreachableError, leases_table
from archive_manager.errors import ArchiveNotFoundError, CatalogLockedError, LeaseExpiredError
from archive_manager.pool import writer as writer_module

pytestmark = pytest.mark.timeout(120)

#: A short lease: the heartbeat runs every 0.1 s of real time and renews with the fake clock.
TTL = 0.3


def _wait_until(predicate: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.005)
    raise AssertionError(f"timed out waiting until {what}")


class FlakyRenewals:
    """The heartbeat's ``renew_lease``, failing while ``failing`` says so (with ``error``),
    else the real one; counts every call and each outcome."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, error: Callable[[], Exception]) -> None:
        self.error = error
        self.failing: Callable[[int], bool] = lambda call: False
        self.calls = self.failed = self.renewed = self.refused = 0
        self._lock = threading.Lock()
        real = writer_module.renew_lease

        def renew(conn: Connection, owner: str, *, now: float, ttl: float) -> float:
            with self._lock:
                self.calls += 1
                call = self.calls
            if self.failing(call):
                self.failed += 1
                raise self.error()
            try:
                expires = real(conn, owner, now=now, ttl=ttl)
            except LeaseExpiredError:
                self.refused += 1
                raise
            self.renewed += 1
            return expires

        monkeypatch.setattr(writer_module, "renew_lease", renew)


def _unreachable() -> Exception:
    return CatalogUnreachableError("cannot reach the catalog server of test: connection refused")


def _locked() -> Exception:
    return CatalogLockedError("the catalog test stayed locked for longer than the busy timeout")


def _lease_expiry(pool: ArchiveManager) -> float:
    with pool.catalog.read() as conn:
        (expires,) = conn.execute(select(leases_table.c.expires_at)).scalars().all()
        return float(expires)


def _no_leases(pool: ArchiveManager) -> bool:
    with pool.catalog.read() as conn:
        return conn.execute(select(leases_table)).all() == []


@pytest.mark.parametrize("error", [_unreachable, _locked], ids=["unreachable", "locked"])
def test_failed_renewals_are_retried_and_the_save_publishes(
    open_pool: Callable[..., ArchiveManager],
    clock: FakeClock,
    monkeypatch: pytest.MonkeyPatch,
    error: Callable[[], Exception],
) -> None:
    """Five renewals in a row fail; the sixth gets through and really extends the lease,
    so a save that outlives its first lease publishes. The old heartbeat gave up at once."""
    pool = open_pool(clock=clock, lease_ttl=TTL, chunk_size=8)
    faults = FlakyRenewals(monkeypatch, error)
    faults.failing = lambda call: call <= 5
    samples = small_rollout(20, seed=3)
    first_expiry = clock.now + TTL
    with pool.writer("w", rollout_id=0) as w:
        for sample in samples[:10]:
            w.add(sample)
        _wait_until(lambda: faults.renewed >= 1, "a renewal got through after the failures")
        assert faults.failed == 5
        # The retried renewal holds the lease: move past the first expiry, twice, renewing.
        for _ in range(2):
            clock.advance(TTL * 2 / 3)
            wanted = clock.now + TTL

            def renewed(w: float = wanted) -> bool:
                return _lease_expiry(pool) >= w

            _wait_until(renewed, "the lease was renewed")

        assert clock.now > first_expiry
        for sample in samples[10:]:
            w.add(sample)
    assert_loads(pool, "w", samples)
    assert _no_leases(pool)


def test_renewal_gives_up_when_the_lease_lapses(
    open_pool: Callable[..., ArchiveManager], clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The catalog stays unreachable: the heartbeat retries for as long as the lease stands
    (here the clock stands still), then, once it lapsed, gives up with LeaseExpiredError
    (the catalog's error as its cause) and the save publishes nothing."""
    pool = open_pool(clock=clock, lease_ttl=TTL, chunk_size=8)
    faults = FlakyRenewals(monkeypatch, _unreachable)
    faults.failing = lambda call: True
    with (
        pytest.raises(LeaseExpiredError, match="renewal kept failing") as info,
        pool.writer("w", rollout_id=0) as w,
    ):
        for sample in small_rollout(10, seed=4):
            w.add(sample)
        _wait_until(lambda: faults.failed >= 4, "four renewals failed")
        assert w.renewing, "the heartbeat gave up while the lease stood"
        clock.advance(TTL + 1)
        w.join_renewal(timeout=30)
        assert not w.renewing, "the heartbeat should have given up"
        w.add(small_rollout(1, seed=5)[0])
    assert isinstance(info.value.__cause__, CatalogUnreachableError)
    assert faults.renewed == 0
    with pytest.raises(ArchiveNotFoundError):
        pool.open_archive("w")


def test_a_lease_taken_over_during_an_outage_is_final(
    open_pool: Callable[..., ArchiveManager], clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While the writer's renewals fail, a GC whose clock runs ahead (another machine) finds
    the lease lapsed and drops it, reclaiming its blobs. When the catalog comes back, the
    retried renewal is refused (it cannot revive the lease), is not retried again, and the
    save fails without publishing over the reclaimed blobs."""
    pool = open_pool(clock=clock, lease_ttl=TTL, chunk_size=8)
    faults = FlakyRenewals(monkeypatch, _unreachable)
    outage = threading.Event()
    outage.set()
    faults.failing = lambda call: outage.is_set()
    ahead = FakeClock(clock.now + 3600)
    gc_pool = open_pool(clock=ahead)  # the same catalog, seen by a process whose clock is ahead
    with pytest.raises(LeaseExpiredError), pool.writer("w", rollout_id=0) as w:
        for sample in small_rollout(20, seed=6):
            w.add(sample)
        w.wait_stored()  # its chunks are stored and held by the lease
        _wait_until(lambda: faults.failed >= 2, "renewals failed")
        report = gc_pool.gc(grace=0)
        assert report.expired_leases == 1 and report.blobs >= 2
        outage.clear()
        w.join_renewal(timeout=30)
        assert not w.renewing, "the refused renewal must end the heartbeat"
        assert faults.refused == 1 and faults.renewed == 0
        calls = faults.calls
    assert faults.calls == calls  # never retried after the refusal
    with pytest.raises(ArchiveNotFoundError):
        pool.open_archive("w")
    assert _no_leases(pool)
    assert gc_pool.verify(read_data=True).ok


def test_a_refused_renewal_is_not_retried(
    open_pool: Callable[..., ArchiveManager], clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No fault at all: the clock jumps past the lease, the one renewal is refused and the
    heartbeat stops at once (a lapsed lease is an answer, not an outage)."""
    pool = open_pool(clock=clock, lease_ttl=TTL)
    faults = FlakyRenewals(monkeypatch, _unreachable)
    w = pool.writer("w", rollout_id=0)
    try:
        _wait_until(lambda: faults.renewed >= 1, "a first renewal")
        clock.advance(TTL + 1)
        w.join_renewal(timeout=30)
        assert not w.renewing
        assert faults.refused == 1 and faults.failed == 0
        assert isinstance(w._failure, LeaseExpiredError)
    finally:
        w.abort()
