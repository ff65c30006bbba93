"""The read side of an archive: keys, samples (by key, reading only the chunks needed),
metadata from the catalog, export to slime's ``.pt`` format, release."""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import enum
import functools
import operator
import os
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, SupportsIndex, TypeAlias, TypeVar, overload

from sqlalchemy import Select, bindparam, delete, or_, select, update
from sqlalchemy.engine import Connection, Row

from .._util.lazy_torch import is_tensor, torch_module
from .._util.names import archive_owner, check_archive_name
from .._util.output import check_target, save_torch, write_output
from .._util.threads import Helpers
from ..catalog import (
    archive_blobs_table,
    archives_table,
    blobs_table,
    chunks_table,
    entries_table,
    retention_table,
    sample_metadata_table,
)
from ..catalog.queries import archive_by_name, batches
from ..errors import (
    ArchiveNotFoundError,
    ArchiveReleasedError,
    BlobNotFoundError,
    IntegrityError,
    InvalidInputError,
    UnencodableError,
)
from ..samples import (
    Sample,
    check_key_text,
    check_task_key,
    enum_to_record,
    sample_to_record,
    value_to_record,
)
from .context import HasContext, PoolContext, context_of
from .journal import pool_id_of, release_op, stage_record, write_committed
from .listing import ArchiveInfo, utc_time

# NOTE: the codec (numpy, zstandard) and the Arrow and .pt exports are imported by the
# methods that read or export samples: listing and inspecting archives needs only the
# catalog (docs/architecture/start-up.md, "Start-up").
if TYPE_CHECKING:
    import numpy as np
    import pandas
    import pyarrow
    import torch

    from ..codec import ChunkReader
    from .arrow import ArchiveSource

__all__ = [
    "Archive",
    "ArchiveInfo",
    "not_found",
    "open_archive",
    "payload_gone",
    "pt_native",
    "reclaimed_names",
    "release_archives",
    "similar_names",
]

# Entries read per catalog query by `Archive.iter_samples`: 4,096 rows are ~200 KB in Python
# and one short read transaction each.
_PAGE = 4096
# A load of at most this many records of one version 2 chunk reads them by ranged reads (the
# header and index, then one read per record, each checked against its checksum) from a
# chunk blob of at least `_RANGED_MIN_SIZE` (a store of local files) or
# `_RANGED_MIN_SIZE_REMOTE` bytes (an object store: each read is a request); more records or
# a smaller chunk read the whole blob, verified against its digest (measured:
# docs/architecture/reading.md, "Reading").
_RANGED_MAX_RECORDS = 4
_RANGED_MIN_SIZE = 256 << 10
_RANGED_MIN_SIZE_REMOTE = 8 << 20


def _check_flag(value: object, what: str) -> None:
    if type(value) is not bool:
        raise InvalidInputError(f"{what} must be True or False, not {type(value).__name__}")


#: How a load returns numeric list fields: as lists (False), as int64/float64 arrays (True),
#: or as arrays of the dtypes a mapping names (the rest int64/float64).
Arrays: TypeAlias = "bool | dict[str, np.dtype]"
# a tensor or a numpy array, as a tensor blob is loaded (`Archive._load_blob`)
_Loaded = TypeVar("_Loaded")


def _arrays(as_arrays: object, dtypes: object) -> Arrays:
    """``as_arrays`` and ``dtypes`` of a load, checked, as one `Arrays`."""
    from ..codec.dtypes import check_dtypes

    _check_flag(as_arrays, "as_arrays")
    checked = check_dtypes(dtypes)
    if checked is None:
        return bool(as_arrays)
    if not as_arrays:
        raise InvalidInputError("dtypes= names the dtypes of arrays: pass as_arrays=True too")
    return checked or True


def _check_key(value: object, what: str) -> str | None:
    if value is None:
        return None
    if isinstance(value, str):
        return check_key_text(value, what)
    raise InvalidInputError(f"{what} must be a str or None, not {type(value).__name__}")


@functools.cache
def _selection(by_sample_key: bool, by_task_key: bool) -> Select[Any]:
    """The entries a load selects, in order, each with its chunk's row (digest, size, record
    count; None where the chunk has no row), as one statement built once per kind of key.

    NOTE: one query, built once: a one-key load on an open archive spent 0.45 ms of its ~1 ms
    building and running two (the entries, then their chunks), 0.16 ms with this one
    (docs/performance.md, "Load at the floor").
    """
    e, c = entries_table, chunks_table
    query = (
        select(e.c.chunk_ordinal, e.c.offset, c.c.digest, c.c.size, c.c.samples)
        .select_from(
            e.outerjoin(c, (c.c.archive_id == e.c.archive_id) & (c.c.ordinal == e.c.chunk_ordinal))
        )
        .where(e.c.archive_id == bindparam("archive_id"))
    )
    if by_sample_key:
        query = query.where(e.c.sample_key == bindparam("sample_key"))
    if by_task_key:
        query = query.where(e.c.task_key == bindparam("task_key"))
    return query.order_by(e.c.position)


