# ruff: noqa
# mypy: ignore-errors
"""Re-implementation of the seed's on-disk format (vllm-project/vime @ 8c1c944b).

The seed's writer for tests (a port of vime @ 8c1c944b; mirrors):
  vime/data/codec.py      SampleCodec.prepare/_publish/load   (tagged-JSON "vime.v1" records)
  vime/data/transport.py  DiskPayloadRef                      (chunk reference in the index)
  vime/data/archive.py    RolloutArchive.save / __init__ / load_samples / check_metadata
  vime/data/sample_metadata.py describe_sample / validate_sample_metadata
  vime/utils/types.py     Sample: tests/frameworks/vime (vime itself is not installable)

Needs only PyPI straw-queue==0.1.6 (+ its numpy/torch).  Not the seed's code: the parts that
need vime (args-driven R3/top-p validation in SampleCodec._prepare_sample, DynamicFilterOutput,
PIL images, RawRolloutRef/RolloutGroupRef/TrainBatchRef extras) are reduced or omitted, as noted.
"""

from __future__ import annotations

import base64
import copy
import dataclasses
import json
import math
import sys
import threading
import uuid
from dataclasses import asdict, dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

import numpy as np
import torch
from straw import Publication, Record
from straw.errors import CorruptData, InvalidReference, UnsupportedSchema
from straw.protocol import RecordSetRef, decode, digest, encode
from straw.reporting import write_report
from straw.store import MAX_RECORDS, SharedFilesystemStore
from straw.tensor import MAX_PUBLICATION_BYTES, MAX_TENSOR_BYTES
from straw.tensor import TensorRef as QueueTensorRef
from straw.tensor import tensor_record

FORMAT = "vime.straw-debug"  # slime's earlier copy wrote "slime.straw-debug" (THUDM/slime)
CODECS = ("bytes.v1", "json.v1", "vime.v1", "tensor.v1")
CHUNK = 64
CAPTURE_FIELDS = (
    "rollout_routed_experts",
    "rollout_topk_token_ids",
    "rollout_topk_log_probs",
    "rollout_top_p_token_ids",
    "rollout_top_p_token_offsets",
    "rollout_top_p_log_probs",
)
LIVE_QUEUE_FIELDS = (
    "_queue_lease",
    "_queue_receipt",
    "_queue_source_positions",
    "_queue_generation_start",
    "_queue_resume_origin",
)


# ----------------------------------------------------------------------------- Sample stand-in
# vime's Sample: the project's one field-for-field stand-in (tests/frameworks/vime/utils/types.py),
# under vime's module path, so that what the seed writes is what a vime rollout hands it.
_FRAMEWORKS = str(Path(__file__).resolve().parent / "frameworks")
if _FRAMEWORKS not in sys.path:
    sys.path.insert(0, _FRAMEWORKS)
from vime.utils.types import Sample  # noqa: E402


@dataclass(frozen=True)
class DiskPayloadRef:
    """Stand-in for vime.data.transport.DiskPayloadRef (only what the index needs)."""

    manifest: RecordSetRef
    root: str
    path: tuple = field(default=(), kw_only=True)
    sample_metadata: list | None = field(default=None, kw_only=True)


def open_store(root, run_id, **kw):
    """How every seed reader opens a pool (archive.py __init__, DiskPayloadRef.load)."""
    return SharedFilesystemStore(
        root,
        run_id,
        codecs=CODECS,
        max_record_bytes=MAX_TENSOR_BYTES,
        max_buffer_bytes=MAX_PUBLICATION_BYTES,
        **kw,
    )


