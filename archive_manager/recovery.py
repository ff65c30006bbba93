"""Catalog recovery (docs/architecture.md, "Recovery"): restore the archives the catalog lacks
from the manifest blobs under the blob root (`ArchiveManager.rebuild_catalog`).

Manifests are the source of truth for what an archive is; the catalog is an index over them.
The rebuild is *incremental*: it looks only at blob files that have no catalog row (a lost
catalog has none; one restored from a backup lacks what was written after the backup) and
never changes what the catalog already records.  That is what makes it safe beside live
saves and GC: a save inserts a blob's row before it writes the file, so a file without a row
is never one a save in flight is writing, and every step below runs under the catalog's write
lock, which GC's unlinks also take.

Per archive, one transaction: the name is still free, every blob it needs is present (a file,
or a row that is not being deleted), rows are added for the blobs that had none, and the
archive is inserted published and owned by its own owner.  When several manifests name one
archive, the one saved last wins (`Manifest.order`: the published one, see the manifest
module); every other manifest is reported with its reason.  Owners other than the archive's
own (checkpoints, queues) and releases are not in manifests: they must be restored by hand.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sqlalchemy import delete, select, update
from sqlalchemy import exc as sa_exc

from ._names import MAX_NAME_BYTES, archive_owner
from .catalog import (
    archive_blobs_table,
    archives_table,
    blobs_table,
    insert_rows,
    pool_info_table,
    retention_table,
)
from .catalog.queries import archive_by_name, blob_rows, raise_save_seq
from .errors import ArchiveError
from .gc import kind_of, rowless_files
from .identity import UNINDEXED_BLOBS
from .manifest import Manifest
from .writer import insert_contents

if TYPE_CHECKING:
    from .manager import ArchiveManager

__all__ = ["RebuildReport", "rebuild_catalog"]

_BATCH = 500

Progress = Callable[[int, int], None]


@dataclass
class RebuildReport:
    """What `rebuild_catalog` restored and what it did not, each with its reason."""

    archives: list[str] = field(default_factory=list)
    renamed: dict[str, str] = field(default_factory=dict)  # restored name -> name it had
    blobs: int = 0
    skipped: dict[str, str] = field(default_factory=dict)
    unknown_files: list[str] = field(default_factory=list)
    duration: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        """A JSON-friendly view."""
        return dict(self.__dict__)


class _Skip(Exception):
    """This manifest's archive cannot be restored; the message says why."""


def rebuild_catalog(pool: ArchiveManager, *, progress: Progress | None = None) -> RebuildReport:
    """Index every blob file the catalog lacks and restore every archive the catalog lacks
    whose manifest and blobs are intact (see the module docstring).

    Safe on a live pool and on a catalog that survived in part or was restored from a backup:
    what the catalog records is never changed, and a rebuild killed anywhere is finished by
    the next one (GC refuses until then).
    """
    started = time.perf_counter()
    report = RebuildReport()
    now = pool.clock()
    rowless = rowless_files(pool, list(pool.store.iter_stat()))
    kinds: dict[str, str] = {}
    for digest in sorted(rowless):
        try:
            kind = kind_of(pool, digest)
        except (OSError, ArchiveError):
            continue  # vanished since the listing (a GC or a rollback took it)
        if kind is None:
            report.unknown_files.append(digest)
        else:
            kinds[digest] = kind
    by_name: dict[str, list[tuple[Manifest, str]]] = defaultdict(list)
    highest_seq = 0
    for digest in sorted(d for d, k in kinds.items() if k == "manifest"):
        try:
            manifest = Manifest.decode(pool.store.get(digest), digest)
        except (ArchiveError, OSError, KeyError, TypeError, ValueError) as exc:
            report.skipped[digest] = f"{type(exc).__name__}: {exc}"
            continue
        by_name[manifest.name].append((manifest, digest))
        highest_seq = max(highest_seq, manifest.save_seq or 0)
    for done, name in enumerate(sorted(by_name), start=1):
        group = sorted(by_name[name], key=lambda md: (md[0].order, md[1]), reverse=True)
        (winner, digest), losers = group[0], group[1:]
        for manifest, other in losers:
            report.skipped[other] = (
                f"superseded: archive {name!r} was saved again later (manifest {digest}"
                f"{_seq_text(winner)}; this one{_seq_text(manifest)})"
            )
        try:
            added, restored_as = _restore(pool, digest, winner, kinds, rowless, now)
            report.blobs += added
        except _Skip as exc:
            report.skipped[digest] = str(exc)
        except sa_exc.IntegrityError as exc:
            report.skipped[digest] = f"archive {name!r} could not be inserted: {exc.orig}"
        else:
            report.archives.append(restored_as)
            if restored_as != name:
                report.renamed[restored_as] = name
        if progress is not None:
            progress(done, len(by_name))
    report.blobs += _index_rest(pool, rowless, kinds, now)
    # Only now, every archive restored: a rebuild that died half-way leaves GC refusing.
    with pool.catalog.write("rebuild.finish") as conn:
        raise_save_seq(conn, highest_seq)
        conn.execute(delete(pool_info_table).where(pool_info_table.c.key == UNINDEXED_BLOBS))
    report.archives.sort()
    report.duration = time.perf_counter() - started
    return report


def _seq_text(manifest: Manifest) -> str:
    if manifest.save_seq is not None:
        return f", save {manifest.save_seq}"
    return f", created at {manifest.created_at}"


