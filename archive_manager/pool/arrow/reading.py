"""Reading an archive's records for the Arrow export: the catalog's chunk plan, chunks read ahead
on a thread, records decoded (numeric lists as `StoredNumbers`).

(docs/architecture/getting-data-out.md, "Getting data out".)
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy import select

from ..._util.threads import Helpers
from ...catalog import chunks_table, entries_table, sample_metadata_table
from ...codec import ChunkReader
from ...codec.values import TEXT_FIELDS, gc_paused
from ...errors import IntegrityError
from ...metadata import CATALOG_FIELDS
from .columns import build_batch, field_name
from .common import KEY_COLUMNS, SHAPE_SUFFIX, TAIL_COLUMNS, ArchiveSource, Row

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


@dataclass(frozen=True)
class Needs:
    """What a read of some columns needs of each sample: the fields to decode (None: every
    one, as ``sample_shared`` needs), whether the record's tree (``sample_class``,
    ``sample_converted``), and whether the tail columns at all."""

    fields: frozenset[str] | None
    tree: bool
    tail: bool


#: A read of every column.
EVERYTHING = Needs(None, True, True)
_CATALOG_FIELDS = frozenset(CATALOG_FIELDS)


def column_needs(columns: Sequence[str] | None) -> Needs:
    """What a read of ``columns`` (None: all) needs (docs/architecture/getting-data-out.md, "Getting
    data out", "Reading only what the columns need")."""
    if columns is None:
        return EVERYTHING
    fields: set[str] = set()
    tree = tail = False
    for column in columns:
        if column in KEY_COLUMNS:
            continue
        if column in TAIL_COLUMNS:
            if column == "sample_shared":  # the places of every field's shared values
                return EVERYTHING
            tail = True
            tree = tree or column != "archive_attrs"
            continue
        fields.add(field_name(column))
        if column.endswith(SHAPE_SUFFIX):  # a tensor's shape column (or a field so named)
            fields.add(field_name(column[: -len(SHAPE_SUFFIX)]))
    return Needs(frozenset(fields), tree, tail)


def catalog_values(
    source: ArchiveSource, fields: frozenset[str], positions: Iterable[int] | None = None
) -> dict[int, dict[str, Any]]:
    """Position -> the values of ``fields`` (`CATALOG_FIELDS`) as the catalog's
    descriptions record them, for the samples whose description says it records every one
    of them exactly (its ``"inexact"`` list names none of them): what decoding the record
    would give, type and value (docs/architecture/getting-data-out.md, "Columns from the
    catalog")."""
    if not fields <= _CATALOG_FIELDS:
        raise ValueError(f"not fields the catalog records: {sorted(fields - _CATALOG_FIELDS)}")
    m = sample_metadata_table
    wanted = None if positions is None else set(positions)
    out: dict[int, dict[str, Any]] = {}
    with source.context.catalog.read() as conn:
        found = conn.execute(
            select(m.c.position, m.c.description).where(m.c.archive_id == source.archive_id)
        )
        for position, description in found:
            if wanted is not None and position not in wanted:
                continue
            inexact = description.get("inexact") if type(description) is dict else None
            if type(inexact) is list and fields.isdisjoint(inexact):
                out[position] = {f: description.get(f) for f in fields}
    return out


def fetch_chunk(source: ArchiveSource, part: ChunkPlan, texts: bool = True) -> ChunkReader:
    """Read, check and inflate one chunk's records (no decoding: it releases the GIL);
    without ``texts``, not their text parts."""
    reader = read_chunk(source, part)
    inflate_part(reader, part, texts)
    return reader


def inflate_part(reader: ChunkReader, part: ChunkPlan, texts: bool = True) -> None:
    """Inflate the records of ``part`` (a chunk's, or a piece's) in ``reader``; without
    ``texts``, not their text parts."""
    reader.inflate([offset for *_, offset in part[2]], texts=texts)


def read_chunk(source: ArchiveSource, part: ChunkPlan) -> ChunkReader:
    """Read one chunk and parse its index; nothing inflated."""
    ordinal, digest, _ = part
    return ChunkReader(
        source.read_blob(digest, f"chunk {ordinal}"),
        digest=digest,
        loader=source.load_tensor,
        array_loader=source.load_array,
    )


#: The most bytes (inflated) of one piece of a chunk read (see `pieces_of`).
PIECE_BYTES = 16 << 20


def pieces_of(reader: ChunkReader, part: ChunkPlan) -> list[ChunkPlan]:
    """``part`` as runs of consecutive entries whose records inflate to at most
    `PIECE_BYTES` (at least one entry each): the pieces a large chunk is inflated, decoded
    and handed on in, so that the thread reading ahead inflates the next piece while this
    one is used (a chunk of 40 R3 samples inflates to 125 MB: whole, its inflating and its
    use could not overlap)."""
    ordinal, digest, entries = part
    pieces: list[ChunkPlan] = []
    run: list[tuple[int, str, str | None, int]] = []
    size = 0
    for entry in entries:
        raw = reader.raw_size(entry[3])
        if run and size + raw > PIECE_BYTES:
            pieces.append((ordinal, digest, run))
            run, size = [], 0
        run.append(entry)
        size += raw
    if run:
        pieces.append((ordinal, digest, run))
    return pieces


class Piece(list[Row]):
    """The rows of one piece of a chunk (`iter_chunk_rows` with ``pieces``); ``first``:
    whether it is its chunk's first."""

    def __init__(self, rows: list[Row], *, first: bool) -> None:
        super().__init__(rows)
        self.first = first


def decode_chunk_rows(
    source: ArchiveSource,
    part: ChunkPlan,
    reader: ChunkReader,
    names: Collection[str] | None = None,
) -> list[Row]:
    """The records of one fetched chunk, decoded (numeric lists as `StoredNumbers`); with
    ``names``, only those top-level fields of each."""
    ordinal = part[0]
    rows = []
    with gc_paused():
        for position, skey, tkey, offset in part[2]:
            try:
                cls, fields, converted = reader.record(offset, names)
            except (IndexError, IntegrityError) as exc:
                raise IntegrityError(
                    f"archive {source.name!r}, chunk {ordinal} (blob {reader.digest}): {exc}"
                ) from exc
            rows.append(Row(position, skey, tkey, cls, fields, converted))
    return rows


def iter_chunk_rows(
    source: ArchiveSource,
    positions: Iterable[int] | None = None,
    needs: Needs = EVERYTHING,
    *,
    pieces: bool = False,
) -> Iterator[list[Row]]:
    """The archive's samples (or those at ``positions``) as records, a chunk at a time (with
    ``pieces``, a large chunk in pieces, `pieces_of`), in archive order, holding what
    ``needs`` asks for: decoded, each chunk read and inflated while the one before is used
    (at most two chunks held, as `Archive.load_samples` reads); or, where no chunk needs
    reading (keys only, or `CATALOG_FIELDS` every sample of the chunk has recorded exactly),
    from the catalog alone (class and converted None).
    """
    plan = chunk_plan(source, positions)
    if not plan:
        return
    known: dict[int, dict[str, Any]] = {}
    if needs.fields and not needs.tree and needs.fields <= _CATALOG_FIELDS:
        known = catalog_values(source, needs.fields, positions)
    keys_only = needs.fields is not None and not needs.fields and not needs.tree

    def from_catalog(part: ChunkPlan) -> bool:
        return keys_only or (bool(known) and all(entry[0] in known for entry in part[2]))

    texts = needs.fields is None or not needs.fields.isdisjoint(TEXT_FIELDS)
    to_read = iter([part for part in plan if not from_catalog(part)])
    pool: Helpers | None = None
    # On the thread: the next chunk read, cut in pieces, its first piece inflated; or the
    # next piece of this chunk inflated.  One piece ahead of the one being used.
    ahead: Future[tuple[ChunkReader, list[ChunkPlan]]] | None = None
    ahead_piece: Future[None] | None = None

    def fetch(part: ChunkPlan) -> tuple[ChunkReader, list[ChunkPlan]]:
        reader = read_chunk(source, part)
        cut = pieces_of(reader, part) if pieces else [part]
        inflate_part(reader, cut[0], texts)
        return reader, cut

    def read_next() -> Future[tuple[ChunkReader, list[ChunkPlan]]] | None:
        assert pool is not None
        part = next(to_read, None)
        return None if part is None else pool.submit(fetch, part)

    try:
        for part in plan:
            if from_catalog(part):
                yield [
                    Row(position, skey, tkey, None, dict(known.get(position, {})), None)
                    for position, skey, tkey, _ in part[2]
                ]
                continue
            if pool is None:
                pool = Helpers(1, thread_name_prefix="archive-export")
                ahead = read_next()
            assert ahead is not None
            reader, cut = ahead.result()
            for k, piece in enumerate(cut):
                if ahead_piece is not None:
                    ahead_piece.result()
                    ahead_piece = None
                # Read ahead, or in pieces, while the caller's code ran: its map may have
                # lost its file's end (reading on would be SIGBUS).
                reader.check_untruncated(f"archive {source.name!r}, chunk {part[0]}")
                if k + 1 < len(cut):
                    ahead_piece = pool.submit(inflate_part, reader, cut[k + 1], texts)
                else:
                    ahead = read_next()
                rows = decode_chunk_rows(source, piece, reader, needs.fields)
                yield Piece(rows, first=k == 0) if pieces else rows
    finally:
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)


