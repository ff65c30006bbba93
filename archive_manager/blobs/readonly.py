"""`ReadOnlyBlobStore`: the blob store of a pool opened read-only
(docs/architecture/shared-pools.md, "Shared pools").

It reads, verifies and lists as `BlobStore` does and refuses every write (put, delete, temp
file removal) with `ReadOnlyPoolError` before touching anything: the second gate after
`Catalog.write`, for a write path that would reach the files first.  `ReadOnlyStoreView` is
that gate around a store the caller passed in.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, NoReturn

from .._util.digest import Buffer
from . import BlobStore
from ._common import read_only_refusal
from .base import AbstractBlobStore, BlobStat, IncompleteWrite, PutItem

__all__ = ["ReadOnlyBlobStore", "ReadOnlyStoreView"]


class _RefusesWrites:
    """Every write of the blob-store interface refused with `ReadOnlyPoolError` before it
    reaches a file or a request: the one gate both read-only stores below share."""

    reason: str

    def _where(self) -> object:
        raise NotImplementedError

    @property
    def read_only_reason(self) -> str:
        """Why this store refuses writes."""
        return self.reason

    def _refuse(self, what: str) -> NoReturn:
        raise read_only_refusal(self._where(), self.reason, what)

    def put(self, data: Buffer | Sequence[Buffer], digest: str | None = None) -> str:
        """Refused: `ReadOnlyPoolError`."""
        self._refuse("write a blob")

    def put_many(self, items: Sequence[PutItem], *, workers: int = 4) -> list[str]:
        """Refused: `ReadOnlyPoolError`."""
        self._refuse("write blobs")

    def put_new(self, items: Sequence[PutItem], *, workers: int | None = None) -> list[str]:
        """Refused: `ReadOnlyPoolError`."""
        self._refuse("write blobs")

    def delete(self, digest: str) -> bool:
        """Refused: `ReadOnlyPoolError`."""
        self._refuse("delete a blob")

    def delete_many(self, digests: Iterable[str]) -> int:
        """Refused: `ReadOnlyPoolError`."""
        self._refuse("delete blobs")

    def remove_incomplete(self, write: IncompleteWrite) -> bool:
        """Refused: `ReadOnlyPoolError`."""
        self._refuse("remove an incomplete write")

    def sweep_incomplete(self, older_than: float) -> int:
        """Refused: `ReadOnlyPoolError`."""
        self._refuse("sweep incomplete writes")


class ReadOnlyBlobStore(_RefusesWrites, BlobStore):
    """A `BlobStore` that only reads; ``reason`` says why (for the error)."""

    def __init__(
        self, root: str | os.PathLike[str], reason: str, *, read_retry: float | None = None
    ) -> None:
        super().__init__(root, read_retry=read_retry)
        self.reason = reason

    def _where(self) -> object:
        return self.root

    def remove_temp(self, path: str | os.PathLike[str]) -> bool:
        """Refused: `ReadOnlyPoolError`."""
        self._refuse("remove a temp file")


class ReadOnlyStoreView(_RefusesWrites, AbstractBlobStore):
    """A store the caller passed to a read-only open, as that pool sees it: reads go to the
    store, every write of the interface (put, put_many, put_new, delete, delete_many, removal
    and sweep of incomplete writes) is refused with `ReadOnlyPoolError` before it is reached.

    NOTE: a view, not the store: the caller's store stays writable for their other pools.
    Of the store's own extras only reading ones pass through (`root`, `path`, `temp_files`,
    `read_retry`, as `BlobStore` has them); any other, which may write, is not there.
    """

    _EXTRAS = frozenset({"root", "path", "temp_files", "read_retry"})

    def __init__(self, store: AbstractBlobStore, where: object, reason: str) -> None:
        self._store = store
        self._place = where
        self.reason = reason
        self.capabilities = store.capabilities

    def __repr__(self) -> str:
        return f"ReadOnlyStoreView({self._store!r})"

    def __getattr__(self, name: str) -> Any:
        if name in ReadOnlyStoreView._EXTRAS:
            return getattr(self._store, name)
        raise AttributeError(
            f"{type(self).__name__} has no attribute {name!r} (a read-only pool's store "
            "offers reads only)"
        )

    def _where(self) -> object:
        return self._place

    def get(self, digest: str) -> bytes:
        """The store's `get`."""
        return self._store.get(digest)

    def open(self, digest: str, *, verify: bool = True) -> memoryview:
        """The store's `open`."""
        return self._store.open(digest, verify=verify)

    def open_private(self, digest: str) -> memoryview:
        """The store's `open_private` (a private view: nothing reaches the store)."""
        return self._store.open_private(digest)

    def read_range(self, digest: str, offset: int, length: int) -> bytes:
        """The store's `read_range`."""
        return self._store.read_range(digest, offset, length)

    def read_head(self, digest: str, n: int) -> bytes:
        """The store's `read_head`."""
        return self._store.read_head(digest, n)

    def stat(self, digest: str) -> BlobStat:
        """The store's `stat`."""
        return self._store.stat(digest)

    def size(self, digest: str) -> int:
        """The store's `size`."""
        return self._store.size(digest)

    def has(self, digest: str) -> bool:
        """The store's `has`."""
        return self._store.has(digest)

    def check(self, digest: str) -> None:
        """The store's `check`."""
        self._store.check(digest)

    def iter_stat(self) -> Iterator[tuple[str, int, float]]:
        """The store's `iter_stat`."""
        return self._store.iter_stat()

    def iter_digests(self) -> Iterator[str]:
        """The store's `iter_digests`."""
        return self._store.iter_digests()

    def incomplete_writes(self) -> list[IncompleteWrite]:
        """The store's `incomplete_writes` (listed, never removed here)."""
        return self._store.incomplete_writes()


def read_only_store(store: AbstractBlobStore, where: Path | str, reason: str) -> AbstractBlobStore:
    """``store`` as a pool opened read-only sees it (see `ReadOnlyStoreView`); a store that
    refuses writes already is used as it is."""
    if isinstance(store, (ReadOnlyBlobStore, ReadOnlyStoreView)):
        return store
    return ReadOnlyStoreView(store, where, reason)