def _restore(
    pool: ArchiveManager,
    digest: str,
    m: Manifest,
    kinds: dict[str, str],
    rowless: dict[str, int],
    now: float,
) -> tuple[int, str]:
    """Insert archive ``m`` if every blob it needs is there; return how many blob rows it
    added and the name it got (its own, unless the catalog has another archive of that
    name)."""
    needed: dict[str, str] = {d: "chunk" for d, _, _ in m.chunks}
    needed.update({d: "tensor" for d in m.tensors})
    needed[digest] = "manifest"
    chunk_sizes = {d: size for d, _, size in m.chunks}
    store = pool.store
    with pool.catalog.write("rebuild.archive") as conn:
        rows = blob_rows(conn, list(needed))
        if digest in rows:
            raise _Skip("its manifest was indexed meanwhile (by another rebuild, or a save)")
        name = m.name
        existing = archive_by_name(conn, name)
        if existing is not None:
            # NOTE: a catalog restored from a backup, then a save of a name that an archive
            # published after the backup also had: both were real.  Keeping only the
            # catalog's would leave the other's blobs unowned for the next GC, so it comes
            # back under a name of its own (reported), and nothing is lost.
            name = _restored_name(m, digest)
            if archive_by_name(conn, name) is not None:
                raise _Skip(
                    f"the catalog already has archives {m.name!r} and {name!r}; what the "
                    "catalog records is kept"
                )
        sizes: dict[str, int] = {}
        new_rows: list[tuple[str, int, str, str, float]] = []
        revive: list[str] = []
        for d, kind in needed.items():
            row = rows.get(d)
            # Under the write lock: GC and rollbacks unlink only while holding it, so a file
            # seen here stays until this transaction ends.
            present = store.has(d)
            if row is None:
                if not present or kinds.get(d, kind) != kind or d not in rowless:
                    raise _Skip(f"its {kind} blob {d} is missing or not a {kind}")
                size = rowless[d]
                new_rows.append((d, size, kind, "live", now))
            else:
                if row.kind != kind:
                    raise _Skip(f"its {kind} blob {d} is recorded as a {row.kind}")
                if not present:
                    raise _Skip(f"its {kind} blob {d} is missing (recorded {row.state})")
                size = int(row.size)
                if row.state in ("deleting", "writing"):
                    # GC unlinks only rows still 'deleting', under this lock: taking the row
                    # back here keeps the file.  A 'writing' row whose file is at its final
                    # name is complete (files are renamed there after their fsync); a save
                    # that never finishes would leave it 'writing' for good.
                    revive.append(d)
            if d in chunk_sizes and chunk_sizes[d] != size:
                raise _Skip(f"its chunk blob {d} holds {size} bytes, not {chunk_sizes[d]}")
            sizes[d] = size
        insert_rows(conn, blobs_table, ("digest", "size", "kind", "state", "created_at"), new_rows)
        if revive:
            conn.execute(
                update(blobs_table)
                .where(
                    blobs_table.c.digest.in_(revive),
                    blobs_table.c.state.in_(("deleting", "writing")),
                )
                .values(state="live", created_at=now)
            )
        created = m.created_at if m.created_at is not None else now
        archive_id = conn.execute(
            archives_table.insert().values(
                name=name,
                rollout_id=m.rollout_id,
                evaluation=m.evaluation,
                state="published",
                manifest_digest=digest,
                samples=len(m.entries),
                bytes=sum(sizes.values()),
                created_at=created,
                published_at=created,
                attrs=m.attrs,
                reference_name=m.reference,
            )
        ).inserted_primary_key[0]
        chunks = {i: c for i, c in enumerate(m.chunks)}
        entries = [(pos, *e) for pos, e in enumerate(m.entries)]
        insert_contents(conn, archive_id, chunks, entries, list(m.metadata))
        insert_rows(
            conn,
            archive_blobs_table,
            ("archive_id", "digest", "kind"),
            [(archive_id, d, k) for d, k in sorted(needed.items())],
        )
        conn.execute(
            retention_table.insert().values(
                owner=archive_owner(name), archive_id=archive_id, created_at=now
            )
        )
    return len(new_rows), name


def _restored_name(m: Manifest, digest: str) -> str:
    """``<name>~restored-<save number or digest>``, cut to fit the name limit."""
    suffix = f"~restored-{m.save_seq if m.save_seq is not None else digest[:16]}"
    base = m.name
    while len((base + suffix).encode()) > MAX_NAME_BYTES:
        base = base[:-1]
    return base.rstrip() + suffix


def _index_rest(
    pool: ArchiveManager, rowless: dict[str, int], kinds: dict[str, str], now: float
) -> int:
    """Give every remaining row-less blob file of a known kind a ``live`` row (unowned: GC
    reclaims it after the grace period); return how many rows it added."""
    store = pool.store
    digests = sorted(d for d in rowless if d in kinds)
    added = 0
    for i in range(0, len(digests), _BATCH):
        batch = digests[i : i + _BATCH]
        with pool.catalog.write("rebuild.blobs") as conn:
            known = set(
                conn.execute(
                    select(blobs_table.c.digest).where(blobs_table.c.digest.in_(batch))
                ).scalars()
            )
            rows = [
                (d, rowless[d], kinds[d], "live", now)
                for d in batch
                if d not in known and store.has(d)
            ]
            insert_rows(conn, blobs_table, ("digest", "size", "kind", "state", "created_at"), rows)
            added += len(rows)
    return added
