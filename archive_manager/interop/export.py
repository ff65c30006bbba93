"""Getting data out and back in: a pool-wide Arrow stream over a sample query, Parquet and
JSONL files of an archive (or of many, one file each), and imports of such files, this
library's or another framework's (docs/architecture/getting-data-out.md, "Getting data out").

Every file is written to a temp file beside its target and renamed into place, so a failed
export leaves no partial file, and a full disk, a read-only folder or a missing permission
is one `OutputWriteError` (`archive_manager._util.output`); an import streams into one
`ArchiveWriter`, so a failed import publishes nothing.
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import itertools
import json
import os
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import select

from .._util.output import Output, write_output
from .._util.threads import Helpers
from ..catalog import archives_table
from ..errors import (
    ArchiveExistsError,
    InvalidInputError,
    OutputWriteError,
    UnencodableError,
    UnsupportedFormatError,
)
from ..lens.query import query_samples
from ..lens.stats import narrow_rollout_bounds
from ..pool.archive import Archive, ArchiveInfo, infos, open_archive
from ..pool.arrow import (
    KEY_COLUMNS,
    SHAPE_SUFFIX,
    TAIL_COLUMNS,
    ArchiveSource,
    ImportedRow,
    PiecesDiffer,
    SchemaDrift,
    archive_batches,
    check_columns,
    column_name,
    column_needs,
    conform,
    empty_batch,
    from_json_value,
    imported_row,
    is_export,
    json_columns,
    json_rows,
    key_schema,
    merge_schemas,
    pyarrow_module,
    rows_to_samples,
    select_columns,
    selected_names,
    stream_schema,
    widened,
    with_json_column,
)
from ..pool.context import PoolContext
from ..pool.listing import check_rollout_range, rollout_filter
from ..pool.writer import ArchiveWriter
from ..samples import Sample

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = [
    "FORMATS",
    "arrow_reader",
    "export_archive",
    "format_of",
    "import_table",
    "selected_archives",
]

#: Export and import formats, by the suffixes that name them.
FORMATS = {
    ".parquet": "parquet",
    ".pq": "parquet",
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".pt": "pt",
}
SUFFIX = {"parquet": ".parquet", "jsonl": ".jsonl", "pt": ".pt"}


def format_of(path: Path, given: str | None = None) -> str:
    """The format ``given``, or the one ``path``'s suffix names.

    Raises:
        UnsupportedFormatError: an unknown format or suffix (the message lists the known).
    """
    if given is not None:
        if given not in SUFFIX:
            raise UnsupportedFormatError(
                f"unknown format {given!r:.40}: use one of {', '.join(SUFFIX)}"
            )
        return given
    found = FORMATS.get(path.suffix.lower())
    if found is None:
        raise UnsupportedFormatError(
            f"cannot tell the format of {path} from its suffix {path.suffix!r:.40}: use "
            f"{', '.join(FORMATS)} or give the format"
        )
    return found


# --------------------------------------------------------------------------- pool-wide


#: The sample filters of `ArchiveManager.query`: those of `query_samples`, and
#: ``rollout_ids``, which narrows their rollout-id ends.
_FILTERS = frozenset(inspect.signature(query_samples).parameters) - {"pool"} | {"rollout_ids"}


#: The filters of `query_samples` that look at samples, not only at their archive.
_SAMPLE_FILTERS = frozenset(
    ("task_key", "sample_key", "status", "min_reward", "max_reward", "min_length", "max_length")
) | {"limit"}


def selected_archives(
    pool: PoolContext, names: Sequence[str] | None, filters: dict[str, Any]
) -> list[tuple[str, list[int] | None]]:
    """``[(archive, positions)]`` of the samples the query selects, in its order (positions
    None: every sample of the archive)."""
    if names is not None and (isinstance(names, str) or not all(isinstance(n, str) for n in names)):
        raise InvalidInputError("names must be a list of archive names")
    # find's spelling, rollout_id, is the same filter, so a query copied from find works here.
    filters = dict(filters)
    bounds = rollout_filter(filters.pop("rollout_ids", None), filters.pop("rollout_id", None))
    unknown = sorted(set(filters) - _FILTERS)
    if unknown:
        raise InvalidInputError(
            f"unknown filter {', '.join(map(repr, unknown))}; the filters are "
            f"{', '.join(sorted(_FILTERS))}"
        )
    filters["min_rollout_id"], filters["max_rollout_id"] = narrow_rollout_bounds(
        bounds,
        filters.get("min_rollout_id"),
        filters.get("max_rollout_id"),
    )
    wanted = None if names is None else set(names)
    if all(filters.get(k) is None for k in _SAMPLE_FILTERS):
        # NOTE: every sample of the archives selected: their names from the archives table,
        # not a row (and a description parsed) per sample of the pool, which cost more than
        # a catalog-only Arrow read of 1,024 samples (docs/performance.md)
        query_samples(pool, **{**filters, "limit": 0})  # checks the filters, reads no sample
        return [
            (name, None)
            for name in _archives_in_order(pool, filters)
            if wanted is None or name in wanted
        ]
    rows = query_samples(pool, **filters)
    out: list[tuple[str, list[int] | None]] = []
    for row in rows:
        if wanted is not None and row.archive not in wanted:
            continue
        if not out or out[-1][0] != row.archive:
            out.append((row.archive, []))
        positions = out[-1][1]
        assert positions is not None
        positions.append(row.position)
    return out


def _archives_in_order(pool: PoolContext, filters: dict[str, Any]) -> list[str]:
    """The names of the archives the archive-level ``filters`` (rollout ids, evaluation,
    state) select, in `query_samples`' order (rollout id, NULL last, then name)."""
    a = archives_table
    query = select(a.c.name)
    state = filters.get("state", "published")
    if state is not None:
        query = query.where(a.c.state == state)
    if filters.get("evaluation") is not None:
        query = query.where(a.c.evaluation == bool(filters["evaluation"]))
    if filters.get("min_rollout_id") is not None:
        query = query.where(a.c.rollout_id >= filters["min_rollout_id"])
    if filters.get("max_rollout_id") is not None:
        query = query.where(a.c.rollout_id <= filters["max_rollout_id"])
    order = (a.c.rollout_id.is_(None), a.c.rollout_id, a.c.name)
    with pool.catalog.read() as conn:
        return list(conn.execute(query.order_by(*order)).scalars())


