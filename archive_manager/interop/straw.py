"""The seed's archives (vime's and slime's straw-backed ``RolloutArchive``), read-only.

A seed index (``"format": "vime.straw-debug"`` or ``"slime.straw-debug"``, version 1) names
a straw-queue pool and the record set of its index; the samples are tagged-JSON trees in
``vime.v1`` records, tensors in ``tensor.v1`` records (docs/dropin.md).  This module reads
them through the ``straw-queue`` package (the ``straw`` extra), imported on
first use.  Nothing here unpickles, and no class a payload names is ever imported: the
``"sample"`` tag rebuilds the class registered in this process for the seed's
``<framework>.utils.types.Sample`` (`archive_manager.samples.fields_to_sample`), else a dict.

Straw's reader registers itself as a writer in the pool's ``control/`` folder (straw's own
behaviour); this module never publishes, retains or releases anything there.
"""

from __future__ import annotations

import base64
import dataclasses
import enum
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..errors import IntegrityError, MissingDependencyError, UnsupportedFormatError, extra_hint
from ..samples import QUEUE_PREFIX, fields_to_sample, record_to_enum, record_to_value

__all__ = [
    "CAPTURE_FIELDS",
    "KEPT_QUEUE_PREFIX",
    "LIVE_QUEUE_FIELDS",
    "SEED_FORMATS",
    "StrawArchive",
]

#: The index formats of the seed (vime's ``RolloutArchive``, and slime's earlier copy), both
#: version 1, and the framework whose ``Sample`` each holds.
SEED_FORMATS = {"vime.straw-debug": "vime", "slime.straw-debug": "slime"}
#: The live queue state the seed strips from every sample it loads (and so does the facade).
LIVE_QUEUE_FIELDS = (
    "_queue_lease",
    "_queue_receipt",
    "_queue_source_positions",
    "_queue_generation_start",
    "_queue_resume_origin",
)
#: The pool drops every undeclared ``_queue_*`` attribute at save; the seed keeps all but
#: `LIVE_QUEUE_FIELDS`.  The facade saves those others as ``_kept_queue_<rest>`` and loads
#: them back under their own names (a pool reader that is not the facade sees the stored name).
KEPT_QUEUE_PREFIX = "_kept_queue_"
#: The seed's sampler and router captures: always lazy (``.load()``) when loaded.
CAPTURE_FIELDS = (
    "rollout_routed_experts",
    "rollout_topk_token_ids",
    "rollout_topk_log_probs",
    "rollout_top_p_token_ids",
    "rollout_top_p_token_offsets",
    "rollout_top_p_log_probs",
)
_CODECS = ("bytes.v1", "json.v1", "vime.v1", "tensor.v1")
_SAMPLE_TAGS = {"vime.v1"}


def _straw() -> Any:
    try:
        import straw.protocol  # type: ignore[import-untyped]
        import straw.store  # type: ignore[import-untyped]
        import straw.tensor  # type: ignore[import-untyped]
    except ImportError as exc:
        raise MissingDependencyError(
            "reading a seed (straw) archive needs the straw-queue package; " + extra_hint("straw")
        ) from exc
    return straw


def read_index(path: Path) -> dict[str, Any]:
    """The seed index at ``path``, checked to be one.

    Raises:
        FileNotFoundError: no file.
        UnsupportedFormatError: not JSON, not an object, another format or version, or
            lacking ``manifest``/``root``.
    """
    try:
        document = json.loads(Path(path).read_bytes())
    except FileNotFoundError:
        raise
    except (OSError, ValueError, RecursionError) as exc:
        raise UnsupportedFormatError(f"{path} is not a seed archive index ({exc})") from exc
    if not isinstance(document, dict) or document.get("format") not in SEED_FORMATS:
        found = document.get("format") if isinstance(document, dict) else None
        raise UnsupportedFormatError(
            f"{path} is not a seed archive index (format {found!r}; expected one of "
            f"{', '.join(SEED_FORMATS)})"
        )
    if document.get("version") != 1:
        raise UnsupportedFormatError(
            f"{path} is seed index version {document.get('version')!r}; version 1 is read"
        )
    if not isinstance(document.get("manifest"), dict) or not isinstance(document.get("root"), str):
        raise UnsupportedFormatError(f"{path} is a seed index without a manifest or root")
    return document