class Archive:
    """A published (or released) archive of a pool.  Opening one reads only the catalog."""

    def __init__(self, pool: PoolContext | HasContext, row: Row[Any]) -> None:
        self._pool = context_of(pool)
        self._id: int = row.id
        self.name: str = row.name
        self.rollout_id: int | None = row.rollout_id
        self.evaluation: bool = bool(row.evaluation)
        self.attrs: dict[str, Any] | None = row.attrs
        self.manifest_digest: str | None = row.manifest_digest
        self.reference: str | None = row.reference_name
        # The key of a dict reward chosen as each sample's reward at save (None: none given).
        self.reward_key: str | None = row.reward_key
        self._samples: int = row.samples
        # Called with a blob's digest after each chunk or tensor blob read (`reads_reported`).
        self._read_hook: Callable[[str], None] | None = None

    def __repr__(self) -> str:
        return f"Archive({self.name!r}, rollout_id={self.rollout_id}, samples={self._samples})"

    def __len__(self) -> int:
        return self._samples

    def row(self, conn: Connection) -> Row[Any]:
        """The archive's current catalog row (inside the caller's transaction)."""
        row = conn.execute(
            select(archives_table).where(archives_table.c.id == self._id)
        ).one_or_none()
        if row is None:
            raise ArchiveNotFoundError(f"archive {self.name!r} no longer exists")
        return row

    @property
    def state(self) -> str:
        """``"published"`` or ``"released"``, read afresh from the catalog (``"superseded"``
        once its name was saved again: docs/architecture/save-protocol.md, "Superseding a name")."""
        with self._pool.catalog.read() as conn:
            return str(self.row(conn).state)

    def info(self) -> ArchiveInfo:
        """What the catalog knows of this archive now."""
        with self._pool.catalog.read() as conn:
            return ArchiveInfo.from_row(self.row(conn))

    def chunks(self) -> list[dict[str, Any]]:
        """The archive's chunks: ordinal, blob digest, samples and size, from the catalog."""
        c = chunks_table
        with self._pool.catalog.read() as conn:
            rows = conn.execute(
                select(c.c.ordinal, c.c.digest, c.c.samples, c.c.size)
                .where(c.c.archive_id == self._id)
                .order_by(c.c.ordinal)
            )
            return [dict(r._mapping) for r in rows]

    def payload_sizes(self) -> dict[str, int]:
        """The stored size of each chunk and tensor blob of the archive, by digest: what
        reading all of it reads (its manifest aside), from the catalog."""
        ab, b = archive_blobs_table, blobs_table
        with self._pool.catalog.read() as conn:
            rows = conn.execute(
                select(ab.c.digest, b.c.size)
                .join(b, b.c.digest == ab.c.digest)
                .where(ab.c.archive_id == self._id, ab.c.kind != "manifest")
            )
            return {digest: int(size) for digest, size in rows}

    @contextmanager
    def reads_reported(self, report: Callable[[str], None]) -> Iterator[None]:
        """Call ``report(digest)`` after each blob this archive reads, inside the block
        (an export's progress counts the bytes it read by it).  ``report`` may be called
        from the thread that reads ahead."""
        self._read_hook = report
        try:
            yield
        finally:
            self._read_hook = None

    def owners(self) -> list[str]:
        """The owners retaining this archive (``archive:<name>`` until it is released)."""
        r = retention_table
        with self._pool.catalog.read() as conn:
            return sorted(
                conn.execute(select(r.c.owner).where(r.c.archive_id == self._id)).scalars()
            )

    def keys(self) -> list[tuple[str, str | None]]:
        """``(sample_key, task_key)`` of every sample, in archive order."""
        e = entries_table
        with self._pool.catalog.read() as conn:
            rows = conn.execute(
                select(e.c.sample_key, e.c.task_key)
                .where(e.c.archive_id == self._id)
                .order_by(e.c.position)
            )
            return [(sk, tk) for sk, tk in rows]

    def sample_metadata(self) -> list[dict[str, Any]]:
        """`describe_sample` of every sample, from the catalog alone (no blob is read)."""
        from ..metadata import as_described

        m = sample_metadata_table
        with self._pool.catalog.read() as conn:
            found = conn.execute(
                select(m.c.description).where(m.c.archive_id == self._id).order_by(m.c.position)
            ).scalars()
            return [as_described(d) for d in found]

    def load_samples(
        self,
        sample_key: str | None = None,
        task_key: str | None = None,
        *,
        as_arrays: bool = False,
        materialize: bool = False,
        dtypes: Mapping[str, Any] | None = None,
    ) -> list[Any]:
        """The samples in archive order: all, or those matching every key given.

        Only the chunks holding the selected samples are read, each once; tensor blobs stay
        lazy (`TensorRef`) until touched, or are read now with ``materialize=True`` (then
        every tensor is a ``torch.Tensor``: see docs/architecture/reading.md, "Lazy tensors").

        Numeric lists come back as lists, equal to the saved ones.  With ``as_arrays=True``,
        every field that is a list of ints (within int64) or of floats (``tokens``,
        ``loss_mask``, ``rollout_log_probs``, ...) comes back as ``np.array(that list)``
        instead: the same values as int64 or float64, a writable array of its own.  That skips
        creating a Python object per number, which is most of a load's time (and memory);
        ``torch.from_numpy`` then makes a tensor without a copy.  An empty list (which
        records no dtype) is an empty array of the dtype ``dtypes`` names, else float64.
        Lists nested deeper (in ``metadata``, say) and lists of anything else stay lists.  ``dtypes``
        (with ``as_arrays=True``) keeps them narrow: ``{"loss_mask": "int8", "tokens":
        "int32", "rollout_log_probs": "float32"}`` (numpy or torch dtypes, or their names)
        gives those fields in those dtypes, whatever their values: ints must fit (else
        `InvalidInputError`), floats are rounded as ``np.asarray(list, dtype)`` rounds them
        (docs/architecture/reading.md, "Reading").  Tensors and numpy arrays always come back in the
        dtype and shape they were saved in.

        Raises:
            KeyError: keys were given and no sample matches them all.
            IntegrityError: a needed blob is missing or damaged (names archive, chunk, blob).
            ArchiveReleasedError: the archive was released and GC reclaimed its payload.
        """
        sample_key = _check_key(sample_key, "sample_key")
        task_key = check_task_key(task_key)
        arrays = _arrays(as_arrays, dtypes)
        _check_flag(materialize, "materialize")
        with self._pool.catalog.read() as conn:
            found = conn.execute(
                _selection(sample_key is not None, task_key is not None),
                {"archive_id": self._id, "sample_key": sample_key, "task_key": task_key},
            ).all()
        if not found:
            if sample_key is None and task_key is None:
                return []
            raise self._no_match(sample_key, task_key)
        wanted = [(o, off) for o, off, _, _, _ in found]
        ordinals = sorted({o for o, _ in wanted})
        digests = {o: d for o, _, d, _, _ in found if d is not None}
        shapes = {o: (size, n) for o, _, d, size, n in found if d is not None}
        by_chunk: dict[int, list[int]] = defaultdict(list)
        for ordinal, offset in wanted:
            by_chunk[ordinal].append(offset)
        decoded: dict[tuple[int, int], Any] = {}
        from ..codec.values import gc_paused

        # One GC pause over the whole load: pausing per chunk let each resume collect (and
        # traverse) everything decoded so far, quadratic in the archive's size.
        with gc_paused(promote=True):
            self._decode_into(
                decoded, ordinals, digests, by_chunk, arrays, materialize, shapes=shapes
            )
        return [decoded[o, off] for o, off in wanted]

    def load_sample(
        self,
        position: int,
        *,
        as_arrays: bool = False,
        materialize: bool = False,
        dtypes: Mapping[str, Any] | None = None,
    ) -> Any:
        """The sample at ``position`` (0-based, in archive order), reading only its chunk.

        Tensor blobs stay lazy (`TensorRef`) until touched; ``as_arrays``, ``dtypes`` and
        ``materialize`` as in `load_samples`.  Sample keys need not be unique; a position always is, so viewers and
        tools that list samples address them by it.

        Raises:
            InvalidInputError: ``position`` is not an int.
            IndexError: the archive has no sample at ``position`` (negative ones included).
            IntegrityError: the chunk is missing or damaged (names archive, chunk, blob).
            ArchiveReleasedError: the archive was released and GC reclaimed its payload.
        """
        arrays = _arrays(as_arrays, dtypes)
        _check_flag(materialize, "materialize")
        ordinal, offset, digests, shapes = self._where(position)
        decoded: dict[tuple[int, int], Any] = {}
        self._decode_into(
            decoded, [ordinal], digests, {ordinal: [offset]}, arrays, materialize, shapes=shapes
        )
        return decoded[ordinal, offset]

    def load_positions(
        self, positions: Sequence[int], *, as_arrays: bool = False, materialize: bool = False
    ) -> list[Any]:
        """The samples at ``positions`` (0-based, in any order, repeats allowed), in that
        order: each chunk holding one of them is read once, as in `load_samples`; a position
        given twice comes back as the same object twice.  ``as_arrays`` and ``materialize`` as
        in `load_samples`.

        Raises:
            InvalidInputError: a position is not an int.
            IndexError: the archive has no sample at a position (negative ones included).
            IntegrityError, ArchiveReleasedError: as `load_samples`.
        """
        _check_flag(as_arrays, "as_arrays")
        _check_flag(materialize, "materialize")
        if isinstance(positions, (str, bytes)) or not hasattr(positions, "__len__"):
            raise InvalidInputError("positions must be a sequence (a list) of ints")
        wanted = list(positions)
        for position in wanted:
            if isinstance(position, bool) or not isinstance(position, int):
                raise InvalidInputError(f"position must be an int, not {type(position).__name__}")
            if not 0 <= position < self._samples:
                raise IndexError(
                    f"archive {self.name!r} has no sample at position {position} "
                    f"(it holds {self._samples}, from 0)"
                )
        if not wanted:
            return []
        unique = sorted(set(wanted))
        e, c = entries_table, chunks_table
        at: dict[int, tuple[int, int]] = {}
        shapes: dict[int, tuple[int, int]] = {}
        digests: dict[int, str] = {}
        with self._pool.catalog.read() as conn:
            for batch in batches(unique):
                at.update(
                    (p, (o, off))
                    for p, o, off in conn.execute(
                        select(e.c.position, e.c.chunk_ordinal, e.c.offset).where(
                            e.c.archive_id == self._id, e.c.position.in_(batch)
                        )
                    )
                )
            ordinals = sorted({o for o, _ in at.values()})
            for batch in batches(ordinals):
                for o, d, size, n in conn.execute(
                    select(c.c.ordinal, c.c.digest, c.c.size, c.c.samples).where(
                        c.c.archive_id == self._id, c.c.ordinal.in_(batch)
                    )
                ):
                    digests[o] = d
                    shapes[o] = (size, n)
        missing = [p for p in unique if p not in at]
        if missing:
            raise IntegrityError(f"archive {self.name!r} has no entry for position {missing[0]}")
        by_chunk: dict[int, list[int]] = defaultdict(list)
        for position in unique:
            ordinal, offset = at[position]
            by_chunk[ordinal].append(offset)
        from ..codec.values import gc_paused

        decoded: dict[tuple[int, int], Any] = {}
        with gc_paused(promote=True):
            self._decode_into(
                decoded, ordinals, digests, by_chunk, as_arrays, materialize, shapes=shapes
            )
        return [decoded[at[p]] for p in wanted]

    def stored_class(self, position: int) -> str | None:
        """The registered name of the class the sample at ``position`` was saved as (None
        for a dict), as the record holds it: known whether or not this process registered
        that class (a tool that shows samples as data says what they are).  Raises as
        `load_sample`."""
        ordinal, offset, digests, shapes = self._where(position)
        reader = self._fetch(ordinal, digests, {ordinal: [offset]}, shapes)
        try:
            return reader.record_class(offset)
        except (IndexError, IntegrityError) as exc:
            raise IntegrityError(
                f"archive {self.name!r}, chunk {ordinal} (blob {reader.digest}): {exc}"
            ) from exc

    def field_values(self, field: str) -> list[Any]:
        """The top-level field ``field`` of every sample, in archive order (None where a
        sample has no such field), with that field alone decoded (`ChunkReader.fields`):
        each chunk is read and inflated once, but the token ids, log-probs and tensors of the
        other fields are never decoded.  What grouping by a field the catalog does not hold
        reads (`ArchiveManager.groups` with ``group_by``).  Raises as `load_samples`."""
        if not isinstance(field, str) or not field:
            raise InvalidInputError("field must be a non-empty str")
        values: list[Any] = []
        for run in self._chunk_runs(self._entry_page(None, None, after=-1), None, None):
            reader = self._fetch_run(run)
            for offset in run[2]:
                try:
                    found = reader.fields(offset, [field])
                except (IndexError, IntegrityError) as exc:
                    raise IntegrityError(
                        f"archive {self.name!r}, chunk {run[0]} (blob {reader.digest}): {exc}"
                    ) from exc
                values.append(None if found is None else found.get(field))
        return values

    def _where(self, position: int) -> tuple[int, int, dict[int, str], dict[int, tuple[int, int]]]:
        """The chunk ordinal and offset of ``position``, and that chunk's digest and shape."""
        if isinstance(position, bool) or not isinstance(position, int):
            raise InvalidInputError(f"position must be an int, not {type(position).__name__}")
        missing = IndexError(
            f"archive {self.name!r} has no sample at position {position} "
            f"(it holds {self._samples}, from 0)"
        )
        # Checked before the query: PostgreSQL refuses to compare an INTEGER column with a
        # number beyond its range instead of finding nothing.
        if not 0 <= position < self._samples:
            raise missing
        e, c = entries_table, chunks_table
        with self._pool.catalog.read() as conn:
            entry = conn.execute(
                select(e.c.chunk_ordinal, e.c.offset).where(
                    e.c.archive_id == self._id, e.c.position == position
                )
            ).one_or_none()
            if entry is None:
                raise missing
            ordinal, offset = entry
            rows = conn.execute(
                select(c.c.ordinal, c.c.digest, c.c.size, c.c.samples).where(
                    c.c.archive_id == self._id, c.c.ordinal == ordinal
                )
            ).all()
        digests = {o: d for o, d, _, _ in rows}
        shapes = {o: (size, n) for o, _, size, n in rows}
        return ordinal, offset, digests, shapes

    # ------------------------------------------------------------ streaming and sequence

    def iter_samples(
        self,
        *,
        sample_key: str | None = None,
        task_key: str | None = None,
        as_arrays: bool = False,
        materialize: bool = False,
        dtypes: Mapping[str, Any] | None = None,
    ) -> Iterator[Any]:
        """The samples of `load_samples`, in archive order, one chunk at a time.

        Memory stays bounded whatever the archive's size: the entries are read from the
        catalog a page at a time (each page its own short read transaction, so no snapshot is
        held while the caller works), and at most two chunks are held: the one whose samples
        are being yielded (decoded) and the next one, read ahead on a thread.  Arguments are
        checked, and the first page read, when this is called, not at the first ``next``.

        Raises:
            KeyError: keys were given and no sample matches them all.
            IntegrityError, ArchiveReleasedError: as `load_samples`, when the chunk is reached.
        """
        sample_key = _check_key(sample_key, "sample_key")
        task_key = check_task_key(task_key)
        arrays = _arrays(as_arrays, dtypes)
        _check_flag(materialize, "materialize")
        first = self._entry_page(sample_key, task_key, after=-1)
        if not first and (sample_key is not None or task_key is not None):
            raise self._no_match(sample_key, task_key)
        return self._stream(first, sample_key, task_key, arrays, materialize)

    def __iter__(self) -> Iterator[Any]:
        """Every sample in order, streamed (`iter_samples`)."""
        return self.iter_samples()

    @overload
    def __getitem__(self, key: SupportsIndex) -> Any: ...

    @overload
    def __getitem__(self, key: slice) -> list[Any]: ...

    def __getitem__(self, key: SupportsIndex | slice) -> Any:
        """``arc[i]``: the sample at position ``i`` (negative counts from the end, as in a
        list); ``arc[a:b:c]``: a list of those samples, reading each chunk needed once.

        Raises:
            IndexError: ``i`` is out of range.
            InvalidInputError: ``key`` is neither an integer nor a slice.
        """
        if isinstance(key, slice):
            return self._load_positions(range(self._samples)[key])
        try:
            index = operator.index(key)
        except TypeError:
            raise InvalidInputError(
                f"archive indices must be integers or slices, not {type(key).__name__}"
            ) from None
        position = index + self._samples if index < 0 else index
        if not 0 <= position < self._samples:
            raise IndexError(
                f"archive {self.name!r} has no sample {index} (it holds {self._samples})"
            )
        return self.load_sample(position)

    def _no_match(self, sample_key: str | None, task_key: str | None) -> KeyError:
        return KeyError(
            f"archive {self.name!r} has no sample with "
            + " and ".join(
                f"{k}={v!r}"
                for k, v in (("sample_key", sample_key), ("task_key", task_key))
                if v is not None
            )
            + _key_hint(sample_key)
        )

    def _entry_page(
        self, sample_key: str | None, task_key: str | None, *, after: int
    ) -> list[tuple[int, int, int, str | None]]:
        """``(position, chunk ordinal, offset, chunk digest)`` of up to `_PAGE` selected
        entries past position ``after``, in order (keyset paging on the primary key)."""
        e, c = entries_table, chunks_table
        query = (
            select(e.c.position, e.c.chunk_ordinal, e.c.offset, c.c.digest)
            .select_from(
                e.outerjoin(
                    c, (c.c.archive_id == e.c.archive_id) & (c.c.ordinal == e.c.chunk_ordinal)
                )
            )
            .where(e.c.archive_id == self._id, e.c.position > after)
        )
        if sample_key is not None:
            query = query.where(e.c.sample_key == sample_key)
        if task_key is not None:
            query = query.where(e.c.task_key == task_key)
        with self._pool.catalog.read() as conn:
            rows = conn.execute(query.order_by(e.c.position).limit(_PAGE)).all()
        return [(p, o, off, d) for p, o, off, d in rows]

    def _chunk_runs(
        self,
        page: list[tuple[int, int, int, str | None]],
        sample_key: str | None,
        task_key: str | None,
    ) -> Iterator[tuple[int, str | None, list[int]]]:
        """``(ordinal, digest, offsets)`` per run of consecutive selected entries in one
        chunk, reading the next page of entries only when this one is used up."""
        run: tuple[int, str | None, list[int]] | None = None
        while page:
            for _, ordinal, offset, digest in page:
                if run is not None and run[0] != ordinal:
                    yield run
                    run = None
                if run is None:
                    run = (ordinal, digest, [])
                run[2].append(offset)
            if len(page) < _PAGE:
                break
            page = self._entry_page(sample_key, task_key, after=page[-1][0])
        if run is not None:
            yield run

    def _fetch_run(self, run: tuple[int, str | None, list[int]]) -> ChunkReader:
        ordinal, digest, offsets = run
        return self._fetch(ordinal, {} if digest is None else {ordinal: digest}, {ordinal: offsets})

    def _stream(
        self,
        page: list[tuple[int, int, int, str | None]],
        sample_key: str | None,
        task_key: str | None,
        as_arrays: Arrays,
        materialize: bool,
    ) -> Iterator[Any]:
        from ..codec.values import gc_paused

        runs = self._chunk_runs(page, sample_key, task_key)
        run = next(runs, None)
        if run is None:
            return
        # NOTE: one chunk read ahead, as `_decode_into` does, and no more: that is the bound
        # on memory (docs/architecture/reading.md, "Reading").  The GC pause covers each chunk's
        # decoding only: the caller's code runs between the yields.
        reader = Helpers(1, thread_name_prefix="archive-stream")
        try:
            ahead: Future[ChunkReader] | None = reader.submit(self._fetch_run, run)
            while run is not None and ahead is not None:
                chunk = ahead.result()
                ordinal, _, offsets = run
                # Read ahead while the caller's code ran: its map may have lost its file's end.
                chunk.check_untruncated(f"archive {self.name!r}, chunk {ordinal}")
                run = next(runs, None)
                ahead = None if run is None else reader.submit(self._fetch_run, run)
                decoded: dict[tuple[int, int], Any] = {}
                with gc_paused(promote=True):
                    self._decode_chunk(decoded, ordinal, chunk, offsets, as_arrays, materialize)
                del chunk
                for offset in offsets:
                    yield decoded[ordinal, offset]
        finally:
            reader.shutdown(wait=True, cancel_futures=True)

    def _load_positions(self, positions: range) -> list[Any]:
        """The samples at ``positions`` (a slice of ``range(len(self))``), in its order."""
        if not positions:
            return []
        lo, hi = min(positions), max(positions)
        e, c = entries_table, chunks_table
        with self._pool.catalog.read() as conn:
            found = conn.execute(
                select(e.c.position, e.c.chunk_ordinal, e.c.offset).where(
                    e.c.archive_id == self._id, e.c.position >= lo, e.c.position <= hi
                )
            ).all()
            step = abs(positions.step)
            at = {p: (o, off) for p, o, off in found if (p - lo) % step == 0}
            ordinals = sorted({o for o, _ in at.values()})
            digests = dict(
                conn.execute(
                    select(c.c.ordinal, c.c.digest).where(
                        c.c.archive_id == self._id, c.c.ordinal.in_(ordinals)
                    )
                ).all()
            )
        missing = [p for p in positions if p not in at]
        if missing:
            raise IntegrityError(f"archive {self.name!r} has no entry for position {missing[0]}")
        by_chunk: dict[int, list[int]] = defaultdict(list)
        for position in sorted(at):
            ordinal, offset = at[position]
            by_chunk[ordinal].append(offset)
        from ..codec.values import gc_paused

        decoded: dict[tuple[int, int], Any] = {}
        with gc_paused(promote=True):
            self._decode_into(decoded, ordinals, digests, by_chunk, False, False)
        return [decoded[at[p]] for p in positions]

    def _decode_into(
        self,
        decoded: dict[tuple[int, int], Any],
        ordinals: list[int],
        digests: dict[int, str],
        by_chunk: dict[int, list[int]],
        as_arrays: Arrays,
        materialize: bool = False,
        *,
        shapes: dict[int, tuple[int, int]] | None = None,
    ) -> None:
        """Decode the ``by_chunk`` offsets of chunks ``ordinals`` into ``decoded``.  With
        ``shapes`` (ordinal: the chunk's size and record count, from the catalog), a chunk
        of which few records are wanted may be read by ranged reads (`_fetch`)."""
        # NOTE: a reader thread reads, checks and decompresses chunk k+1 (file reads and zstd
        # release the GIL) while this thread decodes chunk k: on the 1024-sample benchmark,
        # from the page cache, load all went from 0.275 to 0.255 s; from a disk the reads
        # hide behind decoding too.  One chunk ahead bounds the extra memory to one chunk's.
        reader: Helpers | None = None
        ahead: Future[ChunkReader] | None = None
        if len(ordinals) > 1:
            reader = Helpers(1, thread_name_prefix="archive-read")
            try:
                ahead = reader.submit(self._fetch, ordinals[0], digests, by_chunk, shapes)
            except RuntimeError:  # interpreter shutdown (an atexit hook) takes no new threads
                reader.shutdown()
                reader = None
        try:
            for k, ordinal in enumerate(ordinals):
                if reader is None or ahead is None:
                    chunk = self._fetch(ordinal, digests, by_chunk, shapes)
                else:
                    chunk = ahead.result()
                    if k + 1 < len(ordinals):
                        ahead = reader.submit(
                            self._fetch, ordinals[k + 1], digests, by_chunk, shapes
                        )
                self._decode_chunk(
                    decoded, ordinal, chunk, by_chunk[ordinal], as_arrays, materialize
                )
        finally:
            if reader is not None:
                reader.shutdown(wait=True, cancel_futures=True)

    def _fetch(
        self,
        ordinal: int,
        digests: dict[int, str],
        by_chunk: dict[int, list[int]],
        shapes: dict[int, tuple[int, int]] | None = None,
    ) -> ChunkReader:
        from ..codec import ChunkReader

        digest = digests.get(ordinal)
        if digest is None:
            raise IntegrityError(f"archive {self.name!r} has no row for chunk {ordinal}")
        shape = shapes.get(ordinal) if shapes else None
        ranged = None
        if shape is not None and self._ranged_pays(shape[0], len(by_chunk[ordinal])):
            ranged = self._read_records(ordinal, digest, shape, by_chunk[ordinal])
        if ranged is not None:
            ranged.inflate(by_chunk[ordinal])
            return ranged
        reader = ChunkReader(
            self._read_blob(digest, f"chunk {ordinal}"),
            digest=digest,
            loader=self._load_tensor,
            array_loader=self._load_array,
        )
        reader.inflate(by_chunk[ordinal])
        return reader

    def _ranged_pays(self, size: int, wanted: int) -> bool:
        """Whether ``wanted`` records of a chunk blob of ``size`` bytes are read by ranged
        reads rather than whole (docs/architecture/reading.md, "Reading": measured)."""
        local = self._pool.store.capabilities.local_paths
        return wanted <= _RANGED_MAX_RECORDS and size >= (
            _RANGED_MIN_SIZE if local else _RANGED_MIN_SIZE_REMOTE
        )

    def _read_records(
        self, ordinal: int, digest: str, shape: tuple[int, int], offsets: list[int]
    ) -> ChunkReader | None:
        """Records ``offsets`` of a version 2 chunk by ranged reads, each checked against its
        checksum when decoded (`codec.read_records`); None for a version 1 chunk."""
        from ..codec import read_records

        store = self._pool.store
        size, count = shape
        what = f"chunk {ordinal}"
        with self._blob_errors(digest, what):
            reader = read_records(
                lambda offset, length: store.read_range(digest, offset, length),
                offsets,
                digest=digest,
                size=size,
                count=count,
                loader=self._load_tensor,
                array_loader=self._load_array,
            )
        if reader is not None and self._read_hook is not None:
            self._read_hook(digest)
        return reader

    def _decode_chunk(
        self,
        decoded: dict[tuple[int, int], Any],
        ordinal: int,
        reader: ChunkReader,
        offsets: list[int],
        as_arrays: Arrays,
        materialize: bool = False,
    ) -> None:
        from ..codec import materialize_tensor_refs
        from ..codec.dtypes import NotHeldError

        dtypes = as_arrays if isinstance(as_arrays, dict) else None
        for offset in offsets:
            try:
                sample = reader.sample(offset, as_arrays=bool(as_arrays), dtypes=dtypes)
            except NotHeldError as exc:
                raise NotHeldError(f"archive {self.name!r}, chunk {ordinal}: {exc}") from None
            except (IndexError, IntegrityError) as exc:
                # The chunk's own error names its blob and record; this names whose it is.
                raise IntegrityError(
                    f"archive {self.name!r}, chunk {ordinal} (blob {reader.digest}): {exc}"
                ) from exc
            # Outside the try: a tensor blob's error names that blob, not the chunk.
            decoded[ordinal, offset] = materialize_tensor_refs(sample) if materialize else sample

    @contextlib.contextmanager
    def _blob_errors(self, digest: str, what: str) -> Iterator[None]:
        """A blob read's errors named for this archive: a missing blob of a released archive
        says it was reclaimed (`raise_reclaimed`); otherwise, and for damage, `IntegrityError`."""
        try:
            yield
        except BlobNotFoundError as exc:
            self._raise_if_released(f"{what} (blob {digest}) is gone")
            raise IntegrityError(
                f"archive {self.name!r}, {what}: blob {digest} is missing"
            ) from exc
        except IntegrityError as exc:
            raise IntegrityError(f"archive {self.name!r}, {what}: {exc}") from exc

    def _read_blob(self, digest: str, what: str) -> memoryview:
        """The verified bytes of a chunk, read-only (`AbstractBlobStore.get_view`: a map of
        a local file, no copy)."""
        with self._blob_errors(digest, what):
            data = self._pool.store.get_view(digest)
        if self._read_hook is not None:
            self._read_hook(digest)
        return data

    def _load_tensor(self, digest: str) -> torch.Tensor:
        from ..codec import decode_tensor_blob

        return self._load_blob(digest, decode_tensor_blob)

    def _load_array(self, digest: str) -> np.ndarray:
        from ..codec import decode_array_blob

        return self._load_blob(digest, decode_array_blob)

    def _load_blob(self, digest: str, decode: Callable[..., _Loaded]) -> _Loaded:
        """The tensor or array of tensor blob ``digest``, over a private map of it (written
        to, it never reaches the store; docs/architecture/reading.md, "Arrays in place")."""
        try:
            loaded = decode(self._pool.store.open_private(digest), digest, owned=True)
        except BlobNotFoundError as exc:
            self._raise_if_released(f"tensor blob {digest} is gone")
            raise IntegrityError(f"archive {self.name!r}: tensor blob {digest} is missing") from exc
        except IntegrityError as exc:
            raise IntegrityError(f"archive {self.name!r}, tensor blob: {exc}") from exc
        if self._read_hook is not None:
            self._read_hook(digest)
        return loaded

    def _raise_if_released(self, detail: str) -> None:
        with self._pool.catalog.read() as conn:
            row = self.row(conn)
        if row.state == "released":
            self.raise_reclaimed(detail, row)

    def raise_reclaimed(self, detail: str, row: Row[Any] | None = None) -> NoReturn:
        """Raise `ArchiveReleasedError` (or IntegrityError if the archive was not released)."""
        if row is None:
            with self._pool.catalog.read() as conn:
                row = self.row(conn)
        if row.state != "released":
            raise IntegrityError(f"archive {self.name!r}: {detail}")
        when = utc_time(row.released_at)
        shown = when.astimezone().isoformat(timespec="seconds") if when else "an unknown time"
        raise ArchiveReleasedError(
            f"archive {self.name!r} was released at {shown} and garbage collection "
            f"reclaimed its payload ({detail}); its catalog rows remain for inspection"
        )

    def export_pt(self, path: str | os.PathLike[str], *, overwrite: bool = True) -> Path:
        """Write slime's dump format: ``torch.save({"rollout_id", "samples": [dict]})``, plus
        the archive's facts under ``"archive_manager"`` (name, evaluation, attrs, each sample's
        sample key, task key and class), which `ArchiveManager.import_pt` reads back.

        Self-contained (tensors materialized), loadable with ``torch.load(weights_only=True)``,
        written atomically like every export (a temp file, mode ``0666`` less the umask,
        renamed into place); parent folders are created.  numpy arrays become tensors and
        numpy scalars (values and keys) Python numbers, the types that loader accepts.

        Raises:
            ArchiveExistsError: ``path`` exists and ``overwrite`` is False (before any work).
            OutputWriteError: the file could not be written (a full disk, a read-only
                folder, no permission...; torch's own error for it is replaced); nothing is
                left at ``path``.
            UnencodableError: a sample holds what that loader, or `import_pt` after it, would
                not give back: an int of 2,040 bits or more, a numpy complex scalar, a
                `Sample` whose status is None or whose ``spec_info``/``prefix_cache_info``
                is not its helper with only its counters; the message names the sample and
                field, and no file is written; so is an attrs int of that size.
        """
        from ..codec import materialize_tensor_refs
        from ..codec.values import error_at
        from .facts import FACTS_KEY, facts_block

        target = Path(path)
        check_target(target, overwrite=overwrite)
        samples = []
        classes: list[str | None] = []
        conversions: list[list[str] | None] = []
        for position, sample in enumerate(self.load_samples()):
            try:
                cls, fields, converted = sample_to_record(materialize_tensor_refs(sample))
                if isinstance(sample, Sample):
                    _check_slime_readable(fields, converted or [])
                elif cls is not None:
                    # another registered class (slime's or vime's own Sample): its fields
                    # holding a dataclass or an enum member go into the dump as plain values,
                    # as the frameworks' to_dict() writes them, and the facts name them so
                    # that import_pt rebuilds them (`samples.fields_to_sample`)
                    converted = [
                        k
                        for k, v in fields.items()
                        if isinstance(v, enum.Enum) or dataclasses.is_dataclass(type(v))
                    ] or None
                samples.append(pt_native(fields))
            except UnencodableError as exc:
                raise error_at(
                    exc, f"cannot export sample {position} of {self.name!r}: field "
                ) from None
            classes.append(cls)
            conversions.append(converted)
        try:
            attrs = pt_native(self.attrs)
        except UnencodableError as exc:
            raise error_at(exc, f"cannot export {self.name!r}: attrs ") from None
        # The facts ride along under a key of their own: docs/architecture/getting-data-out.md,
        # "Exports and imports".  slime reads only rollout_id and samples.
        facts = facts_block(
            name=self.name,
            evaluation=self.evaluation,
            attrs=attrs,
            keys=self.keys(),
            classes=classes,
            converted=conversions,
        )
        dump = {"rollout_id": self.rollout_id, "samples": samples, FACTS_KEY: facts}
        return write_output(target, lambda output: save_torch(dump, output), overwrite=overwrite)

    def arrow_source(self) -> ArchiveSource:
        """What the Arrow export reads of this archive (`archive_manager.pool.arrow`)."""
        from .arrow import ArchiveSource

        return ArchiveSource(
            context=self._pool,
            archive_id=self._id,
            name=self.name,
            rollout_id=self.rollout_id,
            evaluation=self.evaluation,
            attrs=self.attrs,
            read_blob=self._read_blob,
            load_tensor=self._load_tensor,
            load_array=self._load_array,
        )

    def to_arrow(self, columns: Sequence[str] | None = None) -> pyarrow.Table:
        """The archive as a `pyarrow.Table`, one row per sample
        (docs/architecture/getting-data-out.md, "Getting data out"): ``archive``, ``position``,
        ``sample_key``, ``task_key``, ``rollout_id``, ``evaluation``, then a column per sample
        field, then ``archive_attrs``, ``sample_class``, ``sample_converted``, ``sample_shared``;
        ``columns`` keeps those named, in that order (a tensor's ``.shape`` column after it),
        and reads only what they need: key columns, and fields the catalog records exactly
        (``reward``, ``status``, ...), from the catalog alone, other fields decoded alone
        (docs/architecture/getting-data-out.md, "Columns from the catalog").  Needs pyarrow (the
        ``data`` extra).

        Raises:
            InvalidInputError: ``columns`` names a column the archive does not have.
            UnencodableError: a field no column type can hold (named).
            MissingDependencyError: pyarrow is not installed.
        """
        from .arrow import archive_table

        return archive_table(self.arrow_source(), columns)

    def to_pandas(self, columns: Sequence[str] | None = None) -> pandas.DataFrame:
        """`to_arrow` as a pandas DataFrame (through Arrow; needs pandas)."""
        return self.to_arrow(columns).to_pandas()

    def release(self) -> bool:
        """Drop the archive's own owner; its rows stay.  Idempotent.

        Returns:
            True if this call released it, False if it was released already.
        """
        return bool(release_archives(self._pool, [self._id]))