class PiecesDiffer(Exception):
    """`archive_batches` read in pieces met a batch typed otherwise than the one before it
    (the caller starts again a chunk at a time, whose types are the whole chunk's)."""


def archive_batches(
    source: ArchiveSource,
    *,
    positions: Iterable[int] | None = None,
    columns: Sequence[str] | None = None,
    force_json: frozenset[str] = frozenset(),
    pieces: bool = False,
) -> Iterator[pa.RecordBatch]:
    """One record batch per chunk read, or with ``pieces`` per piece of a large one (each
    with its own inferred types; see `conform`).  With ``pieces``, a piece typed otherwise
    than the piece of its chunk before it raises `PiecesDiffer`: a piece's types may differ
    from its whole chunk's (ints in one piece and floats in the next are JSON in the chunk,
    float64 merged; bools then ints are JSON, not bools), so the caller starts again
    without.  Pieces of one chunk typed alike are typed as their whole chunk is; chunks may
    differ from each other, as without pieces (the caller's `conform` decides).

    With ``columns``, the batches hold the key columns and the columns of the fields those
    need (`column_needs`: others are neither decoded nor built, and chunks are not read at
    all where the catalog answers), for the caller to select from after `conform`: the
    same values, types and metadata a whole batch has in those columns.
    """
    needs = column_needs(columns)
    typed: pa.Schema | None = None
    for rows in iter_chunk_rows(source, positions, needs, pieces=pieces):
        batch = build_batch(source, rows, force_json=force_json, tail=needs.tail)
        if pieces:
            first = not isinstance(rows, Piece) or rows.first
            if not first and typed is not None and not batch.schema.equals(typed, True):
                raise PiecesDiffer(f"archive {source.name!r}: a chunk's pieces differ in types")
            typed = batch.schema
        yield batch
