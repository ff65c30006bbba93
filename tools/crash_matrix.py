#!/usr/bin/env python3
"""Crash matrix: kill a process at every failpoint of every durable operation, check the pool.

For each operation (save, streaming save, background save (`save_async`), reference save, a save
that fails and rolls back, a save through the pointer-file facade, a save that supersedes a
released archive of its name, retain, release, release_owner, gc, rebuild_catalog):

1. a probe run arms every failpoint with ``sleep:0`` and counts how often the operation
   reaches each one (so the matrix follows the code, not a list that can go stale);
2. for every point reached, and for its first and last hit, a fresh pool is set up
   (published archives, one released, one held by an extra owner, an orphan file and a stale
   temp file where the operation is gc), and the operation runs in a forked child process
   armed to die there (``kill``: SIGKILL, or ``raise`` with ``--action raise``);
3. the parent reopens the pool and checks the invariants of the save and GC protocols
(docs/architecture/save-protocol.md, docs/architecture/gc-protocol.md):

   - ``intact``: every archive published and owned before loads identical (before any gc);
   - ``atomic``: the archive in flight is wholly published (loads identical) or invisible
     (a superseding save: the name points at the earlier archive or the new one, never
     neither, never both);
     a retain/release is wholly applied or not at all; a pointer file that exists opens;
   - ``gc``: a gc run (clock past the lease TTL and the grace period) finishes what the
     killed process left (no lease, pending archive, ``writing``/``deleting`` row, temp or
     orphan file remains; a further gc finds nothing) and reclaims what the scenario released;
   - ``verify``: ``verify(read_data=True)`` then reports neither damage nor notices;
   - ``owned``: every blob of every owned archive is still live and intact, and every owned
     archive (the one in flight too, if published) still loads identical after that gc.

Usage::

    python3 tools/crash_matrix.py                       # SQLite, every point, kill
    python3 tools/crash_matrix.py --action raise        # the error paths instead
    python3 tools/crash_matrix.py --only gc --json out.json
    python3 tools/crash_matrix.py --pg-admin-url postgresql+psycopg://me@host/postgres

With ``--pg-admin-url`` each row gets a new database on that server (created and dropped
through the admin connection).  Children are forked (Linux), so a row costs no interpreter
start; the exit status of a killed child is checked to be SIGKILL.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import enum
import hashlib
import json
import os
import shutil
import signal
import struct
import sys
import tempfile
import time
import traceback
import uuid
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from archive_manager import ArchiveManager
from archive_manager._util import failpoints as _failpoints
from archive_manager._util.names import archive_owner
from archive_manager.blobs import LocalBlobStore, RetryingReads
from archive_manager.catalog import (
    archive_blobs_table,
    archives_table,
    blobs_table,
    leases_table,
    retention_table,
)
from archive_manager.codec import TensorRef
from archive_manager.compat import RolloutArchive
from archive_manager.errors import ArchiveNotFoundError, PoolIdentityError, UnencodableError
from archive_manager.interop.synthetic import make_rollout

CHILD_TIMEOUT = 120.0
LEASE_TTL = 60.0
RECOVERY_SKEW = 3 * 3600.0  # the checker's clock: past every lease and the grace below
RECOVERY_GRACE = 3600.0
TINY = {"prompt_len": 8, "response_min": 4, "response_max": 12, "group_size": 2, "r3_layers": 2}
POOL_OPTIONS = {"chunk_size": 4, "inline_limit": 512, "lease_ttl": LEASE_TTL}


# --------------------------------------------------------------------------- sample identity


def fingerprint(samples: list[Any]) -> str:
    """A digest of samples' exact content: types, field order, float bits, tensor bytes."""
    h = hashlib.blake2b(digest_size=16)
    _feed(h, samples)
    return h.hexdigest()


def _feed(h: Any, value: Any) -> None:
    if isinstance(value, TensorRef):
        value = value.materialize()
    if isinstance(value, torch.Tensor):
        t = value.detach().contiguous().reshape(-1)
        h.update(f"T{value.dtype}{tuple(value.shape)}".encode())
        h.update(t.view(torch.uint8).numpy().tobytes())
    elif isinstance(value, enum.Enum):
        h.update(f"E{type(value).__name__}.{value.name};".encode())
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        h.update(f"D{type(value).__name__};".encode())
        _feed(h, vars(value))
    elif isinstance(value, dict):
        h.update(f"M{len(value)};".encode())
        for k, v in value.items():
            _feed(h, k)
            _feed(h, v)
    elif isinstance(value, (list, tuple)):
        h.update(f"{'L' if isinstance(value, list) else 'U'}{len(value)};".encode())
        for v in value:
            _feed(h, v)
    elif isinstance(value, bool) or value is None:
        h.update(f"B{value};".encode())
    elif isinstance(value, int):
        h.update(f"I{value};".encode())
    elif isinstance(value, float):
        h.update(b"F" + struct.pack("<d", value))
    elif isinstance(value, str):
        h.update(f"S{len(value)};".encode() + value.encode("utf-8", "surrogatepass"))
    elif isinstance(value, bytes):
        h.update(f"Y{len(value)};".encode() + value)
    else:
        h.update(f"?{type(value).__name__}:{value!r};".encode())


