"""A Hypothesis state machine over saves, references, owners, GC, verify and time, and over
what operators do to catalogs: take and restore a backup, lose the catalog and rebuild it,
open the blob root with a second catalog, rebuild beside live saves.

The model knows which owners hold which archive, which save content each archive has, which
archives' manifests are still on disk and what the catalog knows of them.  After every step,
every archive some owner retains loads exactly, verify finds no damage (a catalog restored
from a backup is "behind": then it reports exactly the manifests it lacks), and after a GC no
blob file is left that nothing retains.
"""

from __future__ import annotations

import copy
import dataclasses
import shutil
import tempfile
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from helpers import (
    Backend,
    FakeClock,
    abandon_writer,
    assert_loads,
    blob_sizes,
    canon,
    die_before_publish,
    open_on,
    owned_blobs,
    snapshot_pool,
    tiny_rollout,
)
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
from test_recovery import CatalogBackup

from archive_manager import ArchiveManager, ArchiveWriter
from archive_manager.catalog import (
    Catalog,
    archive_blobs_table,
    archives_table,
    lease_blobs_table,
    leases_table,
    retention_table,
)
from archive_manager.errors import (
    ArchiveNotFoundError,
    ArchiveReleasedError,
    GcAbortedError,
    PoolIdentityError,
)
from archive_manager.pool.identity import IDENTITY_FILE
from archive_manager.pool.manifest import Manifest
from archive_manager.pool.verify import VerifyReport

LEASE_TTL = 30.0
# Examples per backend, so that each run stays near a minute on a loaded 2-core machine: a
# PostgreSQL example costs about twice a SQLite one (a round trip per statement).
MAX_EXAMPLES = {"sqlite": 25, "postgresql": 12}
OWNERS = ("checkpoint:a", "checkpoint:b", "queue:train")


@cache
def _rollout(seed: int, n: int) -> tuple[Any, ...]:
    return tuple(tiny_rollout(n, seed=seed, r3_layers=1 if seed % 2 else None))  # odd: tensor blobs


@cache
def _expected(seed: int, n: int) -> tuple[Any, ...]:
    return tuple(canon(s) for s in _rollout(seed, n))


@dataclasses.dataclass
class Model:
    """What the pool must hold: per archive its content and owners, and what the catalog
    knows of it."""

    content: dict[str, tuple[int, int]] = dataclasses.field(default_factory=dict)
    # Published or released archives in the catalog, and who holds each.
    owners: dict[str, set[str]] = dataclasses.field(default_factory=dict)
    released: set[str] = dataclasses.field(default_factory=set)
    leases: dict[str, float] = dataclasses.field(default_factory=dict)  # owner -> expires_at
    # Saves killed between their ownership commit and publication: pending in the catalog,
    # manifest on disk, rolled back by the first GC after their lease lapsed.
    pending: dict[str, float] = dataclasses.field(default_factory=dict)
    # Archives whose manifest is under blobs/ (a GC removes an unowned archive's manifest).
    disk: set[str] = dataclasses.field(default_factory=set)
    # Manifests on disk that the catalog lacks ("behind": restored from a backup).
    unindexed: set[str] = dataclasses.field(default_factory=set)
    # Names neither the catalog nor any manifest knows any more.
    gone: set[str] = dataclasses.field(default_factory=set)
    # A restored catalog may hold rows of blobs that GC deleted after the backup (until the
    # next GC), and blob files may have no row (until the next rebuild).
    stale_rows: bool = False
    rowless_files: bool = False
    # Retention journal records and checkpoints written so far (publications, retains,
    # releases, release_owners, and the checkpoint a rebuild writes when something was
    # decided since the last one): a backup taken before the last of them is behind.
    decisions: int = 0
    checkpointed: int = 0  # ``decisions`` as of the last checkpoint

    def checkpoint(self) -> None:
        """A checkpoint takes a number of its own when decisions were made since the last
        one; otherwise it describes the same state under the same number.  A rebuild that
        left archives out (reclaimed, or their manifest gone) describes another state, and
        takes a number of its own too; this model does not count that one: the rules that
        make such a rebuild take a backup after it (`lose_catalog_and_rebuild`) or hold a
        backup already behind (`restore_backup`), so no restore tells the two apart."""
        if self.decisions != self.checkpointed:
            self.decisions += 1
        self.checkpointed = self.decisions

    def owned(self) -> set[str]:
        return {n for n, held in self.owners.items() if held}