def _key_hint(sample_key: str | None) -> str:
    """A hint for a sample key that is not of the stored form (``5`` for ``sample:5``)."""
    if sample_key is None or sample_key.startswith(("sample:", "position:")):
        return ""
    if sample_key.strip().lstrip("-").isdigit():
        return f" (sample keys look like 'sample:{sample_key.strip()}')"
    return " (sample keys look like 'sample:5', or 'position:5' for a sample without an index)"


def release_archives(pool: PoolContext, ids: Sequence[int]) -> list[str]:
    """Release the archives of ``ids`` (drop each one's own owner) in one transaction, with
    one journal record: either every one of them is released or, on an error, none is.

    Archives already released (or no longer published) are left as they are.

    Returns:
        The names this call released, in the order of ``ids``.
    """
    a, r = archives_table, retention_table
    released: list[str] = []
    record = None
    # Before the transaction (an object store's look is a request): a release whose record
    # went to a pool moved or unmounted meanwhile would be lost with a lost catalog.
    pool.check_in_place("release")
    floor = pool.journal_floor()
    with pool.catalog.write("release") as conn:
        # Inside: a read-only pool is refused by the write gate first; a journal folder
        # that cannot take the record rolls the release back.
        pool.journal.ready()
        now = pool.clock()
        ops = []
        for archive_id in ids:
            row = conn.execute(
                select(a.c.name, a.c.state, a.c.manifest_digest).where(a.c.id == archive_id)
            ).one_or_none()
            if row is None:
                continue
            conn.execute(
                delete(r).where(r.c.owner == archive_owner(row.name), r.c.archive_id == archive_id)
            )
            changed = conn.execute(
                update(a)
                .where(a.c.id == archive_id, a.c.state == "published")
                .values(state="released", released_at=now)
            ).rowcount
            if changed == 1:
                released.append(row.name)
                if row.manifest_digest is not None:
                    ops.append(release_op(row.name, row.manifest_digest, at=now))
        if ops:
            record = stage_record(conn, pool_id_of(conn), ops, now, floor=floor)
    # After the commit, before returning: docs/architecture/retention-journal.md, "Retention
    # journal".
    write_committed(pool.journal, record)
    return released