def rollout(n: int, seed: int) -> list[Any]:
    return make_rollout(n, seed=seed, **TINY)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- scenarios


@dataclasses.dataclass
class World:
    """A fresh pool and what the checker must find in it after the operation."""

    root: Path
    url: str | None
    intact: dict[str, str]  # owned archives that must load identical: name -> fingerprint
    inflight: tuple[str, str] | None = None  # the archive being saved: name, fingerprint
    # A save of ``inflight``'s name with supersede=True: the fingerprint of the released
    # archive the name points at before it.  After the crash the name points at exactly one
    # of the two, intact: the earlier one (released) or the new one (published, complete),
    # never neither, never both.
    supersedes: str | None = None
    pointer: Path | None = None
    owners_before: dict[str, set[str]] = dataclasses.field(default_factory=dict)
    owners_after: dict[str, set[str]] = dataclasses.field(default_factory=dict)
    reclaim: set[str] = dataclasses.field(default_factory=set)  # blobs gc must remove
    plant: list[Path] = dataclasses.field(default_factory=list)  # files gc must remove
    rebuild: bool = False  # the checker finishes a rebuild first, then expects ``names``
    recover: bool = False  # the catalog was lost: that rebuild opens with recover=True
    names: set[str] = dataclasses.field(default_factory=set)
    rebind: bool = False  # a copy being rebound: the checker reruns an interrupted rebind
    # The catalog is lost right after the crash: the checker rebuilds it from the manifests
    # and the retention journal first, and expects the same owners (issue: a lost catalog
    # loses no retention decision).
    lose_catalog: bool = False

    def open(self, **options: Any) -> ArchiveManager:
        return ArchiveManager.open(self.root, self.url, **{**POOL_OPTIONS, **options})


@dataclasses.dataclass(frozen=True)
class Scenario:
    name: str
    about: str
    prepare: Callable[[World], None]  # in the parent, after the common setup
    run: Callable[[World], None]  # in the child


def _setup(root: Path, url: str | None) -> World:
    """Published archives kept/shared/held/doomed; held is retained by job:held only."""
    world = World(root, url, intact={})
    with world.open() as pool:
        for name, seed, rid in (("kept", 1, 1), ("held", 2, 2), ("doomed", 3, 3)):
            samples = rollout(10, seed)
            pool.save(name, samples, rollout_id=rid)
            world.intact[name] = fingerprint(samples)
        pool.save("shared", None, rollout_id=1, reference="kept")
        world.intact["shared"] = world.intact["kept"]
        pool.retain("job:held", "held")
        pool.retain("job:kept", "kept")
    return world


def _owners(pool: ArchiveManager) -> dict[str, set[str]]:
    owners: dict[str, set[str]] = {}
    with pool.catalog.read() as conn:
        rows = conn.execute(
            archives_table.select()
            .with_only_columns(archives_table.c.name, retention_table.c.owner)
            .join_from(
                archives_table,
                retention_table,
                retention_table.c.archive_id == archives_table.c.id,
                isouter=True,
            )
        ).all()
    for name, owner in rows:
        owners.setdefault(name, set())
        if owner is not None:
            owners[name].add(owner)
    return owners


def _exclusive_blobs(pool: ArchiveManager, name: str) -> set[str]:
    """Blobs of archive ``name`` that no other archive references."""
    a, ab = archives_table, archive_blobs_table
    with pool.catalog.read() as conn:
        mine = set(
            conn.execute(
                ab.select()
                .with_only_columns(ab.c.digest)
                .join_from(ab, a, a.c.id == ab.c.archive_id)
                .where(a.c.name == name)
            ).scalars()
        )
        others = set(
            conn.execute(
                ab.select()
                .with_only_columns(ab.c.digest)
                .join_from(ab, a, a.c.id == ab.c.archive_id)
                .where(a.c.name != name)
            ).scalars()
        )
    return mine - others


INFLIGHT_SEED = 5


def _inflight_samples() -> list[Any]:
    # Eight new samples, then kept's first four: a chunk identical to one of kept's, so the
    # save also takes the dedup path (blobs already live) besides writing new ones.
    return rollout(8, INFLIGHT_SEED) + rollout(10, 1)[:4]


def _prepare_save(world: World) -> None:
    world.inflight = ("inflight", fingerprint(_inflight_samples()))


def _run_save(world: World) -> None:
    with world.open() as pool:
        pool.save("inflight", _inflight_samples(), rollout_id=9)


SMALL_SEED = 11


def _prepare_small(world: World) -> None:
    world.inflight = ("inflight", fingerprint(rollout(3, SMALL_SEED)))


def _run_small(world: World) -> None:
    # One chunk of new samples: claimed by the ownership transaction and written, with its
    # tensor blobs, in the manifest's put (docs/architecture/save-protocol.md, "Save protocol").
    with world.open() as pool:
        pool.save("inflight", rollout(3, SMALL_SEED), rollout_id=9)


def _run_stream(world: World) -> None:
    with world.open() as pool, pool.writer("inflight", rollout_id=9) as writer:
        for sample in _inflight_samples():
            writer.add(sample)