# ----------------------------------------------------------------------------- codec
class SeedCodec:
    """vime.data.codec.SampleCodec without args validation (args=None path)."""

    def __init__(self, store):
        if sys.byteorder != "little":
            raise UnsupportedSchema("Version 1 tensor codec requires a little-endian host")
        if not set(CODECS).issubset(store.codecs):
            raise ValueError("SampleCodec requires explicit vime.v1 and tensor.v1 store codecs")
        self.store = store

    def publish(self, value, *, submission_id, metadata=None):
        publications = self.prepare(value, submission_id=submission_id, metadata=metadata)
        return self._publish(publications, submission_id=submission_id)[-1]

    def _publish(self, publications, *, submission_id):
        refs, start = [], 0
        while start < len(publications):
            stop, count = start, 0
            while stop < len(publications):
                records = publications[stop].records
                if stop > start and count + len(records) + 1 > MAX_RECORDS:
                    break
                count += len(records) + 1
                stop += 1
            batch = [
                Publication(
                    p.records,
                    tuple(
                        (refs[d] if d < start else d - start) if type(d) is int else d
                        for d in p.dependencies
                    ),
                )
                for p in publications[start:stop]
            ]
            refs.extend(
                self.store.publish_many(batch, submission_id=f"{submission_id}:part:{start}")
            )
            start = stop
        return refs

    def prepare(self, value, *, submission_id, metadata=None):
        blobs, aliases, dependencies, positions_of = [], {}, [], {}
        keep_alive = []
        token_count = 0

        def tensor(value, *, lazy=False, kind=None, validated=False):
            identity = (id(value), lazy, kind, validated)
            if identity in aliases:
                return aliases[identity]
            keep_alive.append(value)
            if isinstance(value, QueueTensorRef) and value.shares_storage(self.store):
                dep, ordinal = value.share(
                    self.store, submission_id=f"{submission_id}:retain:{len(dependencies)}"
                )
                if dep not in positions_of:
                    positions_of[dep] = len(dependencies)
                    dependencies.append(dep)
                node = [
                    "tensor",
                    {"dependency": positions_of[dep], "ordinal": ordinal},
                    list(value.shape),
                    value.dtype,
                    lazy,
                    value.kind,
                    validated or value.validated,
                ]
                aliases[identity] = node
                return node
            if isinstance(value, QueueTensorRef):
                kind, validated = kind or value.kind, validated or value.validated
                value = value.load()
            if isinstance(value, np.ndarray):
                value = torch.from_numpy(np.array(value, copy=True))
            record = tensor_record(value, f"{submission_id}:tensor:{len(blobs)}", kind=kind)
            node = [
                "tensor",
                len(blobs),
                record.metadata["shape"],
                record.metadata["dtype"],
                lazy,
                kind,
                validated,
            ]
            aliases[identity] = node
            blobs.append(record)
            return node

        active = set()

        def visit(value):
            nonlocal token_count
            if isinstance(value, DiskPayloadRef):
                if value.manifest not in positions_of:
                    positions_of[value.manifest] = len(dependencies)
                    dependencies.append(value.manifest)
                extra = {}
                if value.path:
                    extra["path"] = value.path
                if value.sample_metadata is not None:
                    extra["sample_metadata"] = value.sample_metadata
                return [
                    "rollout-ref",
                    type(value).__name__,
                    positions_of[value.manifest],
                    visit(extra),
                ]
            if value is None or type(value) in (str, bool, int):
                return value
            if type(value) is float:
                return value if math.isfinite(value) else ["float", repr(value)]
            if isinstance(value, (QueueTensorRef, torch.Tensor)):
                return tensor(value, lazy=isinstance(value, QueueTensorRef))
            if isinstance(value, np.ndarray):
                return ["ndarray", tensor(value)]
            if isinstance(value, np.generic):
                return visit(value.item())
            if isinstance(value, (bytes, bytearray)):
                return ["bytes", base64.b64encode(value).decode("ascii")]
            if isinstance(value, Sample.Status):
                return ["status", value.value]
            if isinstance(value, RecordSetRef):
                if value not in positions_of:
                    positions_of[value] = len(dependencies)
                    dependencies.append(value)
                return ["record-set", positions_of[value]]
            identity = id(value)
            if identity in active:
                raise TypeError(
                    "Cyclic custom fields are not supported by the durable Sample codec"
                )
            active.add(identity)
            try:
                if isinstance(value, Sample):
                    token_count += len(value.tokens)
                    validated = set()  # seed: SampleCodec._prepare_sample(value) when args given
                    fields = []
                    for key, child in vars(value).items():
                        if child is not None and key in CAPTURE_FIELDS:
                            if key == "rollout_routed_experts" and not isinstance(
                                child, QueueTensorRef
                            ):
                                child = value.materialize_rollout_routed_experts(replace=False)
                            elif not isinstance(child, QueueTensorRef):
                                array = np.asarray(child)
                                dtype = None
                                if key in validated or array.size == 0:
                                    dtype = (
                                        torch.float32 if key.endswith("log_probs") else torch.int32
                                    )
                                child = torch.as_tensor(array.copy(), dtype=dtype)
                            node = tensor(child, lazy=True, kind=key, validated=key in validated)
                        else:
                            node = visit(child)
                        fields.append([visit(key), node])
                    return ["sample", ["dict", fields]]
                if isinstance(value, Sample.SpecInfo):
                    return ["spec-info", visit(vars(value))]
                if isinstance(value, Sample.PrefixCacheInfo):
                    return ["prefix-cache-info", visit(vars(value))]
                if isinstance(value, dict):
                    return ["dict", [[visit(k), visit(v)] for k, v in value.items()]]
                if isinstance(value, (list, tuple)):
                    return [
                        "tuple" if isinstance(value, tuple) else "list",
                        [visit(i) for i in value],
                    ]
                # seed: DynamicFilterOutput -> ["dynamic-filter", ...]; PIL Image -> ["image-png", b64]
                raise TypeError(
                    f"Unsupported durable Sample field type: {type(value).__module__}.{type(value).__qualname__}"
                )
            finally:
                active.remove(identity)

        tree = visit(value)
        publications = []
        if blobs:
            where, start = {}, 0
            while start < len(blobs):
                stop = min(len(blobs), start + MAX_RECORDS - 1)
                dep_index = len(dependencies)
                dependencies.append(len(publications))  # local index of the blob publication
                publications.append(Publication(tuple(blobs[start:stop])))
                for i in range(start, stop):
                    where[i] = {"dependency": dep_index, "ordinal": i - start}
                start = stop
            for node in aliases.values():
                if isinstance(node[1], int):
                    node[1] = where[node[1]]
        payload = encode({"version": 1, "tree": tree})
        publications.append(
            Publication(
                (Record(submission_id, payload, "vime.v1", metadata or {}, tokens=token_count),),
                tuple(dependencies),
            )
        )
        return publications

    def load(self, ref, *, reader=None, sample_factory=None):
        if reader is None:
            with self.store.read_session() as reader:
                return self.load(ref, reader=reader, sample_factory=sample_factory)
        records = list(reader.read(ref))
        if len(records) != 1 or records[0].codec != "vime.v1":
            raise UnsupportedSchema("Expected one vime.v1 collection record")
        payload = decode(records[0].payload)
        if payload.get("version") != 1:
            raise UnsupportedSchema("Unsupported Sample codec version")
        dependencies = [RecordSetRef.from_dict(v) for v in reader.manifest(ref)["dependencies"]]
        aliases, tensor_sets = {}, {}

        def dependency(i):
            if type(i) is not int or not 0 <= i < len(dependencies):
                raise CorruptData("Sample codec dependency index is outside the manifest")
            return dependencies[i]

        def visit(node):
            if not isinstance(node, list):
                return node
            tag = node[0]
            if tag == "rollout-ref":
                if (
                    node[1] != "DiskPayloadRef"
                ):  # seed also knows RawRolloutRef/RolloutGroupRef/TrainBatchRef
                    raise UnsupportedSchema(f"Unknown rollout reference type: {node[1]}")
                return DiskPayloadRef(
                    dependency(node[2]), str(self.store.backend.root), **visit(node[3])
                )
            if tag == "dict":
                return {visit(k): visit(v) for k, v in node[1]}
            if tag in {"list", "tuple"}:
                items = [visit(i) for i in node[1]]
                return tuple(items) if tag == "tuple" else items
            if tag == "sample":
                values = visit(node[1])
                if sample_factory is not None:
                    return sample_factory(values)
                names = {f.name for f in dataclasses.fields(Sample)}
                sample = Sample(**{k: v for k, v in values.items() if k in names})
                for k, v in values.items():
                    if k not in names:
                        setattr(sample, k, v)
                return sample
            if tag == "spec-info":
                return Sample.SpecInfo(**visit(node[1]))
            if tag == "prefix-cache-info":
                return Sample.PrefixCacheInfo(**visit(node[1]))
            if tag == "status":
                return Sample.Status(node[1])
            if tag == "float":
                if node[1] not in {"inf", "-inf", "nan"}:
                    raise CorruptData("Invalid special float")
                return float(node[1])
            if tag == "bytes":
                return base64.b64decode(node[1], validate=True)
            if tag == "record-set":
                value = dependency(node[1])
                reader.validate(value)
                return value
            if tag == "tensor":
                key = (encode(node[1]), node[4])
                if key not in aliases:
                    dep = node[1]["dependency"]
                    if dep not in tensor_sets:
                        tensor_sets[dep] = QueueTensorRef.from_record_set_many(
                            self.store, dependency(dep), reader=reader
                        )
                    ordinal = node[1]["ordinal"]
                    if type(ordinal) is not int or ordinal not in tensor_sets[dep]:
                        raise CorruptData(
                            "Tensor ordinal does not name a tensor in the publication"
                        )
                    value = dataclasses.replace(tensor_sets[dep][ordinal], validated=node[6])
                    if value.shape != tuple(node[2]) or value.dtype != node[3]:
                        raise CorruptData(
                            "Sample tensor descriptor disagrees with its storage record"
                        )
                    value = dataclasses.replace(value, kind=node[5])
                    aliases[key] = value if node[4] else value.load(reader=reader)  # lazy flag
                return aliases[key]
            if tag == "ndarray":
                return visit(node[1]).numpy()
            raise UnsupportedSchema(
                f"Unknown Sample codec tag: {tag!r}"
            )  # seed: also dynamic-filter, image-png

        return visit(payload["tree"])