def _payload_gone() -> Any:
    """SQL on ``archives``: a blob the archive needs has no live row (GC reclaimed it, or is
    deleting it)."""
    a, ab, b = archives_table, archive_blobs_table, blobs_table
    return (
        select(ab.c.digest)
        .outerjoin(b, b.c.digest == ab.c.digest)
        .where(ab.c.archive_id == a.c.id, or_(b.c.digest.is_(None), b.c.state != "live"))
        .exists()
    )


def reclaimed_names(conn: Connection, names: Sequence[str]) -> set[str]:
    """Which of the archives ``names`` (those the names point at) lack part of their
    payload: a blob they need has no live row (GC reclaimed it, or is deleting it).
    Released archives only end so."""
    a = archives_table
    out: set[str] = set()
    for batch in batches(list(names)):
        out.update(
            conn.execute(
                select(a.c.name).where(
                    a.c.name.in_(batch), a.c.state != "superseded", _payload_gone()
                )
            ).scalars()
        )
    return out


def payload_gone(conn: Connection, archive_id: int) -> bool:
    """Whether the archive of ``archive_id`` lacks part of its payload (see
    `reclaimed_names`)."""
    a = archives_table
    return bool(conn.execute(select(a.c.id).where(a.c.id == archive_id, _payload_gone())).first())