class PoolMachine(RuleBasedStateMachine):
    archives = Bundle("archives")
    # Set per backend by the test below: the PostgreSQL server, and a migrated empty catalog
    # that new databases copy (an empty catalog all the same, without a migration each).
    server: PgServer | None = None
    template: str | None = None

    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="am-sm-"))
        self.root = self.dir / "pool"
        self.clock = FakeClock()
        # On PostgreSQL every example gets a database of its own (dropped in teardown).
        self.url = None if self.server is None else self._new_database()
        self.other_url: str | None = None  # a second catalog, on PostgreSQL
        self.pool = self._open()
        self.model = Model()
        self.backup: Model | None = None  # the model as of the catalog backup
        self.count = 0

    def _open(self, **options: Any) -> ArchiveManager:
        return ArchiveManager.open(
            self.root,
            catalog_url=self.url,
            clock=self.clock,
            lease_ttl=LEASE_TTL,
            chunk_size=4,
            inline_limit=32,
            **options,
        )

    def _new_database(self) -> str:
        assert self.server is not None
        return self.server.create_database(template=self.template)

    def teardown(self) -> None:
        self.pool.close()
        shutil.rmtree(self.dir, ignore_errors=True)
        for url in (self.url, self.other_url):
            if url is not None:
                self.server.drop_database(url)  # type: ignore[union-attr]

    def _name(self) -> str:
        self.count += 1
        return f"a{self.count}"

    def _backup_tool(self) -> CatalogBackup:
        backend = Backend("sqlite" if self.server is None else "postgresql", self.server)
        return CatalogBackup(backend, self.root, self.url, self.dir / "catalog.backup")

    def _published(self, name: str, content: tuple[int, int]) -> None:
        self.model.content[name] = content
        self.model.owners[name] = {f"archive:{name}"}
        self.model.disk.add(name)
        self.model.decisions += 1

    # --- rules: saves and owners ----------------------------------------------------------

    @initialize(target=archives)
    def first_save(self) -> str:
        return self._save(0, 5)

    @initialize()
    def first_backup(self) -> None:
        # So that a restore is possible from the first step on (take_backup takes newer ones).
        self.take_backup()

    @rule(target=archives, seed=st.integers(0, 3), n=st.integers(0, 9))
    def save(self, seed: int, n: int) -> str:
        # Four seeds only, so archives often share chunks and tensors (dedup).
        return self._save(seed, n)

    def _save(self, seed: int, n: int) -> str:
        name = self._name()
        self.pool.save(name, list(_rollout(seed, n)), rollout_id=seed)
        self._published(name, (seed, n))
        return name

    @rule(target=archives, source=archives)
    def reference_save(self, source: str) -> Any:
        if source not in self.model.owners:
            self._assert_not_found(
                lambda: self.pool.save("x", None, rollout_id=0, reference=source)
            )
            self._assert_live_leases()
            return multiple()
        name = self._name()
        try:
            self.pool.save(name, None, rollout_id=0, reference=source)
        except ArchiveReleasedError:
            # Only a released source that a GC found unowned may have lost its payload; the
            # failed save leaves nothing behind.
            assert not self.model.owners[source] and source not in self.model.disk
            assert name not in {i.name for i in self.pool.find(state=None)}
            self._assert_live_leases()
            return multiple()
        self._published(name, self.model.content[source])
        return name

    @rule(owner=st.sampled_from(OWNERS), name=archives)
    def retain(self, owner: str, name: str) -> None:
        if name not in self.model.owners:
            self._assert_not_found(lambda: self.pool.retain(owner, name))
            return
        held = self.model.owners[name]
        if not held:
            try:
                self.pool.retain(owner, name)
            except ArchiveReleasedError:
                return
            raise AssertionError(f"retain of unowned, released {name!r} succeeded")
        added = self.pool.retain(owner, name)
        assert added is (owner not in held)
        held.add(owner)
        self.model.decisions += added

    @rule(name=archives)
    def release(self, name: str) -> None:
        if name not in self.model.owners:
            self._assert_not_found(lambda: self.pool.open_archive(name))
            return
        first = name not in self.model.released
        assert self.pool.open_archive(name).release() is first
        self.model.released.add(name)
        self.model.decisions += first
        self.model.owners[name].discard(f"archive:{name}")

    @rule(owner=st.sampled_from(OWNERS))
    def release_owner(self, owner: str) -> None:
        held = [n for n, o in self.model.owners.items() if owner in o]
        assert self.pool.release_owner(owner) == len(held)
        for n in held:
            self.model.owners[n].discard(owner)
        self.model.decisions += bool(held)  # a call that drops nothing records nothing

    @precondition(lambda self: len(self.model.leases) < 2)
    @rule(seed=st.integers(0, 3))
    def abandoned_save(self, seed: int) -> None:
        """A writer that stored a chunk and stopped: its lease lapses after LEASE_TTL."""
        w: ArchiveWriter = self.pool.writer(self._name(), rollout_id=seed)
        for s in _rollout(seed, 5):
            w.add(s)
        w.wait_stored()
        w.abandon()
        self.model.leases[w.lease] = self.clock.now + LEASE_TTL

    @precondition(lambda self: len(self.model.pending) < 2)
    @rule(seed=st.integers(0, 3), n=st.integers(1, 9))
    def crashed_save(self, seed: int, n: int) -> None:
        """A save killed after its manifest was written, before it published."""
        name = self._name()
        with pytest.MonkeyPatch.context() as mp:
            die_before_publish(self.pool, name, list(_rollout(seed, n)), mp)
        a = archives_table
        with self.pool.catalog.read() as conn:
            lease = conn.execute(select(a.c.lease_owner).where(a.c.name == name)).scalar_one()
        self.model.leases[lease] = self.model.pending[name] = self.clock.now + LEASE_TTL
        self.model.content[name] = (seed, n)
        self.model.disk.add(name)

    @rule(seconds=st.sampled_from([1.0, LEASE_TTL / 2, LEASE_TTL + 1]))
    def advance_clock(self, seconds: float) -> None:
        self.clock.now += seconds

    @rule()
    def gc(self) -> None:
        if self.model.unindexed:
            # The catalog is behind its blobs: GC must refuse before it changes anything.
            before = snapshot_pool(self.pool)
            with pytest.raises(GcAbortedError, match="behind its blobs"):
                self.pool.gc(grace=0)
            assert snapshot_pool(self.pool) == before
            return
        report = self.pool.gc(grace=0)
        assert report.finished_from_earlier == 0
        now = self.clock.now
        dead = sorted(n for n, expires in self.model.pending.items() if expires <= now)
        assert report.rolled_back == dead
        for name in dead:
            del self.model.pending[name], self.model.content[name]
            self.model.disk.discard(name)
            self.model.gone.add(name)
        self.model.disk -= {n for n, held in self.model.owners.items() if not held}
        self.model.leases = {k: v for k, v in self.model.leases.items() if v > now}
        self.model.stale_rows = False
        retained = owned_blobs(self.pool) | self._leased_blobs()
        files = {d for d, _, _ in self.pool.store.iter_stat()}
        if self.model.rowless_files:
            # Files written after the restored backup and no longer needed: orphans, which
            # GC leaves alone until their mtime is older than the grace period (the fake
            # clock is years behind it).
            assert set(blob_sizes(self.pool)) == retained and retained <= files
        else:
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
        self._check_verify(self.pool.verify(read_data=True))

    # --- rules: what operators do to catalogs ---------------------------------------------

    @rule()
    def take_backup(self) -> None:
        self._backup_tool().take()
        self.backup = copy.deepcopy(self.model)

    @precondition(
        lambda self: (
            self.backup is not None
            # A restore gives back every owner the backup knew; an archive owned then, released
            # and collected since, would be owned again with its payload gone.  That is what a
            # stale restore means, not a fault of the pool, so it is not tried.
            and self.backup.owned() <= self.model.disk
        )
    )
    @rule()
    def restore_backup(self) -> None:
        """Stop the pool, restore the backup over its catalog, open it again.  When
        decisions were made since the backup, the catalog is behind the retention journal:
        GC refuses, and the operator's rebuild brings the catalog forward."""
        b, m = self.backup, self.model
        assert b is not None
        self.pool.close()
        self._backup_tool().restore()
        self.pool = self._open()
        in_catalog = set(b.owners) | set(b.pending)
        # Archives saved since the backup (and crashed saves, whose manifests look alike)
        # come back only through a rebuild.
        unindexed = m.disk - in_catalog
        content = {n: b.content[n] for n in in_catalog} | {n: m.content[n] for n in unindexed}
        gone = (m.gone | set(m.content) | set(b.content)) - set(content)
        if m.decisions == b.decisions:
            self.model = Model(
                content=content,
                owners=copy.deepcopy(b.owners),
                released=set(b.released),
                leases=dict(b.leases),
                pending=dict(b.pending),
                disk=set(m.disk),
                unindexed=unindexed,
                gone=gone,
                stale_rows=True,
                rowless_files=True,
                decisions=m.decisions,
                checkpointed=m.checkpointed,
            )
            self._owned_archives_load_whole()
            return
        before = snapshot_pool(self.pool)
        with pytest.raises(GcAbortedError, match="behind"):
            self.pool.gc(grace=0)
        assert snapshot_pool(self.pool) == before
        report = self.pool.rebuild_catalog()
        assert report.archives == sorted(unindexed)
        assert not report.skipped and not report.unknown_files
        assert not report.journal_damaged and not report.unresolved
        # Owners, states and release times as they were before the restore; archives saved
        # since come back with theirs; a crashed save, of which the journal knows nothing,
        # comes back published and owned by itself.
        owners = {n: set(held) for n, held in m.owners.items() if n in content}
        owners |= {n: {f"archive:{n}"} for n in unindexed if n not in m.owners}
        assert sorted(report.reclaimed) == sorted(set(m.owners) - set(content))
        self.model = Model(
            content=content,
            owners=owners,
            released=m.released & set(owners),
            leases=dict(b.leases),
            pending=dict(b.pending),
            disk=set(m.disk),
            gone=gone,
            stale_rows=True,
            decisions=m.decisions,
            checkpointed=m.checkpointed,
        )
        self.model.checkpoint()
        self._owned_archives_load_whole()

    @rule()
    def lose_catalog_and_rebuild(self) -> None:
        """The catalog is lost (its file deleted, or its database replaced by a new empty
        one); the pool is opened with ``recover=True`` and rebuilt from its manifests."""
        self.pool.close()
        if self.server is None:
            for path in self.root.glob("catalog.db*"):
                path.unlink()
        else:
            self.server.drop_database(self.url)  # type: ignore[arg-type]
            self.url = self._new_database()
        files = {d for d, _, _ in self.pool.store.iter_stat()}
        self.pool = self._open(recover=True)
        if files:  # a root with no blob left has nothing a new catalog could take for orphans
            with pytest.raises(GcAbortedError, match="rebuild"):
                self.pool.gc(grace=0)
        assert {d for d, _, _ in self.pool.store.iter_stat()} == files
        report = self.pool.rebuild_catalog()
        # Every archive whose manifest survived comes back with the owners, state and
        # release time the lost catalog had (the retention journal); a crashed save's
        # manifest, which the journal knows nothing of, comes back published and owned by
        # itself.  Released archives already reclaimed stay gone, and are reported.
        m = self.model
        survivors = m.disk
        assert report.archives == sorted(survivors)
        assert not report.skipped and not report.unknown_files
        assert not report.journal_damaged and not report.unresolved
        assert sorted(report.reclaimed) == sorted(set(m.owners) - survivors)
        owners = {n: set(m.owners.get(n, {f"archive:{n}"})) for n in survivors}
        self.model = Model(
            content={n: m.content[n] for n in survivors},
            owners=owners,
            released=m.released & survivors,
            disk=set(survivors),
            gone=(m.gone | set(m.content)) - survivors,
            decisions=m.decisions,
            checkpointed=m.checkpointed,
        )
        self.model.checkpoint()
        self._owned_archives_load_whole()
        # The catalog has a new identity, which a backup of the lost one does not have: the
        # operator backs up the new one.
        self.take_backup()

    @rule()
    def second_catalog(self) -> None:
        """Opening the blob root with another, empty catalog is refused and changes nothing."""
        before = snapshot_pool(self.pool)
        identity = (self.root / IDENTITY_FILE).read_bytes()
        # An empty catalog (set up, no pool bound to it), and one that does not exist yet.
        if self.server is None:
            other, missing = self.dir / "other.db", self.dir / "missing.db"
            if not other.exists():
                Catalog.open(f"sqlite:///{other}").close()
            urls: list[str | None] = [f"sqlite:///{other}", f"sqlite:///{missing}"]
        else:
            missing = self.root / "catalog.db"  # the default: a forgotten --catalog-url
            self.other_url = self.other_url or self._new_database()
            urls = [self.other_url, None]
        for url in urls:
            with pytest.raises(PoolIdentityError):
                ArchiveManager.open(self.root, catalog_url=url, clock=self.clock)
        assert snapshot_pool(self.pool) == before
        assert (self.root / IDENTITY_FILE).read_bytes() == identity
        assert not missing.exists()

    @rule()
    def rebuild(self) -> None:
        self._rebuild_and_check()

    @rule(
        target=archives,
        seed=st.integers(0, 3),
        n=st.integers(0, 9),
        at=st.sampled_from(["chunks", "manifest"]),
    )
    def save_beside_a_rebuild(self, seed: int, n: int, at: str) -> str:
        """A rebuild while a save holds a lease: after its chunks, or after its manifest was
        written (pending, not yet published)."""
        name = self._name()
        if at == "chunks":
            with self.pool.writer(name, rollout_id=seed) as w:
                for s in _rollout(seed, n):
                    w.add(s)
                w.wait_stored()
                self._rebuild_and_check()
        else:
            real = ArchiveWriter._publish

            def publish(writer: ArchiveWriter, *args: Any) -> Any:
                self._rebuild_and_check()
                assert name not in {i.name for i in self.pool.find()}
                return real(writer, *args)

            with pytest.MonkeyPatch.context() as mp:
                mp.setattr(ArchiveWriter, "_publish", publish)
                self.pool.save(name, list(_rollout(seed, n)), rollout_id=seed)
        self._published(name, (seed, n))
        return name

    def _rebuild_and_check(self) -> None:
        """A rebuild restores exactly the archives the catalog lacks, and nothing else."""
        behind = sorted(self.model.unindexed)
        report = self.pool.rebuild_catalog()
        assert report.archives == behind
        assert not report.skipped and not report.unknown_files
        if not self.model.rowless_files:
            assert report.blobs == 0
        for name in behind:
            self.model.owners[name] = {f"archive:{name}"}
        self.model.unindexed = set()
        self.model.rowless_files = False
        self.model.checkpoint()  # a rebuild writes a journal checkpoint
        if behind:
            self._owned_archives_load_whole()

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
        held = sum(len(o) for o in self.model.owners.values())
        assert len(rows) == held + len(self.model.pending)  # a pending save's own owner
        states = {i.name: i.state for i in self.pool.find(state=None)}
        published = {n for n, s in states.items() if s == "published"}
        assert published == set(self.model.owners) - self.model.released
        assert {n for n, s in states.items() if s == "pending"} == set(self.model.pending)

    @invariant()
    def archives_the_catalog_lacks_are_not_found(self) -> None:
        for name in sorted(self.model.unindexed | self.model.gone | set(self.model.pending)):
            self._assert_not_found(lambda name=name: self.pool.open_archive(name))

    @invariant()
    def verify_is_ok(self) -> None:
        self._check_verify(self.pool.verify())

    # --- helpers --------------------------------------------------------------------------

    def _check_verify(self, report: VerifyReport) -> None:
        """No damage, except what a restored catalog must report: one ``unindexed-manifest``
        per archive it lacks, and, until the next GC, the rows of blobs that GC deleted after
        the backup, which no owned archive needs."""
        needed = self._blobs_of(self.model.owned()) if self.model.stale_rows else set()
        lacking, damage = [], []
        for finding in report.problems:
            if finding.kind == "unindexed-manifest":
                assert finding.digest is not None
                lacking.append(Manifest.decode(self.pool.store.get(finding.digest)).name)
            elif self.model.stale_rows and (
                finding.kind == "missing-blob"
                or (finding.kind == "archive-blob" and finding.archive in self.model.pending)
            ):
                # Rows the backup had, of blobs GC deleted since: unowned ones, or those of
                # a save that was pending then and rolled back since (pending again now).
                if finding.digest in needed:
                    damage.append(finding)
            else:
                damage.append(finding)
        assert not damage, damage
        assert sorted(lacking) == sorted(self.model.unindexed)

    def _owned_archives_load_whole(self) -> None:
        for name in sorted(self.model.owned()):
            assert_loads(self.pool, name, list(_rollout(*self.model.content[name])))

    def _assert_live_leases(self) -> None:
        live = sorted(k for k, v in self.model.leases.items() if v > self.clock.now)
        assert self.pool.owners().live_leases == live

    def _assert_not_found(self, call: Any) -> None:
        with pytest.raises(ArchiveNotFoundError):
            call()

    def _blobs_of(self, names: set[str]) -> set[str]:
        ab, a = archive_blobs_table, archives_table
        with self.pool.catalog.read() as conn:
            return set(
                conn.execute(
                    select(ab.c.digest)
                    .join(a, a.c.id == ab.c.archive_id)
                    .where(a.c.name.in_(sorted(names)))
                ).scalars()
            )

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


