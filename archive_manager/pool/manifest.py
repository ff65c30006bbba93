"""The archive manifest (docs/architecture/save-protocol.md, "Manifests"): one small blob per
archive that describes it whole, so that the catalog can be rebuilt from the blob root alone.

Built by the writer, encoded by the codec's blob framing, read back and validated by
recovery; the format lives here only.  A manifest carries ``save_seq``, the number the
catalog gave the save when it claimed the archive's name: names are claimed one save at a
time (a unique row) and a claimed name is freed only by rolling back a save that never
published, so among manifests naming one archive, the published one has the highest number.
That is what lets a rebuild choose it over a crashed attempt of the same name.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from .._util.digest import Buffer, check_digest
from .._util.names import check_archive_name
from ..codec import decode_manifest, encode_manifest
from ..metadata import reward_component
from ..samples import check_key_text, task_key_and_text

__all__ = [
    "MANIFEST_FORMAT",
    "MANIFEST_VERSION",
    "Manifest",
    "check_rollout_id_value",
]

MANIFEST_FORMAT = "archive_manager.manifest"
# Version 1 throughout: ``save_seq``, ``reward_key`` and ``task_texts`` were added as optional
# fields, which readers of the first manifests ignore and this reader treats as absent in
# theirs.
MANIFEST_VERSION = 1
_INT32, _INT63 = 2**31, 2**63  # limits of the catalog's INTEGER and BIGINT columns


def check_rollout_id_value(value: object) -> int | None:
    """A rollout id as stored: None or an int within the catalog's BIGINT."""
    if value is None:
        return None
    if type(value) is not int or not -_INT63 <= value < _INT63:
        raise ValueError(f"rollout_id {value!r:.40} is not a 64-bit int")
    return value