def _check_entries(path: Path, contents: dict[str, Any]) -> None:
    """Every entry of a seed index record names a chunk and an offset inside it and a sample
    key, as the seed's save writes them; anything else is a damaged index, refused before a
    sample is read (a negative or bool offset would pick another sample)."""
    chunks = contents.get("chunks")
    entries = contents.get("entries")
    if not isinstance(chunks, list) or not isinstance(entries, list):
        raise IntegrityError(f"{path}: its index record's chunks or entries are not lists")
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise IntegrityError(f"{path}: entry {i} is not a mapping")
        chunk, offset = entry.get("chunk"), entry.get("offset")
        if type(chunk) is not int or not 0 <= chunk < len(chunks):
            raise IntegrityError(f"{path}: entry {i} names chunk {chunk!r:.40}")
        if type(offset) is not int or offset < 0:
            raise IntegrityError(f"{path}: entry {i} has offset {offset!r:.40}")
        if type(entry.get("sample_key")) is not str:
            raise IntegrityError(f"{path}: entry {i} has no sample key")


class StrawArchive:
    """One seed archive, open read-only: `keys`, `load_samples` (the seed's rules)."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        root: str | os.PathLike[str] | None = None,
        index: dict[str, Any] | None = None,
    ) -> None:
        self.path = Path(path)
        self.index = read_index(self.path) if index is None else index
        if self.index.get("version") != 1:
            raise UnsupportedFormatError(f"Unsupported straw rollout archive: {self.path}")
        self.framework = SEED_FORMATS[self.index["format"]]
        self.sample_class = f"{self.framework}.utils.types.Sample"
        straw = _straw()
        self._straw = straw
        try:
            self.manifest = straw.protocol.RecordSetRef.from_dict(self.index["manifest"])
            run_id = self.manifest.manifest.segment.run_id
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise UnsupportedFormatError(f"{self.path} has a malformed manifest: {exc}") from exc
        where = Path(root if root is not None else self.index["root"])
        if not where.is_dir():
            raise UnsupportedFormatError(f"{self.path} names a straw pool {where} that is gone")
        self.store = straw.store.SharedFilesystemStore(
            str(where),
            run_id,
            codecs=_CODECS,
            max_record_bytes=straw.tensor.MAX_TENSOR_BYTES,
            max_buffer_bytes=straw.tensor.MAX_PUBLICATION_BYTES,
        )
        try:
            contents = self._load(self.manifest, lazy=True)
            if not isinstance(contents, dict) or "entries" not in contents:
                raise UnsupportedFormatError(f"{self.path}: its index record holds no entries")
            if "chunks" not in contents:
                raise UnsupportedFormatError(
                    f"{self.path} is a reference (raw) seed archive, which needs vime to read"
                )
            _check_entries(self.path, contents)
            self.contents: dict[str, Any] = contents
        except BaseException:
            self.store.close()
            raise

    # ------------------------------------------------------------------ reading

    def keys(self) -> list[tuple[str, Any]]:
        return [(e["sample_key"], e["task_key"]) for e in self.contents["entries"]]

    def __len__(self) -> int:
        return len(self.contents["entries"])

    def sample_metadata(self) -> list[dict[str, Any]]:
        meta = self.index.get("sample_metadata") or {}
        return list(meta.get("samples") or [])

    def chunk_count(self) -> int:
        return len(self.contents["chunks"])

    def load_chunk(self, ordinal: int, *, lazy: bool) -> list[Any]:
        """The samples of chunk ``ordinal`` as stored (no live field stripped)."""
        ref = self.contents["chunks"][ordinal]
        samples = self._load(ref, lazy=lazy)
        if not isinstance(samples, list):
            raise IntegrityError(f"{self.path}: chunk {ordinal} is not a list of samples")
        return samples

    def load_samples(
        self,
        *,
        sample_key: str | None = None,
        task_key: Any = None,
        lazy: bool = True,
        keep_queue: bool = False,
    ) -> list[Any]:
        """The selected samples in archive order (each chunk decoded once), the seed's five
        live queue fields stripped; with ``keep_queue`` the other ``_queue_*`` names are
        renamed ``_kept_queue_*`` (what a pool keeps)."""
        entries = [
            e
            for e in self.contents["entries"]
            if (sample_key is None or e["sample_key"] == sample_key)
            and (task_key is None or e["task_key"] == task_key)
        ]
        return list(self._select(entries, lazy=lazy, keep_queue=keep_queue))

    def _select(
        self, entries: list[dict[str, Any]], *, lazy: bool, keep_queue: bool
    ) -> Iterator[Any]:
        loaded: dict[int, list[Any]] = {}
        for entry in entries:
            chunk = entry.get("chunk")
            if type(chunk) is not int or not 0 <= chunk < self.chunk_count():
                raise IntegrityError(f"{self.path}: an entry names chunk {chunk!r}")
            if chunk not in loaded:
                loaded[chunk] = self.load_chunk(chunk, lazy=lazy)
            rows = loaded[chunk]
            if entry["offset"] >= len(rows):
                raise IntegrityError(
                    f"{self.path}: an entry names offset {entry['offset']} of chunk {chunk}, "
                    f"which holds {len(rows)} samples"
                )
            yield _finish(rows[entry["offset"]], keep_queue)

    def close(self) -> None:
        self.store.close()

    def __enter__(self) -> StrawArchive:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ decoding

    def _load(self, ref: Any, *, lazy: bool) -> Any:
        straw = self._straw
        errors = _straw_errors()
        try:
            with self.store.read_session() as reader:
                records = list(reader.read(ref))
                if len(records) != 1 or records[0].codec not in _SAMPLE_TAGS:
                    raise UnsupportedFormatError(
                        f"{self.path}: expected one vime.v1 record, found "
                        f"{[r.codec for r in records]}"
                    )
                payload = straw.protocol.decode(records[0].payload)
                if not isinstance(payload, dict) or payload.get("version") != 1:
                    raise UnsupportedFormatError(f"{self.path}: unsupported sample codec version")
                deps = [
                    straw.protocol.RecordSetRef.from_dict(d)
                    for d in reader.manifest(ref)["dependencies"]
                ]
                return _Decoder(self, reader, deps, lazy).visit(payload["tree"])
        except errors as exc:
            raise IntegrityError(f"{self.path}: the straw pool refused a read: {exc}") from exc


def _straw_errors() -> tuple[type[BaseException], ...]:
    from straw.errors import QueueError  # type: ignore[import-untyped]

    return (QueueError,)


def _finish(sample: Any, keep_queue: bool) -> Any:
    """A decoded sample as the seed's ``load_samples`` returns it (a shallow copy)."""
    import copy

    sample = copy.copy(sample)
    state = sample if isinstance(sample, dict) else getattr(sample, "__dict__", {})
    for name in LIVE_QUEUE_FIELDS:
        state.pop(name, None)
    if keep_queue:
        for key in [k for k in state if isinstance(k, str) and k.startswith(QUEUE_PREFIX)]:
            state[KEPT_QUEUE_PREFIX + key[len(QUEUE_PREFIX) :]] = state.pop(key)
    return sample