def similar_names(conn: Connection, name: str, *, limit: int = 1) -> list[str]:
    """Published or released archive names that look like ``name`` (for "did you mean")."""
    names = conn.execute(
        select(archives_table.c.name).where(archives_table.c.state.in_(("published", "released")))
    ).scalars()
    return difflib.get_close_matches(name, list(names), n=limit, cutoff=0.75)


def not_found(conn: Connection, name: str) -> ArchiveNotFoundError:
    """`ArchiveNotFoundError` for ``name``, naming the closest existing names, if any."""
    close = similar_names(conn, name)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return ArchiveNotFoundError(f"archive {name!r} not found{hint}")


_PLAIN = frozenset({type(None), bool, int, float, str})
# The widest ints torch.load(weights_only=True) reads: pickle's LONG1 holds up to 255 bytes
# of two's complement; a wider int is written as LONG4, which that loader refuses.
_PT_INT_MIN, _PT_INT_MAX = -(2**2039), 2**2039 - 1


def _pt_int(value: int) -> int:
    if not _PT_INT_MIN <= value <= _PT_INT_MAX:
        raise UnencodableError(
            f"an int of {value.bit_length():,} bits cannot be exported: "
            "torch.load(weights_only=True) reads ints of at most 2,040 bits (sign included)"
        )
    return value


