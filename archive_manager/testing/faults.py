"""A blob store that fails on purpose: `FaultyBlobStore` wraps any store and makes chosen calls
raise, or return damaged bytes (as restic's error backend does for its tests).

Tests inject faults at the blob store's interface (docs/architecture/blob-store-contract.md, "Blob
store contract") instead of patching a store's private functions, so they hold for every store and
survive a change of its internals::

    store = FaultyBlobStore(BlobStore(root))
    pool = ArchiveManager.open(root, store=store)
    store.fail("put", OSError(errno.ENOSPC, "No space left on device"), nth=3)
    ...                       # the third blob a save writes fails; nothing was stored for it
    store.clear()             # the disk has room again

A fault counts the calls of its operation that it matches (``match``, given the digest, and
for a put the data's first bytes) and fires on the ``nth`` of them, then on the following ones
until it fired ``times`` times (None: for good).  The operations:

=============  ==============================================================================
``put``        each blob put (`put`, or one item of `put_many`); the failing blob is not
               stored, the items of the call before it are
``read``       `get`, `open`, `read_range` (and `read_head`), `check`
``stat``       `stat`, `size`, `has`
``delete``     `delete` (each digest of `delete_many`); the failing blob stays
``list``       `iter_stat`, `iter_digests`; with ``after=k`` the listing fails after ``k``
               blobs instead of at once
``incomplete`` `incomplete_writes`, `remove_incomplete`
=============  ==============================================================================

A corruption (`corrupt`) is a fault of the ``read`` operation that flips a bit of the bytes
read instead of raising: verified reads then raise `BlobCorruptError` as they would for a blob
damaged on its medium, unverified ones return the damaged bytes.
"""

from __future__ import annotations

import functools
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from .._util.digest import Buffer, check_digest
from ..blobs import AbstractBlobStore, BlobStat, IncompleteWrite, PutItem
from ..blobs._common import verify as _verify
from ..blobs._common import views_of

__all__ = ["OPERATIONS", "Fault", "FaultyBlobStore"]

OPERATIONS = frozenset({"put", "read", "stat", "delete", "list", "incomplete"})

#: What a fault's ``match`` is given: the digest (None for a put without one) and, for a put,
#: the data's first 16 bytes (empty otherwise).
Matcher = Callable[[str | None, bytes], bool]
_HEAD = 16


@dataclass
class Fault:
    """One planned failure: see the module docstring.  ``seen`` and ``fired`` count the calls
    it matched and those it failed."""

    op: str
    exc: BaseException | Callable[[], BaseException] | None
    nth: int = 1
    times: int | None = 1
    match: Matcher | None = None
    after: int = 0
    seen: int = field(default=0, init=False)
    fired: int = field(default=0, init=False)

    def error(self) -> BaseException:
        """A fresh exception to raise (an exception instance is raised as it is)."""
        assert self.exc is not None
        return self.exc() if callable(self.exc) else self.exc

    @property
    def spent(self) -> bool:
        """Whether it fired as often as it was asked to."""
        return self.times is not None and self.fired >= self.times


def _head(data: Buffer | Sequence[Buffer]) -> bytes:
    """The first bytes of ``data`` (a buffer or parts), without joining all of it."""
    head = b""
    for view in views_of(data):
        head += bytes(view[: _HEAD - len(head)])
        if len(head) == _HEAD:
            break
    return head


def _flip(data: bytes) -> bytes:
    """``data`` with its first bit flipped, or one byte more when it is empty."""
    if not data:
        return b"\x01"
    return bytes([data[0] ^ 0x01]) + data[1:]


class FaultyBlobStore(AbstractBlobStore):
    """``inner`` with faults injected at its interface; every call without a fault is
    ``inner``'s own.

    Attributes the interface does not have (the filesystem store's ``root``, ``path``,
    ``temp_files``) are ``inner``'s, so a test can look behind the wrapper.  ``calls`` counts
    the calls per operation, failed ones included.
    """

    def __init__(self, inner: AbstractBlobStore) -> None:
        self.inner = inner
        self.capabilities = inner.capabilities
        self.read_extras = inner.read_extras
        self.faults: list[Fault] = []
        self.calls: Counter[str] = Counter()
        # The writer puts from an I/O thread while GC or a reader may call from another.
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"FaultyBlobStore({self.inner!r}, {len(self.faults)} faults)"

    def __getattr__(self, name: str) -> Any:
        if name == "inner":  # not set yet (a copy being made): never recurse
            raise AttributeError(name)
        return getattr(self.inner, name)

    @property
    def read_only_reason(self) -> str | None:
        """``inner``'s: a read-only store stays read-only behind the faults."""
        return self.inner.read_only_reason

    # ------------------------------------------------------------------ planning faults

    def fail(
        self,
        op: str,
        exc: BaseException | Callable[[], BaseException],
        *,
        nth: int = 1,
        times: int | None = 1,
        match: Matcher | None = None,
        after: int = 0,
    ) -> Fault:
        """Make the ``nth`` call of ``op`` that ``match`` accepts raise ``exc`` (an exception,
        or a function that makes one), and the following ones until it raised ``times``
        times (None: for good).  Returns the fault, whose counters tell what happened."""
        return self._add(Fault(op, exc, nth=nth, times=times, match=match, after=after))

    def corrupt(
        self, *, nth: int = 1, times: int | None = None, match: Matcher | None = None
    ) -> Fault:
        """Make reads of the blobs ``match`` accepts (every blob by default) see damaged
        bytes, from the ``nth`` read on, ``times`` times (None: for good)."""
        return self._add(Fault("read", None, nth=nth, times=times, match=match))

    def clear(self) -> None:
        """Remove every fault: the store works again."""
        with self._lock:
            self.faults.clear()

    def _add(self, fault: Fault) -> Fault:
        if fault.op not in OPERATIONS:
            raise ValueError(f"unknown operation {fault.op!r}; one of {sorted(OPERATIONS)}")
        if fault.nth < 1 or (fault.times is not None and fault.times < 1) or fault.after < 0:
            raise ValueError("nth and times must be >= 1 (times may be None), after >= 0")
        with self._lock:
            self.faults.append(fault)
        return fault

    def _due(self, op: str, digest: str | None, head: bytes = b"") -> Fault | None:
        """Count this call of ``op`` and return the first fault it fires, if any."""
        with self._lock:
            self.calls[op] += 1
            due = None
            for fault in self.faults:
                if fault.op != op or fault.spent:
                    continue
                if fault.match is not None and not fault.match(digest, head):
                    continue
                fault.seen += 1
                if due is None and fault.seen >= fault.nth:
                    fault.fired += 1
                    due = fault
            return due

    def _raise_if_due(self, op: str, digest: str | None, head: bytes = b"") -> Fault | None:
        """Raise the fault due now; return a corruption (which does not raise) if one is."""
        fault = self._due(op, digest, head)
        if fault is not None and fault.exc is not None:
            raise fault.error()
        return fault

    # ------------------------------------------------------------------ writing

    def put_many(self, items: Sequence[PutItem], *, workers: int = 4) -> list[str]:
        """`put` each item; a fault fails its item after the items before it were put."""
        return self._put_faulted(items, functools.partial(self.inner.put_many, workers=workers))

    def put_new(self, items: Sequence[PutItem], *, workers: int | None = None) -> list[str]:
        """`put_many`'s faults, then ``inner``'s `put_new`: a wrapped store takes the path
        a save takes without the wrapper (on S3, no HEAD before each upload)."""
        return self._put_faulted(items, functools.partial(self.inner.put_new, workers=workers))

    def _put_faulted(
        self, items: Sequence[PutItem], put: Callable[[Sequence[PutItem]], list[str]]
    ) -> list[str]:
        for i, (data, digest) in enumerate(items):
            head = _head(data) if self.faults else b""
            fault = self._due("put", digest, head)
            if fault is not None and fault.exc is not None:
                if i:
                    put(items[:i])
                raise fault.error()
        return put(items)

    def put(self, data: Buffer | Sequence[Buffer], digest: str | None = None) -> str:
        """See `AbstractBlobStore.put`."""
        return self.put_many([(data, digest)])[0]

    # ------------------------------------------------------------------ reading

    def _read(self, digest: str) -> bytes | None:
        """None, or the damaged bytes a corruption due now makes this read see."""
        check_digest(digest)
        if self._raise_if_due("read", digest) is None:
            return None
        return _flip(bytes(self.inner.open(digest, verify=False)))

    def get(self, digest: str) -> bytes:
        """See `AbstractBlobStore.get`."""
        damaged = self._read(digest)
        if damaged is None:
            return self.inner.get(digest)
        _verify(digest, damaged)
        return damaged

    def open(self, digest: str, *, verify: bool = True) -> memoryview:
        """See `AbstractBlobStore.open`."""
        damaged = self._read(digest)
        if damaged is None:
            return self.inner.open(digest, verify=verify)
        if verify:
            _verify(digest, damaged)
        return memoryview(damaged)

    def read_range(self, digest: str, offset: int, length: int) -> bytes:
        """See `AbstractBlobStore.read_range`."""
        damaged = self._read(digest)
        if damaged is None:
            return self.inner.read_range(digest, offset, length)
        return damaged[offset : offset + length]

    def check(self, digest: str) -> None:
        """See `AbstractBlobStore.check`."""
        damaged = self._read(digest)
        if damaged is None:
            self.inner.check(digest)
        else:
            _verify(digest, damaged)

    def stat(self, digest: str) -> BlobStat:
        """See `AbstractBlobStore.stat`."""
        self._raise_if_due("stat", check_digest(digest))
        return self.inner.stat(digest)

    def size(self, digest: str) -> int:
        """See `AbstractBlobStore.size`."""
        self._raise_if_due("stat", check_digest(digest))
        return self.inner.size(digest)

    def has(self, digest: str) -> bool:
        """See `AbstractBlobStore.has`."""
        self._raise_if_due("stat", check_digest(digest))
        return self.inner.has(digest)

    # ------------------------------------------------------------------ listing

    def iter_stat(self) -> Iterator[tuple[str, int, float]]:
        """See `AbstractBlobStore.iter_stat`."""
        return self._listing(self.inner.iter_stat())

    def iter_digests(self) -> Iterator[str]:
        """See `AbstractBlobStore.iter_digests`."""
        return self._listing(self.inner.iter_digests())

    def _listing(self, items: Iterator[Any]) -> Iterator[Any]:
        fault = self._due("list", None)
        if fault is None:
            return items
        if fault.after == 0:
            raise fault.error()
        return self._fail_after(items, fault)

    @staticmethod
    def _fail_after(items: Iterator[Any], fault: Fault) -> Iterator[Any]:
        for i, item in enumerate(items):
            if i == fault.after:
                raise fault.error()
            yield item

    # ------------------------------------------------------------------ deleting

    def delete(self, digest: str) -> bool:
        """See `AbstractBlobStore.delete`."""
        self._raise_if_due("delete", check_digest(digest))
        return self.inner.delete(digest)

    def delete_many(self, digests: Iterable[str]) -> int:
        """See `AbstractBlobStore.delete_many`: the digests before a fault are deleted."""
        return sum(1 for digest in digests if self.delete(digest))

    # ------------------------------------------------------------------ incomplete writes

    def incomplete_writes(self) -> list[IncompleteWrite]:
        """See `AbstractBlobStore.incomplete_writes`."""
        self._raise_if_due("incomplete", None)
        return self.inner.incomplete_writes()

    def remove_incomplete(self, write: IncompleteWrite) -> bool:
        """See `AbstractBlobStore.remove_incomplete`."""
        self._raise_if_due("incomplete", None)
        return self.inner.remove_incomplete(write)