class _Decoder:
    """The seed codec's ``load``: fixed tags only (docs/dropin.md, "The seed's records")."""

    def __init__(self, archive: StrawArchive, reader: Any, deps: list[Any], lazy: bool) -> None:
        self.archive, self.reader, self.deps, self.lazy = archive, reader, deps, lazy
        self.aliases: dict[Any, Any] = {}
        self.tensor_sets: dict[int, Any] = {}

    def dependency(self, i: Any) -> Any:
        if type(i) is not int or not 0 <= i < len(self.deps):
            raise IntegrityError("a seed record names a dependency outside its manifest")
        return self.deps[i]

    def visit(self, node: Any) -> Any:
        if not isinstance(node, list):
            return node
        if not node or not isinstance(node[0], str):
            raise IntegrityError(f"malformed seed codec node {node!r:.80}")
        tag = node[0]
        if tag == "dict":
            return {self.visit(k): self.visit(v) for k, v in node[1]}
        if tag in ("list", "tuple"):
            items = [self.visit(i) for i in node[1]]
            return tuple(items) if tag == "tuple" else items
        if tag == "rollout-ref":
            if node[1] != "DiskPayloadRef":
                raise UnsupportedFormatError(
                    f"seed rollout reference {node[1]!r} needs vime to read"
                )
            return self.dependency(node[2])
        if tag == "sample":
            fields = self.visit(node[1])
            if not isinstance(fields, dict):
                raise IntegrityError("a seed sample is not a mapping")
            return self.sample(fields)
        if tag == "status":
            # the framework's Status member where this process has its Sample, else its value
            return record_to_enum(f"{self.archive.sample_class}.Status", node[1])
        if tag in ("spec-info", "prefix-cache-info"):
            fields = self.visit(node[1])
            if not isinstance(fields, dict):
                raise IntegrityError(f"a seed {tag} value is not a mapping")
            helper = "SpecInfo" if tag == "spec-info" else "PrefixCacheInfo"
            return record_to_value(f"{self.archive.sample_class}.{helper}", fields)
        if tag == "float":
            if node[1] not in ("inf", "-inf", "nan"):
                raise IntegrityError(f"invalid special float {node[1]!r:.40}")
            return float(node[1])
        if tag == "bytes":
            return base64.b64decode(node[1], validate=True)
        if tag == "record-set":
            raise UnsupportedFormatError("seed record-set values need vime to read")
        if tag == "tensor":
            return self.tensor(node)
        if tag == "ndarray":
            value = self.tensor(node[1], force_load=True)
            return value.numpy()
        raise UnsupportedFormatError(f"unknown seed codec tag {tag!r:.40}")

    def tensor(self, node: list[Any], force_load: bool = False) -> Any:
        import dataclasses

        straw = self.archive._straw
        where, shape, dtype, lazy, kind, validated = node[1:7]
        key = (json.dumps(where, sort_keys=True), bool(lazy) and not force_load)
        if key in self.aliases:
            return self.aliases[key]
        dep = where["dependency"]
        if dep not in self.tensor_sets:
            self.tensor_sets[dep] = straw.tensor.TensorRef.from_record_set_many(
                self.archive.store, self.dependency(dep), reader=self.reader
            )
        ordinal = where["ordinal"]
        if type(ordinal) is not int or ordinal not in self.tensor_sets[dep]:
            raise IntegrityError("a seed tensor ordinal names no tensor of its publication")
        ref = dataclasses.replace(self.tensor_sets[dep][ordinal], validated=validated)
        if tuple(ref.shape) != tuple(shape) or ref.dtype != dtype:
            raise IntegrityError("a seed tensor descriptor disagrees with its storage record")
        ref = dataclasses.replace(ref, kind=kind)
        value = ref if (lazy and self.lazy and not force_load) else ref.load(reader=self.reader)
        self.aliases[key] = value
        return value

    def sample(self, fields: dict[str, Any]) -> Any:
        return restore_queue(fields_to_sample(self.archive.sample_class, _protect_queue(fields)))


