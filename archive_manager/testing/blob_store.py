"""The blob store contract suite (docs/architecture/blob-store-contract.md, "Blob store
contract"), shipped with the package as zarr ships its store tests: every store passes both
of its parts.

* `BlobStoreContract`: what a store does (puts, verified and ranged reads, listing, deleting,
  incomplete writes, the errors);
* `ReadOnlyStoreContract`: the store seen through its read-only view
  (`AbstractBlobStore.read_only_view`): every write refused with `ReadOnlyPoolError` and
  nothing changed on the store's medium, every read what the store itself answers.

A test module subclasses both and gives them a ``store`` fixture that returns a new, empty
store, and, where its store allows, a ``damage`` method (make a blob hold other bytes behind
the store's back), ``leave_incomplete`` (leave a crashed writer's incomplete write) and
``medium`` (what the store holds as its medium shows it: files, a bucket's objects)::

    from archive_manager.testing.blob_store import BlobStoreContract, ReadOnlyStoreContract

    class TestMyStore(BlobStoreContract, ReadOnlyStoreContract):
        @pytest.fixture
        def store(self, tmp_path):
            return MyStore(tmp_path)

        def damage(self, store, digest, data):
            ...  # make ``digest`` hold ``data`` without going through ``put``

It needs pytest, hypothesis and numpy (the package's test extra).
"""

from __future__ import annotations

import array
import itertools
import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .._util.digest import digest_of
from .._util.filemap import mapped
from ..blobs import AbstractBlobStore, BlobStat, Capabilities, IncompleteWrite
from ..blobs.base import ObjectRoot
from ..errors import (
    BlobCorruptError,
    BlobDigestMismatchError,
    BlobNotFoundError,
    IntegrityError,
    InvalidNameError,
    ReadOnlyPoolError,
)

__all__ = [
    "ABSENT",
    "BAD_DIGESTS",
    "READ_OPS",
    "WRITE_OPS",
    "BlobStoreContract",
    "ReadOnlyStoreContract",
    "flip_bit",
]

BAD_DIGESTS = [
    "../../etc/passwd",
    "A" * 32,
    "0123456789ABCDEF0123456789abcdef",
    "a" * 31,
    "a" * 33,
    "a" * 31 + "\x00",
    "a" * 32 + "\n",
    "g" * 32,
    "",
    "../" + "a" * 29,
    123,
    None,
    b"a" * 32,
]
READ_OPS = ["get", "open", "has", "size", "stat", "delete", "check"]
ABSENT = digest_of(b"never stored")


def flip_bit(data: bytes, index: int = 0) -> bytes:
    """``data`` with bit 0 of byte ``index`` flipped."""
    return data[:index] + bytes([data[index] ^ 0x01]) + data[index + 1 :]