# ----------------------------------------------------------------------------- metadata
def describe_sample(sample):
    """vime/data/sample_metadata.py describe_sample, verbatim logic."""
    tensors = {}
    for name in CAPTURE_FIELDS:
        value = getattr(sample, name, None)
        if value is None:
            continue
        shape, dtype = getattr(value, "shape", None), getattr(value, "dtype", None)
        if name == "rollout_routed_experts" and isinstance(value, (list, tuple)) and value:
            shapes = [tuple(p.shape) for p in value]
            if any(p[1:] != shapes[0][1:] for p in shapes):
                raise ValueError("Routed-experts chunks have different layer/expert shapes")
            shape, dtype = (sum(p[0] for p in shapes), *shapes[0][1:]), value[0].dtype
        elif shape is None:
            array = np.asarray(value)
            shape, dtype = array.shape, array.dtype
        tensors[name] = {"shape": list(shape), "dtype": str(dtype).removeprefix("torch.")}
    return {
        "index": sample.index.item() if isinstance(sample.index, np.generic) else sample.index,
        "group_index": sample.group_index.item()
        if isinstance(sample.group_index, np.generic)
        else sample.group_index,
        "status": sample.status.value,
        "tokens": len(sample.tokens),
        "response_length": sample.response_length,
        "loss_mask": len(sample.loss_mask) if sample.loss_mask is not None else None,
        "rollout_log_probs": len(sample.rollout_log_probs)
        if sample.rollout_log_probs is not None
        else None,
        "tensors": tensors,
    }