def selected_batches(
    pool: PoolContext,
    *,
    names: Sequence[str] | None = None,
    force_json: frozenset[str] = frozenset(),
    columns: Sequence[str] | None = None,
    **filters: Any,
) -> Iterator[pa.RecordBatch]:
    """Batches (one per chunk read) of the samples a query selects, each typed on its own;
    with ``columns``, of what those need (`archive_batches`)."""
    for name, positions in selected_archives(pool, names, filters):
        source = open_archive(pool, name).arrow_source()
        yield from archive_batches(
            source, positions=positions, columns=columns, force_json=force_json
        )


def scan_schema(
    pool: PoolContext,
    names: Sequence[str] | None,
    filters: dict[str, Any],
    columns: Sequence[str] | None = None,
) -> pa.Schema:
    """The schema every batch of a selection fits: a first pass over all of it, a chunk at
    a time (as costly as reading it once more; of ``columns``, as costly as they are)."""
    schema: pa.Schema | None = None
    for batch in selected_batches(pool, names=names, columns=columns, **filters):
        if schema is None:
            schema = stream_schema(batch.schema)
            continue
        try:
            conform(batch, schema)
        except SchemaDrift as drift:
            schema = drift.schema
    return key_schema() if schema is None else schema


def arrow_reader(
    pool: PoolContext,
    *,
    columns: Sequence[str] | None = None,
    schema: pa.Schema | str | None = None,
    names: Sequence[str] | None = None,
    **filters: Any,
) -> pa.RecordBatchReader:
    """`ArchiveManager.arrow_reader`: the samples a query selects as a stream of batches.

    ``filters`` are `ArchiveManager.query`'s (``min_rollout_id``, ``max_rollout_id``,
    ``evaluation``, ``task_key``, ``status``, rewards, lengths...); ``names`` keeps only
    those archives.  One batch per chunk read, so memory stays about two chunks whatever the
    selection.  The stream's schema is its first batch's (columns holding only nulls made
    JSON, and a typed column of a later chunk turned into JSON where the first made it
    JSON); ``schema="scan"`` reads the selection once first to find a schema every batch
    fits, or pass a schema.  A later batch that does not fit raises `SchemaDrift`.

    With ``columns`` (in that order, a tensor's shape column after it), only what they need
    is read: key columns and the fields the catalog records exactly (reward, status...) come
    from the catalog without reading a chunk; other fields are the only ones decoded
    (docs/architecture/getting-data-out.md, "Getting data out", "Reading only what the columns
    need").
    """
    pa = pyarrow_module()
    check_columns(columns)
    if isinstance(schema, str):
        if schema != "scan":
            raise InvalidInputError('schema must be a pyarrow.Schema, "scan" or None')
        schema = scan_schema(pool, names, filters, columns)
    if schema is not None and not isinstance(schema, pa.Schema):
        raise InvalidInputError('schema must be a pyarrow.Schema, "scan" or None')
    if schema is not None and columns is not None:
        schema = _needed_schema(schema, columns)
    force = frozenset() if schema is None else json_columns(schema)
    batches = selected_batches(pool, names=names, force_json=force, columns=columns, **filters)
    first = next(batches, None)
    if first is None:
        empty = schema if schema is not None else key_schema()
        return pa.RecordBatchReader.from_batches(_selected_schema(empty, columns), iter(()))
    assert not isinstance(schema, str)  # "scan" was replaced by the scanned schema
    target = schema if schema is not None else stream_schema(first.schema)
    if columns is not None and any(c not in target.names for c in columns):
        # the message lists the columns a whole first batch has (rare: a misspelt name)
        whole = next(selected_batches(pool, names=names, force_json=force, **filters))
        _selected_schema(stream_schema(whole.schema), columns)
    out_schema = _selected_schema(target, columns)

    def stream() -> Iterator[Any]:
        yield select_columns(conform(first, target), columns)
        for batch in batches:
            yield select_columns(conform(batch, target), columns)

    return pa.RecordBatchReader.from_batches(out_schema, stream())