class BlobStoreContract:
    """Behaviour every blob store must share; subclasses provide `store` and `damage`."""

    # NOTE: the tests take ``store: Any``: they call methods only some stores have (the
    # filesystem store's ``path``) behind capability checks, and pass wrong types on purpose.

    @pytest.fixture
    def store(self) -> AbstractBlobStore:
        """A new, empty store (a subclass overrides this fixture)."""
        raise NotImplementedError

    def damage(self, store: AbstractBlobStore, digest: str, data: bytes) -> None:
        """Replace the stored bytes of ``digest`` behind the store's back; a store that
        cannot be damaged so skips the tests that need it."""
        pytest.skip(f"{type(store).__name__} cannot be damaged behind its back")

    @pytest.mark.parametrize(
        "data",
        [b"hello blob", bytearray(b"a bytearray"), memoryview(b"a memoryview"), b"\x00" * 10_000],
    )
    def test_round_trip(self, store: Any, data: Any) -> None:
        digest = store.put(data)
        assert digest == digest_of(bytes(data))
        assert store.get(digest) == bytes(data)
        assert bytes(store.open(digest)) == bytes(data)
        assert bytes(store.get_view(digest)) == bytes(data)
        assert store.has(digest)
        assert store.size(digest) == len(bytes(data))
        store.check(digest)

    def test_parts_are_concatenated(self, store: Any) -> None:
        parts = [b"header:", memoryview(bytearray(b"x" * 1000)), b"", bytearray(b":trailer")]
        whole = b"header:" + b"x" * 1000 + b":trailer"
        digest = store.put(parts)
        assert digest == digest_of(whole)
        assert store.get(digest) == whole
        assert store.put(whole) == digest
        assert list(store.iter_digests()) == [digest]

    def test_typed_and_multidimensional_buffers_are_stored_as_raw_bytes(self, store: Any) -> None:
        ints = array.array("i", range(10))
        matrix = np.arange(24, dtype=np.float32).reshape(4, 6)
        digest = store.put([b"hdr", memoryview(ints), matrix])
        assert store.get(digest) == b"hdr" + ints.tobytes() + matrix.tobytes()
        assert store.size(digest) == 3 + 40 + 96

    def test_non_contiguous_buffer_is_refused(self, store: Any) -> None:
        matrix = np.arange(24, dtype=np.int64).reshape(4, 6)
        with pytest.raises(TypeError, match="contiguous"):
            store.put([b"hdr", matrix[:, ::2]])
        assert list(store.iter_digests()) == []

    @pytest.mark.parametrize("empty", [b"", [], [b"", memoryview(b"")]])
    def test_empty_blob(self, store: Any, empty: Any) -> None:
        digest = store.put(empty)
        assert digest == digest_of(b"")
        assert store.get(digest) == b""
        view = store.open(digest)
        assert len(view) == 0
        assert store.size(digest) == 0
        store.check(digest)

    def test_open_is_read_only(self, store: Any) -> None:
        digest = store.put(b"immutable")
        for view in (store.open(digest), store.get_view(digest)):
            assert view.readonly
            with pytest.raises(TypeError):
                view[0] = 0

    @pytest.mark.parametrize("size", [0, 10_000, 3 << 20])
    def test_get_view_is_the_verified_bytes(self, store: Any, size: int) -> None:
        """`get_view`: `get`'s bytes, read-only (a store of local files maps a large file on
        a local disk: chunks are read so, without a copy)."""
        data = os.urandom(size)
        digest = store.put(data)
        view = store.get_view(digest)
        assert bytes(view) == data == store.get(digest) and view.readonly
        if size > 2 << 20 and type(store).__name__ == "LocalBlobStore":  # on a local disk
            assert mapped(view.obj)

    def test_put_of_existing_blob_is_idempotent(self, store: Any) -> None:
        first = store.put(b"same bytes")
        assert store.put([b"same ", b"bytes"]) == first
        assert store.put(b"same bytes", digest=first) == first
        assert list(store.iter_digests()) == [first]

    def test_put_over_blob_of_other_size_raises(self, store: Any) -> None:
        data = b"0123456789" * 10
        digest = store.put(data)
        self.damage(store, digest, data[:-7])
        with pytest.raises(IntegrityError, match=digest):
            store.put(data)
        assert store.size(digest) == len(data) - 7  # the damaged blob was not silently replaced

    def test_put_with_wrong_digest_raises_and_stores_nothing(self, store: Any) -> None:
        wrong = digest_of(b"other bytes")
        with pytest.raises(IntegrityError, match=wrong):
            store.put(b"some bytes", digest=wrong)
        assert not store.has(wrong)
        assert not store.has(digest_of(b"some bytes"))
        assert list(store.iter_digests()) == []

    def test_wrong_digest_never_dedups_against_a_blob_of_equal_size(self, store: Any) -> None:
        stored = store.put(b"abc")
        with pytest.raises(IntegrityError):
            store.put(b"abd", digest=stored)
        assert store.get(stored) == b"abc"

    def test_put_many_stores_each_item_once(self, store: Any) -> None:
        items = [(os.urandom(1000 + i), None) for i in range(6)]
        items.append((items[0][0], None))  # a duplicate within the batch
        digests = store.put_many(items)
        assert digests == [digest_of(data) for data, _ in items]
        for (data, _), digest in zip(items, digests, strict=True):
            assert store.get(digest) == data
        assert sorted(store.iter_digests()) == sorted(set(digests))

    def test_put_many_refuses_a_wrong_digest(self, store: Any) -> None:
        good, bad = os.urandom(100), os.urandom(100)
        with pytest.raises(IntegrityError):
            store.put_many([(good, None), (bad, digest_of(good))])
        assert not store.has(digest_of(bad))

    def test_put_new_stores_each_item(self, store: Any) -> None:
        items = [(os.urandom(1000 + i), None) for i in range(5)]
        digests = store.put_new(items)
        assert digests == [digest_of(data) for data, _ in items]
        for (data, _), digest in zip(items, digests, strict=True):
            assert store.get(digest) == data

    def test_put_new_over_a_stored_blob_keeps_its_bytes(self, store: Any) -> None:
        # An orphan of a crashed save is put again by the next save of the same content.
        data = os.urandom(3000)
        digest = store.put(data)
        assert store.put_new([(data, digest), ([data[:1000], data[1000:]], digest)]) == [
            digest,
            digest,
        ]
        assert store.get(digest) == data
        assert sorted(store.iter_digests()) == [digest]

    def test_put_new_refuses_a_wrong_digest(self, store: Any) -> None:
        good, bad = os.urandom(100), os.urandom(100)
        with pytest.raises(IntegrityError):
            store.put_new([(good, None), (bad, digest_of(good))])
        assert not store.has(digest_of(bad))
        if store.has(digest_of(good)):  # the other item may have been stored, and whole
            assert store.get(digest_of(good)) == good

    def test_put_with_right_digest(self, store: Any) -> None:
        digest = digest_of(b"given")
        assert store.put([b"gi", b"ven"], digest=digest) == digest
        assert store.get(digest) == b"given"

    @pytest.mark.parametrize("op", READ_OPS)
    @pytest.mark.parametrize("bad", BAD_DIGESTS, ids=repr)
    def test_invalid_digest_is_refused(self, store: Any, op: str, bad: Any) -> None:
        with pytest.raises(InvalidNameError):
            getattr(store, op)(bad)

    @pytest.mark.parametrize("bad", [b for b in BAD_DIGESTS if b is not None], ids=repr)
    def test_put_with_invalid_digest_is_refused(self, store: Any, bad: Any) -> None:
        with pytest.raises(InvalidNameError):
            store.put(b"data", digest=bad)
        assert list(store.iter_digests()) == []

    @pytest.mark.parametrize("op", ["get", "get_view", "open", "size", "stat", "check"])
    def test_missing_blob(self, store: Any, op: str) -> None:
        with pytest.raises(BlobNotFoundError, match=ABSENT) as info:
            getattr(store, op)(ABSENT)
        assert isinstance(info.value, IntegrityError)
        assert isinstance(info.value, FileNotFoundError)
        assert not store.has(ABSENT)
        assert store.delete(ABSENT) is False

    def test_delete(self, store: Any) -> None:
        keep, gone = store.put(b"keep"), store.put(b"gone")
        assert store.delete(gone) is True
        assert not store.has(gone)
        with pytest.raises(BlobNotFoundError):
            store.get(gone)
        assert store.delete(gone) is False
        assert list(store.iter_digests()) == [keep]

    @pytest.mark.parametrize("kind", ["bit flip", "truncated", "emptied", "extended"])
    def test_damaged_blob_raises_naming_the_digest(self, store: Any, kind: str) -> None:
        data = bytes(range(256)) * 4
        digest = store.put(data)
        damaged = {
            "bit flip": flip_bit(data, 517),
            "truncated": data[:100],
            "emptied": b"",
            "extended": data + b"\x00",
        }[kind]
        self.damage(store, digest, damaged)
        for op in (store.get, store.open, store.check):
            with pytest.raises(IntegrityError, match=f"{digest}.*corrupt or truncated"):
                op(digest)
        assert bytes(store.open(digest, verify=False)) == damaged

    def test_iteration_yields_every_blob_once(self, store: Any) -> None:
        payloads = [b"one", b"two" * 100, b"", b"three" * 7]
        digests = {store.put(p) for p in payloads}
        assert sorted(store.iter_digests()) == sorted(digests)
        assert sorted(store) == sorted(digests)
        stats = {d: (size, mtime) for d, size, mtime in store.iter_stat()}
        assert {d: size for d, (size, _) in stats.items()} == {
            digest_of(p): len(p) for p in payloads
        }
        assert all(mtime > 0 for _, mtime in stats.values())

    def test_delete_while_iterating(self, store: Any) -> None:
        for i in range(20):
            store.put(b"blob %d" % i)
        for digest in store.iter_digests():
            assert store.delete(digest)
        assert list(store.iter_digests()) == []

    @settings(
        max_examples=60,
        deadline=None,
        # Reusing one store across examples is sound: blobs are content-addressed and immutable.
        # Each contract subclass is its own executor by design; they may share saved examples.
        suppress_health_check=[
            HealthCheck.function_scoped_fixture,
            HealthCheck.differing_executors,
        ],
    )
    @given(data=st.binary(max_size=4096), cuts=st.lists(st.integers(0, 4096), max_size=5))
    def test_round_trip_property(self, store: Any, data: bytes, cuts: list[int]) -> None:
        bounds = [0, *sorted(c % (len(data) + 1) for c in cuts), len(data)]
        parts = [data[a:b] for a, b in itertools.pairwise(bounds)]
        digest = store.put(parts)
        assert digest == digest_of(data)
        assert store.get(digest) == data
        assert bytes(store.open(digest)) == data
        assert store.size(digest) == len(data)
        assert digest in set(store.iter_digests())

    # ------------------------------------------------------------------ the wider interface

    def test_is_a_blob_store_with_capabilities(self, store: Any) -> None:
        assert isinstance(store, AbstractBlobStore)
        assert isinstance(store.capabilities, Capabilities)

    def test_read_range(self, store: Any) -> None:
        data = bytes(range(256)) * 3
        digest = store.put(data)
        assert store.read_range(digest, 0, 10) == data[:10]
        assert store.read_range(digest, 300, 50) == data[300:350]
        assert store.read_range(digest, len(data) - 5, 100) == data[-5:]  # short at the end
        assert store.read_range(digest, len(data) + 10, 5) == b""
        assert store.read_range(digest, 7, 0) == b""
        assert store.read_head(digest, 4) == data[:4]
        with pytest.raises(ValueError):
            store.read_range(digest, -1, 5)

    def test_ranged_read_is_unverified(self, store: Any) -> None:
        data = b"0123456789" * 10
        digest = store.put(data)
        damaged = flip_bit(data, 95)
        self.damage(store, digest, damaged)
        assert store.read_range(digest, 90, 10) == damaged[90:]

    def test_missing_blob_ranged_read(self, store: Any) -> None:
        with pytest.raises(BlobNotFoundError, match=ABSENT):
            store.read_range(ABSENT, 0, 1)

    @pytest.mark.parametrize("bad", BAD_DIGESTS, ids=repr)
    def test_ranged_read_refuses_an_invalid_digest(self, store: Any, bad: Any) -> None:
        with pytest.raises(InvalidNameError):
            store.read_range(bad, 0, 1)

    def test_stat(self, store: Any) -> None:
        before = time.time()
        digest = store.put(b"x" * 321)
        found = store.stat(digest)
        assert isinstance(found, BlobStat)
        assert found.size == 321 == store.size(digest)
        # A filesystem's clock may run a tick behind time.time().
        assert before - 1 <= found.mtime <= time.time() + 1
        listed = {d: (size, mtime) for d, size, mtime in store.iter_stat()}
        assert listed[digest] == (found.size, found.mtime)

    def test_delete_many(self, store: Any) -> None:
        digests = [store.put(b"blob %d" % i) for i in range(5)]
        assert store.delete_many([digests[0], ABSENT, digests[3], digests[0]]) == 2
        assert sorted(store.iter_digests()) == sorted(digests[i] for i in (1, 2, 4))
        with pytest.raises(InvalidNameError):
            store.delete_many(["../escape"])

    def test_a_put_leaves_no_incomplete_write(self, store: Any) -> None:
        store.put_many([(os.urandom(100), None) for _ in range(3)])
        writes = store.incomplete_writes()
        assert writes == []
        assert store.sweep_incomplete(time.time() + 3600) == 0
        assert len(list(store.iter_digests())) == 3

    def test_incomplete_writes_are_listed_as_such(self, store: Any) -> None:
        for write in store.incomplete_writes():
            assert isinstance(write, IncompleteWrite)
        # Removing one that is gone is no error.
        assert store.remove_incomplete(IncompleteWrite("gone.tmp", 0.0)) is False

    def test_damage_is_a_corrupt_blob_error(self, store: Any) -> None:
        data = b"precious bytes"
        digest = store.put(data)
        self.damage(store, digest, flip_bit(data, 3))
        for op in (store.get, store.get_view, store.open, store.check):
            with pytest.raises(BlobCorruptError, match=digest) as info:
                op(digest)
            assert isinstance(info.value, IntegrityError)
            # What a read retry tries again (`RetryingReads`): bytes not hashing to the digest.
            assert isinstance(info.value, BlobDigestMismatchError)

    def test_put_over_a_damaged_blob_of_other_size_is_a_corrupt_blob_error(
        self, store: Any
    ) -> None:
        data = b"0123456789"
        digest = store.put(data)
        self.damage(store, digest, data[:4])
        with pytest.raises(BlobCorruptError, match=digest):
            store.put(data)

    def test_open_maps_when_the_store_says_so(self, store: Any) -> None:
        data = os.urandom(10_000)
        digest = store.put(data)
        view = store.open(digest)
        assert bytes(view) == data
        if store.capabilities.mmap:
            assert mapped(view.obj)

    @pytest.mark.parametrize("size", [0, 10_000, 3 << 20])
    def test_open_private_is_the_callers_own(self, store: Any, size: int) -> None:
        """`open_private`: the verified bytes, writable, and what one caller writes reaches
        neither the store nor another view (a store of local files maps a large file
        copy-on-write: a loaded tensor uses it as its memory)."""
        data = os.urandom(size)
        digest = store.put(data)
        view = store.open_private(digest)
        assert bytes(view) == data and not view.readonly
        if size:
            view[0] ^= 0xFF
            assert store.get(digest) == data
            assert bytes(store.open_private(digest)) == data
            assert bytes(store.open(digest)) == data
            if size > 2 << 20 and type(store).__name__ == "LocalBlobStore":  # a local disk
                assert mapped(view.obj)  # no copy of the bytes

    def test_open_private_checks_the_digest(self, store: Any) -> None:
        data = b"0123456789" * 100
        digest = store.put(data)
        self.damage(store, digest, flip_bit(data, 500))
        with pytest.raises(IntegrityError, match=digest):
            store.open_private(digest)

    def test_local_paths_when_the_store_says_so(self, store: Any) -> None:
        digest = store.put(b"on a disk")
        if not store.capabilities.local_paths:
            return
        assert store.path(digest).read_bytes() == b"on a disk"
        assert store.path(digest).is_relative_to(store.root)