def validate_sample_metadata(metadata, args):
    """vime/data/sample_metadata.py validate_sample_metadata, verbatim logic."""
    for sample in metadata:
        count = sample["response_length"]
        if not 0 <= count <= sample["tokens"]:
            raise ValueError("Response length exceeds the token count")
        for name in ("loss_mask", "rollout_log_probs"):
            if sample[name] is not None and sample[name] != count:
                raise ValueError(f"{name} length does not match the response length")
        tensors = sample["tensors"]
        routes = tensors.get("rollout_routed_experts")
        if getattr(args, "use_rollout_routing_replay", False) and routes is not None:
            expected = [max(0, sample["tokens"] - 1), int(args.num_layers), args.moe_router_topk]
            if routes["shape"] != expected or not np.issubdtype(
                np.dtype(routes["dtype"]), np.integer
            ):
                raise ValueError("Routed-experts shape/dtype does not match tokens and model")
        if not getattr(args, "use_score_centering", False):
            continue
        top_p = getattr(args, "rollout_top_p", 1.0) < 1
        prefix = "rollout_top_p" if top_p else "rollout_topk"
        ids, logps = tensors.get(prefix + "_token_ids"), tensors.get(prefix + "_log_probs")
        if ids is None or logps is None:
            raise ValueError("Missing sampler capture metadata")
        if (
            ids["shape"] != logps["shape"]
            or not np.issubdtype(np.dtype(ids["dtype"]), np.integer)
            or not np.issubdtype(np.dtype(logps["dtype"]), np.floating)
        ):
            raise ValueError("Sampler ids/logprobs shape/dtype mismatch")
        if top_p:
            offsets = tensors.get(prefix + "_token_offsets")
            if (
                len(ids["shape"]) != 1
                or offsets is None
                or offsets["shape"] != [count + 1]
                or not np.issubdtype(np.dtype(offsets["dtype"]), np.integer)
            ):
                raise ValueError("Sampler top-p offsets/shape mismatch")
        elif ids["shape"] != [count, args.score_centering_top_k]:
            raise ValueError("Sampler top-k shape mismatch")