def _run_async(world: World) -> None:
    samples = _inflight_samples()
    with world.open() as pool:
        pool.save_async("inflight", samples, rollout_id=9)
        # The caller goes on at once and reuses its samples: the save holds what they were.
        for sample in samples:
            sample.tokens.clear()
            sample.rollout_log_probs[:] = [0.0]
            sample.rollout_routed_experts.fill_(0)
            sample.reward = -1.0
        # Leaving the block waits for the save (and raises its error, if it failed).


def _prepare_reference(world: World) -> None:
    world.inflight = ("inflight", world.intact["kept"])


def _run_reference(world: World) -> None:
    with world.open() as pool:
        pool.save("inflight", None, rollout_id=9, reference="kept")


def _prepare_failed(world: World) -> None:
    world.inflight = ("inflight", "")  # must stay invisible: the save fails


def _run_failed(world: World) -> None:
    samples = rollout(12, INFLIGHT_SEED)
    samples[9].metadata = {"unencodable": object()}  # the third chunk fails to encode
    with (
        contextlib.suppress(UnencodableError),
        world.open() as pool,
        pool.writer("inflight", rollout_id=9) as writer,
    ):
        for sample in samples:
            writer.add(sample)
    with world.open() as pool:
        if "inflight" in {a.name for a in pool.find()}:
            raise AssertionError("a save with an unencodable sample was published")


def _prepare_pointer(world: World) -> None:
    _prepare_save(world)
    world.pointer = world.root.parent / "run" / "rollout_9.pt"


def _run_pointer(world: World) -> None:
    assert world.pointer is not None
    args = SimpleNamespace(archive_root=str(world.root), archive_catalog_url=world.url)
    RolloutArchive.save(world.pointer, _inflight_samples(), rollout_id=9, args=args)


def _prepare_supersede(world: World) -> None:
    with world.open() as pool:
        pool.open_archive("doomed").release()
    world.supersedes = world.intact.pop("doomed")  # released: gc may reclaim it
    world.inflight = ("doomed", fingerprint(_inflight_samples()))


def _run_supersede(world: World) -> None:
    with world.open() as pool:
        pool.save("doomed", _inflight_samples(), rollout_id=3, supersede=True)


def _prepare_retain(world: World) -> None:
    with world.open() as pool:
        world.owners_before = _owners(pool)
    world.owners_after = {k: set(v) for k, v in world.owners_before.items()}
    world.owners_after["doomed"].add("job:new")


def _run_retain(world: World) -> None:
    with world.open() as pool:
        pool.retain("job:new", "doomed")


def _prepare_release(world: World) -> None:
    with world.open() as pool:
        world.owners_before = _owners(pool)
        world.reclaim = _exclusive_blobs(pool, "doomed")
    world.owners_after = {k: set(v) for k, v in world.owners_before.items()}
    world.owners_after["doomed"].clear()
    del world.intact["doomed"]  # may legitimately be reclaimed once released


def _run_release(world: World) -> None:
    with world.open() as pool:
        pool.open_archive("doomed").release()


def _prepare_release_owner(world: World) -> None:
    with world.open() as pool:
        pool.open_archive("held").release()  # job:held is now its only owner
        world.owners_before = _owners(pool)
        world.reclaim = _exclusive_blobs(pool, "held")
    world.owners_after = {k: set(v) for k, v in world.owners_before.items()}
    world.owners_after["held"].discard("job:held")
    del world.intact["held"]


def _run_release_owner(world: World) -> None:
    with world.open() as pool:
        pool.release_owner("job:held")


def _prepare_gc(world: World) -> None:
    with world.open() as pool:
        world.reclaim = _exclusive_blobs(pool, "doomed")
        pool.open_archive("doomed").release()
        orphan_data = b"an orphan: a file under blobs/ that no catalog row names"
        orphan = _local_store(pool).path(pool.store.put(orphan_data))
    del world.intact["doomed"]
    temp = world.root / "tmp" / f"{'0' * 32}.1.abcdef.tmp"
    temp.parent.mkdir(exist_ok=True)
    temp.write_bytes(b"a temp file a killed writer left")
    old = time.time() - 2 * 3600  # older than TEMP_MIN_AGE, so this gc may remove it
    for path in (orphan, temp):
        os.utime(path, (old, old))
    world.plant = [orphan, temp]


def _run_gc(world: World) -> None:
    with world.open() as pool:
        pool.gc(grace=0)


def _prepare_rebuild(world: World) -> None:
    world.rebuild = world.recover = True
    world.names = {"kept", "held", "doomed", "shared"}
    _lose_catalog(world)


def _lose_catalog(world: World) -> None:
    if world.url is None:
        for path in world.root.glob("catalog.db*"):
            path.unlink()
    else:
        _wipe_database(world.url)


def _then_lose_catalog(prepare: Callable[[World], None]) -> Callable[[World], None]:
    """``prepare``, and the catalog is lost after the operation (see `World.lose_catalog`);
    a save's owners are checked too."""

    def prepare_and_lose(world: World) -> None:
        prepare(world)
        world.lose_catalog = True
        if not world.owners_before:
            with world.open() as pool:
                world.owners_before = _owners(pool)
            world.owners_after = {k: set(v) for k, v in world.owners_before.items()}
            if world.inflight is not None:
                world.owners_after[world.inflight[0]] = {archive_owner(world.inflight[0])}

    return prepare_and_lose


