"""Reading an archive's records for the Arrow export: the catalog's chunk plan, chunks read ahead
on a thread, records decoded (numeric lists as `StoredNumbers`).

(docs/architecture.md, "Getting data out".)
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING

from sqlalchemy import select

from ...catalog import chunks_table, entries_table
from ...codec import ChunkReader
from ...codec.values import gc_paused
from ...errors import IntegrityError
from .columns import build_batch
from .common import ArchiveSource, Row

if TYPE_CHECKING:
    import pyarrow as pa


#: One chunk's part of a read: ``(ordinal, digest, [(position, sample_key, task_key, offset)])``.
ChunkPlan = tuple[int, str, list[tuple[int, str, str | None, int]]]


def chunk_plan(source: ArchiveSource, positions: Iterable[int] | None = None) -> list[ChunkPlan]:
    """The chunks holding the archive's samples (or those at ``positions``), in archive
    order, each with its entries: the catalog alone."""
    e, c = entries_table, chunks_table
    with source.context.catalog.read() as conn:
        entries = conn.execute(
            select(e.c.position, e.c.sample_key, e.c.task_key, e.c.chunk_ordinal, e.c.offset)
            .where(e.c.archive_id == source.archive_id)
            .order_by(e.c.position)
        ).all()
        digests = dict(
            conn.execute(
                select(c.c.ordinal, c.c.digest).where(c.c.archive_id == source.archive_id)
            ).all()
        )
    wanted = None if positions is None else set(positions)
    plan: list[ChunkPlan] = []
    for position, skey, tkey, ordinal, offset in entries:
        if wanted is not None and position not in wanted:
            continue
        if not plan or plan[-1][0] != ordinal:
            digest = digests.get(ordinal)
            if digest is None:
                raise IntegrityError(f"archive {source.name!r} has no row for chunk {ordinal}")
            plan.append((ordinal, digest, []))
        plan[-1][2].append((position, skey, tkey, offset))
    return plan


def fetch_chunk(source: ArchiveSource, part: ChunkPlan) -> ChunkReader:
    """Read, check and inflate one chunk's records (no decoding: it releases the GIL)."""
    ordinal, digest, entries = part
    reader = ChunkReader(
        source.read_blob(digest, f"chunk {ordinal}"), digest=digest, loader=source.load_tensor
    )
    reader.inflate([offset for *_, offset in entries])
    return reader


def decode_chunk_rows(source: ArchiveSource, part: ChunkPlan, reader: ChunkReader) -> list[Row]:
    """The records of one fetched chunk, decoded (numeric lists as `StoredNumbers`)."""
    ordinal = part[0]
    rows = []
    with gc_paused():
        for position, skey, tkey, offset in part[2]:
            try:
                cls, fields, converted = reader.record(offset)
            except (IndexError, IntegrityError) as exc:
                raise IntegrityError(
                    f"archive {source.name!r}, chunk {ordinal} (blob {reader.digest}): {exc}"
                ) from exc
            rows.append(Row(position, skey, tkey, cls, fields, converted))
    return rows


def iter_chunk_rows(
    source: ArchiveSource, positions: Iterable[int] | None = None
) -> Iterator[list[Row]]:
    """The archive's samples (or those at ``positions``) as decoded records, a chunk at a
    time, in archive order; the next chunk is read and inflated while this one is used, so
    at most two chunks are held (as `Archive.load_samples` reads)."""
    plan = chunk_plan(source, positions)
    if not plan:
        return
    pool = ThreadPoolExecutor(1, thread_name_prefix="archive-export")
    try:
        ahead: Future[ChunkReader] = pool.submit(fetch_chunk, source, plan[0])
        for k, part in enumerate(plan):
            reader = ahead.result()
            if k + 1 < len(plan):
                ahead = pool.submit(fetch_chunk, source, plan[k + 1])
            yield decode_chunk_rows(source, part, reader)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def archive_batches(
    source: ArchiveSource,
    *,
    positions: Iterable[int] | None = None,
    columns: Sequence[str] | None = None,
    force_json: frozenset[str] = frozenset(),
) -> Iterator[pa.RecordBatch]:
    """One record batch per chunk read (each with its own inferred types; see `conform`)."""
    for rows in iter_chunk_rows(source, positions):
        batch = build_batch(source, rows, force_json=force_json)
        yield batch if columns is None else batch.select(list(columns))