def pt_native(value: Any, *, top: bool = True, tensors: dict[int, Any] | None = None) -> Any:
    """``value`` with numpy arrays as tensors and numpy scalars as Python numbers, and a
    registered dataclass or an enum member as its fields or value: what a ``.pt`` dump holds
    so that ``torch.load(weights_only=True)`` reads it (no pickle of any class).

    NOTE: `torch.load(weights_only=True)` refuses numpy objects (values or keys) and ints past
    `_PT_INT_MAX`, which the codec stores faithfully; an export must load with it (and import
    back equal), so numpy becomes its torch/Python equivalents and huge ints are refused.
    One array held in several places of ``value`` becomes one tensor (``tensors``: by id),
    as a load gives one array (docs/architecture/samples-and-values.md, "Samples and values").
    """
    if tensors is None:
        tensors = {}
    kind = type(value)
    if kind is int:
        return _pt_int(value)
    if kind in _PLAIN or is_tensor(value):
        return value
    if kind is list:
        kinds = set(map(type, value))
        if kinds <= _PLAIN:  # token ids, masks, log-probs: no copy
            if int in kinds:
                _check_ints(value, kinds)
            return value
        return _native_items(value, tensors)
    if kind is tuple:
        return tuple(_native_items(value, tensors))
    if kind is dict:
        out = {}
        key: Any = None
        try:
            for key, v in value.items():
                out[pt_native(key, top=False, tensors=tensors)] = pt_native(
                    v, top=False, tensors=tensors
                )
        except UnencodableError as exc:
            from ..codec.values import error_at, key_text

            raise error_at(exc, key_text(key) if top else f"[{key_text(key)}]") from None
        return out
    import numpy as np  # only an export reaches here (docs/architecture/start-up.md, "Start-up")

    if isinstance(value, np.ndarray):
        # the array is kept alive by ``value``, so its id is not reused meanwhile
        tensor = tensors.get(id(value))
        if tensor is None:
            tensor = tensors[id(value)] = torch_module().from_numpy(value.copy())
        return tensor
    if isinstance(value, enum.Enum):
        # the member's value: a dump loads with weights_only=True, which refuses classes
        return pt_native(enum_to_record(value)[1], top=top, tensors=tensors)
    if dataclasses.is_dataclass(kind):
        return pt_native(value_to_record(value)[1], top=top, tensors=tensors)
    if isinstance(value, np.generic):
        if value.dtype.kind == "c":
            # NOTE: item() gives a Python complex, which torch.load reads but the codec (and
            # so import_pt) does not store: the export would not import back.
            raise UnencodableError(
                f"a numpy {value.dtype} scalar cannot be exported: it would become a Python "
                "complex, which import_pt cannot store (a 0-d numpy array exports as a tensor)"
            )
        return value.item()
    return value


