"""`RetryingReads`: a blob store whose reads try again past a shared filesystem's stale caches
(docs/architecture/shared-pools.md, "Shared pools").

On a filesystem several hosts mount (JuiceFS, NFS, Lustre), when another host's GC has
unlinked a blob and a writer has renamed a new copy in, this host may, until its metadata
caches expire, find the name missing, or open the old file (ESTALE; a stale cached size makes
the bytes not hash to the digest).  The wrapper's verified and ranged reads (`get`, `open`,
`open_private`, `check`, `read_range`) therefore call the store again on `BlobNotFoundError`,
`BlobDigestMismatchError` or ESTALE, pausing 50 ms, doubling to at most 250 ms, until its
bound has passed since the first failure; then the last error is raised.  Nothing else is
retried (EACCES, EIO, a FIFO in a blob's place are what the next try would meet too), nor are
`stat`, `size`, `has` (no bytes read) or `read_head` (GC's probe of row-less files, which
takes a file gone for nothing to do).  Every write and listing is the store's own.

A pool on a folder gets it around its `LocalBlobStore` (`blobs.local.local_pool_store`, with
the bound that follows the root's filesystem); it wraps any store.
"""

from __future__ import annotations

import errno
import logging
import math
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, TypeVar

from .._util.digest import Buffer
from ..errors import BlobDigestMismatchError, BlobNotFoundError, InvalidInputError
from .base import AbstractBlobStore, BlobStat, IncompleteWrite, PutItem

__all__ = ["RetryingReads", "check_seconds"]

_T = TypeVar("_T")
_log = logging.getLogger("archive_manager")

# The first pause, doubled after each try up to the last.  NOTE: a short cap: with 1 s it took
# 1.6 s to read a blob past JuiceFS's 1 s entry cache (tries at 0.75 s and 1.55 s); with
# 0.25 s, about 1.1 s, and a 5 s bound costs a missing blob about 20 lookups.
_RETRY_FIRST = 0.05
_RETRY_MAX = 0.25


def check_seconds(value: float, what: str) -> float:
    """``value`` as a float; InvalidInputError unless it is a finite number of seconds >= 0."""
    if not math.isfinite(value) or value < 0:
        raise InvalidInputError(f"{what} must be a finite number of seconds >= 0, not {value!r}")
    return float(value)


