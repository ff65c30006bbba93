"""The blob store interface (docs/architecture/blob-store-contract.md, "Blob store contract").

Everything above the blob store (the writer, GC, verify, recovery, the read side) goes
through `AbstractBlobStore` and nothing else: no module above it builds a blob's path, opens a
blob's file or touches an incomplete write.  A new backend (an object store) subclasses it and
passes the contract suite shipped in `archive_manager.testing`.

The contract, for every method that takes a digest:

* a digest that is not canonical (32 lowercase hex characters) raises `InvalidNameError`
  before any I/O, so no name ever escapes the store;
* a blob the store does not hold raises `BlobNotFoundError` (an `IntegrityError` and a
  `FileNotFoundError`); `has` says False and `delete` False instead;
* stored bytes that do not hash to their digest, or something that is not a blob in a blob's
  place, raise `BlobCorruptError` (an `IntegrityError`) naming the digest, from every
  verified read (`get`, `open`, `check`; the first as `BlobDigestMismatchError`, which
  `retry.RetryingReads` tries again) and from a put that finds the blob stored with
  another size; unverified reads (`open(verify=False)`, `read_range`) return the bytes as
  stored;
* a failure of the medium raises `OSError`: the filesystem store lets the OS's error through
  unchanged (its ``errno`` is what callers test: ENOSPC, EROFS, EIO), other stores raise
  `BlobStoreError` (an `ArchiveError` and an `OSError`), and `TransientBlobStoreError` where
  a retry may succeed.  Catching `OSError` therefore catches every store's failures, which is
  what GC's fail-closed wrapping relies on; no store lets an SDK's own exception out.

What a put guarantees: when it returns, every blob it names is durable and readable by every
process of the pool; when it raises, no blob of another content is visible under any digest,
and what it left behind (a temp file) is an incomplete write that `sweep_incomplete` removes.
Blobs are immutable: a put of a stored digest checks the stored size and changes nothing.

Read-only is part of the interface: every store says whether it refuses writes
(`AbstractBlobStore.read_only`, `read_only_reason`), and `read_only_view` gives any store as a
read-only pool sees it (`readonly.ReadOnlyView`: every write refused with `ReadOnlyPoolError`
before it reaches the store, every read the store's own).
"""

from __future__ import annotations

import abc
import contextlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple, Protocol, runtime_checkable

from .._util.digest import Buffer

if TYPE_CHECKING:
    from .readonly import ReadOnlyView

__all__ = [
    "AbstractBlobStore",
    "BlobStat",
    "Capabilities",
    "IncompleteWrite",
    "ObjectRoot",
    "PutItem",
]

#: One blob to put: its data (a buffer or a sequence of parts) and its digest, if known.
PutItem = tuple[Buffer | Sequence[Buffer], str | None]


class BlobStat(NamedTuple):
    """A stored blob's size in bytes and the time (seconds since the epoch) it was written."""

    size: int
    mtime: float


@dataclass(frozen=True)
class Capabilities:
    """What a store can do beyond the contract; callers may choose a faster path by them."""

    #: `open` maps the blob: pages are read when touched and nothing is copied, so opening a
    #: large tensor blob to read a slice of it is cheap.  Without it `open` may read it whole.
    mmap: bool
    #: Blobs are files on a filesystem, and the store has ``root`` and ``path(digest)``.
    local_paths: bool
    #: Other processes (and later runs) see the same blobs: a pool's catalog may be shared.
    persistent: bool


@dataclass(frozen=True)
class IncompleteWrite:
    """A write that was begun and not finished (a crashed writer's temp file, an abandoned
    upload): ``name`` is the store's own token for it, ``mtime`` when it was last written (by
    the store's clock), ``digest`` the blob it was writing if the store can tell (None: not
    known, and then only its age can say it is abandoned)."""

    name: str
    mtime: float
    digest: str | None = None


