"""Catalog recovery: rebuild archives, chunks, entries, metadata and ownership from the
manifest blobs when the catalog was lost (`ArchiveManager.rebuild_catalog`).

Manifests are the source of truth for what an archive is; the catalog is an index over them.
What manifests do not record comes back conservatively: every restored archive is published
and retained by its own owner (a released archive whose payload GC had not reclaimed yet is
restored as published; external owners such as checkpoints must be retained again).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sqlalchemy import select

from ._digest import is_digest
from ._names import archive_owner, check_archive_name
from .catalog import (
    archive_blobs_table,
    archives_table,
    blobs_table,
    insert_rows,
    retention_table,
)
from .codec import CHUNK_MAGIC, MANIFEST_MAGIC, TENSOR_MAGIC, decode_manifest
from .errors import ArchiveError
from .writer import MANIFEST_FORMAT, MANIFEST_VERSION, insert_contents

if TYPE_CHECKING:
    from .manager import ArchiveManager

__all__ = ["RebuildReport", "rebuild_catalog"]

_KINDS = {CHUNK_MAGIC: "chunk", TENSOR_MAGIC: "tensor", MANIFEST_MAGIC: "manifest"}


@dataclass
class RebuildReport:
    """What `rebuild_catalog` restored and what it had to skip, with reasons."""

    archives: list[str] = field(default_factory=list)
    blobs: int = 0
    skipped: dict[str, str] = field(default_factory=dict)
    unknown_files: list[str] = field(default_factory=list)
    duration: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        """A JSON-friendly view."""
        return dict(self.__dict__)


def _kind_of(pool: ArchiveManager, digest: str) -> str | None:
    with open(pool.store.path(digest), "rb") as f:
        return _KINDS.get(f.read(len(CHUNK_MAGIC)))


def rebuild_catalog(pool: ArchiveManager) -> RebuildReport:
    """Index every blob file and restore every archive whose manifest and blobs are intact.

    Archives already in the catalog are left alone, so it is safe to run on a catalog that
    survived in part.
    """
    started = time.perf_counter()
    report = RebuildReport()
    now = pool.clock()
    files = {d: size for d, size, _ in pool.store.iter_stat()}
    kinds: dict[str, str] = {}
    for digest in files:
        kind = _kind_of(pool, digest)
        if kind is None:
            report.unknown_files.append(digest)
        else:
            kinds[digest] = kind
    with pool.catalog.write("rebuild.blobs") as conn:
        known = set(conn.execute(select(blobs_table.c.digest)).scalars())
        rows = [(d, files[d], k, "live", now) for d, k in sorted(kinds.items()) if d not in known]
        insert_rows(conn, blobs_table, ("digest", "size", "kind", "state", "created_at"), rows)
        report.blobs = len(rows)
        names = set(conn.execute(select(archives_table.c.name)).scalars())
    for digest in sorted(d for d, k in kinds.items() if k == "manifest"):
        try:
            manifest = decode_manifest(pool.store.get(digest), digest)
            name = _restore(pool, digest, manifest, files, kinds, names, now)
        except (ArchiveError, KeyError, TypeError, ValueError) as exc:
            report.skipped[digest] = f"{type(exc).__name__}: {exc}"
            continue
        if name is not None:
            report.archives.append(name)
            names.add(name)
    report.archives.sort()
    report.duration = time.perf_counter() - started
    return report


def _restore(
    pool: ArchiveManager,
    digest: str,
    manifest: dict[str, Any],
    files: dict[str, int],
    kinds: dict[str, str],
    names: set[str],
    now: float,
) -> str | None:
    if manifest.get("format") != MANIFEST_FORMAT or manifest.get("version") != MANIFEST_VERSION:
        raise ValueError(f"not a version-{MANIFEST_VERSION} archive manifest")
    name = check_archive_name(manifest["name"])
    if name in names:
        return None
    chunks = {i: (d, int(n), int(size)) for i, (d, n, size) in enumerate(manifest["chunks"])}
    tensors = list(manifest.get("tensors", []))
    needed = {d: "chunk" for d, _, _ in chunks.values()} | {d: "tensor" for d in tensors}
    for d, kind in needed.items():
        if not is_digest(d) or d not in files or kinds.get(d) != kind:
            raise ValueError(f"its {kind} blob {d} is missing or not a {kind}")
    needed[digest] = "manifest"
    entries = [
        (position, sk, tk, int(ordinal), int(offset))
        for position, (sk, tk, ordinal, offset) in enumerate(manifest["entries"])
    ]
    metadata = list(manifest["metadata"])
    if len(metadata) != len(entries):
        raise ValueError("entries and metadata disagree in length")
    created = float(manifest.get("created_at") or now)
    with pool.catalog.write("rebuild.archive") as conn:
        archive_id = conn.execute(
            archives_table.insert().values(
                name=name,
                rollout_id=manifest.get("rollout_id"),
                evaluation=bool(manifest.get("evaluation")),
                state="published",
                manifest_digest=digest,
                samples=len(entries),
                bytes=sum(files[d] for d in needed),
                created_at=created,
                published_at=created,
                attrs=manifest.get("attrs"),
                reference_name=manifest.get("reference"),
            )
        ).inserted_primary_key[0]
        insert_contents(conn, archive_id, chunks, entries, metadata)
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
    return name