def _run_rebuild(world: World) -> None:
    with world.open(recover=True) as pool:
        pool.rebuild_catalog()


def _copy_catalog(world: World, to: str) -> None:
    """Copy the pool's (closed) catalog: a SQLite backup, or a PostgreSQL database clone."""
    if world.url is None:
        import sqlite3

        source = sqlite3.connect(world.root / "catalog.db")
        target = sqlite3.connect(to)
        try:
            source.backup(target)
        finally:
            source.close()
            target.close()
        return
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    admin = make_url(world.url).set(database="postgres")
    engine = create_engine(admin, isolation_level="AUTOCOMMIT")
    original, copy = make_url(world.url).database, make_url(to).database
    try:
        with engine.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{copy}" WITH (FORCE)'))
            conn.execute(text(f'CREATE DATABASE "{copy}" TEMPLATE "{original}"'))
    finally:
        engine.dispose()


def _prepare_restore(world: World) -> None:
    """A catalog backup taken, then 'late' saved, then the backup restored over the catalog."""
    from sqlalchemy.engine import make_url

    world.rebuild = True
    world.names = {"kept", "held", "doomed", "shared", "late"}
    if world.url is None:
        backup = str(world.root.parent / "backup.db")
    else:
        backup = (
            make_url(world.url)
            .set(database=f"bk_{uuid.uuid4().hex[:12]}")
            .render_as_string(hide_password=False)
        )
    _copy_catalog(world, backup)
    with world.open() as pool:
        samples = rollout(12, 7)
        pool.save("late", samples, rollout_id=4)
        world.intact["late"] = fingerprint(samples)
    if world.url is None:
        for path in world.root.glob("catalog.db*"):
            path.unlink()
        shutil.copy(backup, world.root / "catalog.db")
        os.unlink(backup)
    else:
        backup_world = World(world.root, backup, intact={})
        _copy_catalog(backup_world, world.url)
        _drop(backup)