# ----------------------------------------------------------------------------- archive save
def _entry(sample, position, chunk=None, offset=0):
    context = getattr(sample, "_queue_receipt", None) or getattr(sample, "_queue_lease", None)
    entry = {
        "sample_key": f"sample:{sample.index}"
        if sample.index is not None
        else f"position:{position}",
        "task_key": context["task_id"] if context else None,
    }
    if chunk is not None:
        entry["chunk"] = chunk
    entry["offset"] = offset
    return entry


def seed_save(path, samples, *, rollout_id, evaluation=False, store=None):
    """RolloutArchive.save (archive.py @ 8c1c944b), chunk mode.

    store=None: the standalone pool (args None or not straw transport):
      <index dir>/straw-data, run id "debug-rollout", online_gc=True, closed afterwards.
    store=<SharedFilesystemStore>: the shared-pool mode (seed: rollout_store(args), pool
      args.rollout_data_dir, run args.rollout_queue_run_id or "rollout"); not closed.
    Returns None, like the seed.
    """
    path = Path(path)
    if path.exists():
        raise FileExistsError(f"Rollout archives are immutable; choose a new path: {path}")
    shared = store is not None
    if not shared:
        store = open_store(path.parent / "straw-data", "debug-rollout", online_gc=True)
    codec, lock = SeedCodec(store), threading.RLock()
    try:
        chunks, entries, sample_metadata = [], [], []
        with lock:
            for start in range(0, len(samples), CHUNK):
                chunk = samples[start : start + CHUNK]
                ref = codec.publish(chunk, submission_id=f"debug-chunk:{uuid.uuid4().hex}")
                for offset, sample in enumerate(chunk):
                    sample_metadata.append(describe_sample(sample))
                    entries.append(_entry(sample, start + offset, len(chunks), offset))
                chunks.append(DiskPayloadRef(ref, str(store.backend.root)))
            manifest = codec.publish(
                {"chunks": chunks, "entries": entries},
                submission_id=f"debug-index:{uuid.uuid4().hex}",
            )
            owner = f"debug:{path.resolve()}:{digest(asdict(manifest))}"
            store.retain(owner, [manifest])
            store.release_publications([manifest])
            write_report(
                path,
                {
                    "format": FORMAT,
                    "version": 1,
                    "rollout_id": rollout_id,
                    "evaluation": evaluation,
                    "root": str(store.backend.root),
                    "manifest": asdict(manifest),
                    "storage_owner": owner,
                    "sample_metadata": {"version": 1, "samples": sample_metadata},
                },
            )
    finally:
        if not shared:
            store.close()


