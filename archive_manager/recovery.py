"""Catalog recovery: rebuild archives, chunks, entries, metadata and ownership from the
manifest blobs when the catalog was lost (`ArchiveManager.rebuild_catalog`).

Manifests are the source of truth for what an archive is; the catalog is an index over them.
What manifests do not record comes back conservatively: every restored archive is published
and retained by its own owner (a released archive whose payload GC had not reclaimed yet is
restored as published; external owners such as checkpoints must be retained again).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sqlalchemy import delete, select

from ._digest import check_digest, is_digest
from ._names import archive_owner, check_archive_name
from .catalog import (
    archive_blobs_table,
    archives_table,
    blobs_table,
    insert_rows,
    pool_info_table,
    retention_table,
)
from .codec import CHUNK_MAGIC, MANIFEST_MAGIC, TENSOR_MAGIC, decode_manifest
from .errors import ArchiveError
from .gc import UNINDEXED_BLOBS
from .samples import check_key_text, check_task_key
from .writer import MANIFEST_FORMAT, MANIFEST_VERSION, check_rollout_id, insert_contents

if TYPE_CHECKING:
    from .manager import ArchiveManager

__all__ = ["RebuildReport", "rebuild_catalog"]

_INT32, _INT63 = 2**31, 2**63  # limits of the catalog's INTEGER and BIGINT columns
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
    # Only now, every archive restored: a rebuild that died half-way leaves GC refusing.
    with pool.catalog.write() as conn:
        conn.execute(delete(pool_info_table).where(pool_info_table.c.key == UNINDEXED_BLOBS))
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
    manifest = _checked_manifest(manifest)
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


def _count(value: object, limit: int, what: str) -> int:
    if type(value) is not int or not 0 <= value < limit:
        raise ValueError(f"{what} {value!r:.40} is not an int in [0, {limit})")
    return value


def _checked_manifest(manifest: dict[str, Any]) -> dict[str, Any]:
    """``manifest`` if every field has the shape and range a save writes, else ValueError.

    NOTE: manifests are read back from blob files, which may be damaged or forged; one whose
    entries were not lists made the insert raise AttributeError and stopped every later
    rebuild, so everything the catalog will hold is checked before anything is written.
    """
    m = manifest
    if m.get("format") != MANIFEST_FORMAT or type(m.get("version")) is not int:
        raise ValueError("not an archive manifest")
    if m["version"] != MANIFEST_VERSION:
        raise ValueError(f"manifest version {m['version']}; this library reads {MANIFEST_VERSION}")
    check_archive_name(m.get("name"))
    check_rollout_id(m.get("rollout_id"))
    if not isinstance(m.get("evaluation", False), bool):
        raise ValueError("evaluation is not a bool")
    if m.get("attrs") is not None and not isinstance(m["attrs"], dict):
        raise ValueError("attrs is not a JSON object")
    if m.get("reference") is not None:
        check_archive_name(m["reference"])
    created = m.get("created_at")
    # (an exact comparison: also false for NaN, infinities and ints past any float)
    if created is not None and not (type(created) in (int, float) and abs(created) < 1e11):
        raise ValueError(f"created_at {created!r:.40} is not a time")
    chunks, tensors, entries = m.get("chunks"), m.get("tensors", []), m.get("entries")
    metadata = m.get("metadata")
    if not all(isinstance(x, list) for x in (chunks, tensors, entries, metadata)):
        raise ValueError("chunks, tensors, entries and metadata must be lists")
    counts = []
    for chunk in chunks:
        if not (isinstance(chunk, list) and len(chunk) == 3 and isinstance(chunk[0], str)):
            raise ValueError(f"chunk {chunk!r:.80} is not [digest, samples, size]")
        check_digest(chunk[0])
        counts.append(_count(chunk[1], _INT32, "chunk samples"))
        _count(chunk[2], _INT63, "chunk size")
    for digest in tensors:
        check_digest(digest)
    if len(entries) != sum(counts) or len(metadata) != len(entries):
        raise ValueError("entries, metadata and the chunks' sample counts disagree")
    for entry in entries:
        if not (isinstance(entry, list) and len(entry) == 4 and isinstance(entry[0], str)):
            raise ValueError(f"entry {entry!r:.80} is not [sample_key, task_key, chunk, offset]")
        check_key_text(entry[0], "sample key")
        if entry[1] is not None and not isinstance(entry[1], str):
            raise ValueError(f"task key {entry[1]!r:.40} is not a str")
        check_task_key(entry[1])
        ordinal = _count(entry[2], len(counts), "chunk ordinal")
        _count(entry[3], counts[ordinal], "offset")
    if not all(isinstance(d, dict) for d in metadata):
        raise ValueError("sample metadata must be JSON objects")
    # NaN and infinities are JSON to Python but not to PostgreSQL's JSON type.
    json.dumps([m.get("attrs"), metadata], allow_nan=False)
    return m