def _needed_schema(schema: pa.Schema, columns: Sequence[str]) -> pa.Schema:
    """The part of a whole schema (``schema=``: a scan's, a `SchemaDrift`'s) that the batches
    of a read of ``columns`` hold (`column_needs`)."""
    pa = pyarrow_module()
    needs = column_needs(columns)
    if needs.fields is None:
        return schema
    keep = set(KEY_COLUMNS) | (set(TAIL_COLUMNS) if needs.tail else set())
    for field in needs.fields:
        keep |= {column_name(field), column_name(field) + SHAPE_SUFFIX}
    return pa.schema([f for f in schema if f.name in keep])


def _selected_schema(schema: pa.Schema, columns: Sequence[str] | None) -> pa.Schema:
    pa = pyarrow_module()
    if columns is None:
        return schema
    return pa.schema([schema.field(n) for n in selected_names(schema, columns)])


# --------------------------------------------------------------------------- files


def _write_parquet(
    make: Callable[[frozenset[str], bool], Iterator[pa.RecordBatch]],
    output: Output,
    empty: Callable[[], pa.RecordBatch],
) -> int:
    """Stream batches into a Parquet file; on a batch that does not fit the schema so far,
    start again with both merged (rare: each restart widens the schema).  Returns rows.

    ``make(force_json, pieces)`` reads large chunks in pieces while ``pieces``; on
    `PiecesDiffer` the file starts again a chunk at a time (types as the whole chunks').

    Only pyarrow's writes are marked as the file's (`Output.writing`): a batch's reads of
    the pool keep their own errors."""
    pq = _parquet()
    arrow = pyarrow_module()
    path = str(output.path)

    def write_batch(writer: Any, batch: pa.RecordBatch) -> None:
        with output.writing():
            _write_groups(writer, batch)

    def close(writer: Any, sink: Any) -> None:
        # NOTE: the file is opened here, not by pyarrow, which leaves a file it opened
        # itself open when closing the writer fails (a full disk): the removed temp file
        # would keep its blocks until the process ends.
        try:
            if writer is not None:
                with output.writing():
                    writer.close()
        finally:
            if sink is not None:
                with output.writing():
                    sink.close()

    schema: pa.Schema | None = None
    force: frozenset[str] = frozenset()
    pieces = True
    while True:
        writer = None
        sink = None
        rows = 0
        # NOTE: Parquet encodes and compresses without the GIL: batch k is written on this
        # thread while batch k+1 is decoded and built (at most two batches held).  Measured
        # on the 1024-sample rollout: 0.97 s -> see docs/usage.md, "Getting data out".
        io = Helpers(1, thread_name_prefix="parquet-write")
        pending: Future[None] | None = None
        try:
            for batch in make(force, pieces):
                if schema is None:
                    schema = batch.schema
                if writer is None:
                    with output.writing():
                        sink = arrow.OSFile(path, "wb")
                        writer = pq.ParquetWriter(sink, schema, **_parquet_options(schema))
                fitted = conform(batch, schema)
                if pending is not None:
                    pending.result()
                pending = io.submit(write_batch, writer, fitted)
                rows += batch.num_rows
            if pending is not None:
                pending.result()
        except PiecesDiffer:
            schema, force, pieces = None, frozenset(), False
            continue
        except SchemaDrift as drift:
            assert schema is not None
            schema = widened(schema, drift)
            force = json_columns(schema)
            continue
        finally:
            io.shutdown(wait=True, cancel_futures=True)
            close(writer, sink)
        if writer is None:
            batch = empty()
            table = arrow.Table.from_batches([batch])
            with output.writing():
                sink = arrow.OSFile(path, "wb")
            try:
                with output.writing():
                    pq.write_table(table, sink, **_parquet_options(table.schema))
            finally:
                close(None, sink)
        return rows