# The helpers slime's ``from_dict`` rebuilds from a dump, and the counters it reads of each.
_SLIME_HELPERS = {
    "spec_info": frozenset(f.name for f in dataclasses.fields(Sample.SpecInfo)),
    "prefix_cache_info": frozenset(f.name for f in dataclasses.fields(Sample.PrefixCacheInfo)),
}


def _check_slime_readable(fields: dict[str, Any], converted: Sequence[str]) -> None:
    """Refuse a `Sample` that slime's ``from_dict`` (what `import_pt` reads a dump with)
    would not give back: it reads a None status as pending and a helper from its counters
    only (docs/architecture/samples-and-values.md, "Samples and values")."""
    from ..codec.values import error_at

    if fields.get("status", ...) is None:
        raise error_at(
            UnencodableError("a None status imports back as 'pending' (slime's from_dict)"),
            "'status'",
        )
    for key, counters in _SLIME_HELPERS.items():
        if key not in fields:
            continue
        if key not in converted:
            raise error_at(
                UnencodableError(
                    f"a {type(fields[key]).__name__} imports back as a Sample helper "
                    "(slime's from_dict reads only a helper's counters)"
                ),
                f"{key!r}",
            )
        extra = sorted(map(repr, set(fields[key]) - counters))
        if extra:
            raise error_at(
                UnencodableError(
                    f"extra attributes {', '.join(extra)[:80]} of the helper would not import "
                    "back (slime's from_dict reads only its counters)"
                ),
                f"{key!r}",
            )