def test_pool_state_machine(backend: Backend) -> None:
    template = None
    if backend.server is not None:
        template = backend.new_url()
        Catalog.open(template).close()
        template = template.rsplit("/", 1)[-1]
    machine = type(
        "PoolMachineOn", (PoolMachine,), {"server": backend.server, "template": template}
    )
    run_state_machine_as_test(
        machine,
        settings=settings(
            max_examples=MAX_EXAMPLES[backend.name],
            stateful_step_count=20,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )


# --------------------------------------------------------------------------- found by the machine


def test_a_backup_taken_during_a_save_loses_nothing_published(
    tmp_path: Path, backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    root, clock = tmp_path / "pool", FakeClock()
    backup = CatalogBackup(backend, root, backend.url(root), tmp_path / "catalog.backup")
    real = ArchiveWriter._publish

    def publish(writer: ArchiveWriter, *args: Any) -> Any:
        backup.take()  # the nightly pg_dump, while training saves
        return real(writer, *args)

    with open_on(backend, root, clock=clock, lease_ttl=LEASE_TTL) as pool:
        monkeypatch.setattr(ArchiveWriter, "_publish", publish)
        pool.save("x", tiny_rollout(), rollout_id=1)
        monkeypatch.undo()
        assert_loads(pool, "x", tiny_rollout())
    backup.restore()
    with open_on(backend, root, clock=clock, lease_ttl=LEASE_TTL) as pool:
        clock.advance(LEASE_TTL + 1)
        # An operator who forgets the rebuild: the journal shows the catalog is behind.
        with pytest.raises(GcAbortedError, match="behind"):
            pool.gc(grace=0)
        report = pool.rebuild_catalog()  # what an operator runs after a restore
        assert report.brought_forward == {"x": ["published (was pending)"]}
        pool.gc(grace=0)
        assert_loads(pool, "x", tiny_rollout())
        assert pool.open_archive("x").state == "published"
        assert pool.verify().ok


def test_a_reference_to_an_archive_reclaimed_after_the_backup_loads(
    tmp_path: Path, backend: Backend
) -> None:
    root = tmp_path / "pool"
    backup = CatalogBackup(backend, root, backend.url(root), tmp_path / "catalog.backup")
    with open_on(backend, root) as pool:
        pool.save("r", tiny_rollout(), rollout_id=1)
        pool.open_archive("r").release()
        backup.take()
        assert pool.gc(grace=0).blobs > 0  # r's payload is reclaimed
    backup.restore()
    with open_on(backend, root) as pool:
        try:
            pool.save("y", None, rollout_id=1, reference="r")
        except ArchiveReleasedError:
            assert "y" not in {i.name for i in pool.find(state=None)}
        else:
            assert_loads(pool, "y", tiny_rollout())


def test_a_rebuild_beside_a_save_that_never_finishes_leaves_no_damage(
    tmp_path: Path, backend: Backend
) -> None:
    root, clock = tmp_path / "pool", FakeClock()
    backup = CatalogBackup(backend, root, backend.url(root), tmp_path / "catalog.backup")
    options: dict[str, Any] = {"clock": clock, "lease_ttl": LEASE_TTL, "chunk_size": 2}
    with open_on(backend, root, **options) as pool:
        backup.take()  # of the empty catalog
        pool.save("a", tiny_rollout(4), rollout_id=0)
    backup.restore()  # the catalog lacks "a": its blob files have no rows
    with open_on(backend, root, **options) as pool:
        abandon_writer(pool, "b", tiny_rollout(4))  # stores a's chunks again, then stops
        assert pool.rebuild_catalog().archives == ["a"]
        assert_loads(pool, "a", tiny_rollout(4))
        clock.advance(LEASE_TTL + 1)
        pool.gc(grace=0)  # the lease of the save that stopped is gone
        assert_loads(pool, "a", tiny_rollout(4))
        report = pool.verify()
        assert report.ok, report.problems