#: The most bytes (Arrow's, uncompressed) of a batch written as one Parquet row group.
_GROUP_BYTES = 16 << 20


def _write_groups(writer: Any, batch: pa.RecordBatch) -> None:
    """Write ``batch`` as row groups of at most `_GROUP_BYTES` (at least one row each).

    NOTE: pyarrow builds a column chunk's repetition and definition levels (two int16 per
    list item) for the whole row group at once: for a chunk of
    R3 rollouts (31 M expert ids) that is 125 MB of fresh memory, which the allocator
    gets from the kernel (zeroed) on every write.  Groups of 16 MiB reuse their buffers:
    the kernel's share of r3-40's export 0.12-0.21 -> 0.04-0.07 s of CPU, the file 0.5%
    larger (docs/performance.md, "Load at the floor").
    """
    rows = batch.num_rows
    writer.write_batch(batch, row_group_size=max(1, rows * _GROUP_BYTES // max(1, batch.nbytes)))


#: Columns worth dictionary-encoding: few distinct values per file.
_DICTIONARY = frozenset(
    (
        "archive",
        "sample_key",
        "task_key",
        "status",
        "archive_attrs",
        "sample_class",
        "sample_converted",
    )
)


def _parquet_options(schema: pa.Schema) -> dict[str, Any]:
    """How exports write Parquet.

    NOTE: dictionary encoding only where values repeat: on token ids and log-probs it is
    wasted work (measured on a 256-sample rollout: write 0.45 s with it on every column,
    0.09 s with it on these only); zstd makes the file a quarter smaller than snappy for
    about the same time.
    """
    dictionary = [n for n in schema.names if n in _DICTIONARY]
    # NOTE: and the items of integer tensor and array columns: R3's routed expert ids (a few
    # hundred distinct values, 125 MB of int32 for 40 samples) wrote in 1.28 s to 27.9 MB
    # dictionary-encoded, 2.07 s to 39.7 MB plain.  A column of too many distinct values
    # falls back to plain once its dictionary passes pyarrow's page limit (1 MiB).
    # NOTE: min/max statistics on every column but a tensor's or array's items, which no
    # reader filters on: on r3-40's expert ids they were a tenth of the write (0.49 -> 0.44 s
    # of CPU without; docs/performance.md, "Load at the floor").
    statistics = []
    pa = pyarrow_module()
    for field in schema:
        kind = (field.metadata or {}).get(b"archive_manager.kind")
        # Parquet's path to a list's items (pyarrow writes the compliant nested form)
        path = f"{field.name}.list.element" if pa.types.is_list(field.type) else field.name
        if kind not in (b"tensor", b"ndarray"):
            statistics.append(path)
        elif pa.types.is_list(field.type) and pa.types.is_integer(field.type.value_type):
            dictionary.append(path)
    # NOTE: data pages of 256 KiB, not pyarrow's 1 MiB: a page's values are encoded, then
    # compressed, and a page of a quarter the size stays in the CPU's cache between the two.
    # r3-40's table wrote in 0.409 -> 0.366 s (medians of 11, by turns; the same file size
    # and read time, pyarrow and DuckDB); the 1024-sample rollout's unchanged.  NOTE: not
    # BYTE_STREAM_SPLIT for the integer items (0.27 s): DuckDB before mid-2026 refuses it
    # (docs/performance.md, "Load at the floor").
    return {
        "compression": "zstd",
        "use_dictionary": dictionary,
        "write_statistics": statistics,
        "data_page_size": _PAGE_BYTES,
    }


#: The size of a Parquet data page exports write (see `_parquet_options`).
_PAGE_BYTES = 256 << 10


def _parquet() -> Any:
    pyarrow_module()
    import pyarrow.parquet as pq

    return pq


def _line(row: dict[str, Any]) -> bytes:
    try:
        return (json.dumps(row, ensure_ascii=False, allow_nan=False) + "\n").encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate (legal in model output): escaped, exact
        return (json.dumps(row, allow_nan=False) + "\n").encode("ascii")


def _write_jsonl(source: ArchiveSource, output: Output) -> int:
    """One JSON object per sample: the row's columns, a field's value as JSON (tagged where
    JSON would lose it, `to_json_value`), written from the records, not through Arrow."""
    rows = 0
    with output.writing():
        file = open(output.path, "wb")  # noqa: SIM115 (closed below, its error marked)
    try:
        f = output.stream(file)
        for row in json_rows(source):
            f.write(_line(row))
            rows += 1
    finally:
        with output.writing():
            file.close()
    return rows


@contextmanager
def _bytes_read(
    arc: Archive, sizes: dict[str, int], report: Callable[[int], None]
) -> Iterator[None]:
    """Call ``report(bytes read so far)`` as ``arc`` reads its blobs (each counted once, by
    its stored size in ``sizes``), inside the block."""
    seen: set[str] = set()
    done = 0
    # The read-ahead thread reads chunks while this one loads tensors: one count, one bar.
    lock = threading.Lock()

    def on_read(digest: str) -> None:
        nonlocal done
        with lock:
            if digest in seen or digest not in sizes:
                return
            seen.add(digest)
            done += sizes[digest]
            report(done)

    with arc.reads_reported(on_read):
        yield


def export_archive(
    arc: Archive,
    path: str | os.PathLike[str],
    *,
    format: str | None = None,
    overwrite: bool = False,
    progress: Callable[[int, int], None] | None = None,
) -> Path:
    """`ArchiveManager.export`: write archive ``arc`` to ``path`` as Parquet, JSONL or
    slime's ``.pt`` (by ``format``, else by the suffix), through a temp file.

    ``progress(done, total)`` counts the stored bytes of the archive's chunk and tensor
    blobs read (`Archive.payload_sizes`); it is called last with ``done == total``.

    Raises:
        UnsupportedFormatError: an unknown format or suffix.
        ArchiveExistsError: ``path`` exists and ``overwrite`` is False.
        UnencodableError: a field no column can hold (Parquet), or a value JSON cannot (named).
    """
    target = Path(path)
    kind = format_of(target, format)
    if progress is None:
        _export_to(arc, target, kind, overwrite)
        return target
    sizes = arc.payload_sizes()
    total = sum(sizes.values())
    with _bytes_read(arc, sizes, lambda done: progress(done, total)):
        _export_to(arc, target, kind, overwrite)
    progress(total, total)
    return target


def _export_to(arc: Archive, target: Path, kind: str, overwrite: bool) -> None:
    source = arc.arrow_source()
    if kind == "pt":
        arc.export_pt(target, overwrite=overwrite)
    elif kind == "parquet":
        write_output(
            target,
            lambda output: _write_parquet(
                # NOTE: a large chunk in pieces (`pieces_of`), so that inflating the next
                # piece overlaps writing this one (a chunk of R3 rollouts inflates to 125 MB);
                # pieces typed differently start the file again a chunk at a time.
                lambda force, pieces: archive_batches(source, force_json=force, pieces=pieces),
                output,
                lambda: empty_batch(source),
            ),
            overwrite=overwrite,
        )
    else:
        write_output(target, lambda output: _write_jsonl(source, output), overwrite=overwrite)


def _shifted(
    progress: Callable[[int, int], None], before: int, total: int
) -> Callable[[int], None]:
    """``report(n)`` for one archive of many: ``progress(before + n, total)``."""
    return lambda n: progress(before + n, total)


def export_many(
    pool: PoolContext,
    folder: str | os.PathLike[str],
    *,
    format: str,
    overwrite: bool = False,
    progress: Callable[[int, int], None] | None = None,
    rollout_ids: object = None,
    evaluation: bool | None = None,
) -> list[Path]:
    """`ArchiveManager.export_many`: each published archive of the rollout id range (and
    evaluation flag) to ``folder/<name><suffix>``; ``progress(done, total)`` counts the
    stored bytes of the archives' chunk and tensor blobs read, as `export_archive`'s does.

    Parquet files get one schema, so that the folder reads as one table (`pyarrow.dataset`,
    DuckDB's ``read_parquet('folder/*.parquet')``, ``datasets``' parquet loader): the
    files' schemas merged (`merge_schemas`: a field all None in one archive takes the type
    it has in another, ints and floats become float64, a field of two kinds JSON), and each
    file of another schema written again in it (`_one_schema`).  The Parquet files earlier
    exports left in ``folder`` (an incremental export of later rollouts) are of that table
    too: merged with and, where their schema differs, written again in the merged one.

    Raises:
        ArchiveExistsError: a target exists and ``overwrite`` is False (checked for every
            archive before anything is written).
    """
    kind = format_of(Path("x"), format)
    out = Path(folder)
    if out.exists() and not out.is_dir():
        raise InvalidInputError(f"{out} is not a folder")
    low, high = check_rollout_range(rollout_ids) or (None, None)
    if evaluation is not None and not isinstance(evaluation, bool):
        raise InvalidInputError("evaluation must be a bool or None")
    arcs = [
        open_archive(pool, info.name)
        for info in _published(pool)
        if (low is None or (info.rollout_id is not None and info.rollout_id >= low))
        and (high is None or (info.rollout_id is not None and info.rollout_id <= high))
        and (evaluation is None or info.evaluation == evaluation)
    ]
    targets = [out / f"{a.name}{SUFFIX[kind]}" for a in arcs]
    if not overwrite:
        taken = [str(t) for t in targets if t.exists()]
        if taken:
            raise ArchiveExistsError(
                f"{taken[0]} exists ({len(taken)} of the targets do); pass --force to replace them"
            )
    sizes = [a.payload_sizes() for a in arcs] if progress is not None else []
    total = sum(sum(s.values()) for s in sizes)
    done: list[Path] = []
    before = 0  # bytes of the archives already exported
    try:
        for i, (arc, target) in enumerate(zip(arcs, targets, strict=True)):
            if progress is None:
                done.append(export_archive(arc, target, format=kind, overwrite=overwrite))
                continue
            with _bytes_read(arc, sizes[i], _shifted(progress, before, total)):
                done.append(export_archive(arc, target, format=kind, overwrite=overwrite))
            before += sum(sizes[i].values())
            progress(before, total)
    except OutputWriteError as exc:
        # the files already written are whole: say which are there, so a retry can skip them
        raise OutputWriteError(
            f"{exc}; {len(done)} of the {len(arcs)} archives were exported before it",
            exc.errno,
            exc.filename,
        ) from exc
    # Earlier exports into the folder (an export of rollouts 0..99 last week, 100..199
    # now) are of the table too: merged with, and written again in its schema if need be.
    earlier = _earlier_exports(out, done) if kind == "parquet" and done else []
    if kind == "parquet" and len(done) + len(earlier) > 1:
        try:
            _one_schema([*[None] * len(earlier), *arcs], [*earlier, *done])
        except OutputWriteError as exc:
            # each file is whole (written through a temp file), in its own schema or the
            # folder's
            raise OutputWriteError(
                f"{exc}; every archive was exported, but not every file has the folder's "
                "one schema yet (export again to give it)",
                exc.errno,
                exc.filename,
            ) from exc
    return done


def _earlier_exports(folder: Path, written: list[Path]) -> list[Path]:
    """The Parquet files of ``folder`` that an earlier export wrote (recognised by the
    columns every export has, as an import recognises them), other than ``written``."""
    pq = _parquet()
    ours = {str(p) for p in written}
    found = []
    for path in sorted(folder.glob("*.parquet")):
        if str(path) in ours or not path.is_file():
            continue
        try:
            names = set(pq.read_schema(path).names)
        except (OSError, ValueError):  # not Parquet (pyarrow's ArrowInvalid is a ValueError)
            continue
        if {"archive", "position", "sample_key", "sample_class"} <= names:
            found.append(path)
    return found


def _one_schema(arcs: list[Archive | None], paths: list[Path]) -> None:
    """Give the Parquet files ``paths`` (of archives ``arcs``; None: an earlier export's
    file, whose archive this export did not read) one schema: their schemas merged, and each
    file of another schema rewritten in it, through a temp file.

    A file is rewritten from its own batches cast to the merged schema (`conform`: nulls
    typed, ints as floats, typed values as JSON text); where they cannot be (a tensor
    column made JSON) it is exported again from its archive with that schema, and a column
    whose values the merged type cannot hold (an int past 2**53 among floats) is made JSON
    for every file.
    """
    pq = _parquet()
    schemas = [pq.read_schema(p) for p in paths]
    merged = schemas[0]
    for path, schema in zip(paths[1:], schemas[1:], strict=True):
        merged = merge_schemas(merged, schema, _null_columns(path))
    while True:
        try:
            for arc, path in zip(arcs, paths, strict=True):
                if not pq.read_schema(path).equals(merged, check_metadata=True):
                    _rewrite_in(arc, path, merged)
            return
        except SchemaDrift as drift:
            if drift.column is None or drift.column not in merged.names:
                raise
            merged = with_json_column(merged, drift.column)


def _null_columns(path: Path) -> set[str]:
    """The columns of Parquet file ``path`` that hold a null."""
    nulls: set[str] = set()
    for batch in _parquet().ParquetFile(path).iter_batches(batch_size=1024):
        nulls.update(
            n for n, c in zip(batch.schema.names, batch.columns, strict=True) if c.null_count
        )
    return nulls


def _rewrite_in(arc: Archive | None, path: Path, schema: pa.Schema) -> None:
    """Write Parquet file ``path`` (archive ``arc``'s export, or an earlier export's file
    for None) again in ``schema``.

    Raises:
        SchemaDrift: a value of the archive that ``schema`` cannot hold (``.column``).
        InvalidInputError: an earlier export's file that only its archive could write in
            ``schema`` (a tensor column made JSON); ``path`` is as it was.
        OutputWriteError: the medium failed; ``path`` is as it was.
    """
    pq = _parquet()

    def written(batches: Iterator[pa.RecordBatch]) -> Callable[[Output], None]:
        def write(output: Output) -> None:
            # only pyarrow's writes are the file's (`Output.writing`): reads keep their errors
            with output.writing():
                writer = pq.ParquetWriter(str(output.path), schema, **_parquet_options(schema))
            try:
                for batch in batches:
                    fitted = conform(batch, schema)
                    with output.writing():
                        _write_groups(writer, fitted)
            finally:
                with output.writing():
                    writer.close()

        return write

    try:
        write_output(path, written(pq.ParquetFile(path).iter_batches(batch_size=64)))
    except SchemaDrift as drift:
        if arc is None:
            raise InvalidInputError(
                f"{path} (an earlier export in the folder) cannot be written in the folder's "
                f"schema from its own columns (column {drift.column!r}); the files of this "
                "export were written: export into an empty folder, or move the earlier "
                "files out and export their rollouts again with these"
            ) from None
        force = json_columns(schema)
        write_output(path, written(archive_batches(arc.arrow_source(), force_json=force)))


def _published(pool: PoolContext) -> list[ArchiveInfo]:
    a = archives_table
    with pool.catalog.read() as conn:
        rows = conn.execute(
            select(a).where(a.c.state == "published").order_by(a.c.rollout_id, a.c.name)
        ).all()
    return infos(rows)


# --------------------------------------------------------------------------- import


def _check_mapping(mapping: Mapping[str, str] | None) -> dict[str, str]:
    if mapping is None:
        return {}
    if not isinstance(mapping, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) and k and v for k, v in mapping.items()
    ):
        raise InvalidInputError("mapping must map sample field names to column names (text)")
    # NOTE: a target that is no Sample field would import as an extra attribute of that name:
    # ``promt=input`` (a typo) left every prompt empty and the text under ``promt``, silently.
    known = [f.name for f in dataclasses.fields(Sample)] + ["task_key"]
    for target in mapping:
        if target not in known:
            close = difflib.get_close_matches(target, known, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise InvalidInputError(f"mapping: {target!r} is not a sample field{hint}")
    return dict(mapping)


def _parquet_batches(path: Path, mapping: dict[str, str]) -> Iterator[pa.RecordBatch]:
    pa = pyarrow_module()
    pq = _parquet()
    try:
        file = pq.ParquetFile(path)
    except (pa.ArrowInvalid, OSError) as exc:
        if isinstance(exc, FileNotFoundError):
            raise
        raise UnsupportedFormatError(f"{path} is not a Parquet file: {exc}") from None
    schema = file.schema_arrow
    twice = sorted({n for n in schema.names if schema.names.count(n) > 1})
    if twice:
        # a row is a dict by column name: which of the two would be the field is a guess
        raise UnsupportedFormatError(
            f"{path} has several columns named {', '.join(map(repr, twice))[:200]}"
        )
    missing = [s for s in mapping.values() if s not in schema.names]
    if missing:
        raise InvalidInputError(
            f"{path} has no column {', '.join(map(repr, missing))} (the mapping names it); "
            f"its columns are {', '.join(schema.names)[:400]}"
        )

    def batches() -> Iterator[Any]:
        try:
            yield from file.iter_batches(batch_size=64)
        except pa.ArrowInvalid as exc:
            raise UnsupportedFormatError(f"{path} is damaged: {exc}") from None

    return batches()


def _parquet_imported(path: Path, mapping: dict[str, str]) -> Iterator[ImportedRow]:
    done = 0  # rows of earlier batches: an error names the row's number in the file
    for batch in _parquet_batches(path, mapping):
        yield from rows_to_samples(batch, mapping=mapping, where=str(path), first_row=done)
        done += batch.num_rows


def _jsonl_rows_in(path: Path) -> Iterator[dict[str, Any]]:
    with open(path, "rb") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            # ValueError: also an int past Python's digit limit; RecursionError: nesting
            # deeper than the parser's stack (hostile input, docs/architecture/getting-data-out.md
            # "Exports and imports")
            except (ValueError, RecursionError) as exc:
                raise UnsupportedFormatError(
                    f"{path}, line {number} is not JSON (is it a JSONL file?): {exc}"
                ) from None
            if not isinstance(row, dict):
                raise UnsupportedFormatError(f"{path}, line {number} is not a JSON object")
            yield row


def _jsonl_imported(path: Path, mapping: dict[str, str]) -> Iterator[ImportedRow]:
    rows = _jsonl_rows_in(path)
    first = next(rows, None)
    if first is None:
        return
    ours = is_export(first)
    seen: set[str] = set()
    for number, row in enumerate(itertools.chain([first], rows)):
        seen.update(row)
        where = f"{path}, row {number}"
        if ours:
            yield imported_row({k: from_json_value(v) for k, v in row.items()}, True, None, where)
        else:
            yield imported_row(row, False, mapping, where)
    missing = [s for s in mapping.values() if s not in seen]
    if missing:
        raise InvalidInputError(
            f"{path} has no field {', '.join(map(repr, missing))} (the mapping names it)"
        )


def _rollout_id_in(sample: Any, field: str, where: str) -> int:
    import numpy as np

    value = sample.get(field, None) if type(sample) is dict else getattr(sample, field, None)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if type(value) is bool or not isinstance(value, (int, np.integer)):
        raise InvalidInputError(
            f"{where}: the rollout id column {field!r} holds {value!r:.40}, not an integer"
        )
    return int(value)


def import_table(
    pool: PoolContext,
    path: str | os.PathLike[str],
    *,
    name: str | None = None,
    rollout_id: int | None = None,
    evaluation: bool | None = None,
    mapping: Mapping[str, str] | None = None,
    format: str | None = None,
    rollout_id_column: str | None = None,
    reward_key: str | None = None,
) -> Archive:
    """`ArchiveManager.import_table`: a Parquet or JSONL file as a new archive.

    This library's exports come back as they were saved: samples, sample and task keys,
    rollout id, evaluation flag and attrs (``name``, ``rollout_id`` and ``evaluation``
    given here win).  Other tables (verl's ``rollout_data_dir`` dumps, a DataFrame's
    Parquet) give one `Sample` per row, ``mapping`` renaming columns to sample fields
    (``{"prompt": "input", "response": "output", "reward": "score"}``); a ``task_key``
    field becomes the task key.  A foreign row without a ``status`` or a ``response_length``
    has none in the catalog (statistics count it as unknown), never the `Sample` class's
    defaults ("pending", 0).  ``rollout_id_column`` names the column holding the rollout id
    (TRL's ``step``, verl's ``step``): every row must hold the same integer.

    Raises:
        UnsupportedFormatError: an unknown format, or a file that is not what its suffix says.
        InvalidInputError: the mapping names a column the file lacks; no name for a foreign
            file; a file holding several archives.
        UnencodableError: a value no sample can hold (names the row and field).
        ArchiveExistsError: the name is taken.  Nothing is written on any error.
    """
    source = Path(path)
    if not source.is_file():
        if not source.exists():
            raise FileNotFoundError(f"no such file: {source}")
        raise InvalidInputError(f"{source} is not a file")
    kind = format_of(source, format)
    if kind == "pt":
        raise UnsupportedFormatError(f"{source} is a .pt dump: import it with import_pt")
    fields = _check_mapping(mapping)
    if kind == "parquet":
        rows: Iterator[ImportedRow] = _parquet_imported(source, fields)
    else:
        rows = _jsonl_imported(source, fields)
    first = next(rows, None)
    if first is None:
        raise InvalidInputError(f"{source} holds no rows")
    if rollout_id_column is not None and rollout_id is not None:
        raise InvalidInputError("give rollout_id or rollout_id_column, not both")
    # A mapped column is the field it was renamed to.
    by_column = {column: target for target, column in fields.items()}
    step_field = (
        None if rollout_id_column is None else by_column.get(rollout_id_column, rollout_id_column)
    )
    if step_field is not None:
        rollout_id = _rollout_id_in(first.sample, step_field, f"{source}, row 0")
    archive = name if name is not None else first.archive
    if archive is None:
        raise InvalidInputError(
            f"{source} is not an archive_manager export: give the archive a name"
        )
    writer = ArchiveWriter(
        pool,
        archive,
        rollout_id=rollout_id if rollout_id is not None else first.rollout_id,
        evaluation=evaluation if evaluation is not None else bool(first.evaluation),
        attrs=first.attrs,
        reward_key=reward_key,
    )
    with writer:
        for number, row in enumerate(itertools.chain([first], rows)):
            if row.archive != first.archive:
                raise InvalidInputError(
                    f"{source} holds rows of archives {first.archive!r} and {row.archive!r}; "
                    "import one archive per file"
                )
            if step_field is not None and number:
                step = _rollout_id_in(row.sample, step_field, f"{source}, row {number}")
                if step != rollout_id:
                    raise InvalidInputError(
                        f"{source} holds rows of rollout ids {rollout_id} and {step} (column "
                        f"{rollout_id_column!r}); import one rollout id per file"
                    )
            try:
                writer.add(row.sample, task_key=row.task_key, facts=row.facts)
            except UnencodableError as exc:
                raise UnencodableError(f"{source}, row {number}: {exc}") from None
    return open_archive(pool, archive)