def _native_items(values: list[Any] | tuple[Any, ...], tensors: dict[int, Any]) -> list[Any]:
    out: list[Any] = []
    try:
        for v in values:
            out.append(pt_native(v, top=False, tensors=tensors))
    except UnencodableError as exc:
        from ..codec.values import error_at

        raise error_at(exc, f"[{len(out)}]") from None
    return out


def _check_ints(values: list[Any], kinds: set[type]) -> None:
    if kinds == {int} and min(values) >= _PT_INT_MIN and max(values) <= _PT_INT_MAX:
        return
    for i, v in enumerate(values):
        if type(v) is int:
            try:
                _pt_int(v)
            except UnencodableError as exc:
                from ..codec.values import error_at

                raise error_at(exc, f"[{i}]") from None


def open_archive(pool: PoolContext, name: str) -> Archive:
    """`ArchiveManager.open_archive`: the published or released archive ``name``.

    Raises:
        ArchiveNotFoundError: no such archive, or it is still pending.
    """
    check_archive_name(name)
    with pool.catalog.read() as conn:
        row = archive_by_name(conn, name)
        if row is None or row.state not in ("published", "released"):
            raise not_found(conn, name)
    return Archive(pool, row)


def infos(rows: Sequence[Row[Any]]) -> list[ArchiveInfo]:
    """`ArchiveInfo` of each row."""
    return [ArchiveInfo.from_row(r) for r in rows]