# ----------------------------------------------------------------------------- archive read
class SeedArchive:
    """RolloutArchive reader (archive.py @ 8c1c944b), chunk mode ("raw" mode needs vime's
    load_rollout_samples and is reported, not implemented)."""

    def __init__(self, path, *, root=None, formats=(FORMAT,)):
        self.path = Path(path)
        self.index = json.loads(self.path.read_text())
        if self.index.get("format") not in formats or self.index.get("version") != 1:
            raise ValueError(f"Unsupported straw rollout archive: {path}")
        self.manifest = RecordSetRef.from_dict(self.index["manifest"])
        self.store = open_store(root or self.index["root"], self.manifest.manifest.segment.run_id)
        self.codec = SeedCodec(self.store)
        self.contents = self.codec.load(self.manifest)

    def keys(self):
        return [(e["sample_key"], e["task_key"]) for e in self.contents["entries"]]

    def load_samples(self, *, sample_key=None, task_key=None):
        selected = [
            e
            for e in self.contents["entries"]
            if (sample_key is None or e["sample_key"] == sample_key)
            and (task_key is None or e["task_key"] == task_key)
        ]
        if not selected and (sample_key is not None or task_key is not None):
            raise KeyError((sample_key, task_key))
        if "raw" in self.contents and selected:
            raise NotImplementedError(
                "reference (raw) archives need vime.data.transport.load_rollout_samples"
            )
        loaded, result = {}, []
        for e in selected:
            chunk = e.get("chunk", "raw")
            if chunk not in loaded:
                loaded[chunk] = self.codec.load(self.contents["chunks"][chunk].manifest)
            sample = copy.copy(loaded[chunk][e["offset"]])
            for name in LIVE_QUEUE_FIELDS:
                sample.__dict__.pop(name, None)
            result.append(sample)
        return result

    def export_pt(self, path):
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save(
            materialize_tensor_refs(
                {
                    "rollout_id": self.index["rollout_id"],
                    "samples": [s.to_dict() for s in self.load_samples()],
                }
            ),
            path,
        )

    def release(self):
        return self.store.release(self.index["storage_owner"])

    def close(self):
        self.store.close()

    def __enter__(self):
        return self

    def __exit__(self, *_):
        self.close()


def materialize_tensor_refs(value):
    if isinstance(value, QueueTensorRef):
        return value.load()
    if isinstance(value, dict):
        return {k: materialize_tensor_refs(v) for k, v in value.items()}
    if isinstance(value, list):
        return [materialize_tensor_refs(v) for v in value]
    if isinstance(value, tuple):
        return tuple(materialize_tensor_refs(v) for v in value)
    return value


def check_metadata(path, args, *, formats=(FORMAT,)):
    """RolloutArchive.check_metadata (staticmethod) @ 8c1c944b; reads only JSON files."""
    path = Path(path)
    index = json.loads(path.read_text())
    if index.get("format") not in formats or index.get("version") != 1:
        raise ValueError("Unsupported rollout archive")
    metadata = index.get("sample_metadata")
    if metadata is None:
        sidecar = json.loads(path.with_suffix(path.suffix + ".metadata.json").read_text())
        if sidecar["manifest_digest"] != index["manifest"]["digest"]:
            raise ValueError("Metadata sidecar belongs to a different archive")
        metadata = sidecar["sample_metadata"]
    if metadata.get("version") != 1:
        raise ValueError("Unsupported sample metadata version")
    validate_sample_metadata(metadata["samples"], args)
    return metadata["samples"]


def rewrite_contents(src_index, dst_index, mutate):
    """A copy of the seed index ``src_index`` at ``dst_index`` whose index record (its
    ``entries`` and ``chunks``) was changed by ``mutate(contents)`` and published again into
    the same straw pool, as the seed's save publishes it: damage inside the record."""
    archive = SeedArchive(src_index)
    try:
        contents = {
            "chunks": list(archive.contents["chunks"]),
            "entries": [dict(e) for e in archive.contents["entries"]],
        }
        contents = mutate(contents) or contents
        manifest = archive.codec.publish(contents, submission_id=f"debug-index:{uuid.uuid4().hex}")
        owner = f"debug:{Path(dst_index).resolve()}:{digest(asdict(manifest))}"
        archive.store.retain(owner, [manifest])
        archive.store.release_publications([manifest])
        index = dict(archive.index)
        index["manifest"] = asdict(manifest)
        index["storage_owner"] = owner
        write_report(Path(dst_index), index)
    finally:
        archive.close()