#: Every write of the interface, as ``(name, call)``: ``call(view, stored, incomplete)`` with a
#: digest the store holds and an incomplete write it lists (or a made-up one).
WRITE_OPS: list[tuple[str, Any]] = [
    ("put", lambda v, d, w: v.put(b"a new blob")),
    ("put of a stored blob", lambda v, d, w: v.put(v.get(d))),
    ("put with a given digest", lambda v, d, w: v.put(b"given", digest_of(b"given"))),
    ("put with an invalid digest", lambda v, d, w: v.put(b"x", "../../etc/passwd")),
    ("put_many", lambda v, d, w: v.put_many([(b"one", None), (b"two", None)], workers=2)),
    ("put_new", lambda v, d, w: v.put_new([(b"three", None)])),
    ("put_new of a stored blob", lambda v, d, w: v.put_new([(v.get(d), d)])),
    ("delete", lambda v, d, w: v.delete(d)),
    ("delete of an absent blob", lambda v, d, w: v.delete(ABSENT)),
    ("delete of an invalid digest", lambda v, d, w: v.delete("../../etc/passwd")),
    ("delete_many", lambda v, d, w: v.delete_many([d, ABSENT])),
    ("remove_incomplete", lambda v, d, w: v.remove_incomplete(w)),
    ("sweep_incomplete", lambda v, d, w: v.sweep_incomplete(time.time() + 3600)),
]