def _protect_queue(fields: dict[str, Any]) -> dict[str, Any]:
    """``fields`` with ``_queue_*`` keys renamed so that the sample rebuild (which drops
    them) keeps them; `_finish` puts them back or keeps the pool's name."""
    for key in [k for k in fields if isinstance(k, str) and k.startswith(QUEUE_PREFIX)]:
        fields["\x00" + key] = fields.pop(key)
    return fields


def restore_queue(sample: Any) -> Any:
    """Undo `_protect_queue` on a rebuilt sample (a dict or an object)."""
    state = sample if isinstance(sample, dict) else getattr(sample, "__dict__", None)
    if state is None:
        return sample
    for key in [k for k in state if isinstance(k, str) and k.startswith("\x00")]:
        state[key[1:]] = state.pop(key)
    return sample


def import_straw_archive(
    context: Any,
    path: str | os.PathLike[str],
    name: str | None = None,
    *,
    progress: Any = None,
    reward_key: str | None = None,
) -> Any:
    """Import the seed archive at ``path`` into the pool of ``context`` as archive ``name``
    (default: the index's absolute path, made a name as the facade makes one).

    Samples (rebuilt as the registered class or as dicts), sample and task keys in order
    with duplicates, rollout id, evaluation, metadata and tensors (loaded: the pool stores
    its own copy) are kept; ``_queue_*`` names other than the live five as ``_kept_queue_*``.
    Every sample is read back from the store and compared with the source before the archive
    is published; a difference rolls the save back and raises (keys are compared once it is
    published: a difference there releases it).  ``progress(done, total)`` is called per chunk.

    Raises:
        UnsupportedFormatError: not a seed index (a foreign or damaged file).
        IntegrityError: the straw pool is damaged, or the import did not match the source.
        MissingDependencyError: straw-queue is not installed.
    """
    from .._util.names import archive_name_for
    from ..pool.archive import open_archive, release_archives
    from ..pool.listing import check_rollout_id
    from ..pool.writer import ArchiveWriter
    from ..samples import sample_key

    source = StrawArchive(path)
    try:
        entries = source.contents["entries"]
        rollout_id = source.index.get("rollout_id")
        if rollout_id is not None and (type(rollout_id) is not int):
            raise UnsupportedFormatError(
                f"{path}: rollout_id {rollout_id!r:.40} is not an int (the seed writes one)"
            )
        rollout_id = check_rollout_id(rollout_id)
        evaluation = source.index.get("evaluation", False)
        if type(evaluation) is not bool:
            raise UnsupportedFormatError(f"{path}: evaluation {evaluation!r:.40} is not a bool")
        if name is None:
            # as the facade names a pointer's archive: runs that both wrote rollout_7 in
            # their own folders do not collide
            name = archive_name_for(Path(path))
        writer = ArchiveWriter(
            context,
            name,
            rollout_id=rollout_id,
            evaluation=evaluation,
            reward_key=reward_key,
        )
        total = source.chunk_count()
        sources: list[Any] = []
        with writer:
            loaded: dict[int, list[Any]] = {}
            for i, entry in enumerate(entries):
                chunk = entry.get("chunk")
                if type(chunk) is not int or not 0 <= chunk < total:
                    raise IntegrityError(f"{path}: entry {i} names chunk {chunk!r}")
                if chunk not in loaded:
                    loaded.clear()
                    loaded[chunk] = source.load_chunk(chunk, lazy=False)
                    if progress is not None:
                        progress(chunk + 1, total)
                rows = loaded[chunk]
                if entry["offset"] >= len(rows):
                    raise IntegrityError(
                        f"{path}: entry {i} names offset {entry['offset']} of a chunk of {len(rows)}"
                    )
                sample = _finish(rows[entry["offset"]], keep_queue=True)
                if sample_key(sample, i) != entry["sample_key"]:
                    # checked before the add, inside the writer's block: a mismatch rolls
                    # the save back, where after publication it could only be released
                    raise IntegrityError(
                        f"{path}: entry {i} says {entry['sample_key']!r:.60} but its sample "
                        f"is {sample_key(sample, i)!r:.60}"
                    )
                writer.add(sample, task_key=entry["task_key"])
                sources.append(sample)
            # NOTE: verified before the writer's clean exit publishes: what the store holds is
            # read back and compared with the source, and a difference raises inside the
            # block, which rolls the save back (nothing of it is ever visible).
            problem = None
            count = 0
            for i, got in enumerate(writer.stored_samples()):
                count += 1
                if i >= len(sources) or not _same(got, sources[i]):
                    problem = f"sample {i} ({entries[i]['sample_key']}) differs from its source"
                    break
            if problem is None and count != len(sources):
                problem = f"{count} samples stored for {len(sources)} in the index"
            if problem is not None:
                raise IntegrityError(
                    f"import of {path} did not verify: {problem}; nothing was published"
                )
        archive = writer.archive
        assert archive is not None  # published by the clean exit of the block
        problem = _compare(archive.keys(), [(e["sample_key"], e["task_key"]) for e in entries])
        if problem is not None:
            release_archives(context, [archive._id])
            raise IntegrityError(f"import of {path} did not verify: {problem}; released")
        return open_archive(context, archive.name)
    finally:
        source.close()


