"""The in-memory blob store: the filesystem store's twin for tests, with the same contract
(docs/architecture/blob-store-contract.md, "Blob store contract") and nothing kept past the
process."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from .._util.digest import Buffer, check_digest
from ._common import check_size, missing, prepare
from ._common import verify as _verify
from .base import AbstractBlobStore, BlobStat, Capabilities, PutItem

__all__ = ["MemoryBlobStore"]


class MemoryBlobStore(AbstractBlobStore):
    """Blobs in a dict of this process.  Its puts are atomic, so it has no incomplete writes."""

    capabilities = Capabilities(mmap=False, local_paths=False, persistent=False)
    read_extras = frozenset({"temp_files"})

    def __init__(self) -> None:
        # digest -> (bytes, time of the put)
        self._blobs: dict[str, tuple[bytes, float]] = {}

    def __repr__(self) -> str:
        return f"MemoryBlobStore(<{len(self._blobs)} blobs>)"

    def put(self, data: Buffer | Sequence[Buffer], digest: str | None = None) -> str:
        """Store ``data`` once and return its digest (see `AbstractBlobStore.put`)."""
        views, digest = prepare(data, digest)
        if digest in self._blobs:
            check_size(digest, len(self._blobs[digest][0]), views)
        else:
            self._blobs[digest] = (b"".join(views), time.time())
        return digest

    def put_many(self, items: Sequence[PutItem], *, workers: int = 4) -> list[str]:
        """`put` each ``(data, digest)`` item; return their digests in order."""
        return [self.put(data, digest) for data, digest in items]

    def _entry(self, digest: str) -> tuple[bytes, float]:
        try:
            return self._blobs[check_digest(digest)]
        except KeyError:
            raise missing(digest) from None

    def get(self, digest: str) -> bytes:
        """The verified bytes of ``digest``."""
        data = self._entry(digest)[0]
        _verify(digest, data)
        return data

    def open(self, digest: str, *, verify: bool = True) -> memoryview:
        """A read-only view of ``digest``, verified unless ``verify=False``."""
        data = self._entry(digest)[0]
        if verify:
            _verify(digest, data)
        return memoryview(data)

    def read_range(self, digest: str, offset: int, length: int) -> bytes:
        """Up to ``length`` bytes of ``digest`` from ``offset``, unverified."""
        if offset < 0 or length < 0:
            raise ValueError("offset and length must be >= 0")
        return self._entry(digest)[0][offset : offset + length]

    def has(self, digest: str) -> bool:
        """True when ``digest`` is stored."""
        return check_digest(digest) in self._blobs

    def stat(self, digest: str) -> BlobStat:
        """The size of ``digest`` and the time of its put."""
        data, mtime = self._entry(digest)
        return BlobStat(len(data), mtime)

    def delete(self, digest: str) -> bool:
        """Forget ``digest``; False if it was already gone."""
        return self._blobs.pop(check_digest(digest), None) is not None

    def iter_digests(self) -> Iterator[str]:
        """Digests of the stored blobs (a snapshot, so deleting while iterating is safe)."""
        yield from list(self._blobs)

    def iter_stat(self) -> Iterator[tuple[str, int, float]]:
        """``(digest, size, mtime)`` of each stored blob, mtime being the time of its put."""
        for digest, (data, mtime) in list(self._blobs.items()):
            yield digest, len(data), mtime

    def temp_files(self) -> list[tuple[Path, float]]:
        """Always empty: memory has no temp files (the filesystem store's listing, kept so
        that code written against it runs on this store too)."""
        return []
