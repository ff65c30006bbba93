"""PyTorch datasets over a pool: the samples a query selects, read a chunk at a time
(docs/architecture/getting-data-out.md, "Getting data out").

`RolloutDataset` is map-style (item ``i`` reads only its chunk, with a small chunk cache);
`RolloutIterableDataset` streams chunk by chunk, split across distributed ranks as
`DistributedSampler` splits (equal counts) and across DataLoader workers by whole batches (so
every rank yields ``len(loader)`` batches), with seeded shuffles of chunk order and of samples
through a buffer.  Both hold only names and
the catalog's index when pickled; each process opens the pool itself, read-only, on first
use.  An item is a dict keyed like an Arrow export's columns (``archive``, ``position``,
``sample_key``, ``task_key``, ``rollout_id``, ``evaluation``, then the sample's fields, a
reserved name prefixed ``field.``); numeric lists are tensors (``as_tensors``: ints int64,
floats float32, whatever their values, or the dtypes ``dtypes`` names; an empty list, which
records no dtype, float32 or the dtype named), tensors and arrays
come in the dtype and shape they were saved in, tensor blobs are loaded, so an item crosses
process boundaries as it is.

This module imports torch (its datasets subclass torch's); ``import archive_manager`` does
not import it.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import sys
import time
import warnings
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ._util.lazy_torch import TORCH_EXTRA_HINT
from .errors import MissingDependencyError

try:
    import torch
except ModuleNotFoundError as exc:
    # A lean install has no torch: name the extra instead of a bare ModuleNotFoundError.
    if exc.name != "torch":
        raise
    raise MissingDependencyError(
        f"the torch datasets need PyTorch, which is not installed; {TORCH_EXTRA_HINT}"
    ) from None
from torch.utils.data import Dataset, IterableDataset, get_worker_info

from .codec import StoredNumbers, materialize_tensor_refs
from .codec.dtypes import NotHeldError, check_dtypes, numbers_as
from .codec.values import TEXT_FIELDS
from .errors import InvalidInputError
from .interop.export import selected_archives
from .manager import ArchiveManager
from .pool.archive import Archive
from .pool.arrow import (
    EVERYTHING,
    KEY_COLUMNS,
    ArchiveSource,
    ChunkPlan,
    Needs,
    Row,
    chunk_plan,
    column_name,
    decode_chunk_rows,
    fetch_chunk,
    field_name,
)

__all__ = ["RolloutDataset", "RolloutIterableDataset", "pad_collate"]

#: Chunks a map-style dataset keeps decoded (per process).
DEFAULT_CACHE_CHUNKS = 4
_INT64, _FLOAT32 = np.dtype(np.int64), np.dtype(np.float32)


class _PoolReader:
    """What both datasets share: where the pool is, the index of selected chunks, and (per
    process, opened lazily, never pickled) the read-only pool."""

    def __init__(
        self,
        pool_or_root: ArchiveManager | str | os.PathLike[str],
        catalog_url: str | None,
        fields: Sequence[str] | None,
        as_tensors: bool,
        dtypes: Any,
        query: dict[str, Any],
        shared: bool = False,
    ) -> None:
        if isinstance(pool_or_root, ArchiveManager):
            self.root: str = str(pool_or_root.root)
            self.catalog_url: str | None = catalog_url or pool_or_root.catalog_url
            pool = pool_or_root
            owned = False
        else:
            self.root = (
                str(Path(pool_or_root))
                if not str(pool_or_root).startswith("s3://")
                else str(pool_or_root)
            )
            self.catalog_url = catalog_url
            pool = ArchiveManager.open(self.root, catalog_url, read_only=True, create=False)
            owned = True
        if fields is not None and (
            isinstance(fields, str) or not all(isinstance(f, str) for f in fields)
        ):
            raise InvalidInputError("fields must be a list of field names")
        if type(as_tensors) is not bool:
            raise InvalidInputError("as_tensors must be True or False")
        self.dtypes = check_dtypes(dtypes) or {}
        if self.dtypes and not as_tensors:
            raise InvalidInputError(
                "dtypes= names the dtypes of tensors: as_tensors=False gives lists"
            )
        self.fields = None if fields is None else list(fields)
        # NOTE: only the fields asked for are decoded (a replay of tokens, masks, log-probs
        # and rewards skips prompt and response texts and some 30 other fields); a key item
        # is no field, and an item ``x.shape`` is a field of that name (no shape items here)
        self.needs: Needs = (
            EVERYTHING
            if fields is None
            else Needs(
                frozenset(field_name(f) for f in fields if f not in KEY_COLUMNS), False, False
            )
        )
        self.as_tensors = as_tensors
        try:
            #: ``[(archive, chunk plan)]``: one entry per chunk holding a selected sample
            self.units: list[tuple[str, ChunkPlan]] = []
            if shared and torch.distributed.get_rank() != 0:
                # NOTE: rank 0's index, not a query of this rank's own: a step published
                # between the ranks' queries would give them different selections, so
                # different lengths, and the longer rank would wait in an all-reduce the
                # others never make (and samples would fall to no rank).
                self.units = _share_index(None)
            else:
                try:
                    for name, positions in selected_archives(pool.context, None, query):
                        arc = pool.open_archive(name)
                        for part in chunk_plan(arc.arrow_source(), positions):
                            self.units.append((name, part))
                except Exception as exc:
                    if shared:  # the other ranks wait for the index: tell them why none comes
                        _share_index(None, f"{type(exc).__name__}: {exc}")
                    raise
                if shared:
                    _share_index(self.units)
        finally:
            if owned:
                pool.close()
        self._pool: ArchiveManager | None = None
        self._sources: dict[str, ArchiveSource] = {}
        self._pid = os.getpid()

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_pool"] = None  # no open connection crosses a process boundary
        state["_sources"] = {}
        return state

    def source(self, name: str) -> ArchiveSource:
        if self._pool is None or self._pid != os.getpid():
            # a forked worker must not use its parent's connections
            self._pool = ArchiveManager.open(
                self.root, self.catalog_url, read_only=True, create=False
            )
            self._sources = {}
            self._pid = os.getpid()
        found = self._sources.get(name)
        if found is None:
            arc: Archive = self._pool.open_archive(name)
            found = self._sources[name] = arc.arrow_source()
        return found

    def read_unit(self, k: int) -> list[dict[str, Any]]:
        name, part = self.units[k]
        source = self.source(name)
        rows = self.decode(source, part)
        return [self.item(source, row) for row in rows]

    def read_rows(self, k: int, rows: Sequence[int]) -> list[dict[str, Any]]:
        """Chunk ``k``'s entries at ``rows`` (indices into its entries, ascending): the blob
        is read and checked whole, only those records inflated and decoded."""
        name, (ordinal, digest, entries) = self.units[k]
        if len(rows) == len(entries):
            return self.read_unit(k)
        source = self.source(name)
        part: ChunkPlan = (ordinal, digest, [entries[j] for j in rows])
        return [self.item(source, row) for row in self.decode(source, part)]

    def decode(self, source: ArchiveSource, part: ChunkPlan) -> list[Row]:
        """The rows of one chunk, with the fields the items need."""
        names = self.needs.fields
        texts = names is None or not names.isdisjoint(TEXT_FIELDS)
        return decode_chunk_rows(source, part, fetch_chunk(source, part, texts), names)

    def item(self, source: ArchiveSource, row: Row) -> dict[str, Any]:
        out: dict[str, Any] = {
            "archive": source.name,
            "position": row.position,
            "sample_key": row.sample_key,
            "task_key": row.task_key,
            "rollout_id": source.rollout_id,
            "evaluation": source.evaluation,
        }
        for key, value in row.fields.items():
            out[column_name(key) if type(key) is str else key] = value
        if self.fields is not None:
            missing = [f for f in self.fields if f not in out]
            if missing:
                raise InvalidInputError(
                    f"archive {source.name!r}, sample {row.position} has no field "
                    f"{', '.join(map(repr, missing))}"
                )
            out = {f: out[f] for f in self.fields}
        try:
            return {k: self.value(k, v) for k, v in out.items()}
        except NotHeldError as exc:
            raise NotHeldError(f"archive {source.name!r}, sample {row.position}: {exc}") from None

    def value(self, key: str, value: Any) -> Any:
        if type(value) is StoredNumbers:
            array = np.asarray(value)
            if not self.as_tensors:
                return array.tolist()
            # NOTE: the record stores the narrowest dtype the values fit, which changes with
            # the values (log-probs all float32-exact in one sample, not in the next): a
            # batch must not mix dtypes, so the dtype is the field's, as torch.tensor(list)
            # gives it (int64, the dtype embeddings and losses take; float32), or the one
            # ``dtypes`` names.  A copy of its own: the record's bytes are read-only.
            want = self.dtypes.get(key) or (_INT64 if array.dtype.kind in "iu" else _FLOAT32)
            return torch.from_numpy(numbers_as(array, want, key))
        if type(value) is list and not value and self.as_tensors:
            # An empty list records no dtype: the one asked for, else torch.tensor([])'s
            # (float32); `pad_collate` pads it into its batch's dtype.
            return torch.from_numpy(np.empty(0, dtype=self.dtypes.get(key) or _FLOAT32))
        return materialize_tensor_refs(value)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None


class RolloutDataset(Dataset):  # type: ignore[type-arg]
    """Map-style: the samples ``query`` selects (`ArchiveManager.query`'s filters), in
    rollout id, archive, position order.  Item ``i`` reads only its chunk; the last
    ``cache_chunks`` chunks read stay decoded (per process).

    Numeric list fields are tensors (``as_tensors``) of int64 or float32, whatever their
    values; ``dtypes`` (``{"loss_mask": torch.int8}``: torch or numpy dtypes, by item key)
    names others (ints must fit, floats are rounded; see `codec.dtypes`).  Tensors and
    arrays come in the dtype and shape they were saved in.

    Under torch.distributed (initialised, more than one process), every rank takes rank 0's
    selection, broadcast when the dataset is built, as `RolloutIterableDataset` does: a
    `DistributedSampler` over it then splits the same ``len`` and the same items on every
    rank, even if a step was published while the ranks built it.  That is a collective: build
    it on every process of the default group, or pass ``share_index=False`` (each process
    then queries the catalog itself)."""

    def __init__(
        self,
        pool_or_root: ArchiveManager | str | os.PathLike[str],
        *,
        catalog_url: str | None = None,
        fields: Sequence[str] | None = None,
        as_tensors: bool = True,
        dtypes: Mapping[str, Any] | None = None,
        cache_chunks: int = DEFAULT_CACHE_CHUNKS,
        share_index: bool | None = None,
        **query: Any,
    ) -> None:
        if isinstance(cache_chunks, bool) or not isinstance(cache_chunks, int) or cache_chunks < 1:
            raise InvalidInputError("cache_chunks must be an int >= 1")
        shared = _shares_index(share_index, None)
        self._reader = _PoolReader(
            pool_or_root, catalog_url, fields, as_tensors, dtypes, query, shared
        )
        self._index = [
            (k, j) for k, (_, part) in enumerate(self._reader.units) for j in range(len(part[2]))
        ]
        self._cache_size = cache_chunks
        self._cache: OrderedDict[int, list[dict[str, Any]]] = OrderedDict()

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_cache"] = OrderedDict()
        return state

    def __len__(self) -> int:
        return len(self._index)

    def __getitem__(self, i: int) -> dict[str, Any]:
        if isinstance(i, bool) or not isinstance(i, (int, np.integer)):
            raise InvalidInputError(f"index must be an int, not {type(i).__name__}")
        if not -len(self._index) <= i < len(self._index):
            raise IndexError(f"index {i} out of range for {len(self._index)} samples")
        k, j = self._index[int(i)]
        items = self._cache.get(k)
        if items is None:
            items = self._cache[k] = self._reader.read_unit(k)
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(k)
        return dict(items[j])

    def close(self) -> None:
        """Close this process's pool connection (it reopens on the next item)."""
        self._reader.close()


class RolloutIterableDataset(IterableDataset):  # type: ignore[type-arg]
    """Streamed: the samples ``query`` selects, a chunk at a time, sharded so that DDP can
    trust it (docs/recipes.md, "Replaying under DDP").

    The epoch's order is the selection's chunks in order (``shuffle``: in an order shuffled
    with ``seed + epoch``, the order inside a chunk kept), then, with ``shuffle_buffer=K``, a
    sample-level shuffle through a buffer of ``K`` samples (as ``datasets``'
    ``IterableDataset.shuffle(buffer_size=K)``: the first ``K`` samples fill the buffer, each
    next one replaces a sample drawn at random, which is yielded), seeded by ``seed`` and the
    epoch (`set_epoch`). The order is computed from the catalog's index alone, the same on
    every rank and worker.

    The ranks then split it as `torch.utils.data.DistributedSampler` does: every rank yields
    ``ceil(N / world_size)`` samples, the order padded by repeating it from its start
    (``drop_last=False``), or ``floor(N / world_size)``, the tail dropped (``drop_last=True``);
    rank ``r`` takes the ``r``-th contiguous block (fewer chunks read per rank than a stride).
    ``rank`` and ``world_size`` default to torch.distributed's when it is initialised, else 0
    and 1. Under torch.distributed (initialised, more than one process) and a ``world_size``
    above 1, given or taken, every rank uses rank 0's selection (rank 0 of the default
    group), broadcast when the dataset is built, so a step published while the ranks build it
    changes no rank's length.  That is a collective: build it on every process of the default
    group (data-parallel ranks given as ``rank``/``world_size`` under tensor parallelism
    included), or pass ``share_index=False`` (each process then queries the catalog itself:
    select a range that can no longer grow).

    DataLoader workers each collate their own batches, so a rank's batch count would depend
    on how its samples fell to the workers. Give ``batch_size`` (the DataLoader's): the rank's
    samples are cut into batches of that size and the batches dealt round-robin to the
    workers, so worker ``w`` yields batches ``w, w + W, ...`` and the in-order DataLoader
    yields them in the rank's order, whatever ``num_workers`` is: every rank yields
    ``len(loader)`` batches (``ceil`` or, with the DataLoader's ``drop_last``, ``floor`` of
    ``len(dataset) / batch_size``). Without ``batch_size`` samples are dealt one at a time:
    the ranks still yield equal counts, but with several workers and a DataLoader
    ``batch_size`` above 1, ``len(loader)`` may undercount the batches (a warning says so).

    A worker reads each chunk it needs once, inflating only the records it yields.  Items
    are those of `RolloutDataset` (``as_tensors`` and ``dtypes`` alike).
    """

    def __init__(
        self,
        pool_or_root: ArchiveManager | str | os.PathLike[str],
        *,
        catalog_url: str | None = None,
        fields: Sequence[str] | None = None,
        as_tensors: bool = True,
        dtypes: Mapping[str, Any] | None = None,
        shuffle: bool = False,
        shuffle_buffer: int = 0,
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
        drop_last: bool = False,
        batch_size: int | None = None,
        share_index: bool | None = None,
        **query: Any,
    ) -> None:
        if rank is None and world_size is None and _distributed():
            rank, world_size = torch.distributed.get_rank(), torch.distributed.get_world_size()
        rank = 0 if rank is None else rank
        world_size = 1 if world_size is None else world_size
        for value, what in (
            (rank, "rank"),
            (world_size, "world_size"),
            (seed, "seed"),
            (shuffle_buffer, "shuffle_buffer"),
        ):
            if isinstance(value, bool) or not isinstance(value, int):
                raise InvalidInputError(f"{what} must be an int")
        if not 0 <= rank < world_size:
            raise InvalidInputError(f"rank {rank} is not in [0, world_size={world_size})")
        if shuffle_buffer < 0:
            raise InvalidInputError("shuffle_buffer must be >= 0")
        if batch_size is not None and (
            isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1
        ):
            raise InvalidInputError("batch_size must be an int >= 1 (the DataLoader's) or None")
        if type(drop_last) is not bool:
            raise InvalidInputError("drop_last must be True or False")
        shared = _shares_index(share_index, world_size)
        self._reader = _PoolReader(
            pool_or_root, catalog_url, fields, as_tensors, dtypes, query, shared
        )
        self.shuffle = bool(shuffle)
        self.shuffle_buffer = shuffle_buffer
        self.seed = seed
        # NOTE: shared memory, not an int: DataLoader workers (persistent ones above all) hold
        # their own copy of the dataset, and must see the epoch the main process sets.
        self._epoch = multiprocessing.Value("q", 0, lock=False)
        self.rank = rank
        self.world_size = world_size
        self.drop_last = drop_last
        self.batch_size = batch_size
        sizes = [len(part[2]) for _, part in self._reader.units]
        #: where each chunk's samples start in the selection's flat numbering
        self._starts = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)])

    @property
    def epoch(self) -> int:
        return int(self._epoch.value)

    def set_epoch(self, epoch: int) -> None:
        """Shuffle differently in this epoch (call it on every rank alike)."""
        if isinstance(epoch, bool) or not isinstance(epoch, int):
            raise InvalidInputError("epoch must be an int")
        self._epoch.value = epoch

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        if not _spawning():
            # A copy that is not a DataLoader worker being started (pickle.dumps, a spawn
            # by the user) cannot share the memory: it keeps the epoch as it is now.
            del state["_epoch"]
            state["_epoch_value"] = self.epoch
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        value = state.pop("_epoch_value", None)
        self.__dict__.update(state)
        if value is not None:
            self._epoch = multiprocessing.Value("q", value, lock=False)

    @property
    def total(self) -> int:
        """Samples the query selected (all ranks together, before padding or cut)."""
        return int(self._starts[-1])

    def _chunk_order(self) -> list[int]:
        order = list(range(len(self._reader.units)))
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(order)
        return order

    def _epoch_order(self) -> np.ndarray:
        """Every selected sample once (flat numbers), in this epoch's order."""
        starts = self._starts
        order = self._chunk_order()
        flat = (
            np.concatenate([np.arange(starts[k], starts[k + 1]) for k in order])
            if order
            else np.zeros(0, dtype=np.int64)
        )
        size = self.shuffle_buffer
        if size > 1 and len(flat) > 1:
            bits = random.Random(f"shuffle_buffer/{self.seed}/{self.epoch}").getrandbits(64)
            rng = np.random.default_rng(bits)
            items = flat.tolist()
            buffer, out = items[:size], []
            draws = rng.integers(0, len(buffer), size=max(len(items) - size, 0)).tolist()
            for i, x in zip(draws, items[size:], strict=True):
                out.append(buffer[i])
                buffer[i] = x
            rng.shuffle(buffer)
            flat = np.asarray(out + buffer, dtype=np.int64)
        return flat

    def __len__(self) -> int:
        """Samples this rank yields in an epoch (the same on every rank): ``N / world_size``
        rounded up (``drop_last=False``) or down."""
        n, world = self.total, self.world_size
        return n // world if self.drop_last else -(-n // world)

    def _rank_order(self) -> np.ndarray:
        """This rank's samples (flat numbers) in order: its block of the epoch's order,
        padded or cut as `DistributedSampler` pads or cuts."""
        flat, per = self._epoch_order(), len(self)
        want = per * self.world_size
        if want > len(flat) and len(flat):
            flat = np.resize(flat, want)  # repeats the order from its start
        return flat[self.rank * per : (self.rank + 1) * per]

    def shard(self, worker: int = 0, workers: int = 1) -> list[tuple[int, int]]:
        """The samples this rank's ``worker`` (of ``workers``) yields this epoch, in order,
        as ``(chunk, entry)``: indices into the selection's chunks and into a chunk's
        entries."""
        mine = self._rank_order()
        step = self.batch_size or 1
        if workers > 1:
            batch = np.arange(len(mine)) // step
            mine = mine[batch % workers == worker]
        chunks = np.searchsorted(self._starts, mine, side="right") - 1
        return list(zip(chunks.tolist(), (mine - self._starts[chunks]).tolist(), strict=True))

    def __iter__(self) -> Iterator[dict[str, Any]]:
        info = get_worker_info()
        worker, workers = (0, 1) if info is None else (info.id, info.num_workers)
        if workers > 1 and self.batch_size is None and worker == 0:
            warnings.warn(
                "RolloutIterableDataset without batch_size deals samples to the DataLoader's "
                f"{workers} workers one at a time: len(loader) may undercount the batches; "
                "pass the DataLoader's batch_size to the dataset too",
                stacklevel=2,
            )
        plan = self.shard(worker, workers)
        # Each chunk is read once, inflating the records this worker yields from it; they
        # are held until yielded (a sample the padding repeats is yielded again as a copy).
        left: dict[tuple[int, int], int] = {}
        by_chunk: dict[int, list[int]] = {}
        for key in plan:
            if key not in left:
                by_chunk.setdefault(key[0], []).append(key[1])
            left[key] = left.get(key, 0) + 1
        held: dict[tuple[int, int], dict[str, Any]] = {}
        for key in plan:
            item = held.get(key)
            if item is None:
                rows = sorted(by_chunk.pop(key[0]))
                for row, got in zip(rows, self._reader.read_rows(key[0], rows), strict=True):
                    held[(key[0], row)] = got
                item = held[key]
            left[key] -= 1
            if left[key]:
                yield dict(item)
            else:
                del held[key]
                yield item


#: The longest `_settled_collective` waits for gloo's threads to let go of a tensor (they do
#: within microseconds of the call's return, or a few milliseconds on a loaded machine)
_SETTLE_S = 2.0


def _settled_collective(op: Any, tensor: torch.Tensor, **kwargs: Any) -> None:
    """``op(tensor, **kwargs)``, a synchronous `torch.distributed` collective, returning once
    no thread of the process group holds ``tensor`` (a CPU tensor: gloo's) any more, or
    after `_SETTLE_S`.

    NOTE: gloo's run loop drops a finished collective's tensors after the call has returned,
    and dropping a tensor made in Python calls into Python from that thread, which first
    creates a thread state without holding the GIL.  A fork at that moment (a DataLoader
    starting its workers right after the dataset was built, the common case) gives a child
    that waits forever, before it runs any code, for the lock that thread held (CPython
    before 3.12, python/cpython#112275): seen as a rank whose DataLoader never yields a
    batch (tests/interop/test_ddp_replay.py, about one run in ten under load).  The drop is
    seen from here: the tensor's use count is back to one and the reference its C++ side
    held on its Python object is gone (that is decremented under the GIL, which the thread
    holds until its thread state is deleted).
    """
    before = _tensor_references(tensor)[1]
    op(tensor, **kwargs)
    if tensor.device.type != "cpu":
        # NCCL keeps and drops CUDA tensors on its own schedule (its watchdog, or the
        # next collective), which a wait here could not see end: not waited for
        return
    deadline = time.monotonic() + _SETTLE_S
    while time.monotonic() < deadline:
        uses, refs = _tensor_references(tensor)
        if uses <= 1 and refs <= before:
            return
        time.sleep(0.0001)  # lets the group's thread take the GIL


def _tensor_references(tensor: torch.Tensor) -> tuple[int, int]:
    """``tensor``'s use count (the C++ references to it; 1 where torch does not tell) and
    its Python reference count as seen from the caller (`_settled_collective`)."""
    refs = sys.getrefcount(tensor)
    use_count = getattr(tensor, "_use_count", None)  # (a bound method: one more reference)
    return (1 if use_count is None else int(use_count())), refs


def _share_index(
    units: list[tuple[str, ChunkPlan]] | None, error: str | None = None
) -> list[tuple[str, ChunkPlan]]:
    """Rank 0's index (``units``, or the ``error`` its query raised) handed to every rank of
    torch.distributed's default group; what rank 0 sent, on every rank.  JSON in a byte
    tensor, never a pickle (`broadcast_object_list` unpickles what it receives)."""
    dist = torch.distributed
    device = (
        torch.device("cpu")
        if _takes_cpu(str(dist.get_backend()))
        else torch.device("cuda", torch.cuda.current_device())
    )
    if dist.get_rank() == 0:
        sent = {"units": units} if error is None else {"error": error}
        payload = json.dumps(sent, separators=(",", ":")).encode()
        size = torch.tensor([len(payload)], dtype=torch.int64, device=device)
        _settled_collective(dist.broadcast, size, src=0)
        data = torch.frombuffer(bytearray(payload), dtype=torch.uint8).to(device)
        _settled_collective(dist.broadcast, data, src=0)
        return units or []
    size = torch.zeros(1, dtype=torch.int64, device=device)
    _settled_collective(dist.broadcast, size, src=0)
    data = torch.empty(int(size.item()), dtype=torch.uint8, device=device)
    _settled_collective(dist.broadcast, data, src=0)
    got = json.loads(data.cpu().numpy().tobytes())
    if "error" in got:
        raise InvalidInputError(f"rank 0 could not select the dataset's samples: {got['error']}")
    return [
        (str(name), (int(ordinal), str(digest), [(int(p), str(k), t, int(o)) for p, k, t, o in es]))
        for name, (ordinal, digest, es) in got["units"]
    ]