def _compare(got: list[tuple[str, Any]], want: list[tuple[str, Any]]) -> str | None:
    want = [(s, None if t is None else str(t)) for s, t in want]
    if got != want:
        return "its sample or task keys differ from the index's"
    return None


def _same(a: Any, b: Any) -> bool:
    """Deep equality with tensors and arrays compared by dtype, shape and value."""
    import numpy as np

    from .._util.lazy_torch import is_tensor

    if is_tensor(a) or is_tensor(b):
        if not (is_tensor(a) and is_tensor(b)) or a.dtype != b.dtype or a.shape != b.shape:
            return False
        return bool(((a == b) | ((a != a) & (b != b))).all())
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (
            isinstance(a, np.ndarray)
            and isinstance(b, np.ndarray)
            and a.dtype == b.dtype
            and np.array_equal(a, b, equal_nan=a.dtype.kind in "fc")
        )
    if isinstance(a, float) and isinstance(b, float) and a != a and b != b:
        return True
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(_same, a, b))
    if a is b:
        return True
    if isinstance(a, enum.Enum) or isinstance(b, enum.Enum):
        return False  # members are compared by identity (above)
    if dataclasses.is_dataclass(a) and not isinstance(a, type):
        return type(a) is type(b) and _same(dict(vars(a)), dict(vars(b)))
    return type(a) is type(b) and bool(a == b)