class RetryingReads(AbstractBlobStore):
    """``inner`` with its reads tried again for ``read_retry`` seconds (see the module
    docstring): a number, or a function that gives it when a read first needs a retry (the
    filesystem store's default reads the mount table then, never on the common read).

    Every other call is ``inner``'s own, and so are the members the interface does not have
    (the filesystem store's ``root``, ``path``, ``temp_files``).

    Raises:
        InvalidInputError: ``read_retry`` is not a finite number of seconds >= 0.
    """

    def __init__(self, inner: AbstractBlobStore, read_retry: float | Callable[[], float]) -> None:
        self.inner = inner
        self.capabilities = inner.capabilities
        self.read_extras = inner.read_extras | {"read_retry"}
        self._resolve: Callable[[], float] | None = None
        self._read_retry: float | None = None
        if callable(read_retry):
            self._resolve = read_retry
        else:
            self._read_retry = check_seconds(read_retry, "read_retry")

    def __repr__(self) -> str:
        return f"RetryingReads({self.inner!r})"

    def __getattr__(self, name: str) -> Any:
        if name == "inner":  # not set yet (a copy being made): never recurse
            raise AttributeError(name)
        return getattr(self.inner, name)

    @property
    def read_retry(self) -> float:
        """Seconds a read of a missing or mismatching blob keeps trying."""
        if self._read_retry is None:
            assert self._resolve is not None
            self._read_retry = check_seconds(self._resolve(), "read_retry")
        return self._read_retry

    @property
    def read_only_reason(self) -> str | None:
        """``inner``'s: a read-only store stays read-only with its reads retried."""
        return self.inner.read_only_reason

    def _retried(self, digest: str, read: Callable[[], _T]) -> _T:
        """``read()``, again after a pause while it meets a missing blob, a digest mismatch
        or ESTALE, until `read_retry` seconds have passed; then that error.

        NOTE: each try is a new call of the store, which opens the blob afresh (a held
        descriptor would keep the old file).  The bound keeps real damage reported.
        """
        started = deadline = delay = 0.0
        tries = 0
        while True:
            try:
                value = read()
            except (BlobNotFoundError, BlobDigestMismatchError) as exc:
                error: Exception = exc
            except OSError as exc:
                if exc.errno != errno.ESTALE:
                    raise
                error = exc
            else:
                if tries:
                    _log.info(
                        "blob %s read on try %d, %.2f s after the first (a stale metadata "
                        "cache of a shared filesystem)",
                        digest,
                        tries + 1,
                        time.monotonic() - started,
                    )
                return value
            now = time.monotonic()
            if not tries:
                started, deadline, delay = now, now + self.read_retry, _RETRY_FIRST
            if now >= deadline:
                raise error
            tries += 1
            time.sleep(min(delay, deadline - now))
            delay = min(delay * 2, _RETRY_MAX)

    # ------------------------------------------------------------------ reads: retried

    def get(self, digest: str) -> bytes:
        """``inner``'s `get`, tried again (see the class)."""
        return self._retried(digest, lambda: self.inner.get(digest))

    def open(self, digest: str, *, verify: bool = True) -> memoryview:
        """``inner``'s `open`, tried again (see the class)."""
        return self._retried(digest, lambda: self.inner.open(digest, verify=verify))

    def get_view(self, digest: str) -> memoryview:
        """``inner``'s `get_view`, tried again (see the class)."""
        return self._retried(digest, lambda: self.inner.get_view(digest))

    def open_private(self, digest: str) -> memoryview:
        """``inner``'s `open_private`, tried again (see the class)."""
        return self._retried(digest, lambda: self.inner.open_private(digest))

    def read_range(self, digest: str, offset: int, length: int) -> bytes:
        """``inner``'s `read_range`, tried again (see the class)."""
        return self._retried(digest, lambda: self.inner.read_range(digest, offset, length))

    def check(self, digest: str) -> None:
        """``inner``'s `check`, tried again (see the class)."""
        self._retried(digest, lambda: self.inner.check(digest))

    # ------------------------------------------------------------------ the rest: inner's

    def read_head(self, digest: str, n: int) -> bytes:
        """``inner``'s `read_head`, *not* tried again: its callers, GC's and
        `rebuild_catalog`'s probes of row-less files, take a file gone for nothing to do, and
        waiting for each made a GC on a shared root wait the bound per orphan another host
        had just removed."""
        return self.inner.read_head(digest, n)

    def stat(self, digest: str) -> BlobStat:
        """``inner``'s `stat`."""
        return self.inner.stat(digest)

    def size(self, digest: str) -> int:
        """``inner``'s `size`."""
        return self.inner.size(digest)

    def has(self, digest: str) -> bool:
        """``inner``'s `has`."""
        return self.inner.has(digest)

    def iter_stat(self) -> Iterator[tuple[str, int, float]]:
        """``inner``'s `iter_stat`."""
        return self.inner.iter_stat()

    def iter_digests(self) -> Iterator[str]:
        """``inner``'s `iter_digests`."""
        return self.inner.iter_digests()

    def put(self, data: Buffer | Sequence[Buffer], digest: str | None = None) -> str:
        """``inner``'s `put`."""
        return self.inner.put(data, digest)

    def put_many(self, items: Sequence[PutItem], *, workers: int = 4) -> list[str]:
        """``inner``'s `put_many`."""
        return self.inner.put_many(items, workers=workers)

    def put_new(self, items: Sequence[PutItem], *, workers: int | None = None) -> list[str]:
        """``inner``'s `put_new` (on S3, no HEAD before each upload)."""
        return self.inner.put_new(items, workers=workers)

    def delete(self, digest: str) -> bool:
        """``inner``'s `delete`."""
        return self.inner.delete(digest)

    def delete_many(self, digests: Iterable[str]) -> int:
        """``inner``'s `delete_many`."""
        return self.inner.delete_many(digests)

    def incomplete_writes(self) -> list[IncompleteWrite]:
        """``inner``'s `incomplete_writes`."""
        return self.inner.incomplete_writes()

    def remove_incomplete(self, write: IncompleteWrite) -> bool:
        """``inner``'s `remove_incomplete`."""
        return self.inner.remove_incomplete(write)

    def sweep_incomplete(self, older_than: float) -> int:
        """``inner``'s `sweep_incomplete`."""
        return self.inner.sweep_incomplete(older_than)
