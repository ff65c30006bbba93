"""A Hypothesis state machine over saves, references, owners, GC, verify and time.

The model knows which owners hold which archive and which save content each archive has;
after every step, every archive some owner retains loads exactly, verify finds no damage,
and after a GC no blob file is left that nothing retains.
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
from functools import cache
from pathlib import Path
from typing import Any

from conftest import FakeClock, canon, owned_blobs, tiny_rollout
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    multiple,
    precondition,
    rule,
    run_state_machine_as_test,
)
from pgserver import PgServer
from sqlalchemy import select

from archive_manager import ArchiveManager, ArchiveWriter
from archive_manager.catalog import (
    lease_blobs_table,
    leases_table,
    retention_table,
)
from archive_manager.errors import ArchiveReleasedError

LEASE_TTL = 30.0
OWNERS = ("checkpoint:a", "checkpoint:b", "queue:train")


@cache
def _rollout(seed: int, n: int) -> tuple[Any, ...]:
    return tuple(tiny_rollout(n, seed=seed, r3_layers=1 if seed % 2 else None))  # odd: tensor blobs


@cache
def _expected(seed: int, n: int) -> tuple[Any, ...]:
    return tuple(canon(s) for s in _rollout(seed, n))


@dataclasses.dataclass
class Model:
    """What the pool must hold: per archive its content and owners."""

    content: dict[str, tuple[int, int]] = dataclasses.field(default_factory=dict)
    owners: dict[str, set[str]] = dataclasses.field(default_factory=dict)
    released: set[str] = dataclasses.field(default_factory=set)
    leases: dict[str, float] = dataclasses.field(default_factory=dict)  # abandoned saves


class PoolMachine(RuleBasedStateMachine):
    archives = Bundle("archives")
    server: PgServer | None = None  # set per backend by the test below

    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="am-sm-"))
        self.clock = FakeClock()
        # On PostgreSQL every example gets a database of its own (dropped in teardown).
        self.url = None if self.server is None else self.server.create_database()
        self.pool = ArchiveManager.open(
            self.dir / "pool",
            catalog_url=self.url,
            clock=self.clock,
            lease_ttl=LEASE_TTL,
            chunk_size=4,
            inline_limit=32,
        )
        self.model = Model()
        self.count = 0
        self.gc_ran = False

    def teardown(self) -> None:
        self.pool.close()
        shutil.rmtree(self.dir, ignore_errors=True)
        if self.url is not None:
            self.server.drop_database(self.url)

    def _name(self) -> str:
        self.count += 1
        return f"a{self.count}"

    # --- rules ----------------------------------------------------------------------------

    @initialize(target=archives)
    def first_save(self) -> str:
        return self._save(0, 5)

    @rule(target=archives, seed=st.integers(0, 3), n=st.integers(0, 9))
    def save(self, seed: int, n: int) -> str:
        # Four seeds only, so archives often share chunks and tensors (dedup).
        return self._save(seed, n)

    def _save(self, seed: int, n: int) -> str:
        name = self._name()
        self.pool.save(name, list(_rollout(seed, n)), rollout_id=seed)
        self.model.content[name] = (seed, n)
        self.model.owners[name] = {f"archive:{name}"}
        return name

    @rule(target=archives, source=archives)
    def reference_save(self, source: str) -> Any:
        if source not in self.model.owners:
            return multiple()
        name = self._name()
        try:
            self.pool.save(name, None, rollout_id=0, reference=source)
        except ArchiveReleasedError:
            # Only a released source nobody holds may have lost its payload to GC; the
            # failed save leaves nothing behind.
            assert not self.model.owners[source] and self.gc_ran
            assert name not in {i.name for i in self.pool.find(state=None)}
            live = sorted(k for k, v in self.model.leases.items() if v > self.clock.now)
            assert self.pool.owners().live_leases == live
            return multiple()
        self.model.content[name] = self.model.content[source]
        self.model.owners[name] = {f"archive:{name}"}
        return name

    @rule(owner=st.sampled_from(OWNERS), name=archives)
    def retain(self, owner: str, name: str) -> None:
        if name not in self.model.owners:
            return
        held = self.model.owners[name]
        if not held:
            try:
                self.pool.retain(owner, name)
            except ArchiveReleasedError:
                return
            raise AssertionError(f"retain of unowned, released {name!r} succeeded")
        assert self.pool.retain(owner, name) is (owner not in held)
        held.add(owner)

    @rule(name=archives)
    def release(self, name: str) -> None:
        if name not in self.model.owners:
            return
        first = name not in self.model.released
        assert self.pool.open_archive(name).release() is first
        self.model.released.add(name)
        self.model.owners[name].discard(f"archive:{name}")

    @rule(owner=st.sampled_from(OWNERS))
    def release_owner(self, owner: str) -> None:
        held = [n for n, o in self.model.owners.items() if owner in o]
        assert self.pool.release_owner(owner) == len(held)
        for n in held:
            self.model.owners[n].discard(owner)

    @precondition(lambda self: len(self.model.leases) < 2)
    @rule(seed=st.integers(0, 3))
    def abandoned_save(self, seed: int) -> None:
        """A writer that stored a chunk and stopped: its lease lapses after LEASE_TTL."""
        w: ArchiveWriter = self.pool.writer(self._name(), rollout_id=seed)
        for s in _rollout(seed, 5):
            w.add(s)
        w._wait()
        w._shutdown()
        w._heartbeat.join()
        self.model.leases[w._lease] = self.clock.now + LEASE_TTL

    @rule(seconds=st.sampled_from([1.0, LEASE_TTL / 2, LEASE_TTL + 1]))
    def advance_clock(self, seconds: float) -> None:
        self.clock.now += seconds

    @rule()
    def gc(self) -> None:
        report = self.pool.gc(grace=0)
        assert report.finished_from_earlier == 0
        self.gc_ran = True
        self.model.leases = {k: v for k, v in self.model.leases.items() if v > self.clock.now}
        retained = owned_blobs(self.pool) | self._leased_blobs()
        files = {d for d, _, _ in self.pool.store.iter_stat()}
        assert files == retained, (files - retained, retained - files)
        # A released archive nobody holds now either reads back exactly or says it was
        # released (its chunks may live on in an archive with the same content).
        for name, held in self.model.owners.items():
            if not held:
                try:
                    loaded = self.pool.open_archive(name).load_samples()
                except ArchiveReleasedError:
                    continue
                assert tuple(canon(s) for s in loaded) == _expected(*self.model.content[name])

    @rule()
    def verify_reading_data(self) -> None:
        report = self.pool.verify(read_data=True)
        assert report.ok, report.problems

    # --- invariants -----------------------------------------------------------------------

    @invariant()
    def owned_archives_load(self) -> None:
        for name, held in self.model.owners.items():
            if not held:
                continue
            arc = self.pool.open_archive(name)
            assert arc.state == ("released" if name in self.model.released else "published")
            seed, n = self.model.content[name]
            assert len(arc) == n
            if n:
                i = (self.count + n) % n  # spot-check one sample per archive
                got = arc.load_samples(sample_key=f"sample:{i}")
                assert [canon(s) for s in got] == [_expected(seed, n)[i]]

    @invariant()
    def catalog_owners_match_the_model(self) -> None:
        r = retention_table
        with self.pool.catalog.read() as conn:
            rows = conn.execute(select(r.c.owner, r.c.archive_id)).all()
        assert len(rows) == sum(len(o) for o in self.model.owners.values())
        published = {i.name for i in self.pool.find()}
        assert published == set(self.model.owners) - self.model.released

    @invariant()
    def verify_is_ok(self) -> None:
        report = self.pool.verify()
        assert report.ok, report.problems

    def _leased_blobs(self) -> set[str]:
        lb, lt = lease_blobs_table, leases_table
        with self.pool.catalog.read() as conn:
            return set(
                conn.execute(
                    select(lb.c.digest)
                    .join(lt, lt.c.owner == lb.c.lease)
                    .where(lt.c.expires_at > self.clock.now)
                ).scalars()
            )


def test_pool_state_machine(backend) -> None:
    machine = type("PoolMachineOn", (PoolMachine,), {"server": backend.server})
    run_state_machine_as_test(
        machine,
        settings=settings(
            max_examples=30,
            stateful_step_count=20,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )
