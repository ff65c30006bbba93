#!/usr/bin/env python3
"""End-to-end benchmark: archive_manager against the tools people use today, in one run.

On the same generated workloads (docs/architecture/workload.md "Workload", seeded), side by side:

* archive_manager, through its public API: ``pool.save``; ``pool.writer`` (streaming);
  ``open_archive`` + ``load_samples()`` of all samples (tensor refs materialized, so every
  tool returns the same data); one sample by key and one task key (median over random keys,
  a fresh ``open_archive`` each time); ``sample_metadata()``; ``find(task_key=...)``;
  ``release()`` + ``gc(grace=0)``; bytes on disk (blobs plus the catalog's files);
* slime's way today: ``torch.save({"rollout_id", "samples": [to_dict]})`` + fsync, and
  ``torch.load(weights_only=False)`` of the whole file (also the only way to one sample);
* straw (PyPI ``straw-queue``): the samples as ``to_dict`` JSON in records of 64 samples
  (codec ``json.v1``; tensor fields as straw ``tensor.v1`` records of the same publication),
  one ``SharedFilesystemStore.publish`` (durable, fsynced by straw); read back with
  ``store.read`` + ``json.loads`` (samples come back as dicts); one sample or one task key =
  ``read_record`` of the 64-sample record(s) holding it + ``json.loads`` (straw has no
  per-sample index; the record positions are taken from the save);
* the straw-backed seed (save only; ``--no-seed`` skips it): slime/vime's
  ``RolloutArchive.save`` rebuilt on straw (`seed_save`): each value of each sample walked in
  Python into the seed codec's tagged JSON tree, one publication per 64-sample chunk, the index
  published, retained under an owner and written as a fsynced JSON report;
* the disk's limit: one write + fsync of as many bytes as archive_manager stored, and one read
  of them;
* on the R3 workloads (r3-40, r3-40-numpy), the Parquet export: ``pool.export`` against pyarrow
  written by hand (`pyarrow_export`: load, ``to_dict``, ``Table.from_pylist``, ``write_table``),
  and the export's floor: the export's own table (``to_arrow``) written alone, with the
  export's Parquet options and row groups, through the export's own `write_output` (a temp
  file, synced, renamed into place) (``write_alone``);
* the list load's floor, on the rollouts of lists (realistic-*, long-context): its chunks
  inflated (``inflate_alone``) plus the same numbers made Python objects from ready arrays by
  numpy's ``tolist`` (`numbers_alone`), timed one after the other (``lists_alone``);
* the R3 loads' floors: its tensor blobs (r3-40's tensors, r3-40-numpy's arrays: blobs of
  their own above the inline limit) mapped, checked and used, nothing else read
  (``tensors_alone``), and that plus its chunks inflated and its numeric lists made by
  ``tolist``, which any load of those samples does too (``parts_alone``, the row's floor);
* on realistic-1024 (``--no-s3`` skips it), ``pool.save`` to S3 through a ``juicefs gateway``
  on loopback (tests/s3server.py) against the same save to a local folder, by turns
  (`measure_s3`; the gateway shares the client's cores: read the ratio).

Every timing is the median of ``--repeat`` runs (tools alternate within each round, so noise
from other processes spreads over all of them); ratios are peer time / archive_manager time
(above 1: archive_manager is faster).  Before every save the tool's previous output is
deleted and dirty pages written back with ``os.sync()`` (untimed).  A full ``gc.collect()``
runs before each timed operation, untimed, except the one-key reads on an open archive: one
before their loop (a collection leaves the CPU caches cold for the read: `_point_reads`).
Reads come from the page cache on every side.  MB/s is the samples' in-memory size (see
`samples_nbytes`) per second; for the raw disk it is its bytes.

Peak memory of ``pool.save`` and of loading the 1024-sample rollout (and of torch's two) is
measured in a fresh subprocess each: the child imports everything and generates the samples,
resets its peak RSS (``/proc/self/clear_refs``), runs the operation and reports its peak RSS
minus its RSS before; where that reset is not possible, its ``ru_maxrss`` minus that of a
child that only imported everything and generated the samples.

Run: ``python3 tools/bench.py [--quick] [--workloads a,b] [--repeat N] [--json FILE]``.
"""

from __future__ import annotations

import argparse
import base64
import gc
import json
import math
import os
import platform
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import torch

from archive_manager import ArchiveManager, Sample, TensorRef
from archive_manager.interop.synthetic import make_rollout
from archive_manager.metadata import describe_sample

CHUNK = 64
REPO = Path(__file__).resolve().parent.parent

try:
    from straw import Publication, Record, SharedFilesystemStore
    from straw.protocol import RecordSetRef
    from straw.protocol import digest as straw_digest
    from straw.protocol import encode as straw_encode
    from straw.reporting import write_report
    from straw.tensor import tensor_record

    STRAW_SKIPPED: str | None = None
    STRAW_CODECS = ("bytes.v1", "json.v1", "tensor.v1")
    SEED_CODECS = ("bytes.v1", "json.v1", "vime.v1", "tensor.v1")
except ImportError as exc:  # an optional peer: the rest still runs
    STRAW_SKIPPED = (
        f"straw-queue is not installed ({exc}); pip install -e '.[bench]' in this checkout"
    )


@dataclass(frozen=True)
class Workload:
    """A named rollout shape: ``make_rollout`` arguments, full size and ``--quick`` size."""

    name: str
    text: str
    full: dict[str, Any]
    quick: dict[str, Any]
    # straw and the seed store JSON and torch tensors: no numpy arrays
    straw: bool = True
    # issue 37's R3 export row: pool.export against pyarrow written by hand
    export: bool = False
    # the list load's floor (`lists_alone`): for rollouts of lists, no tensors or arrays
    lists_floor: bool = False

    def make(self, quick: bool) -> list:
        """Generate the samples (seeded: every run and every child gets the same ones)."""
        return make_rollout(seed=1, **(self.quick if quick else self.full))


WORKLOADS = {
    w.name: w
    for w in (
        Workload(
            "realistic-256",
            "256 samples, 512-token prompts, 1400-4200-token responses",
            {"n_samples": 256},
            {"n_samples": 32, "response_min": 64, "response_max": 256},
            lists_floor=True,
        ),
        Workload(
            "realistic-1024",
            "1024 samples, 512-token prompts, 1400-4200-token responses",
            {"n_samples": 1024},
            {"n_samples": 96, "response_min": 64, "response_max": 256},
            lists_floor=True,
        ),
        Workload(
            "long-context",
            "64 samples, 1024-token prompts, 32768-token responses",
            {"n_samples": 64, "prompt_len": 1024, "response_min": 32768, "response_max": 32768},
            {"n_samples": 8, "prompt_len": 64, "response_min": 2048, "response_max": 2048},
            lists_floor=True,
        ),
        Workload(
            "r3",
            "256 samples as realistic-256 + routed experts int32 [T-1, 48, 8]",
            {"n_samples": 256, "r3_layers": 48},
            # 700 + 64..128 tokens x 1.5 KB: past the 1 MiB inline limit, tensor blobs as in full
            {
                "n_samples": 8,
                "prompt_len": 700,
                "response_min": 64,
                "response_max": 128,
                "r3_layers": 48,
            },
        ),
        # issue 37's R3 row: 40 samples of 2-3k tokens, 125 MB of routed experts, every
        # tensor or array used after the load (`_used`)
        Workload(
            "r3-40",
            "40 samples, 512-token prompts, 1000-2000-token responses + routed experts int32 "
            "[T-1, 48, 8] as torch tensors",
            {"n_samples": 40, "response_min": 1000, "response_max": 2000, "r3_layers": 48},
            {
                "n_samples": 8,
                "prompt_len": 700,
                "response_min": 64,
                "response_max": 128,
                "r3_layers": 48,
            },
            export=True,
        ),
        Workload(
            "r3-40-numpy",
            "r3-40 with the routed experts as numpy arrays (as slime hands them)",
            {
                "n_samples": 40,
                "response_min": 1000,
                "response_max": 2000,
                "r3_layers": 48,
                "r3_numpy": True,
            },
            {
                "n_samples": 8,
                "prompt_len": 700,
                "response_min": 64,
                "response_max": 128,
                "r3_layers": 48,
                "r3_numpy": True,
            },
            straw=False,
            export=True,
        ),
    )
}
MEMORY_WORKLOAD = "realistic-1024"
SAVES = ("save", "writer")


def samples_nbytes(samples: list) -> int:
    """The samples' own size: what their values amount to as raw arrays and bytes.

    A number in a list counts 8 bytes (an int64/float64 array's worth, not the ~32 bytes a
    Python int or float object takes), a tensor its ``nbytes``, a string its UTF-8 bytes;
    dicts and lists are walked; other scalars count 8 bytes.
    """

    def size(value: Any) -> int:
        if isinstance(value, torch.Tensor):
            return value.numel() * value.element_size()
        if isinstance(value, np.ndarray):
            return value.nbytes
        if isinstance(value, str):
            return len(value.encode("utf-8", "surrogatepass"))
        if isinstance(value, dict):
            return sum(size(v) for v in value.values())
        if isinstance(value, (list, tuple)):
            return sum(size(v) for v in value)
        return 8

    return sum(size(s.to_dict()) for s in samples)


def tree_bytes(root: Path) -> int:
    """Bytes of every file under ``root``."""
    total = 0
    for folder, _dirs, files in os.walk(root):
        for name in files:
            try:
                total += os.lstat(os.path.join(folder, name)).st_size
            except FileNotFoundError:
                continue
    return total


def _median(times: list[float]) -> float:
    return statistics.median(times)


def _timed(fn: Callable[[], Any], *, collect: bool = True) -> tuple[float, Any]:
    """``fn()`` timed, after a full collection (``collect``) so no tool pays for another's
    garbage.  `_point_reads` passes ``collect=False``: its loop collects once, before its
    first key."""
    if collect:
        gc.collect()
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def _point_reads() -> Callable[[Callable[[], Any]], tuple[float, Any]]:
    """The timer of a loop of point reads (one key each on an open archive): one full
    collection now, none before each read.

    NOTE: a full collection walks the whole benchmark process (the workload, every tool's
    outputs: 0.4-0.9 s), which leaves the CPU caches cold; a 1 ms read timed right after one
    paid ~0.8 ms more CPU (realistic-1024, one key on an open archive, CPU time by turns:
    1.42-1.57 ms after a `gc.collect()`, 0.66-0.77 ms without; touching 96 MB of memory
    instead of collecting gave the same 1.49-1.54 ms).  That measured the benchmark's collection, not the read; a
    read's own garbage is a few objects, nothing for the next read to pay.
    """
    gc.collect()
    return lambda fn: _timed(fn, collect=False)


def _timed_write(fn: Callable[[], Any], *replaced: Path) -> tuple[float, Any]:
    """`_timed` for a save: ``replaced`` files (the previous round's) are deleted and every
    dirty page written back (``os.sync()``) first, untimed, so no tool pays for another's (or
    its own last) writeback or for freeing the blocks of the file it overwrites."""
    for path in replaced:
        path.unlink(missing_ok=True)
    os.sync()
    return _timed(fn)


def _fields(sample: Any) -> dict[str, Any]:
    """A sample's top-level fields: a dict sample itself, else its attributes."""
    return sample if isinstance(sample, dict) else vars(sample)


def _materialized(samples: list) -> list:
    """Load the lazy tensor fields, so archive_manager returns what torch.load returns.

    Only top-level fields are looked at (where these workloads keep their tensors), not every
    item of every token list, which `materialize_tensor_refs` has to check.
    """
    for sample in samples:
        fields = _fields(sample)
        for key, value in fields.items():
            if isinstance(value, TensorRef):
                fields[key] = value.materialize()
    return samples


def _used(samples: list) -> list:
    """Use every top-level tensor and array of the loaded samples (its max: every byte read),
    as training does after a load, so no tool's lazy or mapped bytes go unpaid."""
    for sample in samples:
        for value in _fields(sample).values():
            if isinstance(value, torch.Tensor) and value.numel():
                value = value.numpy()
            if isinstance(value, np.ndarray) and value.size:
                value.max()
    return samples


# ------------------------------------------------------------------------------------------
# torch (slime's dumps), straw, raw


def torch_save(samples: list, path: Path) -> int:
    """slime's debug dump: torch.save of the dicts, then fsync; returns the file's size."""
    with open(path, "wb") as f:
        torch.save({"rollout_id": 0, "samples": [s.to_dict() for s in samples]}, f)
        f.flush()
        os.fsync(f.fileno())
    return path.stat().st_size


def torch_load(path: Path) -> Any:
    """The whole dump; the only way to get at any sample of it."""
    return torch.load(path, weights_only=False)


@dataclass
class StrawSaved:
    """What a straw save leaves: the publication and where each 64-sample record sits."""

    ref: Any
    json_ordinals: list[int]
    tensor_ordinals: dict[int, dict[str, int]] = field(default_factory=dict)


def pyarrow_export(pool: ArchiveManager, name: str, path: Path) -> None:
    """The Parquet export a user writes by hand: load, ``to_dict``, ``pa.Table.from_pylist``,
    ``pq.write_table`` (pyarrow's defaults).  Fixes a user has to make for it to run at all:
    slime's empty ``apply_chat_template_kwargs`` dict as JSON text (Parquet has no empty
    struct), and each tensor or numpy array flattened with its shape in a column of its own
    (pyarrow takes one-dimensional arrays only), as `pool.export` writes them."""
    import pyarrow.parquet as pq

    pq.write_table(pyarrow_table(pool, name), path)


def pyarrow_table(pool: ArchiveManager, name: str) -> Any:
    """The table `pyarrow_export` writes (load, ``to_dict``, ``pa.Table.from_pylist``)."""
    import pyarrow as pa

    rows = [s.to_dict() for s in pool.open_archive(name).load_samples(materialize=True)]
    for row in rows:
        row["apply_chat_template_kwargs"] = json.dumps(row["apply_chat_template_kwargs"])
        for key, value in list(row.items()):
            if isinstance(value, torch.Tensor):
                value = value.numpy()
            if isinstance(value, np.ndarray) and value.ndim != 1:
                row[key] = value.reshape(-1)
                row[f"{key}.shape"] = list(value.shape)
    return pa.Table.from_pylist(rows)


def inflate_alone(pool: ArchiveManager) -> int:
    """Read every chunk of ``rollout-0`` and inflate all its records, nothing decoded; the
    records inflated."""
    from archive_manager.codec.chunk import ChunkReader

    records = 0
    for chunk in pool.open_archive("rollout-0").chunks():
        reader = ChunkReader(pool.store.get_view(chunk["digest"]), digest=chunk["digest"])
        reader.inflate(range(len(reader)))
        records += len(reader)
    return records


def tensors_alone(pool: ArchiveManager, digests: list[str], *, arrays: bool = False) -> int:
    """Map and check each tensor blob of ``digests`` as a load does (`BlobStore.open_private`:
    a private map, its xxh3-128 checked, the tensor over it; with ``arrays``, the numpy array
    over it), and use it as `_used` does (its max), nothing else read or decoded; the bytes
    used.  The R3 rows' floor: any load of those tensors or arrays does this much."""
    from archive_manager.codec import decode_array_blob, decode_tensor_blob

    used = 0
    for digest in digests:
        view = pool.store.open_private(digest)
        if arrays:
            array = decode_array_blob(view, digest, owned=True)
        else:
            array = decode_tensor_blob(view, digest, owned=True).numpy()
        if array.size:
            array.max()
        used += array.nbytes
    return used


def tensor_digests(pool: ArchiveManager) -> list[str]:
    """The tensor blobs of ``rollout-0`` (its torch tensors' and its numpy arrays' above the
    inline limit), from the catalog: its payload blobs that are not chunks; none is read."""
    archive = pool.open_archive("rollout-0")
    chunks = {chunk["digest"] for chunk in archive.chunks()}
    return sorted(digest for digest in archive.payload_sizes() if digest not in chunks)


def number_arrays(samples: list) -> list[np.ndarray]:
    """The numeric lists among the samples' top-level fields, as numpy arrays."""
    return [
        np.asarray(value)
        for sample in samples
        for value in _fields(sample).values()
        if type(value) is list and value and type(value[0]) in (int, float)
    ]


def numbers_alone(arrays: list[np.ndarray]) -> int:
    """Make the numbers of ``arrays`` Python objects, as a list load makes them, by the
    fastest code there is for it (numpy's ``tolist`` of ready arrays), with a load's GC pause
    and arenas made ahead (`gc_paused(promote=True)`); the numbers made."""
    from archive_manager.codec.values import gc_paused

    with gc_paused(promote=True):
        lists = [a.tolist() for a in arrays]
    return sum(map(len, lists))


def _write_parquet(table: Any, path: Path) -> None:
    """``table`` written as `pool.export` writes its batches and its file: its Parquet
    options, row groups of at most 16 MiB, through the export's own `write_output` (a new
    temp file, synced, renamed over ``path``: the export's file is durable when it
    returns)."""
    import pyarrow.parquet as pq

    from archive_manager._util.output import write_output
    from archive_manager.interop import export

    def write(output: Any) -> None:
        options = export._parquet_options(table.schema)
        writer = pq.ParquetWriter(str(output.path), table.schema, **options)
        try:
            for batch in table.to_batches():
                export._write_groups(writer, batch)
        finally:
            writer.close()

    write_output(path, write)


def straw_save(samples: list, root: Path) -> StrawSaved:
    """Publish the samples as JSON records of 64 samples (tensors as tensor.v1 records)."""
    records: list[Any] = []
    json_ordinals: list[int] = []
    tensor_ordinals: dict[int, dict[str, int]] = {}
    for start in range(0, len(samples), CHUNK):
        dicts = []
        tensors = []
        for i, sample in enumerate(samples[start : start + CHUNK], start):
            d = sample.to_dict()
            for key, value in list(d.items()):
                if isinstance(value, torch.Tensor):
                    tensors.append((i, key, tensor_record(value, f"{i}:{key}", kind=key)))
                    d[key] = None  # restored from its tensor record on read
            dicts.append(d)
        json_ordinals.append(len(records))
        records.append(Record(f"samples-{start}", json.dumps(dicts).encode(), "json.v1"))
        for i, key, record in tensors:
            tensor_ordinals.setdefault(i, {})[key] = len(records)
            records.append(record)
    with SharedFilesystemStore(root, "bench", codecs=STRAW_CODECS) as store:
        ref = store.publish(records, submission_id="rollout-0")
    return StrawSaved(ref, json_ordinals, tensor_ordinals)


# The straw-backed seed: slime/vime's RolloutArchive.save, whose codec walks every value of a
# sample in Python into a tagged JSON tree, publishes each 64-sample chunk on its own, then the
# index of chunks and entries, retains it under an owner and writes a fsynced JSON report with
# the samples' metadata.  Rebuilt here from that description (the seed's package is not on
# the registries); where the seed did more (an import statement run on every visited value, a
# PIL check before the error for an unknown type) this does less, so its times flatter it.
# One such cost is kept, because it is what every visited value pays: the seed's visit runs
# ``from vime.data.transport import <its four reference types>`` on each call and tests the
# value against one of them first; ``seed_save(as_written=False)`` leaves that out.
_SAMPLE_TYPES = (Sample.SpecInfo, Sample.PrefixCacheInfo)


class _SeedTree:
    """One chunk's tagged tree (lists as ``["list", [...]]``, non-finite floats as
    ``["float", repr]``, tensors as records of their own) and the tensor records it names."""

    def __init__(self, prefix: str, *, as_written: bool = True) -> None:
        self.prefix = prefix
        self.tensors: list[Any] = []
        self.active: set[int] = set()
        self.visit = self._visit_as_written if as_written else self._visit

    def _visit_as_written(self, value: Any) -> Any:
        from archive_manager.blobs.base import (  # noqa: F401 - the seed's per-value import
            BlobStat,
            Capabilities,
            IncompleteWrite,
            ObjectRoot,
        )

        if isinstance(value, IncompleteWrite):  # the seed's DiskPayloadRef branch
            raise TypeError("not a sample field")
        return self._visit(value)

    def tensor(self, value: Any) -> list[Any]:
        if isinstance(value, np.ndarray):
            value = torch.from_numpy(np.array(value, copy=True))
        record = tensor_record(value, f"{self.prefix}:tensor:{len(self.tensors)}")
        self.tensors.append(record)
        meta = record.metadata
        return ["tensor", len(self.tensors) - 1, meta["shape"], meta["dtype"], False, None, False]

    def _visit(self, value: Any) -> Any:
        if value is None or type(value) in (str, bool, int):
            return value
        if type(value) is float:
            return value if math.isfinite(value) else ["float", repr(value)]
        if isinstance(value, torch.Tensor):
            return self.tensor(value)
        if isinstance(value, np.ndarray):
            return ["ndarray", self.tensor(value)]
        if isinstance(value, np.generic):
            return self.visit(value.item())
        if isinstance(value, (bytes, bytearray)):
            return ["bytes", base64.b64encode(value).decode("ascii")]
        if isinstance(value, Sample.Status):
            return ["status", value.value]
        identity = id(value)
        if identity in self.active:
            raise TypeError("cyclic fields")
        self.active.add(identity)
        try:
            if isinstance(value, Sample):
                fields = [[self.visit(k), self.visit(v)] for k, v in vars(value).items()]
                return ["sample", ["dict", fields]]
            if isinstance(value, _SAMPLE_TYPES):
                return [type(value).__name__, self.visit(vars(value))]
            if isinstance(value, dict):
                return ["dict", [[self.visit(k), self.visit(v)] for k, v in value.items()]]
            if isinstance(value, (list, tuple)):
                kind = "tuple" if isinstance(value, tuple) else "list"
                return [kind, [self.visit(item) for item in value]]
            raise TypeError(f"unsupported field type {type(value).__qualname__}")
        finally:
            self.active.remove(identity)


def seed_save(samples: list, path: Path, *, as_written: bool = True) -> None:
    """The straw-backed seed's save of one rollout into an index file at ``path``."""
    store = SharedFilesystemStore(
        path.parent / "straw-data", "debug-rollout", codecs=SEED_CODECS, online_gc=True
    )
    try:
        chunks, entries, metadata = [], [], []
        for start in range(0, len(samples), CHUNK):
            chunk = samples[start : start + CHUNK]
            tree = _SeedTree(f"debug-chunk:{uuid.uuid4().hex}", as_written=as_written)
            payload = straw_encode({"version": 1, "tree": tree.visit(chunk)})
            head = Record(tree.prefix, payload, "vime.v1", {}, tokens=0)
            publications = [Publication(tuple(tree.tensors)), Publication((head,), (0,))]
            if not tree.tensors:
                publications = [Publication((head,))]
            ref = store.publish_many(publications, submission_id=tree.prefix)[-1]
            for offset, sample in enumerate(chunk):
                metadata.append(describe_sample(sample))
                key = f"sample:{sample.index}" if sample.index is not None else start + offset
                entries.append({"sample_key": key, "task_key": None, "chunk": len(chunks)})
            chunks.append(asdict(ref))
        index = straw_encode({"version": 1, "tree": {"chunks": chunks, "entries": entries}})
        refs = [RecordSetRef.from_dict(c) for c in chunks]
        manifest = store.publish(
            [Record(f"debug-index:{uuid.uuid4().hex}", index, "vime.v1", {})],
            submission_id=f"debug-index:{uuid.uuid4().hex}",
            dependencies=tuple(refs),
        )
        owner = f"debug:{path.resolve()}:{straw_digest(asdict(manifest))}"
        store.retain(owner, [manifest])
        store.release_publications([manifest])
        write_report(
            path,
            {
                "format": "vime.straw-debug",
                "version": 1,
                "rollout_id": 0,
                "manifest": asdict(manifest),
                "storage_owner": owner,
                "sample_metadata": {"version": 1, "samples": metadata},
            },
        )
    finally:
        store.close()


def _straw_tensor(record: Any) -> torch.Tensor:
    dtype = getattr(torch, record.metadata["dtype"])
    return torch.frombuffer(bytearray(record.payload), dtype=dtype).reshape(
        record.metadata["shape"]
    )


def straw_load_all(store: Any, saved: StrawSaved) -> list[dict]:
    """Every sample back as a dict, tensors restored."""
    records = list(store.read(saved.ref))
    out: list[dict] = []
    for ordinal in saved.json_ordinals:
        out.extend(json.loads(records[ordinal].payload))
    for i, fields in saved.tensor_ordinals.items():
        for key, ordinal in fields.items():
            out[i][key] = _straw_tensor(records[ordinal])
    return out


def straw_load_some(store: Any, saved: StrawSaved, positions: list[int]) -> list[dict]:
    """The samples at ``positions``: read and parse the 64-sample record(s) holding them."""
    members = store.validate(saved.ref)
    parsed: dict[int, list[dict]] = {}
    out = []
    for i in positions:
        group = i // CHUNK
        if group not in parsed:
            parsed[group] = json.loads(
                store.read_record(members[saved.json_ordinals[group]]).payload
            )
        sample = parsed[group][i % CHUNK]
        for key, ordinal in saved.tensor_ordinals.get(i, {}).items():
            sample[key] = _straw_tensor(store.read_record(members[ordinal]))
        out.append(sample)
    return out


_BLOCK = os.urandom(1 << 22)


def raw_write(path: Path, nbytes: int) -> None:
    """The disk's limit: one file of ``nbytes`` written and fsynced."""
    with open(path, "wb") as f:
        left = nbytes
        while left > 0:
            left -= f.write(_BLOCK[: min(left, len(_BLOCK))])
        f.flush()
        os.fsync(f.fileno())


def raw_read(path: Path) -> int:
    with open(path, "rb", buffering=0) as f:
        return sum(len(b) for b in iter(lambda: f.read(1 << 22), b""))


# ------------------------------------------------------------------------------------------
# One workload


def _release_gc(pool: ArchiveManager, record: Callable[[str, str, float], None]) -> None:
    """Time release() + gc(grace=0) of the pool's one archive, which frees all its blobs."""

    def release_gc() -> int:
        pool.open_archive("rollout-0").release()
        return pool.gc(grace=0).blobs

    seconds, reclaimed = _timed(release_gc)
    assert reclaimed > 0
    record("release_gc", "archive_manager", seconds)


def measure(
    workload: Workload, quick: bool, repeat: int, work: Path, keys: int, seed: bool = True
) -> dict:
    """Every operation of every tool on one workload; medians of ``repeat`` rounds (the
    straw-backed seed's save with ``seed``)."""
    samples = workload.make(quick)
    nbytes = samples_nbytes(samples)
    straw = STRAW_SKIPPED is None and workload.straw
    times: dict[str, dict[str, list[float]]] = {}

    def record(op: str, tool: str, seconds: float) -> None:
        times.setdefault(op, {}).setdefault(tool, []).append(seconds)

    counter = iter(range(10**9))
    pools: list[ArchiveManager] = []
    straw_root: Path | None = None
    straw_saved: StrawSaved | None = None
    pt = work / "rollout.pt"
    raw = work / "raw.bin"
    am_bytes = am_blob_bytes = pt_bytes = straw_bytes = 0
    wroot: Path | None = None
    try:
        # Saves, alternating tools within each round.
        for _ in range(repeat):
            if pools:
                # The previous round's pool: release + gc timed, then its files deleted right
                # before this save, as every tool's last output is deleted right before its
                # next save, so each writes into the space it freed itself.
                # NOTE: kept pools made every later save write to never-used blocks, which cost
                # this virtual disk up to 2x; the raw write reused its own file's blocks.
                _release_gc(pools[-1], record)
                done = pools.pop()
                done.close()
                shutil.rmtree(done.root)
            root = work / f"pool-{next(counter)}"
            pool = ArchiveManager.open(root)
            seconds, _ = _timed_write(lambda p=pool: p.save("rollout-0", samples, rollout_id=0))
            record("save", "archive_manager", seconds)
            am_blob_bytes = tree_bytes(root / "blobs")
            am_bytes = tree_bytes(root)
            pools.append(pool)

            if wroot is not None:
                shutil.rmtree(wroot)
            wroot = work / f"pool-{next(counter)}"
            with ArchiveManager.open(wroot) as wpool:

                def stream(p: ArchiveManager = wpool) -> None:
                    with p.writer("rollout-0", rollout_id=0) as w:
                        for s in samples:
                            w.add(s)

                record("writer", "archive_manager", _timed_write(stream)[0])

            seconds, pt_bytes = _timed_write(lambda: torch_save(samples, pt), pt)
            record("save", "torch", seconds)

            if straw:
                if straw_root is not None:
                    shutil.rmtree(straw_root)
                straw_root = work / f"straw-{next(counter)}"
                seconds, straw_saved = _timed_write(lambda r=straw_root: straw_save(samples, r))
                record("save", "straw", seconds)
                straw_bytes = tree_bytes(straw_root)

            if straw and seed:
                seed_root = work / f"seed-{next(counter)}"
                seconds, _ = _timed_write(lambda r=seed_root: seed_save(samples, r / "r.json"))
                record("save", "seed", seconds)
                shutil.rmtree(seed_root)

            record("save", "raw", _timed_write(lambda n=am_bytes: raw_write(raw, n), raw)[0])

        pool = pools[-1]
        entries = pool.open_archive("rollout-0").keys()
        rng = random.Random(0)
        picks = [rng.randrange(len(entries)) for _ in range(keys)]
        task_keys = sorted({tk for _, tk in entries if tk is not None})
        task_picks = [rng.choice(task_keys) for _ in range(keys)] if task_keys else []
        positions_of: dict[str, list[int]] = {}
        for i, (_, tk) in enumerate(entries):
            if tk is not None:
                positions_of.setdefault(tk, []).append(i)
        straw_store = (
            SharedFilesystemStore(straw_root, "bench", codecs=STRAW_CODECS)
            if straw and straw_root
            else None
        )
        digests = tensor_digests(pool) if workload.export else []
        numpy_arrays = workload.name.endswith("-numpy")
        arrays = number_arrays(samples) if workload.lists_floor or digests else []
        try:
            for _ in range(repeat):
                seconds, got = _timed(
                    lambda: _used(_materialized(pool.open_archive("rollout-0").load_samples()))
                )
                assert len(got) == len(samples)
                del got
                record("load_all", "archive_manager", seconds)
                seconds, got = _timed(
                    lambda: _used(
                        _materialized(pool.open_archive("rollout-0").load_samples(as_arrays=True))
                    )
                )
                assert len(got) == len(samples)
                del got
                record("load_arrays", "archive_manager", seconds)
                seconds, got = _timed(lambda: {"samples": _used(torch_load(pt)["samples"])})
                assert len(got["samples"]) == len(samples)
                del got
                record("load_all", "torch", seconds)
                if straw_store is not None and straw_saved is not None:
                    seconds, got = _timed(lambda: _used(straw_load_all(straw_store, straw_saved)))
                    assert len(got) == len(samples)
                    del got
                    record("load_all", "straw", seconds)
                record("load_all", "raw", _timed(lambda: raw_read(raw))[0])
                if workload.lists_floor:
                    # The lists row's floor (issue 37): the chunks inflated and the same
                    # numbers made Python objects from ready arrays, which any list load does.
                    seconds = _timed(lambda: inflate_alone(pool))[0]
                    seconds += _timed(lambda: numbers_alone(arrays))[0]
                    record("load_all", "lists_alone", seconds)
                elif workload.export and digests:
                    # The R3 rows' floor (issue 37): their tensor blobs mapped, checked and
                    # used alone (they are not in the chunks: nothing to inflate).
                    seconds = _timed(lambda: tensors_alone(pool, digests, arrays=numpy_arrays))[0]
                    record("load_all", "tensors_alone", seconds)
                    # The whole floor: besides its tensors, any load of these samples makes
                    # their token ids, masks and log-probs Python lists, as torch.load does.
                    seconds += _timed(lambda: inflate_alone(pool))[0]
                    seconds += _timed(lambda: numbers_alone(arrays))[0]
                    record("load_all", "parts_alone", seconds)

            # Point reads: many random keys, on one open Archive (issue 37's row: one
            # collection before them all, `_point_reads`), then each with a fresh Archive.
            opened = pool.open_archive("rollout-0")
            point = _point_reads()
            for i in picks:
                key = entries[i][0]
                seconds, got = point(lambda k=key: _materialized(opened.load_samples(sample_key=k)))
                assert got, key
                record("load_one_open", "archive_manager", seconds)
            for i in picks:
                key = entries[i][0]
                seconds, got = _timed(
                    lambda k=key: _materialized(
                        pool.open_archive("rollout-0").load_samples(sample_key=k)
                    )
                )
                assert got, key
                record("load_one", "archive_manager", seconds)
                if straw_store is not None and straw_saved is not None:
                    seconds, _ = _timed(lambda i=i: straw_load_some(straw_store, straw_saved, [i]))
                    record("load_one", "straw", seconds)
            for tk in task_picks:
                seconds, got = _timed(
                    lambda k=tk: _materialized(
                        pool.open_archive("rollout-0").load_samples(task_key=k)
                    )
                )
                assert len(got) == len(positions_of[tk])
                record("load_task", "archive_manager", seconds)
                if straw_store is not None and straw_saved is not None:
                    seconds, _ = _timed(
                        lambda k=tk: straw_load_some(straw_store, straw_saved, positions_of[k])
                    )
                    record("load_task", "straw", seconds)
                seconds, _ = _timed(lambda k=tk: pool.find(task_key=k))
                record("find", "archive_manager", seconds)
            for _ in range(max(repeat, 5)):
                seconds, meta = _timed(lambda: pool.open_archive("rollout-0").sample_metadata())
                assert len(meta) == len(samples)
                record("sample_metadata", "archive_manager", seconds)
            if workload.export:
                # Each side once untimed first: pyarrow's Parquet modules load on first use.
                for n in range(repeat + 1):
                    seconds, _ = _timed(
                        lambda: pool.export("rollout-0", work / "am.parquet", overwrite=True)
                    )
                    if n:
                        record("export", "archive_manager", seconds)
                    seconds, _ = _timed(lambda: pyarrow_export(pool, "rollout-0", work / "pa.pq"))
                    if n:
                        record("export", "pyarrow", seconds)
                    # The floor (issue 37): only pyarrow writing the export's own table with
                    # the export's options, and the file synced (the export promises a
                    # durable file), which the export has to do whatever it reads; the hand
                    # path's time over it is the most the export could gain on it.
                    table = pool.open_archive("rollout-0").to_arrow()
                    seconds, _ = _timed(lambda t=table: _write_parquet(t, work / "floor.pq"))
                    del table
                    if n:
                        record("export", "write_alone", seconds)
        finally:
            if straw_store is not None:
                straw_store.close()

        _release_gc(pools[-1], record)
    finally:
        for p in pools:
            p.close()
    medians = {op: {tool: _median(ts) for tool, ts in by.items()} for op, by in times.items()}
    runs = {op: {tool: ts for tool, ts in by.items()} for op, by in times.items() if op in SAVES}
    # Only one way to any sample of a torch dump: load all of it.
    for op in ("load_arrays", "load_one", "load_one_open", "load_task"):
        medians.setdefault(op, {})["torch"] = medians["load_all"]["torch"]
    return {
        "workload": workload.name,
        "description": workload.text if not quick else f"{workload.text} (quick: {workload.quick})",
        "samples": len(samples),
        "nbytes": nbytes,
        "repeat": repeat,
        "point_reads": keys,
        "seconds": medians,
        "save_runs": runs,
        "bytes": {
            "archive_manager": am_bytes,
            "archive_manager_blobs": am_blob_bytes,
            "torch": pt_bytes,
            "straw": straw_bytes if straw else None,
            "raw": am_bytes,
        },
    }


def measure_s3(samples: list, repeat: int, work: Path) -> tuple[dict[str, float] | None, str]:
    """Issue 37's S3 row: ``pool.save`` to ``s3://`` (a ``juicefs gateway`` on loopback,
    tests/s3server.py) against the same save to a local folder, by turns in each round, each
    with its catalog in SQLite on the local disk (as tools/bench_s3.py); medians.  The
    gateway shares this machine's cores with the client, so the ratio, not the time, is what
    to read.  (None, why) where the gateway cannot start."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from s3server import S3Server, S3ServerUnavailable

    try:
        server = S3Server.start()
    except S3ServerUnavailable as exc:
        return None, f"S3 row skipped: {exc}"
    saved_env = dict(os.environ)
    times: dict[str, list[float]] = {"archive_manager": [], "local": []}
    try:
        os.environ.update(server.env())
        bucket = server.create_bucket("bench")
        for r in range(repeat):
            for tool, root in (
                ("archive_manager", f"s3://{bucket}/run{r}"),
                ("local", str(work / f"s3-local-{r}")),
            ):
                url = f"sqlite:///{work}/s3-{tool}-{r}.db"
                with ArchiveManager.open(root, catalog_url=url) as pool:
                    seconds, _ = _timed_write(
                        lambda p=pool: p.save("rollout-0", samples, rollout_id=0)
                    )
                times[tool].append(seconds)
                shutil.rmtree(work / f"s3-local-{r}", ignore_errors=True)
    finally:
        os.environ.clear()
        os.environ.update(saved_env)
        server.__exit__(None, None, None)
    return {tool: _median(ts) for tool, ts in times.items()}, ""


# ------------------------------------------------------------------------------------------
# Peak memory, one fresh process per measurement


def _rss() -> tuple[int, int] | None:
    """(current RSS, peak RSS since the last reset) in bytes, from /proc; None elsewhere."""
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        return None
    kib = {
        line.split(":")[0]: int(line.split()[1])
        for line in status.splitlines()
        if line.startswith(("VmRSS:", "VmHWM:"))
    }
    if len(kib) != 2:
        return None
    return kib["VmRSS"] * 1024, kib["VmHWM"] * 1024


def _reset_peak_rss() -> bool:
    # Linux >= 4.0: "5" resets the peak RSS (VmHWM) to the current RSS, so the peak of one
    # operation can be read apart from what importing and generating the samples took.
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return True


def child_main(op: str, workload: str, quick: bool, path: Path) -> None:
    """Run in a fresh process: generate the samples, run ``op``, print its peak RSS."""
    samples = WORKLOADS[workload].make(quick)
    gc.collect()
    before = _rss()
    reset = before is not None and _reset_peak_rss()
    kept: Any = None
    if op == "am-save":
        with ArchiveManager.open(path) as pool:
            pool.save("rollout-0", samples, rollout_id=0)
    elif op == "am-load":
        with ArchiveManager.open(path, create=False) as pool:
            kept = _materialized(pool.open_archive("rollout-0").load_samples())
    elif op == "am-load-arrays":
        with ArchiveManager.open(path, create=False) as pool:
            kept = _materialized(pool.open_archive("rollout-0").load_samples(as_arrays=True))
    elif op == "torch-save":
        torch_save(samples, path)
    elif op == "torch-load":
        kept = torch_load(path)
    elif op != "baseline":
        raise SystemExit(f"unknown child operation {op!r}")
    after = _rss()
    print(
        json.dumps(
            {
                "op": op,
                "rss_before": before[0] if before else None,
                "peak_since_reset": after[1] if reset and after else None,
                "maxrss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                "kept": kept is not None,
            }
        )
    )


def _child(op: str, workload: str, quick: bool, path: Path) -> dict[str, Any]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    command = [sys.executable, __file__, "--child", op, "--workloads", workload]
    command += ["--child-path", str(path)] + (["--quick"] if quick else [])
    out = subprocess.run(command, check=True, capture_output=True, text=True, env=env)
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def measure_memory(quick: bool, work: Path) -> dict:
    """Peak RSS of saving and loading one workload, each in a fresh process.

    Where /proc allows it, the child resets its peak RSS after generating the samples and
    reports the peak during the operation minus its RSS just before; elsewhere, the child's
    ``ru_maxrss`` minus that of a child that only imported everything and generated them.
    """
    workload = WORKLOADS[MEMORY_WORKLOAD]
    nbytes = samples_nbytes(workload.make(quick))
    pool_root = work / "mem-pool"
    pt = work / "mem.pt"
    runs = {
        op: _child(op, workload.name, quick, path)
        for op, path in (
            ("am-save", pool_root),
            ("am-load", pool_root),
            ("am-load-arrays", pool_root),
            ("torch-save", pt),
            ("torch-load", pt),
        )
    }
    if all(r["peak_since_reset"] is not None for r in runs.values()):
        method = "peak RSS during the operation minus RSS before it (VmHWM reset)"
        peaks = {op: r["peak_since_reset"] - r["rss_before"] for op, r in runs.items()}
    else:
        method = "ru_maxrss minus that of a child that only imported and generated"
        baseline = _child("baseline", workload.name, quick, work / "unused")["maxrss"]
        peaks = {op: r["maxrss"] - baseline for op, r in runs.items()}
    shutil.rmtree(pool_root, ignore_errors=True)
    pt.unlink(missing_ok=True)
    return {
        "workload": workload.name,
        "samples_nbytes": nbytes,
        "method": method,
        "rss_before": runs["am-save"]["rss_before"],
        "peak_above_baseline": peaks,
    }


# ------------------------------------------------------------------------------------------
# Report

OPS = [
    ("save", "save (pool.save / torch.save+fsync / straw publish / raw write+fsync)"),
    ("writer", "save streaming (pool.writer, add() per sample)"),
    ("load_all", "load all (open + load_samples / torch.load / straw read / raw read)"),
    ("load_arrays", "load all, numeric lists as numpy arrays (load_samples(as_arrays=True))"),
    ("load_one_open", "one sample by key on an open archive (torch: whole file)"),
    ("load_one", "one sample by key (torch: whole file; straw: its 64-sample record)"),
    ("load_task", "one task key (8 samples; torch: whole file; straw: its record)"),
    ("sample_metadata", "sample_metadata() of every sample"),
    ("find", "find(task_key=...)"),
    ("release_gc", "release() + gc(grace=0)"),
    ("export", "Parquet export (pool.export / pyarrow by hand: load, to_dict, write_table)"),
    ("save_s3", "save to S3 (juicefs gateway on loopback; local: the same save to a folder)"),
]
TOOLS = [
    ("archive_manager", "archive_manager"),
    ("torch", "torch"),
    ("straw", "straw"),
    ("seed", "straw seed"),
    ("raw", "raw disk"),
    ("pyarrow", "pyarrow by hand"),
    ("write_alone", "write only"),
    ("inflate_alone", "inflate only"),
    ("tensors_alone", "tensors only"),
    ("parts_alone", "all parts only"),
    ("lists_alone", "numbers only"),
    ("local", "local save"),
]


# The floors measured beside issue 37's rows: the tool whose time each bounds, the report's
# note ({} the most the row's ratio could be) and the targets' words for it.
FLOORS: dict[str, tuple[str, str, str]] = {
    "inflate_alone": (
        "torch",
        "the floor: its chunks read and inflated, nothing decoded; any load is at most "
        "{:.2f}x faster than torch.load",
        "inflating its chunks only",
    ),
    "lists_alone": (
        "torch",
        "the floor: its chunks inflated, its numbers made from ready arrays (tolist); any "
        "list load is at most {:.2f}x faster than torch.load",
        "inflating and tolist only",
    ),
    "tensors_alone": (
        "torch",
        "its tensor blobs mapped, checked and used, nothing else: at most {:.2f}x faster than "
        "torch.load for them",
        "its tensors only",
    ),
    "parts_alone": (
        "torch",
        "the floor: those tensors, its chunks inflated and its numbers made from ready arrays "
        "(tolist); any load is at most {:.2f}x faster than torch.load",
        "its tensors, chunks and numbers only",
    ),
    "write_alone": (
        "pyarrow",
        "the floor: pyarrow writing the export's table as it does, synced; the export is at "
        "most {:.2f}x faster than by hand",
        "the write alone",
    ),
}


def _floor(by: dict[str, float], *tools: str) -> str:
    """`` (floor Nx: ...)`` for the first of ``tools`` (`FLOORS`) measured in ``by``, else
    ""."""
    for tool in tools:
        if by.get(tool):
            peer, _, words = FLOORS[tool]
            return f" (floor {by[peer] / by[tool]:.2f}x: {words})"
    return ""


def _ratio(peer: float | None, mine: float | None) -> str:
    if not peer or not mine:
        return "-"
    return f"{peer / mine:.1f}x" if peer / mine < 100 else f"{peer / mine:.0f}x"


def _secs(s: float) -> str:
    return f"{s * 1e3:8.2f} ms" if s < 0.1 else f"{s:8.3f} s "


def report(r: dict) -> str:
    lines = [
        f"== {r['workload']}: {r['description']}",
        f"   {r['samples']} samples, {r['nbytes'] / 1e6:.1f} MB in memory as raw arrays; "
        f"medians of {r['repeat']} runs ({r['point_reads']} random keys for point reads)",
        f"   {'operation':<22}{'tool':<17}{'time':>11}{'MB/s':>9}   archive_manager is",
    ]
    secs = r["seconds"]
    for op, _text in OPS:
        by = secs.get(op)
        if not by:
            continue
        mine = by.get("archive_manager")
        for tool, label in TOOLS:
            if tool not in by:
                continue
            s = by[tool]
            mbs = (r["bytes"]["raw"] if tool == "raw" else r["nbytes"]) / 1e6 / s
            if tool == "archive_manager":
                note = ""
            elif tool == "local":
                note = f"S3 save takes {mine / s:.2f}x the local save's time" if mine else ""
            elif tool == "raw":
                note = f"{s / mine * 100:.0f}% of raw speed" if mine else ""
            elif tool in FLOORS:
                peer_tool, text, _ = FLOORS[tool]
                peer = by.get(peer_tool)
                note = text.format(peer / s) if peer else ""
            else:
                note = f"{_ratio(s, mine)} faster than {label}"
            lines.append(f"   {op if tool == 'archive_manager' else '':<22}{label:<17}"
                         f"{_secs(s):>11}{mbs:9.0f}   {note}")  # fmt: skip
    b = r["bytes"]
    lines.append(
        f"   {'bytes on disk':<22}archive_manager {b['archive_manager'] / 1e6:.1f} MB "
        f"(blobs {b['archive_manager_blobs'] / 1e6:.1f} MB + catalog), torch "
        f"{b['torch'] / 1e6:.1f} MB ({b['archive_manager'] / b['torch']:.2f}x)"
        + (
            f", straw {b['straw'] / 1e6:.1f} MB ({b['archive_manager'] / b['straw']:.2f}x)"
            if b.get("straw")
            else ""
        )
    )
    return "\n".join(lines)


def report_memory(m: dict) -> str:
    size = m["samples_nbytes"]
    lines = [
        f"== peak memory, {m['workload']}, a fresh process per operation: {m['method']}; "
        f"the samples' own size is {size / 1e6:.1f} MB (see samples_nbytes)"
    ]
    for op, peak in m["peak_above_baseline"].items():
        lines.append(f"   {op:<16}{peak / 1e6:9.1f} MB  {peak / size:5.2f}x the samples' size")
    return "\n".join(lines)


def targets(results: dict[str, dict], memory: dict | None) -> list[tuple[str, bool, str]]:
    """The issue's targets, each with whether it holds and the figures."""
    out: list[tuple[str, bool, str]] = []
    real = results.get("realistic-1024")
    if real:
        s, b = real["seconds"], real["bytes"]
        am_save, am_load, one = (
            s["save"]["archive_manager"],
            s["load_all"]["archive_manager"],
            s["load_one"]["archive_manager"],
        )
        r = s["save"]["torch"] / am_save
        out.append(("save >= 8x faster than torch.save", r >= 8, f"{r:.1f}x"))
        if "straw" in s["save"]:
            r = s["save"]["straw"] / am_save
            out.append(("save >= 3x faster than straw", r >= 3, f"{r:.1f}x"))
        if "seed" in s["save"]:
            r = s["save"]["seed"] / am_save
            out.append(("save >= 40x faster than the straw-backed seed", r >= 40, f"{r:.1f}x"))
        r = s["load_all"]["torch"] / am_load
        out.append(("load all >= 5x faster than torch.load", r >= 5, f"{r:.1f}x"))
        if "load_arrays" in s:
            r = s["load_all"]["torch"] / s["load_arrays"]["archive_manager"]
            out.append(
                ("load all as_arrays=True >= 5x faster than torch.load", r >= 5, f"{r:.1f}x")
            )
        r = s["load_all"]["torch"] / am_load
        out.append(("load all as lists >= 3.5x faster than torch.load (issue 37)", r >= 3.5,
                    f"{r:.2f}x{_floor(s['load_all'], 'lists_alone')}"))  # fmt: skip
        if "load_one_open" in s:
            t = s["load_one_open"]["archive_manager"]
            out.append(
                ("one key on an open archive <= 1 ms (issue 37)", t <= 1e-3, f"{t * 1e3:.2f} ms")
            )
        r = s["load_all"]["torch"] / one
        out.append(("one sample >= 100x faster than torch.load", r >= 100, f"{r:.0f}x"))
        out.append(("one sample < 5 ms", one < 5e-3, f"{one * 1e3:.2f} ms"))
        r = b["archive_manager"] / b["torch"]
        out.append(("bytes on disk <= 0.6x torch.save's", r <= 0.6, f"{r:.2f}x"))
        out.append(("bytes on disk <= 0.5x torch.save's (issue 37)", r <= 0.5, f"{r:.2f}x"))
    r3 = results.get("r3")
    if r3:
        r = r3["seconds"]["save"]["raw"] / r3["seconds"]["save"]["archive_manager"]
        out.append(("R3 save >= 60% of raw write speed", r >= 0.6, f"{r * 100:.0f}%"))
    for name, kind in (("r3-40", "torch tensors"), ("r3-40-numpy", "numpy arrays")):
        if name in results:
            s = results[name]["seconds"]["load_all"]
            r = s["torch"] / s["archive_manager"]
            out.append(
                (
                    f"R3 load with {kind}, every one used, >= 2x torch.load (issue 37)",
                    r >= 2,
                    f"{r:.2f}x{_floor(s, 'inflate_alone', 'parts_alone')}",
                )
            )
    for name in ("r3-40", "r3-40-numpy"):
        s = results.get(name, {}).get("seconds", {}).get("export")
        if s:
            r = s["pyarrow"] / s["archive_manager"]
            out.append(
                (f"{name} Parquet export >= 1.5x pyarrow by hand (issue 37)", r >= 1.5,
                 f"{r:.2f}x{_floor(s, 'write_alone')}")
            )  # fmt: skip
    s3 = (real or {}).get("seconds", {}).get("save_s3")
    if s3:
        r = s3["archive_manager"] / s3["local"]
        out.append(("S3 save <= 1.25x the local save (issue 37)", r <= 1.25, f"{r:.2f}x"))
    if memory:
        r = memory["peak_above_baseline"]["am-save"] / memory["samples_nbytes"]
        out.append(("save peak memory <= 1.5x the samples' size", r <= 1.5, f"{r:.2f}x"))
    return out


def machine() -> dict[str, Any]:
    info: dict[str, Any] = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "load_average": os.getloadavg(),
    }
    try:
        model = [
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ]
        info["cpu"] = model[0] if model else None
    except OSError:
        info["cpu"] = None
    return info


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--quick", action="store_true", help="tiny sizes, one run: a smoke test")
    ap.add_argument(
        "--workloads",
        default=",".join(WORKLOADS),
        help=f"comma-separated, from {', '.join(WORKLOADS)} (default: all)",
    )
    ap.add_argument("--repeat", type=int, default=None, help="runs per timing (default 5; 1 quick)")
    ap.add_argument("--keys", type=int, default=None, help="random keys for point reads")
    ap.add_argument("--no-memory", action="store_true", help="skip the peak-memory subprocesses")
    ap.add_argument(
        "--no-seed",
        action="store_true",
        help="skip the straw-backed seed's save (about 20 s a run on realistic-1024)",
    )
    ap.add_argument(
        "--no-s3",
        action="store_true",
        help="skip the S3 save row (realistic-1024: a juicefs gateway started on loopback)",
    )
    ap.add_argument("--dir", type=Path, default=None, help="work folder (default: a temp dir)")
    ap.add_argument("--json", type=Path, default=None, help="also write every figure here")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--child-path", type=Path, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    names = [n.strip() for n in args.workloads.split(",") if n.strip()]
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown:
        ap.error(f"unknown workload(s) {', '.join(unknown)}; known: {', '.join(WORKLOADS)}")
    if args.child:
        child_main(args.child, names[0], args.quick, args.child_path)
        return 0
    repeat = args.repeat or (1 if args.quick else 5)
    keys = args.keys or (3 if args.quick else 25)
    if repeat < 1 or keys < 1:
        ap.error("--repeat and --keys must be >= 1")

    info = machine()
    print(
        f"archive_manager end-to-end benchmark, {info['date']}, {info['cpus']} CPUs "
        f"({info['cpu']}), Python {info['python']}, torch {info['torch']}, load average "
        + " ".join(f"{x:.1f}" for x in info["load_average"])
    )
    if STRAW_SKIPPED:
        print(f"straw column skipped: {STRAW_SKIPPED}")
    base = Path(tempfile.mkdtemp(prefix="bench-", dir=args.dir))
    results: dict[str, dict] = {}
    memory = None
    try:
        for name in names:
            work = base / name
            work.mkdir()
            results[name] = measure(
                WORKLOADS[name], args.quick, repeat, work, keys, seed=not args.no_seed
            )
            if name == "realistic-1024" and not args.no_s3:
                s3, why = measure_s3(WORKLOADS[name].make(args.quick), repeat, work)
                if s3 is None:
                    print(why)
                else:
                    results[name]["seconds"]["save_s3"] = s3
            shutil.rmtree(work, ignore_errors=True)
            print(report(results[name]), flush=True)
        if not args.no_memory:
            work = base / "memory"
            work.mkdir()
            memory = measure_memory(args.quick, work)
            print(report_memory(memory))
    finally:
        shutil.rmtree(base, ignore_errors=True)
    info["load_average_after"] = os.getloadavg()
    print("load average at the end: " + " ".join(f"{x:.1f}" for x in info["load_average_after"]))
    checks = targets(results, memory)
    if checks:
        print("== targets (ratios from this run)")
        for text, ok, figure in checks:
            print(f"   {'holds' if ok else 'MISSED':<7}{text}: {figure}")
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "machine": info,
                    "quick": args.quick,
                    "straw_skipped": STRAW_SKIPPED,
                    "results": results,
                    "memory": memory,
                    "targets": [{"target": t, "holds": ok, "figure": f} for t, ok, f in checks],
                },
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
