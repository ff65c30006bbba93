"""`ReadOnlyView`: any blob store as a pool opened read-only sees it
(docs/architecture/blob-store-contract.md, "Blob store contract";
docs/architecture/shared-pools.md, "Shared pools").

Every read is the store's own; every write of the interface (put, put_many, put_new, delete,
delete_many, removal and sweep of incomplete writes) is refused with `ReadOnlyPoolError`
before it reaches the store: the second gate after `Catalog.write`, for a write path that
would reach the files or the bucket first.  One wrapper for every backend, made by
`AbstractBlobStore.read_only_view`; `ReadOnlyRoot` is the same gate for a pool root on an
object store (its identity and journal objects).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, NoReturn

from .._util.digest import Buffer
from ._common import read_only_refusal
from .base import AbstractBlobStore, BlobStat, IncompleteWrite, ObjectRoot, PutItem

__all__ = ["ReadOnlyRoot", "ReadOnlyView"]


class ReadOnlyView(AbstractBlobStore):
    """``store`` with every write refused (see the module docstring); ``reason`` says why and
    ``where`` names the pool (its root or URL) in the refusal.

    NOTE: a view, not a copy: the store stays writable for its other users (a store the caller
    passed to a read-only open serves their other pools).  Of the store's own members beyond
    the interface only those it names as reads (`AbstractBlobStore.read_extras`) pass through,
    and ``pool_root()`` of a store that has one, as a `ReadOnlyRoot`; any other, which may
    write, is not there.
    """

    _store: AbstractBlobStore
    _reason: str
    _where: object

    def __init__(self, store: AbstractBlobStore, reason: str, *, where: object = None) -> None:
        if isinstance(store, ReadOnlyView):
            # A view of a view shows the same store: one gate, whatever the nesting.
            where = store._where if where is None else where
            store = store._store
        self._store = store
        self._reason = reason
        self._where = where
        self.capabilities = store.capabilities
        self.read_extras = store.read_extras

    def __repr__(self) -> str:
        return f"ReadOnlyView({self._store!r}, {self._reason!r})"

    def __getattr__(self, name: str) -> Any:
        # Private names never: one looked up on a copy being made (``_store`` not set yet)
        # must not recurse, and a store's private members may write.
        if not name.startswith("_"):
            if name in self._store.read_extras:
                return getattr(self._store, name)
            if name == "pool_root" and hasattr(self._store, "pool_root"):
                return self._pool_root
        raise AttributeError(
            f"{type(self).__name__} has no attribute {name!r} (a read-only store offers reads only)"
        )

    @property
    def store(self) -> AbstractBlobStore:
        """The store this view shows."""
        return self._store

    @property
    def read_only_reason(self) -> str:
        """Why this view refuses writes."""
        return self._reason

    def read_only_view(self, reason: str, *, where: object = None) -> ReadOnlyView:
        """A view of the same store with another reason (see `AbstractBlobStore.read_only_view`)."""
        return ReadOnlyView(self, reason, where=where)

    def _pool_root(self) -> ReadOnlyRoot:
        pool_root: Callable[[], ObjectRoot] = self._store.pool_root  # type: ignore[attr-defined]
        return ReadOnlyRoot(pool_root(), self._reason)

    def _refuse(self, what: str) -> NoReturn:
        raise read_only_refusal(
            self._store if self._where is None else self._where, self._reason, what
        )

    # ------------------------------------------------------------------ writes: refused

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
        """Refused: `ReadOnlyPoolError` (``digests`` is not consumed)."""
        self._refuse("delete blobs")

    def remove_incomplete(self, write: IncompleteWrite) -> bool:
        """Refused: `ReadOnlyPoolError`."""
        self._refuse("remove an incomplete write")

    def sweep_incomplete(self, older_than: float) -> int:
        """Refused: `ReadOnlyPoolError`."""
        self._refuse("sweep incomplete writes")

    # ------------------------------------------------------------------ reads: the store's

    def get(self, digest: str) -> bytes:
        """The store's `get`."""
        return self._store.get(digest)

    def open(self, digest: str, *, verify: bool = True) -> memoryview:
        """The store's `open`."""
        return self._store.open(digest, verify=verify)

    def get_view(self, digest: str) -> memoryview:
        """The store's `get_view` (read-only)."""
        return self._store.get_view(digest)

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


class ReadOnlyRoot:
    """A pool root on an object store (`ObjectRoot`) with its writes refused: what
    ``pool.root`` is for a pool on S3 opened read-only, so that the identity and the journal
    are read and never written.  ``str(root)`` is the root's URL."""

    def __init__(self, root: ObjectRoot, reason: str) -> None:
        self._root = root
        self._reason = reason

    def __str__(self) -> str:
        return str(self._root)

    def __repr__(self) -> str:
        return f"ReadOnlyRoot({self._root!r}, {self._reason!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ReadOnlyRoot) and str(other) == str(self)

    def __hash__(self) -> int:
        return hash(str(self))

    def read(self, name: str) -> bytes | None:
        """The root's `read`."""
        return self._root.read(name)

    def list(self, folder: str, *, after: str | None = None) -> list[tuple[str, float]]:
        """The root's `list`."""
        return self._root.list(folder, after=after)

    def other(self, url: str) -> ObjectRoot:
        """The root's `other` (only looked at: every write refused there too)."""
        return self._root.other(url)

    def write(self, name: str, data: bytes, *, exclusive: bool = False) -> bool:
        """Refused: `ReadOnlyPoolError`."""
        raise read_only_refusal(self._root, self._reason, "write a pool object")

    def delete(self, name: str) -> bool:
        """Refused: `ReadOnlyPoolError`."""
        raise read_only_refusal(self._root, self._reason, "delete a pool object")