def _takes_cpu(backend: str) -> bool:
    """Whether the default group's ``backend`` (`torch.distributed.get_backend`) takes CPU
    tensors: gloo, MPI, a group made without a backend (gloo, lazily), a device map naming
    ``cpu`` ("cpu:gloo,cuda:nccl"); not NCCL alone ("nccl", or the map "cuda:nccl", which
    had CPU tensors sent to a group with no CPU backend)."""
    mapped = [part.split(":", 1)[0].strip() for part in backend.split(",") if ":" in part]
    if mapped:
        return "cpu" in mapped
    return backend.strip().lower() != "nccl"


def _shares_index(share_index: object, world_size: int | None) -> bool:
    """Whether a dataset takes rank 0's index (`_share_index`): ``share_index`` if True or
    False, else whether torch.distributed runs more than one process and the dataset's
    ``world_size`` (None: the map-style dataset, split by a sampler) is above 1.

    NOTE: every dataset whose layout a rank decides from its length and items (a sampler's
    split, the iterable's blocks) shares the index the same way, however the ranks were
    given: a rank querying on its own could see a step the others did not.

    Raises:
        InvalidInputError: ``share_index`` is not a bool or None, or True without
            torch.distributed initialised.
    """
    if share_index is not None and type(share_index) is not bool:
        raise InvalidInputError("share_index must be True, False or None")
    if share_index is False:
        return False
    if not _distributed():
        if share_index:
            raise InvalidInputError(
                "share_index=True takes rank 0's index over torch.distributed, which is not "
                "initialised"
            )
        return False
    if share_index:
        return True
    return torch.distributed.get_world_size() > 1 and (world_size is None or world_size > 1)


def _spawning() -> bool:
    """Whether this pickling starts a process (a DataLoader worker under spawn/forkserver),
    the one time a shared value may be handed over."""
    from multiprocessing import context

    return context.get_spawning_popen() is not None


def _distributed() -> bool:
    return bool(torch.distributed.is_available() and torch.distributed.is_initialized())


def pad_collate(batch: Sequence[dict[str, Any]], pad_id: int = 0) -> dict[str, Any]:
    """A batch of dataset items as one dict: ``tokens`` padded with ``pad_id`` (right) into
    ``[B, T]`` with ``attention_mask`` (1 on real tokens; an item's own ``attention_mask``
    is kept and padded with 0 instead); ``loss_mask`` and
    ``rollout_log_probs`` padded with 0 into ``[B, R]``; other 1-d tensors padded with 0 (an
    empty one, which has no dtype of its own, in the dtype of the items that have values);
    numbers as a tensor; anything else as a list.

    Raises:
        InvalidInputError: an empty batch, or items with different keys.
    """
    if not batch:
        raise InvalidInputError("pad_collate needs at least one item")
    keys = list(batch[0])
    if any(list(item) != keys for item in batch):
        raise InvalidInputError("pad_collate: the items have different fields")
    out: dict[str, Any] = {}
    for key in keys:
        values = [item[key] for item in batch]
        if all(isinstance(v, torch.Tensor) and v.dim() == 1 for v in values):
            fill = pad_id if key == "tokens" else 0
            # An empty item (an aborted sample's mask) has a dtype of no values: the batch
            # takes the dtype of its items that have some.
            dtype = next((v.dtype for v in values if v.numel()), values[0].dtype)
            values = [v if v.dtype == dtype else v.to(dtype) for v in values]
            out[key] = torch.nn.utils.rnn.pad_sequence(values, batch_first=True, padding_value=fill)
            # NOTE: an item that brings its own attention_mask (packed or left-padded
            # samples) keeps it: it was padded like any 1-d tensor above.
            if key == "tokens" and "attention_mask" not in keys:
                lengths = torch.tensor([len(v) for v in values])
                out["attention_mask"] = (
                    torch.arange(out[key].shape[1])[None, :] < lengths[:, None]
                ).long()
        elif all(type(v) in (int, float) for v in values) and values:
            out[key] = torch.tensor(values)
        else:
            out[key] = values
    return out