def _drop(url: str) -> None:
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    engine = create_engine(make_url(url).set(database="postgres"), isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{make_url(url).database}" WITH (FORCE)'))
    finally:
        engine.dispose()


def _run_restore(world: World) -> None:
    with world.open() as pool:
        pool.rebuild_catalog()


def _prepare_first_open(world: World) -> None:
    """The pool as an earlier version left it: no identity file, no ids in the catalog."""
    from archive_manager.catalog import journal_table, pool_info_table

    with world.open() as pool, pool.catalog.write() as conn:
        keys = ["pool_id", "catalog_id", "journal_checkpoint", "journal_pool"]
        conn.execute(pool_info_table.delete().where(pool_info_table.c.key.in_(keys)))
        conn.execute(journal_table.delete())
    (world.root / "archive-pool.json").unlink()
    shutil.rmtree(world.root / "journal")
    (world.root / "blobs" / ".archive-pool.json").unlink()


def _run_first_open(world: World) -> None:
    with world.open():
        pass


def _set_recorded_root(world: World, where: Path) -> None:
    from archive_manager.catalog import set_pool_info

    with world.open() as pool, pool.catalog.write() as conn:
        set_pool_info(conn, "blob_root", str(where))


def _prepare_move(world: World) -> None:
    """The pool folder was moved: its catalog still records a root that no longer exists."""
    _set_recorded_root(world, world.root.parent / "moved-away")


def _prepare_rebind(world: World) -> None:
    """The pool is a copy (``cp -a``): the original, same identity, is still in place."""
    original = world.root.parent / "original"
    original.mkdir()
    content = json.loads((world.root / "archive-pool.json").read_text())
    if world.url is not None:
        # The copy's catalog is a copy of the original's database: same ids, another URL.
        content["catalog"] = "postgresql+psycopg://original-host/original"
    (original / "archive-pool.json").write_text(json.dumps(content))
    _set_recorded_root(world, original)
    world.rebind = True


def _run_rebind(world: World) -> None:
    with world.open(rebind=True):
        pass


SCENARIOS = {
    s.name: s
    for s in (
        Scenario(
            "save", "pool.save of 12 samples (3 chunks, one deduplicated)", _prepare_save, _run_save
        ),
        Scenario("stream", "pool.writer adding the same 12 samples", _prepare_save, _run_stream),
        Scenario(
            "small_save",
            "pool.save of 3 new samples (one chunk, written with the manifest)",
            _prepare_small,
            _run_small,
        ),
        Scenario(
            "async_save",
            "pool.save_async of the same 12 samples, changed right after the call",
            _prepare_save,
            _run_async,
        ),
        Scenario("reference", "pool.save(reference='kept')", _prepare_reference, _run_reference),
        Scenario(
            "failed_save",
            "a writer whose third chunk fails to encode",
            _prepare_failed,
            _run_failed,
        ),
        Scenario(
            "pointer",
            "RolloutArchive.save: save, then the pointer file",
            _prepare_pointer,
            _run_pointer,
        ),
        Scenario(
            "supersede",
            "pool.save('doomed', supersede=True) once 'doomed' was released",
            _prepare_supersede,
            _run_supersede,
        ),
        Scenario("retain", "pool.retain('job:new', 'doomed')", _prepare_retain, _run_retain),
        Scenario("release", "Archive.release of 'doomed'", _prepare_release, _run_release),
        Scenario(
            "release_owner",
            "pool.release_owner of held's only owner",
            _prepare_release_owner,
            _run_release_owner,
        ),
        Scenario(
            "gc",
            "pool.gc(grace=0): a released archive, an orphan, a stale temp",
            _prepare_gc,
            _run_gc,
        ),
        Scenario(
            "rebuild", "rebuild_catalog after the catalog was lost", _prepare_rebuild, _run_rebuild
        ),
        Scenario(
            "restore",
            "rebuild_catalog after a catalog backup was restored ('late' saved since)",
            _prepare_restore,
            _run_restore,
        ),
        Scenario(
            "move", "the first open of a pool moved as a whole", _prepare_move, _run_first_open
        ),
        Scenario("rebind", "rebind of a copied pool", _prepare_rebind, _run_rebind),
        Scenario(
            "save_lost",
            "pool.save, then the catalog lost and rebuilt (journal)",
            _then_lose_catalog(_prepare_save),
            _run_save,
        ),
        Scenario(
            "supersede_lost",
            "pool.save(supersede=True), then the catalog lost and rebuilt (journal)",
            _then_lose_catalog(_prepare_supersede),
            _run_supersede,
        ),
        Scenario(
            "retain_lost",
            "pool.retain, then the catalog lost and rebuilt (journal)",
            _then_lose_catalog(_prepare_retain),
            _run_retain,
        ),
        Scenario(
            "release_lost",
            "Archive.release, then the catalog lost and rebuilt (journal)",
            _then_lose_catalog(_prepare_release),
            _run_release,
        ),
        Scenario(
            "release_owner_lost",
            "pool.release_owner, then the catalog lost and rebuilt (journal)",
            _then_lose_catalog(_prepare_release_owner),
            _run_release_owner,
        ),
        Scenario(
            "first_open",
            "the first open of a pool written before pool identities",
            _prepare_first_open,
            _run_first_open,
        ),
    )
}


# --------------------------------------------------------------------------- databases


class Databases:
    """Catalog URLs for fresh pools: None (SQLite in the root) or a new PostgreSQL database."""

    def __init__(self, admin_url: str | None) -> None:
        self.admin_url = admin_url
        self._made: list[str] = []

    def _admin(self, *statements: str) -> None:
        from sqlalchemy import create_engine, text

        assert self.admin_url is not None
        # CREATE/DROP DATABASE cannot run inside a transaction.
        engine = create_engine(self.admin_url, isolation_level="AUTOCOMMIT")
        try:
            with engine.connect() as conn:
                for statement in statements:
                    conn.execute(text(statement))
        finally:
            engine.dispose()

    def _url(self, name: str) -> str:
        from sqlalchemy.engine import make_url

        assert self.admin_url is not None
        url = make_url(self.admin_url).set(database=name).render_as_string(hide_password=False)
        if url not in self._made:
            self._made.append(url)
        return url

    def new(self) -> str | None:
        if self.admin_url is None:
            return None
        name = f"crash_{uuid.uuid4().hex[:12]}"
        self._admin(f'CREATE DATABASE "{name}"')
        return self._url(name)

    def clone(self, source: str, target: str | None = None) -> str:
        """A copy of database ``source`` (PostgreSQL's CREATE DATABASE ... TEMPLATE), named
        as ``target`` (dropped first) or new."""
        from sqlalchemy.engine import make_url

        name = (make_url(target).database if target else None) or f"crash_{uuid.uuid4().hex[:12]}"
        drop = [f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'] if target else []
        self._admin(*drop, f'CREATE DATABASE "{name}" TEMPLATE "{make_url(source).database}"')
        return self._url(name)

    def drop(self, url: str | None) -> None:
        if url is None or self.admin_url is None:
            return
        from sqlalchemy.engine import make_url

        self._admin(f'DROP DATABASE IF EXISTS "{make_url(url).database}" WITH (FORCE)')
        with contextlib.suppress(ValueError):
            self._made.remove(url)

    def close(self) -> None:
        for url in list(self._made):
            self.drop(url)


def _wipe_database(url: str) -> None:
    from sqlalchemy import MetaData, create_engine

    engine = create_engine(url)
    try:
        meta = MetaData()
        meta.reflect(engine)
        meta.drop_all(engine)
    finally:
        engine.dispose()


# --------------------------------------------------------------------------- running


@dataclasses.dataclass
class Row:
    scenario: str
    point: str
    hit: int
    of: int
    outcome: str
    checks: dict[str, bool | None]
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.outcome in ("killed", "raised", "absorbed") and all(
            v is not False for v in self.checks.values()
        )


def _in_child(world: World, scenario: Scenario, spec: str, report: Path) -> int:
    """Fork; the child arms ``spec`` and runs the operation. Returns the child's wait status."""
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        code = 0
        try:
            _failpoints.configure(spec)
            scenario.run(world)
            counts = {name: _failpoints.hits(name) for name in _failpoints.POINTS}
            report.write_text(json.dumps(counts))
        except _failpoints.FailpointError:
            code = 3
        except BaseException:
            report.write_text(traceback.format_exc())
            code = 1
        finally:
            os._exit(code)
    deadline = time.monotonic() + CHILD_TIMEOUT
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return -1
        time.sleep(0.005)


def _outcome(status: int) -> str:
    if status == -1:
        return "hung"
    if os.WIFSIGNALED(status):
        return (
            "killed" if os.WTERMSIG(status) == signal.SIGKILL else f"signal {os.WTERMSIG(status)}"
        )
    return {0: "completed", 3: "raised", 1: "error"}.get(os.WEXITSTATUS(status), "exit?")


class Stage:
    """One scenario's starting pool, set up once and restored before every row.

    The pool is rebuilt in place (same root, same database name) because a catalog is bound
    to its blob root's path.
    """

    def __init__(self, scenario: Scenario, workdir: Path, dbs: Databases) -> None:
        self.scenario = scenario
        self.dbs = dbs
        base = Path(tempfile.mkdtemp(prefix=f"{scenario.name}-", dir=workdir))
        self.saved = base / "template"
        self.report = base / "child.txt"
        url = dbs.new()
        self.world = _setup(base / "pool", url)
        scenario.prepare(self.world)
        shutil.copytree(self.world.root, self.saved, symlinks=True)
        self.saved_url = dbs.clone(url) if url is not None else None

    def restore(self) -> World:
        shutil.rmtree(self.world.root)
        shutil.copytree(self.saved, self.world.root, symlinks=True)
        if self.saved_url is not None:
            self.dbs.clone(self.saved_url, self.world.url)
        self.report.unlink(missing_ok=True)
        if self.world.pointer is not None:
            shutil.rmtree(self.world.pointer.parent, ignore_errors=True)
        return self.world

    def close(self) -> None:
        self.dbs.drop(self.world.url)
        self.dbs.drop(self.saved_url)
        shutil.rmtree(self.saved.parent, ignore_errors=True)


def probe(stage: Stage) -> dict[str, int]:
    """How often the stage's operation reaches each failpoint, when nothing fails."""
    world = stage.restore()
    spec = ";".join(f"{name}=sleep:0" for name in _failpoints.POINTS)
    status = _in_child(world, stage.scenario, spec, stage.report)
    if _outcome(status) != "completed":
        raise RuntimeError(
            f"probe of {stage.scenario.name} did not complete ({_outcome(status)}):\n"
            + (stage.report.read_text() if stage.report.exists() else "")
        )
    counts: dict[str, int] = json.loads(stage.report.read_text())
    return {name: n for name, n in counts.items() if n}


def run_row(stage: Stage, point: str, hit: int, of: int, action: str) -> Row:
    """Run the stage's operation in a child armed with ``point=action@hit``; check the pool."""
    world = stage.restore()
    report = stage.report
    status = _in_child(world, stage.scenario, f"{point}={action}@{hit}", report)
    outcome = _outcome(status)
    if outcome == "completed" and json.loads(report.read_text()).get(point, 0) >= hit:
        # The injected error was raised, and the operation's own error path handled it
        # (e.g. a background write failing while the save already fails for another reason).
        outcome = "absorbed"
    detail = report.read_text()[-2000:] if outcome == "error" and report.exists() else ""
    try:
        checks = check(world)
    except Exception:
        checks = {"checker": False}
        detail += traceback.format_exc()[-2000:]
    return Row(stage.scenario.name, point, hit, of, outcome, checks, detail)


def _load_fp(pool: ArchiveManager, name: str) -> str:
    return fingerprint(pool.open_archive(name).load_samples())


def check(world: World) -> dict[str, bool | None]:
    checks: dict[str, bool | None] = {
        "intact": None,
        "atomic": None,
        "gc": None,
        "verify": None,
        "owned": None,
    }
    if world.lose_catalog:
        _lose_catalog(world)
        with world.open(recover=True) as pool:
            report = pool.rebuild_catalog()
        if report.unresolved or report.skipped:
            checks["atomic"] = False
    if world.rebuild:
        # The lost catalog is rebuilt again (finishing the killed run) before anything is
        # checked: manifests are the truth.
        with world.open(recover=world.recover) as pool:
            pool.rebuild_catalog()
            names = {a.name for a in pool.find()}
        checks["atomic"] = names == world.names
    if world.rebind:
        # What the operator does after a crash: run rebind again (refused once it completed).
        with contextlib.suppress(PoolIdentityError):
            world.open(rebind=True).close()
    with world.open() as pool:
        checks["intact"] = all(_load_fp(pool, n) == fp for n, fp in world.intact.items())
        published = {a.name for a in pool.find()}
        atomic = checks["atomic"] is not False
        if world.inflight is not None and world.supersedes is not None:
            atomic = atomic and _one_current(pool, world.inflight, world.supersedes)
        elif world.inflight is not None:
            name, fp = world.inflight
            if name in published:
                atomic = atomic and fp != "" and _load_fp(pool, name) == fp
            else:
                try:
                    pool.open_archive(name)
                    atomic = False
                except ArchiveNotFoundError:
                    pass
        if world.pointer is not None and world.pointer.exists():
            with RolloutArchive(world.pointer, catalog_url=world.url) as facade:
                atomic = atomic and fingerprint(facade.load_samples()) == world.inflight[1]  # type: ignore[index]
        if world.owners_before:
            atomic = atomic and _owners(pool) in (world.owners_before, world.owners_after)
        checks["atomic"] = atomic

    with world.open(clock=lambda: time.time() + RECOVERY_SKEW) as pool:
        pool.gc(grace=RECOVERY_GRACE)
        again = pool.gc(grace=RECOVERY_GRACE)
        with pool.catalog.read() as conn:
            leftovers = [
                *conn.execute(leases_table.select()).all(),
                *conn.execute(
                    archives_table.select().where(archives_table.c.state == "pending")
                ).all(),
                *conn.execute(
                    blobs_table.select().where(blobs_table.c.state.in_(("writing", "deleting")))
                ).all(),
            ]
            rows = set(
                conn.execute(blobs_table.select().with_only_columns(blobs_table.c.digest)).scalars()
            )
        files = set(pool.store.iter_digests())
        # Release scenarios: what the release frees must be gone if (and only if) it applied.
        applied = not world.owners_after or _owners(pool) == world.owners_after
        reclaim = world.reclaim if applied else set()
        checks["gc"] = (
            not leftovers
            and again.blobs == 0
            and again.orphans == 0
            and again.temp_files == 0
            and files == rows
            and not _local_store(pool).temp_files()
            and not _journal_temps(pool)
            and not any(p.exists() for p in world.plant)
            and not (reclaim & rows)
        )
        verified = pool.verify(read_data=True)
        checks["verify"] = verified.ok and not verified.notices
        checks["owned"] = _owned_intact(pool, world, published)
    return checks


def _local_store(pool: ArchiveManager) -> LocalBlobStore:
    """The folder store under a pool's read retry (`local_pool_store`): the matrix's worlds
    are local pools, and their checks look at files."""
    store = pool.store
    inner = store.inner if isinstance(store, RetryingReads) else store
    assert isinstance(inner, LocalBlobStore), type(inner)
    return inner


def _journal_temps(pool: ArchiveManager) -> list[str]:
    """Temp files left in the journal folder (a record begun in a transaction that never
    committed, or committed and not yet renamed): gc sweeps them."""
    folder = pool.journal.folder
    if not folder.is_absolute() or not folder.is_dir():  # an object store's journal: no temps
        return []
    return [n for n in os.listdir(folder) if n.startswith(".") and n.endswith(".tmp")]


def _one_current(pool: ArchiveManager, inflight: tuple[str, str], earlier: str) -> bool:
    """A superseding save killed anywhere: the name points at the earlier archive (released,
    intact) or at the new one (published, complete, the earlier one on record as superseded),
    never neither, never both; its rollout's statistics count that one only."""
    name, fp = inflight
    try:
        arc = pool.open_archive(name)  # never neither
    except ArchiveNotFoundError:
        return False
    states = [i.state for i in pool.history(name) if i.state != "pending"]
    (row,) = pool.stats(3)
    if arc.state == "published":
        ok = states == ["superseded", "published"] and _load_fp(pool, name) == fp
    else:
        ok = arc.state == "released" and states == ["released"] and _load_fp(pool, name) == earlier
    return ok and row.archives == 1 and row.samples == len(arc)


def _owned_intact(pool: ArchiveManager, world: World, published: set[str]) -> bool:
    """Owned blobs live and intact; published archives owned by themselves and loadable."""
    a, ab, r, b = archives_table, archive_blobs_table, retention_table, blobs_table
    with pool.catalog.read() as conn:
        owned = conn.execute(
            ab.select()
            .with_only_columns(ab.c.digest, b.c.state)
            .join_from(ab, r, r.c.archive_id == ab.c.archive_id)
            .join(b, b.c.digest == ab.c.digest, isouter=True)
        ).all()
        self_owned = {
            name
            for name, owner in conn.execute(
                a.select()
                .with_only_columns(a.c.name, r.c.owner)
                .join_from(a, r, r.c.archive_id == a.c.id)
            )
            if owner == archive_owner(name)
        }
        now_published = set(
            conn.execute(
                a.select().with_only_columns(a.c.name).where(a.c.state == "published")
            ).scalars()
        )
    for digest, state in owned:
        if state != "live":
            return False
        pool.store.check(digest)
    # Only a release ends an archive's own ownership, and it also ends publication.
    if not now_published <= self_owned:
        return False
    expected = dict(world.intact)
    if world.inflight is not None and world.inflight[0] in published:
        expected[world.inflight[0]] = world.inflight[1]
    return set(expected) <= now_published and all(
        _load_fp(pool, n) == fp for n, fp in expected.items()
    )


def matrix(
    workdir: Path,
    dbs: Databases,
    *,
    only: list[str] | None = None,
    action: str = "kill",
    first_only: bool = False,
    each_point_once: bool = False,
    progress: Callable[[Row], None] | None = None,
) -> list[Row]:
    """Run every scenario (or ``only`` those) with ``action`` at each failpoint it reaches:
    at the first hit and the last (``first_only``: the first). ``each_point_once`` skips a
    point that an earlier scenario already covered."""
    rows: list[Row] = []
    covered: set[str] = set()
    for scenario in SCENARIOS.values():
        if only and scenario.name not in only:
            continue
        stage = Stage(scenario, workdir, dbs)
        try:
            counts = probe(stage)
            for point in _failpoints.POINTS:
                n = counts.get(point, 0)
                if each_point_once and point in covered:
                    continue
                if n:
                    covered.add(point)
                for hit in ([1] if first_only else sorted({1, n})) if n else ():
                    row = run_row(stage, point, hit, n, action)
                    rows.append(row)
                    if progress is not None:
                        progress(row)
        finally:
            stage.close()
    return rows


MARK = {True: "ok", False: "FAIL", None: "-"}


def table(rows: list[Row]) -> str:
    head = ("failpoint", "operation", "hit", "outcome", "intact", "atomic", "gc", "verify", "owned")
    lines: list[tuple[str, ...]] = [head]
    for row in rows:
        c = row.checks
        lines.append(
            (
                row.point,
                row.scenario,
                f"{row.hit}/{row.of}",
                row.outcome,
                *(MARK[c.get(k)] for k in ("intact", "atomic", "gc", "verify", "owned")),
            )
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    out = []
    for i, line in enumerate(lines):
        out.append("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip())
        if i == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


def summary(rows: list[Row]) -> str:
    """One Markdown line per failpoint: the operations killed there and whether all held."""
    lines = [
        "| failpoint | the state a crash there leaves | operations (hits) | rows | invariants |",
        "|---|---|---|---|---|",
    ]
    for point, about in _failpoints.POINTS.items():
        mine = [r for r in rows if r.point == point]
        if not mine:
            lines.append(f"| `{point}` | {about} | not reached | 0 | - |")
            continue
        ops: dict[str, list[str]] = {}
        for r in mine:
            ops.setdefault(r.scenario, []).append(f"{r.hit}/{r.of}")
        where = ", ".join(f"{op} ({' '.join(hits)})" for op, hits in ops.items())
        held = sum(r.ok for r in mine)
        verdict = "all hold" if held == len(mine) else f"{len(mine) - held} FAIL"
        lines.append(f"| `{point}` | {about} | {where} | {len(mine)} | {verdict} |")
    return "\n".join(lines)


def uncovered(rows: list[Row]) -> list[str]:
    hit = {row.point for row in rows}
    return [name for name in _failpoints.POINTS if name not in hit]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--action", choices=("kill", "raise"), default="kill")
    parser.add_argument("--only", action="append", choices=sorted(SCENARIOS), help="repeatable")
    parser.add_argument("--pg-admin-url", help="run every row on a new PostgreSQL database")
    parser.add_argument(
        "--pg",
        action="store_true",
        help="start a throwaway PostgreSQL server (as the tests do) and use it",
    )
    parser.add_argument(
        "--first-only", action="store_true", help="only the first hit of each point (faster)"
    )
    parser.add_argument(
        "--each-point-once",
        action="store_true",
        help="each failpoint in the first scenario that reaches it only (the suite's raise run)",
    )
    parser.add_argument("--json", type=Path, help="write the rows as JSON here")
    parser.add_argument(
        "--markdown",
        action="store_true",
        help="one Markdown line per failpoint (docs/guarantees.md)",
    )
    parser.add_argument("--workdir", type=Path, help="where the pools go (default: a temp dir)")
    parser.add_argument("-v", "--verbose", action="store_true", help="print failures' details")
    args = parser.parse_args(argv)

    torch.set_num_threads(1)  # children are forked: keep the parent free of worker threads
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="crash-matrix-"))
    workdir.mkdir(parents=True, exist_ok=True)
    server = None
    if args.pg:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
        from pgserver import PgServer  # test support, shared with the tests

        server = PgServer.start()
        args.pg_admin_url = server.url()
    dbs = Databases(args.pg_admin_url)
    started = time.perf_counter()

    def tick(row: Row) -> None:
        print("." if row.ok else "F", end="", flush=True, file=sys.stderr)

    try:
        rows = matrix(
            workdir,
            dbs,
            only=args.only,
            action=args.action,
            first_only=args.first_only,
            each_point_once=args.each_point_once,
            progress=tick,
        )
    finally:
        dbs.close()
        if server is not None:
            server.stop()
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    print(file=sys.stderr)
    backend = "PostgreSQL" if args.pg_admin_url else "SQLite"
    print(
        f"crash matrix: action={args.action}, catalog={backend}, {len(rows)} rows in "
        f"{time.perf_counter() - started:.1f} s\n"
    )
    print(summary(rows) if args.markdown else table(rows))
    failed = [row for row in rows if not row.ok]
    missing = uncovered(rows)
    print(
        f"\n{len(rows) - len(failed)}/{len(rows)} rows hold every invariant; "
        f"{len(_failpoints.POINTS) - len(missing)}/{len(_failpoints.POINTS)} failpoints covered"
    )
    for name in [] if args.only else missing:
        print(f"not reached by any operation: {name}")
    if args.verbose:
        for row in failed:
            print(
                f"\n{row.point} / {row.scenario} hit {row.hit}: {row.outcome} {row.checks}\n{row.detail}"
            )
    if args.json:
        args.json.write_text(json.dumps([dataclasses.asdict(r) for r in rows], indent=1))
    # With --only, points of the other operations are expectedly not reached.
    return 1 if failed or (missing and not args.only) else 0


if __name__ == "__main__":
    sys.exit(main())