class ReadOnlyStoreContract:
    """A store seen through its read-only view: every write refused before it reaches the
    store, nothing changed, every read the store's own; subclasses provide `store` and, where
    they can, `damage`, `leave_incomplete` and `medium`."""

    REASON = "a contract test"

    @pytest.fixture
    def store(self) -> AbstractBlobStore:
        """A new, empty store (a subclass overrides this fixture)."""
        raise NotImplementedError

    def damage(self, store: AbstractBlobStore, digest: str, data: bytes) -> None:
        """As `BlobStoreContract.damage`."""
        pytest.skip(f"{type(store).__name__} cannot be damaged behind its back")

    def leave_incomplete(self, store: AbstractBlobStore, digest: str) -> bool:
        """Leave an incomplete write of ``digest`` behind the store's back, as a writer killed
        mid-put would; False where the store can have none (this default)."""
        return False

    def medium(self, store: AbstractBlobStore) -> Any:
        """What ``store`` holds, as its medium shows it (a subclass looks at the files, or at
        the bucket's objects and uploads); here through the store's own listing."""
        return (
            sorted((d, size, mtime, store.get(d)) for d, size, mtime in store.iter_stat()),
            sorted((w.name, w.mtime, w.digest) for w in store.incomplete_writes()),
        )

    @pytest.fixture
    def filled(self, store: Any) -> tuple[Any, list[str], IncompleteWrite]:
        """``store`` holding a few blobs (one empty, one of 100 kB) and, where it can, an
        incomplete write; the stored digests; an incomplete write it lists (else a made-up
        one)."""
        digests = store.put_many([(b"", None), (b"small", None), (os.urandom(100_000), None)])
        digests.append(store.put([b"in ", b"parts"]))
        left = self.leave_incomplete(store, digest_of(b"never finished"))
        writes = store.incomplete_writes()
        if left:
            assert writes, "leave_incomplete left nothing the store lists"
        write = writes[0] if writes else IncompleteWrite("gone.tmp", 0.0)
        return store, digests, write

    def test_a_store_writes_until_seen_through_its_view(self, store: Any) -> None:
        assert store.read_only is False and store.read_only_reason is None
        view = store.read_only_view(self.REASON)
        assert isinstance(view, AbstractBlobStore)
        assert view.read_only is True and view.read_only_reason == self.REASON
        assert view.capabilities == store.capabilities
        # A view, not a copy: the store still writes, and the view reads what it wrote.
        assert store.read_only is False
        digest = store.put(b"written after the view was made")
        assert view.get(digest) == b"written after the view was made"

    @pytest.mark.parametrize(("name", "call"), WRITE_OPS, ids=[n for n, _ in WRITE_OPS])
    def test_every_write_is_refused_and_changes_nothing(
        self, filled: tuple[Any, list[str], IncompleteWrite], name: str, call: Any
    ) -> None:
        store, digests, write = filled
        view = store.read_only_view(self.REASON, where="the contract's pool")
        before = self.medium(store)
        with pytest.raises(ReadOnlyPoolError) as caught:
            call(view, digests[-1], write)
        message = str(caught.value)
        assert "the contract's pool" in message and f"({self.REASON})" in message, message
        assert "nothing was changed" in message, message
        assert self.medium(store) == before

    def test_refusals_come_before_anything_is_looked_at(self, store: Any) -> None:
        # Not the names' check, not the iterator, not the data: the gate first.
        view = store.read_only_view(self.REASON)
        names = iter(["../../etc", ABSENT])
        with pytest.raises(ReadOnlyPoolError):
            view.delete_many(names)
        assert list(names) == ["../../etc", ABSENT]
        with pytest.raises(ReadOnlyPoolError):
            view.put(object())
        with pytest.raises(ReadOnlyPoolError):
            view.remove_incomplete(None)

    def test_reads_through_the_view_are_the_stores(
        self, filled: tuple[Any, list[str], IncompleteWrite]
    ) -> None:
        store, digests, _ = filled
        view = store.read_only_view(self.REASON)
        for digest in digests:
            data = store.get(digest)
            assert view.get(digest) == data
            assert bytes(view.open(digest)) == data == bytes(view.open(digest, verify=False))
            assert view.open(digest).readonly
            assert bytes(view.get_view(digest)) == data and view.get_view(digest).readonly
            private = view.open_private(digest)
            assert bytes(private) == data and not private.readonly
            assert view.read_range(digest, 2, 3) == data[2:5] == store.read_range(digest, 2, 3)
            assert view.read_head(digest, 4) == data[:4]
            assert view.stat(digest) == store.stat(digest)
            assert view.size(digest) == len(data)
            assert view.has(digest)
            view.check(digest)
        assert sorted(view.iter_stat()) == sorted(store.iter_stat())
        assert sorted(view.iter_digests()) == sorted(digests) == sorted(view)
        assert view.incomplete_writes() == store.incomplete_writes()
        assert not view.has(ABSENT)
        with pytest.raises(BlobNotFoundError, match=ABSENT):
            view.get(ABSENT)
        with pytest.raises(InvalidNameError):
            view.get("../../etc/passwd")

    def test_damage_reads_as_damage_through_the_view(self, store: Any) -> None:
        data = b"0123456789" * 10
        digest = store.put(data)
        self.damage(store, digest, flip_bit(data, 7))
        view = store.read_only_view(self.REASON)
        for op in (view.get, view.get_view, view.open, view.check, view.open_private):
            with pytest.raises(BlobCorruptError, match=digest):
                op(digest)
        assert view.read_range(digest, 0, 10) == flip_bit(data, 7)[:10]

    def test_a_view_of_a_view_shows_the_same_store(self, store: Any) -> None:
        view = store.read_only_view(self.REASON)
        again = view.read_only_view("twice")
        assert again.read_only_reason == "twice" and view.read_only_reason == self.REASON
        digest = store.put(b"seen by both")
        assert again.get(digest) == view.get(digest) == b"seen by both"
        for each in (view, again):
            with pytest.raises(ReadOnlyPoolError):
                each.put(b"refused")
        assert not store.has(digest_of(b"refused"))

    def test_only_the_stores_reading_members_pass_through(self, store: Any) -> None:
        view = store.read_only_view(self.REASON)
        interface = set(dir(AbstractBlobStore)) | set(AbstractBlobStore.__annotations__)
        own = {n for n in dir(store) if not n.startswith("_")} - interface
        for name in own - set(store.read_extras) - {"pool_root"}:
            # A member the store does not name as a read may write: the view does not offer it.
            assert not hasattr(view, name), name
        for name in store.read_extras:
            assert hasattr(view, name), name
        if store.capabilities.local_paths:
            digest = store.put(b"on a disk")
            assert view.root == store.root and view.path(digest) == store.path(digest)

    def test_the_pool_root_of_a_view_writes_nothing(self, store: Any) -> None:
        """A store with a pool root (an object store's: identity, journal) gives its view's
        root with every write refused too."""
        if not hasattr(store, "pool_root"):
            assert not hasattr(store.read_only_view(self.REASON), "pool_root")
            return
        store.pool_root().write("contract/note", b"there")
        root: ObjectRoot = store.read_only_view(self.REASON).pool_root()
        assert str(root) == str(store.pool_root())
        before = self.medium(store), store.pool_root().list("contract")
        writes: list[Callable[[], object]] = [
            lambda: root.write("contract/note", b"changed"),
            lambda: root.write("contract/new", b"new", exclusive=True),
            lambda: root.delete("contract/note"),
        ]
        for write in writes:
            with pytest.raises(ReadOnlyPoolError, match="nothing was changed"):
                write()
        assert (self.medium(store), store.pool_root().list("contract")) == before
        assert root.read("contract/note") == b"there"
        assert [name for name, _ in root.list("contract")] == ["note"]
        assert store.pool_root().delete("contract/note")