@dataclass(frozen=True)
class Manifest:
    """What one archive is: its facts, chunks, tensor blobs, entries and sample metadata."""

    name: str
    rollout_id: int | None
    evaluation: bool
    attrs: dict[str, Any] | None
    reference: str | None
    created_at: float | None
    chunks: list[tuple[str, int, int]]  # (digest, samples, size) by ordinal
    tensors: list[str]
    entries: list[tuple[str, str | None, int, int]]  # (sample_key, task_key, ordinal, offset)
    metadata: list[dict[str, Any]]
    save_seq: int | None = None
    reward_key: str | None = None
    # The whole text of each task key that is the digest of a long text.
    task_texts: dict[str, str] | None = None

    @property
    def order(self) -> tuple[int, float]:
        """Which of several manifests of one name was saved last (see the module docstring).

        Manifests written before ``save_seq`` existed fall back to their creation time.
        """
        if self.save_seq is not None:
            return (1, float(self.save_seq))
        return (0, float(self.created_at or 0.0))

    def to_dict(self) -> dict[str, Any]:
        """The JSON form stored in the blob."""
        out: dict[str, Any] = {
            "format": MANIFEST_FORMAT,
            "version": MANIFEST_VERSION,
            "name": self.name,
            "rollout_id": self.rollout_id,
            "evaluation": self.evaluation,
            "attrs": self.attrs,
            "reference": self.reference,
            "created_at": self.created_at,
            "chunks": [list(c) for c in self.chunks],
            "tensors": list(self.tensors),
            "entries": [list(e) for e in self.entries],
            "metadata": self.metadata,
        }
        if self.save_seq is not None:
            out["save_seq"] = self.save_seq
        if self.reward_key is not None:
            out["reward_key"] = self.reward_key
        if self.task_texts:
            out["task_texts"] = self.task_texts
        return out

    def encode(self) -> bytes:
        """The manifest blob's bytes."""
        return encode_manifest(self.to_dict())

    @classmethod
    def decode(cls, data: Buffer, digest: str = "?") -> Manifest:
        """Read and validate a manifest blob.

        Raises:
            IntegrityError: the bytes are not a manifest blob.
            ValueError: a field does not have the shape and range a save writes.
        """
        return cls.from_dict(decode_manifest(data, digest))

    @classmethod
    def from_dict(cls, m: dict[str, Any]) -> Manifest:
        """Validate ``m`` field by field and build the manifest, else raise ValueError.

        NOTE: manifests are read back from blob files, which may be damaged or forged; one
        whose entries were not lists once made a rebuild's insert raise AttributeError and
        stopped every later rebuild, so everything the catalog will hold is checked here,
        before anything is written.
        """
        if m.get("format") != MANIFEST_FORMAT or type(m.get("version")) is not int:
            raise ValueError("not an archive manifest")
        if m["version"] != MANIFEST_VERSION:
            raise ValueError(
                f"manifest version {m['version']}; this library reads {MANIFEST_VERSION}"
            )
        name = check_archive_name(m.get("name"))
        rollout_id = check_rollout_id_value(m.get("rollout_id"))
        evaluation = m.get("evaluation", False)
        if not isinstance(evaluation, bool):
            raise ValueError("evaluation is not a bool")
        attrs = m.get("attrs")
        if attrs is not None and not isinstance(attrs, dict):
            raise ValueError("attrs is not a JSON object")
        reference = m.get("reference")
        if reference is not None:
            check_archive_name(reference)
        created = m.get("created_at")
        # (an exact comparison: also false for NaN, infinities and ints past any float)
        if created is not None and not (type(created) in (int, float) and abs(created) < 1e11):
            raise ValueError(f"created_at {created!r:.40} is not a time")
        save_seq = m.get("save_seq")
        if save_seq is not None and not (type(save_seq) is int and 0 < save_seq < _INT63):
            raise ValueError(f"save_seq {save_seq!r:.40} is not a positive 64-bit int")
        reward_key = m.get("reward_key")
        if reward_key is not None and reward_component(reward_key) is None:
            raise ValueError(f"reward_key {reward_key!r:.40} is not a key of a reward")
        task_texts = m.get("task_texts")
        if task_texts is not None:
            if not isinstance(task_texts, dict):
                raise ValueError("task_texts is not a JSON object")
            for key, text in task_texts.items():
                # Each key must be its text's own: a forged text never shows under a key.
                if not isinstance(text, str) or task_key_and_text(text) != (key, text):
                    raise ValueError(f"task text of {key!r:.80} is not the text of that key")
        chunks, tensors, entries = m.get("chunks"), m.get("tensors", []), m.get("entries")
        metadata = m.get("metadata")
        if not all(isinstance(x, list) for x in (chunks, tensors, entries, metadata)):
            raise ValueError("chunks, tensors, entries and metadata must be lists")
        assert isinstance(chunks, list) and isinstance(entries, list)  # for mypy
        assert isinstance(tensors, list) and isinstance(metadata, list)
        counts: list[int] = []
        checked_chunks: list[tuple[str, int, int]] = []
        for chunk in chunks:
            if not (isinstance(chunk, list) and len(chunk) == 3 and isinstance(chunk[0], str)):
                raise ValueError(f"chunk {chunk!r:.80} is not [digest, samples, size]")
            check_digest(chunk[0])
            counts.append(_count(chunk[1], _INT32, "chunk samples"))
            checked_chunks.append((chunk[0], chunk[1], _count(chunk[2], _INT63, "chunk size")))
        for digest in tensors:
            check_digest(digest)
        if len(entries) != sum(counts) or len(metadata) != len(entries):
            raise ValueError("entries, metadata and the chunks' sample counts disagree")
        checked_entries: list[tuple[str, str | None, int, int]] = []
        for entry in entries:
            if not (isinstance(entry, list) and len(entry) == 4 and isinstance(entry[0], str)):
                raise ValueError(
                    f"entry {entry!r:.80} is not [sample_key, task_key, chunk, offset]"
                )
            check_key_text(entry[0], "sample key")
            if entry[1] is not None and not isinstance(entry[1], str):
                raise ValueError(f"task key {entry[1]!r:.40} is not a str")
            if entry[1] is not None:
                check_key_text(entry[1], "task key")
            ordinal = _count(entry[2], len(counts), "chunk ordinal")
            _count(entry[3], counts[ordinal], "offset")
            checked_entries.append((entry[0], entry[1], entry[2], entry[3]))
        if not all(isinstance(d, dict) for d in metadata):
            raise ValueError("sample metadata must be JSON objects")
        # NaN and infinities are JSON to Python but not to PostgreSQL's JSON type.
        json.dumps([attrs, metadata], allow_nan=False)
        return cls(
            name=name,
            rollout_id=rollout_id,
            evaluation=evaluation,
            attrs=attrs,
            reference=reference,
            created_at=float(created) if created is not None else None,
            chunks=checked_chunks,
            tensors=list(tensors),
            entries=checked_entries,
            metadata=metadata,
            save_seq=save_seq,
            reward_key=reward_key,
            task_texts=task_texts or None,
        )


def _count(value: object, limit: int, what: str) -> int:
    if type(value) is not int or not 0 <= value < limit:
        raise ValueError(f"{what} {value!r:.40} is not an int in [0, {limit})")
    return value