@runtime_checkable
class ObjectRoot(Protocol):
    """A pool root on an object store (``s3://bucket/prefix``: `blobs.s3.S3Root`): the pool's
    few named objects besides its blobs (the identity, the retention journal) are read and
    written through it, as a filesystem root holds them as files
    (docs/architecture/object-stores.md, "Blobs on an object store").  Names are ``/``-separated and
    relative to the root; the root refuses one that could lead out of it.  ``str(root)`` is its
    URL."""

    def read(self, name: str) -> bytes | None:
        """The object's bytes; None if there is none."""

    def write(self, name: str, data: bytes, *, exclusive: bool = False) -> bool:
        """Write the object whole (visible only once complete); with ``exclusive`` only if
        none exists, of racing writers at most one succeeding (False for the others)."""

    def list(self, folder: str, *, after: str | None = None) -> list[tuple[str, float]]:
        """``(name, mtime)`` of the objects directly in ``folder`` (only those whose names
        sort after ``after``, when given)."""

    def delete(self, name: str) -> bool:
        """Delete the object; False if there was none."""

    def other(self, url: str) -> ObjectRoot:
        """The root at ``url`` on the same store, to be looked at only (every write refused):
        whether a pool a catalog records elsewhere is still there (a copy, or a move)."""


class AbstractBlobStore(abc.ABC):
    """Content-addressed, immutable blobs named by the xxh3-128 digest of their bytes.

    Subclasses implement the abstract methods; the others have a plain implementation here
    that a store may replace with a faster one.
    """

    #: What the store can do; a class attribute of each store (a wrapper sets its own).
    capabilities: Capabilities
    #: The store's own members beyond this interface that only read (the filesystem store's
    #: ``root`` and ``path``): a read-only view of the store offers these and no other, since
    #: any other may write.  A wrapper sets its inner store's.
    read_extras: frozenset[str] = frozenset()

    # ------------------------------------------------------------------ read-only

    @property
    def read_only_reason(self) -> str | None:
        """Why this store refuses every write (a read-only view: `read_only_view`), or None:
        it writes (the default)."""
        return None

    @property
    def read_only(self) -> bool:
        """Whether this store refuses every write (see `read_only_reason`)."""
        return self.read_only_reason is not None

    def read_only_view(self, reason: str, *, where: object = None) -> ReadOnlyView:
        """This store as a pool opened read-only sees it: every read is this store's, every
        write (a put, a delete, an incomplete write's removal) is refused with
        `ReadOnlyPoolError` before it reaches the store, whose ``reason`` and ``where`` (the
        pool's root, for the message) it names.  This store stays as it was (writable for
        its other users).  A view of a view shows the same store, with the new reason."""
        from .readonly import ReadOnlyView

        return ReadOnlyView(self, reason, where=where)

    # ------------------------------------------------------------------ writing

    @abc.abstractmethod
    def put_many(self, items: Sequence[PutItem], *, workers: int = 4) -> list[str]:
        """Put each ``(data, digest)`` item (see `put`); return their digests in order.

        ``workers`` bounds the store's parallelism.  When an item fails, the error is raised;
        blobs of other items may have been stored (each is a valid blob of its digest).
        """

    def put_new(self, items: Sequence[PutItem], *, workers: int | None = None) -> list[str]:
        """`put_many` for blobs the caller's catalog holds no stored copy of (a save's new
        rows, docs/architecture/save-protocol.md "Save protocol", step 2).

        A store may write these without first looking for a stored copy: on an object store
        that look is a round trip per blob, paid by every save for nothing.  A copy that is
        there all the same (an orphan of a crashed save) is replaced by the same bytes, which
        readers cannot tell apart; its size is not checked.  The default is `put_many`.

        ``workers`` None is the store's own default.
        """
        if workers is None:
            # NOTE: a store written before put_new may define put_many(items) alone (the
            # writer called it so): passing workers would fail every save with a TypeError.
            return self.put_many(items)
        return self.put_many(items, workers=workers)

    def put(self, data: Buffer | Sequence[Buffer], digest: str | None = None) -> str:
        """Store ``data`` (a buffer or a sequence of parts) once and return its digest.

        Raises:
            IntegrityError: ``digest`` is not the data's digest (`BlobCorruptError`: the stored
                blob of this digest has another size).
            InvalidNameError: ``digest`` is not canonical.
            OSError: the store failed; nothing was stored.
        """
        return self.put_many([(data, digest)])[0]

    # ------------------------------------------------------------------ reading

    @abc.abstractmethod
    def get(self, digest: str) -> bytes:
        """The verified bytes of ``digest``."""

    @abc.abstractmethod
    def open(self, digest: str, *, verify: bool = True) -> memoryview:
        """A read-only view of ``digest`` (a memory map if ``capabilities.mmap``), verified
        unless ``verify=False``."""

    def get_view(self, digest: str) -> memoryview:
        """`get`'s verified bytes of ``digest`` as a read-only view, for a caller that only
        reads them: here a view of `get`'s bytes; a store of local files maps the file
        instead (no copy, no fresh memory), where the root is on a local filesystem."""
        return memoryview(self.get(digest))

    def open_private(self, digest: str) -> memoryview:
        """A writable view of the verified bytes of ``digest`` that is the caller's own:
        writing to it never reaches the store or another reader.  Here a copy of `open`'s
        view; a store of local files maps the file copy-on-write instead (no copy)."""
        view = self.open(digest)
        try:
            return memoryview(bytearray(view))
        finally:
            view.release()

    @abc.abstractmethod
    def read_range(self, digest: str, offset: int, length: int) -> bytes:
        """Up to ``length`` bytes of ``digest`` from ``offset``, unverified (a range cannot be
        checked against the whole blob's digest); short or empty past the end."""

    def read_head(self, digest: str, n: int) -> bytes:
        """The first ``n`` bytes of ``digest``, unverified (to tell blob kinds apart)."""
        return self.read_range(digest, 0, n)

    @abc.abstractmethod
    def stat(self, digest: str) -> BlobStat:
        """The stored size and write time of ``digest`` (its bytes are not read)."""

    def size(self, digest: str) -> int:
        """The stored size of ``digest`` in bytes."""
        return self.stat(digest).size

    @abc.abstractmethod
    def has(self, digest: str) -> bool:
        """True when ``digest`` is stored (its bytes are not read)."""

    def check(self, digest: str) -> None:
        """Rehash ``digest``: BlobCorruptError or BlobNotFoundError on damage."""
        self.get(digest)

    # ------------------------------------------------------------------ listing

    @abc.abstractmethod
    def iter_stat(self) -> Iterator[tuple[str, int, float]]:
        """``(digest, size, mtime)`` of each stored blob, each once, in no order.

        Deleting while iterating is safe; a blob put meanwhile may or may not be listed.
        """

    def iter_digests(self) -> Iterator[str]:
        """The digest of each stored blob (see `iter_stat`)."""
        for digest, _, _ in self.iter_stat():
            yield digest

    def __iter__(self) -> Iterator[str]:
        return self.iter_digests()

    # ------------------------------------------------------------------ deleting

    @abc.abstractmethod
    def delete(self, digest: str) -> bool:
        """Remove ``digest``; False if it was not stored."""

    def delete_many(self, digests: Iterable[str]) -> int:
        """Remove each of ``digests``; return how many were stored.  On an error, some
        may be removed and the rest are not (this default: those before it, in order; a
        store may remove them in batches)."""
        return sum(1 for digest in digests if self.delete(digest))

    # ------------------------------------------------------------------ incomplete writes

    def incomplete_writes(self) -> list[IncompleteWrite]:
        """Writes begun and not finished: those of puts in flight and of crashed writers.

        A store whose puts leave nothing behind when they fail has none (this default).
        Raises OSError when they cannot be listed.
        """
        return []

    def remove_incomplete(self, write: IncompleteWrite) -> bool:
        """Remove an incomplete write listed by `incomplete_writes`; False if it is gone (a
        put finished it, or another sweep removed it)."""
        return False

    def sweep_incomplete(self, older_than: float) -> int:
        """Remove every incomplete write last written at or before ``older_than`` (seconds
        since the epoch); return how many were removed.

        NOTE: the bound must lie well before the oldest put in flight could have last
        written: removing a live put's temp file fails that put.  GC does not sweep by age
        alone: it also keeps every write of a digest a save in flight holds
        (`pool.reachability.in_flight`).  One that cannot be removed is left for the next
        sweep.
        """
        removed = 0
        for write in self.incomplete_writes():
            if write.mtime <= older_than:
                with contextlib.suppress(OSError):
                    removed += self.remove_incomplete(write)
        return removed


def is_s3_url(root: object) -> bool:
    """Whether ``root`` names a pool on an object store (``s3://bucket/prefix``)."""
    return isinstance(root, str) and root.startswith("s3://")
