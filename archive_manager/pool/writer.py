"""The save protocol (docs/architecture/save-protocol.md, "Save protocol"): lease, blobs, ownership,
manifest, publish.

Every step that makes something durable is ordered so that a process killed anywhere leaves
either a published archive whose every blob is owned and present, or nothing visible (an
expired lease, unowned blobs and maybe a pending row, all of which GC clears).
"""

from __future__ import annotations

import json
import logging
import math
import sys
import threading
import time
import uuid
import weakref
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from sqlalchemy import bindparam, delete, exists, or_, select, update
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Connection

from .. import codec
from .._util.digest import Buffer, digest_of
from .._util.failpoints import failpoint
from .._util.holders import describe_holder, holder_is_dead, holder_status, this_process
from .._util.names import LEASE_PREFIX, archive_owner, check_new_archive_name
from .._util.threads import Helpers
from ..blobs import AbstractBlobStore
from ..catalog import (
    STATUS_LENGTH,
    CatalogUnreachableError,
    archive_blobs_table,
    archives_table,
    blobs_table,
    chunks_table,
    entries_table,
    insert_rows,
    lease_blobs_table,
    leases_table,
    pin_write_lock,
    retention_table,
    sample_metadata_table,
    sample_rewards_table,
    task_texts_table,
)
from ..catalog.queries import (
    archive_rows_by_name,
    blob_rows,
    check_lease,
    drop_lease,
    hold_blobs,
    insert_lease,
    inserted_id,
    mark_live,
    next_save_seq,
    pick_archive,
    renew_lease,
)
from ..codec import EncodedChunk, EncodedSample
from ..codec.snapshot import lists_ahead
from ..codec.values import TakenList, gc_paused
from ..errors import (
    ArchiveError,
    ArchiveExistsError,
    ArchiveRetainedError,
    CatalogLockedError,
    IntegrityError,
    InvalidInputError,
    LeaseExpiredError,
    SaveInFlightError,
)
from ..metadata import (
    CATALOG_FIELDS,
    check_reward_key,
    describe_sample,
    inexact_fields,
    rescored,
    reward_component,
)
from ..samples import (
    check_key_text,
    sample_key,
    task_key_and_text,
    task_key_of,
)
from .archive import Archive, payload_gone
from .context import HasContext, PoolContext, context_of
from .journal import RecordWrite, place_committed, pool_id_of, publish_op, stage_record
from .listing import check_rollout_id
from .manifest import MANIFEST_FORMAT, MANIFEST_VERSION, Manifest
from .summary import group_key_of, store_summaries, summarize_archive

__all__ = [
    "MANIFEST_FORMAT",
    "MANIFEST_VERSION",
    "ArchiveWriter",
    "PreparedSample",
    "prepare_sample",
]

_log = logging.getLogger("archive_manager")

_UNSET: Any = object()
# Stores (of a pair of chunks each) handed to the I/O thread and not yet finished.  Two, so
# that the caller builds on while a pair uploads and the next pair is queued behind it: with
# one, the caller waited for each store and the I/O thread then waited for the next pair, the
# two alternating (docs/architecture/object-stores.md, "Blobs on an object store", Benchmark).
_STORES_IN_FLIGHT = 2
_CHUNKS_PER_STORE = 2  # chunks claimed in one transaction
# A failed lease renewal is retried after 0.1 s, then 0.2 s, ... at most 2 s apart: a catalog
# back from a restart is noticed within seconds, and an outage costs a few dozen attempts.
_RENEW_FIRST_RETRY = 0.1
_RENEW_MAX_RETRY = 2.0
# Renewal failures that pass: the server unreachable or restarting, the lock held past the
# busy timeout.  Anything else (the lease found lapsed or taken over, a bug) is final.
_RENEW_TRANSIENT = (CatalogUnreachableError, CatalogLockedError)
_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1


@dataclass(frozen=True)
class PreparedSample:
    """One sample as the writer takes it in: encoded (its values copied into the record and
    tensor blobs), described and keyed, for the archive position ``position``.  Nothing in it
    aliases the sample, so the caller may change the sample once it is made
    (`prepare_sample`)."""

    position: int
    encoded: EncodedSample
    description: dict[str, Any]
    sample_key: str
    task_key: str | None
    # The whole text of a task key that is the digest of a long one, else None.
    task_text: str | None = None

    @property
    def nbytes(self) -> int:
        """The bytes it holds: the record, its text part and its tensor blobs."""
        encoded = self.encoded
        return (
            len(encoded.record)
            + len(encoded.text)
            + sum(blob.size for blob in encoded.tensor_blobs.values())
        )


def prepare_sample(
    pool: PoolContext,
    sample: Any,
    position: int,
    task_key: Any = _UNSET,
    *,
    copy: bool = True,
    facts: Mapping[str, Any] | None = None,
    reward_key: str | None = None,
    ahead: Mapping[int, tuple[list[Any], TakenList]] | None = None,
) -> PreparedSample:
    """`ArchiveWriter.add`'s work on the sample itself: its task key (``task_key`` overrides
    the sample's), its sample key, its record and tensor blobs, its description (``facts``
    override it, as `ArchiveWriter.add` says; ``reward_key`` picks its reward out of a dict,
    `describe_sample`).  With ``copy`` (the default), no part of the result aliases the
    sample's memory.  ``ahead``: its numeric lists already converted (`codec.encode_sample`).

    Raises:
        UnencodableError: the sample holds a value that cannot be stored.
        InvalidInputError: its task key or sample key cannot be a catalog key, or ``facts``
            names a fact that cannot be set.
    """
    key, text = task_key_and_text(task_key_of(sample) if task_key is _UNSET else task_key)
    skey = check_key_text(sample_key(sample, position), "sample key")
    # NOTE: encoded before it is described, so the description only ever sees values the
    # codec accepted.
    encoded = codec.encode_sample(
        sample, inline_limit=pool.inline_limit, copy=copy, keep=CATALOG_FIELDS, ahead=ahead
    )
    description = describe_sample(sample, reward_key=reward_key)
    if facts:
        unknown = set(facts) - _OVERRIDABLE_FACTS
        if unknown:
            raise InvalidInputError(
                f"facts: {', '.join(sorted(unknown))} cannot be set; "
                f"only {', '.join(sorted(_OVERRIDABLE_FACTS))}"
            )
        description.update(facts)
    # which of its recorded values (facts given included) are the stored ones: an Arrow read
    # of those columns answers from the catalog (docs/architecture/getting-data-out.md, "Columns
    # from the catalog")
    description["inexact"] = inexact_fields(description, encoded.kept)
    encoded.kept = {}  # the values are the caller's: not held while the chunk is built
    return PreparedSample(position, encoded, description, skey, key, text)


@dataclass(frozen=True)
class _Blob:
    digest: str
    parts: Sequence[Buffer]
    size: int
    kind: str


class ArchiveWriter:
    """Streams samples into a new archive with bounded memory; publishes on `commit`.

    Use it through `ArchiveManager.writer` as a context manager: a clean exit publishes, an
    exception rolls back (the lease is dropped and the blobs only this save wrote are
    removed, or left to GC when the store fails).  Memory stays bounded: at most one chunk is being built, one compressed and
    two pairs being stored or queued for the I/O thread (``_STORES_IN_FLIGHT``) at any time.
    """

    def __init__(
        self,
        pool: PoolContext | HasContext,
        name: str,
        *,
        rollout_id: int | None,
        evaluation: bool = False,
        attrs: dict[str, Any] | None = None,
        reference: Archive | None = None,
        supersede: bool = False,
        reward_key: str | None = None,
        _lazy_renewal: bool = False,
        _expected: int | None = None,
    ) -> None:
        pool = context_of(pool)
        self._pool = pool
        self.name = check_new_archive_name(name)
        if not isinstance(supersede, bool):
            raise InvalidInputError("supersede must be True or False")
        self.supersede = supersede
        # The released archive the name points at, which this save supersedes when it
        # publishes (docs/architecture/save-protocol.md, "Superseding a name"): found by the
        # ownership transaction, checked again by the publication's.
        self._replaces: _Replaced | None = None
        self.rollout_id = check_rollout_id(rollout_id)
        if not isinstance(evaluation, bool):
            raise InvalidInputError("evaluation must be a bool")
        self.evaluation = evaluation
        self.attrs = _check_attrs(attrs)
        # The part of a dict reward that is each sample's reward (slime's --reward-key); a
        # reference keeps its source's unless given.
        self.reward_key = check_reward_key(reward_key)
        if reference is not None and reward_key is None:
            self.reward_key = reference.reward_key
        self._reference = reference
        self._lease = f"{LEASE_PREFIX}{uuid.uuid4().hex}"
        self._entries: list[tuple[int, str, str | None, int, int]] = []
        # The whole text of each task key that is the digest of a long one.
        self._task_texts: dict[str, str] = {}
        self._metadata: list[dict[str, Any]] = []
        # The samples of the chunk being filled, encoded at add() (see `add`).
        self._buffer = codec.RawChunk([], {})
        self._hand_over = codec.GilHandOver()
        # `save_samples` holds its samples until the save returns: it may skip the copy.
        self._copy = True
        # `save_samples`: the numeric lists of the samples being added, converted ahead.
        self._ahead: dict[int, tuple[list[Any], TakenList]] | None = None
        # How many samples the save adds, when known (`save_samples`): the pair holding the
        # last chunk is then not stored on its own but claimed by the ownership transaction
        # and written with the manifest (one transaction and one round of fsyncs less at the
        # end of the save, where nothing overlaps them).
        self._expected: int | None = _expected
        self._chunks: dict[int, tuple[str, int, int]] = {}
        self._blob_kinds: dict[str, str] = {}
        self._blob_sizes: dict[str, int] = {}
        self._created: set[str] = set()  # digests whose row this save inserted
        # Whether the lease may hold blobs (step 2 or a reference held some): a small save's
        # holds none, and its ownership transaction has none to drop.
        self._holds = False
        self._unmarked: list[str] = []  # written, not yet flipped to live
        # The chunks `commit` packed itself, claimed by the ownership transaction, and those
        # of their blobs it writes with the manifest (marked live at publication).
        self._last: list[tuple[int, EncodedChunk]] = []
        self._last_writes: list[_Blob] = []
        self._last_stored: list[_Blob] = []  # recorded live: their files looked for
        self._owned_at = 0.0  # when the ownership transaction committed (its owner row's time)
        self._record: RecordWrite | None = None  # the publication's journal record, begun
        self._published_row: Any = None  # the archive's row, as its publication left it
        self._next_ordinal = 0
        self._pending: deque[Future[None]] = deque()  # chunk stores in flight, oldest first
        # Chunks packing or packed that wait for the next one to be stored with (see `_flush`).
        self._batch: list[tuple[int, Future[EncodedChunk]]] = []
        self._state = "open"
        self._lock = threading.Lock()  # one catalog writer of this save at a time
        self._failure: BaseException | None = None
        self._store_failure: BaseException | None = None  # set on the I/O thread
        self.archive: Archive | None = None  # set once published
        # Before the lease and the first blob: a pool moved, unmounted or deleted since it
        # was opened must not get its blobs written to whatever is at its old place now.
        pool.check_in_place(f"saving {self.name!r}")
        now = pool.clock()
        # Whether the lease row may be in the catalog (set inside the transaction that inserts
        # it, so a commit that raised after it happened still counts): a save whose lease
        # never was has nothing there to roll back.
        self._lease_taken = False
        # NOTE: a save all of whose chunks go with the manifest (`save_samples` of at most a
        # pair of chunks' samples) stores nothing before its ownership transaction, which then
        # takes the lease itself: one transaction (and its commit) less
        # (docs/architecture/save-protocol.md, "Save protocol", step 1).
        deferred = (
            _lazy_renewal
            and reference is None
            and _expected is not None
            and _expected <= _CHUNKS_PER_STORE * pool.chunk_size
        )
        if not deferred:
            self._take_lease(now)
        self._expires_at = now + pool.lease_ttl  # as last renewed; only the heartbeat moves it
        self._io = Helpers(1, thread_name_prefix="archive-save")
        self._packer = Helpers(1, thread_name_prefix="archive-pack")
        self._stop = threading.Event()
        interval = max(pool.lease_ttl / 3, 0.05)
        self._heartbeat = threading.Thread(
            target=self._keep_alive,
            args=(weakref.ref(self), self._stop, interval),
            name="archive-lease",
            daemon=True,
        )
        self._lazy_renewal = _lazy_renewal
        self._interval = interval
        self._started = time.monotonic()
        # With ``_lazy_renewal`` (`save_samples`, which holds every sample and adds them in
        # one go) the heartbeat starts only once the save has run for a renewal interval
        # (`_start_renewal_if_due`): a small save ends long before and starts no thread.  A
        # deferred lease has nothing to renew until it is taken (`_take_lease`).
        self._renew_after = (
            time.monotonic() + interval if _lazy_renewal and self._lease_taken else None
        )
        if self._renew_after is None and not _lazy_renewal:
            self._heartbeat.start()

    # ---------------------------------------------------------------- public

    def __len__(self) -> int:
        return len(self._entries)

    def add(
        self, sample: Any, task_key: Any = _UNSET, *, facts: Mapping[str, Any] | None = None
    ) -> None:
        """Append one sample.  ``task_key`` overrides the key read from the sample;
        ``facts`` (``status``, ``response_length``, ``reward``) override what the catalog
        records of it, None meaning unknown (an import of rows that hold no status).

        The sample is encoded now: what it holds at this call is what is stored, and the
        caller may reuse or change it afterwards.

        Raises:
            UnencodableError: the sample holds a value that cannot be stored; nothing of it
                was added and the writer stays usable.
            InvalidInputError: its task key or sample key cannot be a catalog key (idem).
        """
        self._check_open()
        if self._reference is not None:
            raise InvalidInputError("a reference archive takes no samples")
        # Nothing is appended until the sample is prepared whole.
        self.add_prepared(
            prepare_sample(
                self._pool,
                sample,
                len(self._entries),
                task_key,
                copy=self._copy,
                facts=facts,
                reward_key=self.reward_key,
                ahead=self._ahead,
            )
        )

    def add_prepared(self, prepared: PreparedSample) -> None:
        """Append a sample `prepare_sample` made for the next position (`add` is this after
        `prepare_sample`; `save_async` prepares on the caller's thread and appends here on
        its worker's).

        Raises:
            InvalidInputError: it was prepared for another position.
        """
        self._check_open()
        if self._reference is not None:
            raise InvalidInputError("a reference archive takes no samples")
        position = len(self._entries)
        if prepared.position != position:
            raise InvalidInputError(
                f"a sample prepared for position {prepared.position} added at {position}"
            )
        if prepared.task_key is not None and prepared.task_text is not None:
            self._task_texts[prepared.task_key] = prepared.task_text
        self._entries.append(
            (
                position,
                prepared.sample_key,
                prepared.task_key,
                self._next_ordinal,
                len(self._buffer.records),
            )
        )
        self._metadata.append(prepared.description)
        self._buffer.add(prepared.encoded)
        if self._working():
            self._hand_over()
        if len(self._buffer.records) >= self._pool.chunk_size:
            try:
                self._flush()
            except BaseException as exc:
                # NOTE: a failed flush loses a chunk (or leaves its samples unencodable):
                # the writer must refuse to go on, or a caller that catches the error and
                # keeps adding would commit an archive with a hole in it.
                self._failure = exc
                raise

    def commit(self) -> Archive:
        """Write the rest, the manifest, commit ownership, publish; return the archive."""
        try:
            # Inside the try: a writer whose lease lapsed (or whose flush failed) must still
            # roll back, not leave its lease and blobs behind.
            self._check_open()
            if self._reference is not None:
                self._adopt_reference(self._reference)
            # The chunks not yet handed to the I/O thread (the last one or two) are claimed
            # by the ownership transaction and written with the manifest (step 3).
            self._last = self._last_chunks()
            # Again once the earlier blobs are written (the pool may have gone while they
            # were): nothing is claimed for a pool this catalog does not index.
            self._pool.check_in_place(f"publishing {self.name!r}")
            self._pool.journal.ready()
            self._pool.journal_floor()  # read again in both transactions below
            archive_id, manifest = self._commit_ownership()
            self._start_renewal_if_due()
            # The live rows' files looked for after the commit, as step 2 does (the archive's
            # ownership keeps GC from them meanwhile); one gone is written again.
            self._last_writes += _missing(self._pool.store, self._last_stored)
            # NOTE: written after the ownership commit, which gave the manifest its save
            # number (the manifest module says why that number must come from the name's
            # claim) and claimed the last chunks' rows, and before publication, so a
            # published archive always has its manifest and every blob on disk.  Its save
            # number makes the manifest new: the ownership commit has just claimed its row.
            self._pool.store.put_new(
                [(b.parts, b.digest) for b in self._last_writes]
                + [(manifest.parts, manifest.digest)]
            )
            failpoint("save.manifest.after_write")
            # Again once every blob is written: an archive is published only over blobs that
            # went to the pool this catalog indexes.
            self._pool.check_in_place(f"publishing {self.name!r}")
            self._publish(archive_id, manifest.digest)
        except BaseException:
            if self._record is not None:
                self._record.discard()
            self.abort()
            raise
        self._state = "committed"
        try:
            # After the commit, before returning: docs/architecture/retention-journal.md, "Retention
            # journal".
            place_committed(self._record)
        finally:
            self._shutdown()
        self.archive = Archive(self._pool, self._published_row)
        return self.archive

    def abort(self) -> None:
        """Roll back: drop the lease and remove the blobs only this save created."""
        if self._state != "open":
            return
        self._state = "aborted"
        self._stop.set()
        try:
            for pending in self._pending:
                pending.exception()
        finally:
            self._shutdown()
        if not self._rollback():
            failure = sys.exc_info()[1]
            if isinstance(failure, ArchiveError) and [type(a) for a in failure.args] == [str]:
                # Called while the save's own error propagates: a catalog that failed the save
                # (a full disk, `ulimit -f`) fails its rollback too, and that error's "nothing
                # was committed" spoke of its own transaction, not of what the save left.
                failure.args = (
                    f"{failure.args[0]}; the save of {self.name!r} could not be rolled back "
                    "either: its lease and pending archive (and any blobs it wrote) stay in "
                    f"the catalog until the lease lapses (within {self._pool.lease_ttl:g} s), "
                    "then 'archive-manager gc' reclaims them",
                )

    @property
    def lease(self) -> str:
        """The owner name of this save's lease (``lease:<hex>``), as ``owners``, ``verify``
        and GC reports name it."""
        return self._lease

    @property
    def renewing(self) -> bool:
        """Whether the lease is still being renewed (False after commit, abort, `abandon`,
        a lapsed lease, or once the writer was dropped)."""
        return self._heartbeat.is_alive()

    def stored_samples(self) -> Iterator[Any]:
        """The samples added so far, read back from the store before anything is published:
        every chunk this save wrote is read whole (checked against its digest) and decoded,
        tensors materialized, in archive order.  An import compares them with its source and
        raises to roll the save back (`interop.straw`); the archive is then never visible.
        """
        from ..codec import ChunkReader, decode_array_blob, decode_tensor_blob

        self._check_open()
        if self._buffer.records:
            self._flush()
        self._wait()
        store = self._pool.store

        def load(digest: str) -> Any:
            return decode_tensor_blob(store.open(digest), digest)

        def load_array(digest: str) -> Any:
            return decode_array_blob(store.open(digest), digest)

        for ordinal in sorted(self._chunks):
            digest = self._chunks[ordinal][0]
            reader = ChunkReader(
                store.get(digest), digest=digest, loader=load, array_loader=load_array
            )
            offsets = range(len(reader))
            reader.inflate(offsets)
            for i in offsets:
                yield codec.materialize_tensor_refs(reader.sample(i))

    def wait_stored(self) -> None:
        """Block until every chunk filled so far is stored and held by the lease (chunks are
        stored in the background while samples are added).

        Raises:
            Exception: the error a background store failed with, if one did.
        """
        self._wait()

    def join_renewal(self, timeout: float | None = None) -> bool:
        """Wait up to ``timeout`` seconds for the lease renewal to end (it ends by itself when
        the lease lapsed or a renewal was refused); True if it has ended."""
        if self._heartbeat.ident is not None:  # a lazily renewed save may not have one yet
            self._heartbeat.join(timeout)
        return not self._heartbeat.is_alive()

    def stop_renewing(self) -> None:
        """Stop renewing the lease, as a paused (SIGSTOP) process does: the lease lapses after
        its TTL, GC then reclaims what it held, and a later commit fails with
        `LeaseExpiredError`.  For tests and drills of the save protocol."""
        self._renew_after = None
        self._stop.set()
        if self._heartbeat.ident is not None:
            self._heartbeat.join()

    def abandon(self) -> None:
        """Stop as a killed process would: no renewal, no further stores, no rollback.  What
        the save left (its lease, its blobs, a pending archive) is what a crash leaves, and GC
        clears it once the lease lapsed (docs/architecture/save-protocol.md, "Save protocol").  For
        tests and drills; `abort` is the way to give a save up."""
        self.stop_renewing()
        self._shutdown()
        self._state = "abandoned"

    def __enter__(self) -> ArchiveWriter:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is not None:
            self.abort()
        elif self._state == "open":
            self.commit()

    # ---------------------------------------------------------------- internals

    def _take_lease(self, now: float) -> None:
        """Step 1: check the name and take the lease, in a transaction of its own."""
        # NOTE: not waited for on the disk (docs/architecture/save-protocol.md, "Save protocol",
        # step 1): every later step that depends on the lease begins with a durable commit of the
        # catalog, which makes the lease durable too; a power loss before it leaves nothing
        # that needs the lease.
        pool = self._pool
        with pool.catalog.write("save.lease", durable=False) as conn:
            free_name(conn, self.name, now=now, leases=True, supersede=self.supersede)
            self._lease_taken = True
            insert_lease(
                conn,
                self._lease,
                now=now,
                ttl=pool.lease_ttl,
                archive_name=self.name,
                holder=this_process(),
            )

    def _ensure_lease(self) -> None:
        """Take a deferred lease before a blob transaction (step 2), which needs it: a save
        that expected its chunks to go with the manifest but stores one (a sequence longer
        than its length said)."""
        if self._lease_taken:
            return
        now = self._pool.clock()
        self._take_lease(now)
        self._expires_at = now + self._pool.lease_ttl
        if self._lazy_renewal:
            self._renew_after = time.monotonic() + self._interval
        else:
            self._heartbeat.start()

    def _start_renewal_if_due(self) -> None:
        """Start the heartbeat of a lazily renewed save once it has run a renewal interval.

        NOTE: called before each sample is added, at each chunk and in `commit`, so the lease
        goes unrenewed at most an interval plus one sample's encoding or the last chunks'
        packing, well inside its TTL (three intervals)."""
        if self._renew_after is not None and time.monotonic() >= self._renew_after:
            self._renew_after = None
            self._heartbeat.start()

    def _check_open(self) -> None:
        self._start_renewal_if_due()
        if self._state != "open":
            raise ArchiveError(f"the writer of {self.name!r} is {self._state}")
        if self._failure is not None:
            raise self._failure

    def _shutdown(self) -> None:
        self._renew_after = None  # never started after this
        self._stop.set()
        self._io.shutdown(wait=True)
        self._packer.shutdown(wait=True)

    @staticmethod
    def _keep_alive(
        ref: weakref.ref[ArchiveWriter], stop: threading.Event, interval: float
    ) -> None:
        # NOTE: renewal runs on its own thread so that a slow but live producer keeps its
        # lease; a paused (SIGSTOP) or dead process stops renewing and is fenced out.  It holds
        # the writer only weakly: a writer dropped without commit or abort stops renewing, so
        # its lease expires and GC reclaims what it held.
        # A renewal that fails for a passing reason is retried with backoff for as long as the
        # lease stands, so a catalog outage shorter than the lease costs no save.  Retrying
        # cannot revive a lease: renew_lease extends it only if it is still live at the time
        # read under the write lock, and GC drops only lapsed ones; either answer is final.
        while not stop.wait(interval):
            delay = _RENEW_FIRST_RETRY
            while True:
                writer = ref()
                if writer is None:
                    return
                try:
                    with writer._lock, writer._pool.catalog.write() as conn:
                        writer._expires_at = renew_lease(
                            conn,
                            writer._lease,
                            now=writer._pool.clock(),
                            ttl=writer._pool.lease_ttl,
                        )
                    break
                except _RENEW_TRANSIENT as exc:
                    _log.info(
                        "renewal of %s failed (%s); retrying", writer._lease, type(exc).__name__
                    )
                    if writer._pool.clock() >= writer._expires_at:
                        lapsed = LeaseExpiredError(
                            f"{writer._lease} of the save of {writer.name!r} lapsed while its "
                            f"renewal kept failing ({exc}); nothing was published (a writer "
                            "must not publish over blobs that GC may have reclaimed)"
                        )
                        lapsed.__cause__ = exc
                        writer._failure = lapsed
                        return
                except BaseException as exc:  # surfaced by the next add/commit
                    writer._failure = exc
                    return
                del writer
                if stop.wait(delay):
                    return
                delay = min(delay * 2, _RENEW_MAX_RETRY)
            del writer

    def _flush(self) -> None:
        raw = self._buffer
        ordinal = self._next_ordinal
        self._next_ordinal += 1
        self._buffer = codec.RawChunk([], {})
        # NOTE: a pipeline of three stages: this thread builds chunks i+2 and i+3 (needs the
        # GIL) while the packer compresses and hashes them and the I/O thread stores chunks i
        # and i+1 (zstd, xxhash, write and fsync release the GIL).  With one stage for pack
        # and store, each chunk's fsyncs and catalog commit stalled the builder.  Memory stays
        # bounded: at most six chunks past their samples (`_STORES_IN_FLIGHT` pairs stored or
        # queued, one packed, one packing).
        self._batch.append((ordinal, self._packer.submit(raw.pack)))
        # At every chunk, not only when a pair is handed over: a store that already failed
        # surfaces at the next chunk (a producer that carries on must see it), and one still
        # running surfaces at the latest when the pipeline is full and this thread waits.
        while self._pending and self._pending[0].done():
            self._pending.popleft().result()
        while len(self._pending) >= _STORES_IN_FLIGHT:
            self._pending.popleft().result()
        if len(self._batch) >= _CHUNKS_PER_STORE and len(self._entries) != self._expected:
            self._submit_batch()

    def _submit_batch(self) -> None:
        """Hand the chunks of `_batch` to the I/O thread, to be stored in one transaction.

        NOTE: one transaction per chunk cost a commit and ~2.5 ms of the GIL each, taken
        from the encoder; pairs halve that (docs/architecture/save-protocol.md, "Save protocol",
        step 2). The pairs are made here, on the caller's thread (chunks 0+1, 2+3, ...; a chunk
        stored alone only when `_wait` drains: commit, `wait_stored`), so the failpoints are reached
        the same number of times in every run, as the crash matrix needs.  The I/O thread
        never waits for a chunk still to come: it did once, and the interpreter, which joins
        that thread at exit, hung for good in a process that left its writer open after an
        odd number of chunks (tests/pool/test_save_pipeline.py).
        """
        batch, self._batch = self._batch, []
        self._pending.append(self._io.submit(self._store_chunks, batch))

    def _working(self) -> bool:
        """Whether a chunk of this save is being packed or stored on another thread.

        NOTE: the GIL is handed over only then (`codec.GilHandOver`): with no other thread of
        the save running nobody takes it, and the hand-over's sleep gives the core away to
        any other process that wants it, which on a loaded machine cost a small save ~2.5 ms
        a hand-over (docs/performance.md, "Small saves").
        """
        return any(not stored.done() for stored in self._pending) or any(
            not packed.done() for _, packed in self._batch
        )

    def _wait(self) -> None:
        if self._batch:
            self._submit_batch()
        while self._pending:
            self._pending.popleft().result()

    def _last_chunks(self) -> list[tuple[int, EncodedChunk]]:
        """For `commit`: wait for the stores in flight, then pack the chunks that were not
        handed to the I/O thread (the samples still buffered, and a chunk waiting for its
        pair), and return them.

        NOTE: packed here, on the caller's thread, when the packer has nothing of them
        started: the caller would only wait for it, and a small save then starts no thread
        (a thread start cost ~1.5 ms under load; docs/performance.md, "Small saves").
        """
        while self._pending:
            self._pending.popleft().result()
        last = [(ordinal, packed.result()) for ordinal, packed in self._batch]
        self._batch = []
        if self._buffer.records:
            raw = self._buffer
            self._buffer = codec.RawChunk([], {})
            last.append((self._next_ordinal, raw.pack()))
            self._next_ordinal += 1
        self._start_renewal_if_due()
        return last

    def _store_chunks(self, batch: list[tuple[int, Future[EncodedChunk]]]) -> None:
        """On the I/O thread: store these chunks (once packed) in one catalog transaction and
        one `put_many`; raise the error of the first whose packing failed.  After a store
        failed, those queued behind it claim nothing (the save is lost anyway: the caller
        meets the first error, oldest first)."""
        if self._store_failure is not None:
            raise ArchiveError(
                f"chunks of {self.name!r} not stored: an earlier store failed"
            ) from self._store_failure
        try:
            self._store_packed(batch)
        except BaseException as exc:
            self._store_failure = exc
            raise

    def _store_packed(self, batch: list[tuple[int, Future[EncodedChunk]]]) -> None:
        encoded = [(ordinal, packed.result()) for ordinal, packed in batch]
        blobs = _blobs_of(encoded)
        self._store(blobs)
        self._note_stored(encoded, blobs)

    def _note_stored(self, encoded: list[tuple[int, EncodedChunk]], blobs: list[_Blob]) -> None:
        """Record the chunks ``encoded`` and their ``blobs`` as the archive's."""
        for blob in blobs:
            self._blob_kinds[blob.digest] = blob.kind
            self._blob_sizes[blob.digest] = blob.size
        for ordinal, enc in encoded:
            self._chunks[ordinal] = (enc.digest, enc.samples, len(enc.data))

    def _store(self, blobs: list[_Blob]) -> None:
        """Step 2: retain under the lease, then write what is not already live."""
        store = self._pool.store
        to_write: list[_Blob] = []
        with self._lock:
            self._ensure_lease()
        with self._lock, self._pool.catalog.write("save.blobs") as conn:
            now = self._pool.clock()
            check_lease(conn, self._lease, now=now)
            if self._unmarked:
                mark_live(conn, self._unmarked)
                self._unmarked = []
            self._holds = True
            hold_blobs(conn, self._lease, [b.digest for b in blobs])
            to_write, stored = self._claim_rows(conn, blobs, now)
        # NOTE: the live rows' files are looked for after the commit, not inside it: on an
        # object store each look is a request, and a store slow to answer held the catalog's
        # write lock from every other writer (issue 36).  The hold committed above keeps GC
        # from deleting any of them meanwhile, as it would inside the transaction.
        to_write += _missing(store, stored)
        # Every blob claimed here is absent from the store, or being written by another save
        # with the same bytes: none needs the store's look for a stored copy.
        store.put_new([(blob.parts, blob.digest) for blob in to_write])
        with self._lock:
            self._unmarked.extend(b.digest for b in to_write)

    def _claim_rows(
        self, conn: Connection, blobs: list[_Blob], now: float
    ) -> tuple[list[_Blob], list[_Blob]]:
        """Inside a write transaction: insert or take back the rows of ``blobs``; return the
        blobs whose files must be written (absent, being written, or taken back from GC) and
        those recorded live, whose files the caller looks for once this commits (one that
        went missing is written again)."""
        store = self._pool.store
        to_write: list[_Blob] = []
        stored: list[_Blob] = []
        new: list[_Blob] = []
        rows = blob_rows(conn, [b.digest for b in blobs])
        for blob in _unique(blobs):
            row = rows.get(blob.digest)
            if row is None:
                new.append(blob)
                to_write.append(blob)
            elif row.size != blob.size:
                raise IntegrityError(
                    f"blob {blob.digest} is recorded with {row.size} bytes but encodes to "
                    f"{blob.size}: digest collision or a damaged catalog"
                )
            elif row.state == "deleting":
                # A GC marked it and died (or has not reached it): GC unlinks only rows
                # still 'deleting' and only under the catalog's write lock, which this
                # transaction holds, so taking the row back here cannot race it.
                pin_write_lock(conn)
                store.delete(blob.digest)
                conn.execute(
                    update(blobs_table)
                    .where(blobs_table.c.digest == blob.digest)
                    .values(state="writing", created_at=now)
                )
                to_write.append(blob)
            elif row.state == "writing":
                # Another save may be writing it: putting the same bytes again is idempotent.
                to_write.append(blob)
            else:
                stored.append(blob)
        if new:
            # One executemany for the new rows (a chunk of R3 samples brings dozens of tensors).
            insert_rows(
                conn,
                blobs_table,
                ("digest", "size", "kind", "state", "created_at"),
                [(b.digest, b.size, b.kind, "writing", now) for b in new],
            )
            self._created.update(b.digest for b in new)
        return to_write, stored

    def _adopt_reference(self, source: Archive) -> None:
        """Share another archive's chunks and tensor blobs: hold them, copy its rows."""
        with self._pool.catalog.read() as conn:
            src = source.row(conn)
            chunks = conn.execute(
                select(
                    chunks_table.c.ordinal,
                    chunks_table.c.digest,
                    chunks_table.c.samples,
                    chunks_table.c.size,
                )
                .where(chunks_table.c.archive_id == src.id)
                .order_by(chunks_table.c.ordinal)
            ).all()
            entries = conn.execute(
                select(
                    entries_table.c.position,
                    entries_table.c.sample_key,
                    entries_table.c.task_key,
                    entries_table.c.chunk_ordinal,
                    entries_table.c.offset,
                )
                .where(entries_table.c.archive_id == src.id)
                .order_by(entries_table.c.position)
            ).all()
            metadata = (
                conn.execute(
                    select(sample_metadata_table.c.description)
                    .where(sample_metadata_table.c.archive_id == src.id)
                    .order_by(sample_metadata_table.c.position)
                )
                .scalars()
                .all()
            )
            blobs = conn.execute(
                select(archive_blobs_table.c.digest, archive_blobs_table.c.kind, blobs_table.c.size)
                .join(
                    blobs_table, blobs_table.c.digest == archive_blobs_table.c.digest, isouter=True
                )
                .where(
                    archive_blobs_table.c.archive_id == src.id,
                    archive_blobs_table.c.kind != "manifest",
                )
            ).all()
            self._task_texts = dict(
                conn.execute(
                    select(task_texts_table.c.task_key, task_texts_table.c.text).where(
                        task_texts_table.c.archive_id == src.id
                    )
                ).all()
            )
        digests = [b.digest for b in blobs]
        with self._lock, self._pool.catalog.write("save.blobs") as conn:
            check_lease(conn, self._lease, now=self._pool.clock())
            self._holds = True
            hold_blobs(conn, self._lease, digests)
            rows = blob_rows(conn, digests)
            gone = [d for d in digests if d not in rows or rows[d].state != "live"]
        if not gone:
            # The files too, once the holds committed (no store request inside the write
            # transaction; see `_store`): a catalog restored from a backup keeps 'live' rows
            # of blobs that GC deleted after the backup.
            gone = [d for d in digests if not self._pool.store.has(d)]
        if gone:
            source.raise_reclaimed(f"{len(gone)} of its blobs are gone (first: {gone[0]})")
        for ordinal, digest, samples, size in chunks:
            self._chunks[ordinal] = (digest, samples, size)
        self._next_ordinal = len(chunks)
        self._entries = [tuple(e) for e in entries]
        # Each sample's reward as this archive's key chooses it from the parts the source
        # recorded (the same descriptions when the key is the source's).
        self._metadata = (
            list(metadata)
            if self.reward_key == source.reward_key
            else [rescored(d, self.reward_key) for d in metadata]
        )
        for b in blobs:
            self._blob_kinds[b.digest] = b.kind
            self._blob_sizes[b.digest] = b.size or 0

    def _manifest(self, *, save_seq: int, created_at: float) -> _Blob:
        chunks = [self._chunks[i] for i in range(len(self._chunks))]
        data = Manifest(
            name=self.name,
            rollout_id=self.rollout_id,
            evaluation=self.evaluation,
            attrs=self.attrs,
            reference=self._reference.name if self._reference is not None else None,
            created_at=created_at,
            reward_key=self.reward_key,
            chunks=chunks,
            tensors=sorted(d for d, k in self._blob_kinds.items() if k == "tensor"),
            entries=[(sk, tk, o, off) for _, sk, tk, o, off in self._entries],
            metadata=self._metadata,
            save_seq=save_seq,
            task_texts=dict(sorted(self._task_texts.items())) or None,
        ).encode()
        return _Blob(digest_of(data), [data], len(data), "manifest")

    def _commit_ownership(self) -> tuple[int, _Blob]:
        """Step 3: claim the rows of the last chunks' blobs (`_last`; those to write go to
        `_last_writes`), the name with a save number, then, in the same commit, the archive
        (pending), its manifest's row, chunks, entries, metadata and ownership."""
        now = self._pool.clock()
        last = self._last
        blobs = _blobs_of(last)
        with self._lock, self._pool.catalog.write("save.ownership") as conn:
            taken = self._lease_taken
            if taken:
                check_lease(conn, self._lease, now=now)
            mark_live(conn, self._unmarked)
            self._unmarked = []
            self._note_stored(last, blobs)
            self._owned_at = now
            # A deferred lease: step 1's checks of the name, and its lease, here (durable with
            # this commit; its pending archive names it, so GC tells a live save from a dead
            # one as before).
            self._replaces = free_name(
                conn, self.name, now=now, leases=not taken, supersede=self.supersede
            )
            if not taken:
                self._lease_taken = True
                insert_lease(
                    conn,
                    self._lease,
                    now=now,
                    ttl=self._pool.lease_ttl,
                    archive_name=self.name,
                    holder=this_process(),
                )
                self._expires_at = now + self._pool.lease_ttl
                # Renewed as if taken at the start: a save that already ran an interval
                # starts its heartbeat once this commits (`commit`), as step 1's would have.
                self._renew_after = self._started + self._interval
            manifest = self._manifest(
                save_seq=next_save_seq(conn, now, floor=self._pool.journal.floor), created_at=now
            )
            # NOTE: the last chunks' rows and the manifest's claimed in one read and one
            # insert.  No hold of the lease on them: the archive owns them in this very
            # commit, which drops the lease's holds (a hold made here never committed).  The
            # manifest is put after this commit whatever its row said (its save number makes
            # it new): what `_claim_rows` says of it is not needed.
            writes, stored = self._claim_rows(conn, [*blobs, manifest], now)
            self._last_writes = [b for b in writes if b.digest != manifest.digest]
            self._last_stored = [b for b in stored if b.digest != manifest.digest]
            self._blob_kinds[manifest.digest] = "manifest"
            self._blob_sizes[manifest.digest] = manifest.size
            total = sum(self._blob_sizes.values())
            try:
                archive_id = inserted_id(
                    conn.execute(
                        _INSERT_ARCHIVE,
                        {
                            "name": self.name,
                            "rollout_id": self.rollout_id,
                            "evaluation": self.evaluation,
                            "state": "pending",
                            "manifest_digest": manifest.digest,
                            "samples": len(self._entries),
                            "bytes": total,
                            "created_at": now,
                            "attrs": self.attrs,
                            "reference_name": self._reference.name if self._reference else None,
                            "lease_owner": self._lease,
                            "reward_key": self.reward_key,
                        },
                    )
                )
            except sa_exc.IntegrityError as exc:
                raise ArchiveExistsError(f"archive {self.name!r} already exists") from exc
            insert_contents(
                conn, archive_id, self._chunks, self._entries, self._metadata, self._task_texts
            )
            insert_rows(
                conn,
                archive_blobs_table,
                ("archive_id", "digest", "kind"),
                [(archive_id, d, k) for d, k in sorted(self._blob_kinds.items())],
            )
            conn.execute(
                _INSERT_OWNER,
                {"owner": archive_owner(self.name), "archive_id": archive_id, "created_at": now},
            )
            # Ownership has passed to the archive's owner; the lease row itself stays until
            # publication so that GC can tell a live pending save from a dead one.
            if self._holds:
                conn.execute(_DROP_HOLDS, {"lease": self._lease})
                self._holds = False
        return int(archive_id), manifest

    def _publish(self, archive_id: int, manifest_digest: str) -> None:
        """Step 5: mark the manifest and the last chunks' blobs durable, make the archive
        visible, end the lease; stage the publication's journal record (`_record`: its temp
        file written while this commits, placed once it committed)."""
        a = archives_table
        with self._lock, self._pool.catalog.write("save.publish") as conn:
            mark_live(conn, [*(b.digest for b in self._last_writes), manifest_digest])
            now = self._pool.clock()
            replaced = self._replaces
            if replaced is not None:
                # NOTE: in the publication's transaction, so that the name points at the
                # earlier archive until this commits and at this one after: a crash leaves
                # one of the two current, never neither nor both
                # (docs/architecture/save-protocol.md, "Superseding a name").  Checked again: an
                # owner may have come meanwhile.
                check_supersedable(conn, self.name, replaced.id, supersede=True)
                conn.execute(
                    update(a)
                    .where(a.c.id == replaced.id)
                    .values(state="superseded", superseded_by=archive_id, superseded_at=now)
                )
            try:
                published = conn.execute(_PUBLISH, {"archive_id": archive_id, "at": now}).rowcount
            except sa_exc.IntegrityError as exc:
                # The name points at another archive now (restored by a rebuild meanwhile).
                raise ArchiveExistsError(f"archive {self.name!r} already exists") from exc
            if published != 1:
                raise LeaseExpiredError(
                    f"archive {self.name!r} was rolled back by gc before it could be "
                    "published (its lease expired)"
                )
            # Its holds went at the ownership commit.
            drop_lease(conn, self._lease, holds=False)
            # The archive as `commit` returns it, read here rather than in a read
            # transaction of its own after this one.
            self._published_row = conn.execute(_ARCHIVE_BY_ID, {"archive_id": archive_id}).one()
            op = publish_op(
                self.name,
                manifest_digest,
                at=now,
                owned_at=self._owned_at,
                supersedes=replaced.manifest if replaced is not None else None,
            )
            staged = stage_record(conn, pool_id_of(conn), [op], now, floor=self._pool.journal.floor)
            # The last statement of the transaction: its temp file is synced beside the commit.
            self._record = self._pool.journal.begin_write(staged)

    def _rollback(self) -> bool:
        """Drop the lease; delete the blobs this save created that nothing else holds.

        Returns False when the catalog could not be written: the lease and a pending archive
        stay until the lease lapses."""
        if not self._lease_taken:
            # A deferred lease never taken: nothing of this save reached the catalog or the
            # store (every row and file comes after the transaction that takes the lease).
            return True
        store = self._pool.store
        try:
            # NOTE: blobs are unlinked only from the pool opened: at a root that moved or was
            # swapped for another pool's (a remount), a file of the same digest is not ours.
            # Left behind, the rows without a lease are GC's, which checks the same first.
            self._pool.check_in_place(f"rolling back {self.name!r}")
            in_place = True
        except (ArchiveError, OSError):
            in_place = False
        try:
            with self._pool.catalog.write("save.rollback") as conn:
                pending = conn.execute(
                    select(archives_table.c.id).where(
                        archives_table.c.lease_owner == self._lease,
                        archives_table.c.state == "pending",
                    )
                ).scalar_one_or_none()
                if pending is not None:
                    conn.execute(delete(archives_table).where(archives_table.c.id == pending))
                drop_lease(conn, self._lease)
                orphans = [d for d in sorted(self._created) if in_place and not _held(conn, d)]
                if orphans:
                    pin_write_lock(conn)
                deleted: list[str] = []
                try:
                    for digest in orphans:
                        # Deleted under the write lock, as GC does, so no save can adopt it now.
                        store.delete(digest)
                        deleted.append(digest)
                        failpoint("save.rollback.after_unlink")
                except OSError as exc:
                    # The store failed (or stopped answering: the save may have failed for
                    # that): the lease and the pending archive still go now, so the name is
                    # free at once; the blobs not deleted keep their rows, held by nothing,
                    # and GC reclaims them after its grace period.
                    _log.info(
                        "rollback of %r left %d blob(s) to gc: %s",
                        self.name,
                        len(orphans) - len(deleted),
                        exc,
                    )
                if deleted:
                    conn.execute(delete(blobs_table).where(blobs_table.c.digest.in_(deleted)))
        except ArchiveError:
            # The catalog is unreachable: the lease expires and GC clears what is left.
            # (BlobStore.put removes its own temp file on failure, so none is left here.)
            return False
        return True


@dataclass(frozen=True)
class _Replaced:
    """The archive a save supersedes: its id and manifest (for the journal's record)."""

    id: int
    manifest: str | None


# Statements every save runs, built once (see catalog.queries).
_LEASES_OF_NAME = select(
    leases_table.c.owner, leases_table.c.expires_at, leases_table.c.holder
).where(leases_table.c.archive_name == bindparam("name"))
_INSERT_ARCHIVE = archives_table.insert()
_INSERT_OWNER = retention_table.insert()
_DROP_HOLDS = delete(lease_blobs_table).where(lease_blobs_table.c.lease == bindparam("lease"))
_ARCHIVE_BY_ID = select(archives_table).where(archives_table.c.id == bindparam("archive_id"))
_PUBLISH = (
    update(archives_table)
    .where(archives_table.c.id == bindparam("archive_id"), archives_table.c.state == "pending")
    .values(state="published", published_at=bindparam("at"), lease_owner=None)
)


def free_name(
    conn: Connection, name: str, *, now: float, leases: bool, supersede: bool = False
) -> _Replaced | None:
    """Inside a save's write transaction: check that ``name`` is free for a new save, rolling
    back a crashed save of it (docs/architecture/save-protocol.md, "Save protocol", Resuming a
    killed save); return the released archive the name points at, which the save supersedes when it
    publishes (docs/architecture/save-protocol.md, "Superseding a name"), or None.

    A pending archive of that name whose lease is gone or lapsed (a dead pending save, as GC
    rolls back) or whose holder is provably dead (`holder_is_dead`: its process, on this host,
    runs no more) is rolled back as GC would (`gc.roll_back_saves`; its blobs are left to GC).
    With ``leases``, so are the leases of saves of that name that died before their ownership
    commit (they hold blobs, not the name: a live one does not block a new save, the first to
    commit its ownership wins).  Then the archive the name points at, if any, is checked by
    `check_supersedable`.

    Raises:
        SaveInFlightError: the name is taken by a pending save that may be alive (its holder
            alive, or not provably dead): the message names its holder and when its lease
            lapses.
        ArchiveExistsError, ArchiveRetainedError: the name points at an archive that this
            save may not supersede (see `check_supersedable`).
    """
    from .gc import roll_back_saves

    # One read of the name's rows for both questions (is a save of it pending, what does it
    # point at): a small save's transactions are mostly statements like this one.
    spellings, rows = archive_rows_by_name(conn, name)
    row = pick_archive(spellings, rows, pending=True)
    dead: list[str] = []
    if row is not None:
        lt = leases_table
        lease = conn.execute(
            select(lt.c.owner, lt.c.expires_at, lt.c.holder).where(lt.c.owner == row.lease_owner)
        ).first()
        status = "dead" if lease is None else holder_status(lease.holder)
        if lease is not None and lease.expires_at > now and status != "dead":
            lapses = time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(lease.expires_at))
            raise SaveInFlightError(
                f"archive {name!r} already exists as a pending save: a save of that name is in "
                f"flight or crashed ({lease.owner}, held by {describe_holder(lease.holder)}, "
                f"{status}, lapses at {lapses} unless renewed); wait for it to "
                "finish, or, if it crashed, run 'archive-manager gc' once its lease lapsed to "
                "roll it back",
                name=name,
                lease=lease.owner,
                holder=lease.holder if isinstance(lease.holder, dict) else None,
                holder_status=status,
                expires_at=float(lease.expires_at),
            )
        _log.info(
            "save of %r: the pending save of that name by %s is dead; rolled back",
            name,
            describe_holder(None if lease is None else lease.holder),
        )
        if row.lease_owner is not None:
            dead.append(row.lease_owner)
        roll_back_saves(conn, dead, [row.id])
        rows = [r for r in rows if r.id != row.id]
    if leases:
        others = [
            owner
            for owner, expires_at, holder in conn.execute(_LEASES_OF_NAME, {"name": name})
            if owner not in dead and (expires_at <= now or holder_is_dead(holder))
        ]
        if others:
            _log.info("save of %r: dropped %d lease(s) of dead saves of it", name, len(others))
            roll_back_saves(conn, others, [])
    current = pick_archive(spellings, rows)
    if current is None:
        return None
    check_supersedable(conn, name, current.id, supersede=supersede)
    return _Replaced(int(current.id), current.manifest_digest)


def check_supersedable(conn: Connection, name: str, archive_id: int, *, supersede: bool) -> None:
    """Refuse a save of ``name`` unless the archive ``archive_id`` it points at may be
    superseded (docs/architecture/save-protocol.md, "Superseding a name"): it is released, no owner
    retains it, and either ``supersede`` was asked or gc reclaimed its payload (nothing of the
    earlier archive can be read any more, so a plain save takes the name back).

    Raises:
        ArchiveRetainedError: an owner retains it (its own owner while it is published): the
            message names them.
        ArchiveExistsError: it is published and ``supersede`` was not asked, or it is released
            with its payload still stored and ``supersede`` was not asked.
    """
    a, r = archives_table, retention_table
    row = conn.execute(select(a.c.state).where(a.c.id == archive_id)).one_or_none()
    state = None if row is None else row.state
    owners = sorted(conn.execute(select(r.c.owner).where(r.c.archive_id == archive_id)).scalars())
    how = (
        "; to save this step again, release it first ('archive-manager release NAME', "
        "Archive.release()), then save with supersede=True (the earlier archive stays on "
        "record as superseded)"
    )
    if state == "published" and not supersede:
        raise ArchiveExistsError(f"archive {name!r} already exists (published){how}")
    if state == "published":
        listed = ", ".join(owners) or "its own owner"
        raise ArchiveRetainedError(
            f"archive {name!r} cannot be superseded: it is published, retained by {listed}; "
            "release it first, then save again with supersede=True",
            name=name,
            owners=owners,
        )
    if state != "released":
        raise ArchiveExistsError(f"archive {name!r} already exists ({state})")
    if owners:
        listed = ", ".join(owners)
        raise ArchiveRetainedError(
            f"archive {name!r} cannot be superseded: it was released but is still retained by "
            f"{listed}, which keep its payload until they let go ('archive-manager "
            "release-owner OWNER'); then save again with supersede=True",
            name=name,
            owners=owners,
        )
    if not supersede and not payload_gone(conn, archive_id):
        raise ArchiveExistsError(
            f"archive {name!r} already exists (released, its payload not yet reclaimed by "
            "gc); save with supersede=True to save this step again (the earlier archive stays "
            "on record as superseded)"
        )


def _missing(store: AbstractBlobStore, blobs: list[_Blob]) -> list[_Blob]:
    """Of ``blobs``, whose rows are live, those whose file ``store`` does not hold (a file
    deleted behind the pool): putting the same bytes again heals the pool."""
    return [blob for blob in blobs if not store.has(blob.digest)]


def _held(conn: Connection, digest: str) -> bool:
    return bool(
        conn.execute(
            select(
                or_(
                    exists().where(lease_blobs_table.c.digest == digest),
                    exists().where(archive_blobs_table.c.digest == digest),
                )
            )
        ).scalar()
    )


def insert_contents(
    conn: Connection,
    archive_id: int,
    chunks: dict[int, tuple[str, int, int]],
    entries: list[tuple[int, str, str | None, int, int]],
    metadata: list[dict[str, Any]],
    task_texts: dict[str, str] | None = None,
) -> None:
    """Inside the save's (or the rebuild's) write transaction: an archive's chunks, entries,
    sample metadata, reward parts, task texts and summary rows."""
    if task_texts:
        insert_rows(
            conn,
            task_texts_table,
            ("archive_id", "task_key", "text"),
            [(archive_id, key, text) for key, text in sorted(task_texts.items())],
        )
    insert_rows(
        conn,
        chunks_table,
        ("archive_id", "ordinal", "digest", "samples", "size"),
        [(archive_id, o, d, n, s) for o, (d, n, s) in sorted(chunks.items())],
    )
    insert_rows(
        conn,
        entries_table,
        ("archive_id", "position", "sample_key", "task_key", "chunk_ordinal", "offset"),
        [(archive_id, *e) for e in entries],
    )
    indexed = [(_indexed_status(d), _indexed_reward(d), _indexed_length(d)) for d in metadata]
    insert_rows(
        conn,
        sample_metadata_table,
        ("archive_id", "position", "status", "reward", "response_length", "description"),
        [
            (archive_id, i, *row, d)
            for i, (row, d) in enumerate(zip(indexed, metadata, strict=True))
        ],
    )
    # The parts of the rewards that are not numbers, so any key can be chosen later.
    parts = [(i, _reward_parts(d)) for i, d in enumerate(metadata)]
    insert_rows(
        conn,
        sample_rewards_table,
        ("archive_id", "position", "component", "value"),
        [(archive_id, i, *part) for i, found in parts if found for part in found],
    )
    # The archive's summary, from the very values just indexed: a save, a reference save and
    # a catalog rebuild all come through here (docs/architecture/summaries-and-paging.md, "Summaries
    # and paging"). Its prompt groups are those `groups` lists: by task key, else by group_index.
    task_keys = {position: task_key for position, _, task_key, _, _ in entries}
    store_summaries(
        conn,
        [
            (
                archive_id,
                summarize_archive(
                    (
                        (*row, group_key_of(task_keys.get(i), d), bool(found))
                        for (i, found), row, d in zip(parts, indexed, metadata, strict=True)
                    ),
                    (part[0] for _, found in parts if found for part in found[1:]),
                ),
            )
        ],
    )


def _reward_parts(description: dict[str, Any]) -> list[tuple[str, float | None]] | None:
    """The ``sample_rewards`` rows of a sample whose reward is not a number: ``("", None)``,
    then its dict's numeric parts; None for a sample whose reward is a number or absent.

    NOTE: descriptions also come from manifests, which may be damaged or forged: a part that
    no column can hold is left out, as `_indexed_reward` leaves out a reward."""
    if "reward_type" not in description:
        return None
    rows: list[tuple[str, float | None]] = [("", None)]
    parts = description.get("rewards")
    if isinstance(parts, dict):
        for key, value in parts.items():
            number = _indexed_reward({"reward": value})
            if number is not None and reward_component(key) is not None:
                rows.append((key, number))
    return rows


def _indexed_status(description: dict[str, Any]) -> str | None:
    # PostgreSQL enforces the column's length (SQLite did not): a longer status is left out of
    # the index, and kept in the description.
    status = description.get("status")
    if isinstance(status, str) and len(status) <= STATUS_LENGTH and "\x00" not in status:
        return status
    return None


def _indexed_reward(description: dict[str, Any]) -> float | None:
    # A reward the float column cannot hold (an int past 1e308) is left out of the index, and
    # kept in the description: binding it raised OverflowError in the middle of a save.
    reward = description.get("reward")
    if not isinstance(reward, (int, float)) or isinstance(reward, bool):
        return None
    try:
        value = float(reward)
    except OverflowError:
        return None
    return value if math.isfinite(value) else None


_OVERRIDABLE_FACTS = frozenset({"status", "response_length", "reward"})


def _indexed_length(description: dict[str, Any]) -> int | None:
    # The column is a 32-bit INTEGER on PostgreSQL: a length past it stays in the description.
    length = description.get("response_length")
    if type(length) is int and _INT32_MIN <= length <= _INT32_MAX:
        return length
    return None


def _blobs_of(encoded: list[tuple[int, EncodedChunk]]) -> list[_Blob]:
    """The blobs of packed chunks: each one's tensor blobs, then the chunk itself."""
    blobs: list[_Blob] = []
    for _, enc in encoded:
        blobs.extend(_Blob(t.digest, t.parts, t.size, "tensor") for t in enc.tensor_blobs.values())
        blobs.append(_Blob(enc.digest, [enc.data], len(enc.data), "chunk"))
    return blobs


def _unique(blobs: list[_Blob]) -> list[_Blob]:
    seen: dict[str, _Blob] = {}
    for blob in blobs:
        seen.setdefault(blob.digest, blob)
    return list(seen.values())


def _check_attrs(attrs: object) -> dict[str, Any] | None:
    if attrs is None:
        return None
    if not isinstance(attrs, dict) or not all(isinstance(k, str) for k in attrs):
        raise InvalidInputError("attrs must be a dict with str keys")
    try:
        json.dumps(attrs, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidInputError(f"attrs must be JSON-serializable: {exc}") from exc
    return attrs


def _plain_key(task_key: object) -> str | None:
    """A task key checked, as text: the key itself, or the whole text of a long one."""
    key, text = task_key_and_text(task_key)
    return text if text is not None else key


def save_samples(
    pool: PoolContext,
    name: str,
    samples: Sequence[Any],
    *,
    rollout_id: int | None,
    evaluation: bool,
    task_keys: Sequence[Any] | None,
    attrs: dict[str, Any] | None,
    supersede: bool = False,
    reward_key: str | None = None,
) -> Archive:
    """`ArchiveManager.save`: validate everything checkable up front, then stream."""
    if isinstance(samples, (str, bytes, dict)) or not hasattr(samples, "__len__"):
        raise InvalidInputError("samples must be a sequence (a list) of samples")
    if task_keys is not None:
        if isinstance(task_keys, (str, bytes, dict)) or not hasattr(task_keys, "__len__"):
            raise InvalidInputError("task_keys must be a sequence (a list) of keys, one per sample")
        if len(task_keys) != len(samples):
            raise InvalidInputError(
                f"task_keys has {len(task_keys)} keys for {len(samples)} samples; "
                "give one key (or None) per sample"
            )
        # Checked up front; the writer gets each key as given (a long text is keyed by its
        # digest there, and its text kept).
        keys = [_plain_key(k) for k in task_keys]
    # NOTE: no garbage collection during the save: a full collection walks the caller's whole
    # heap (a training process's; here the samples' millions of numbers) and the save's own
    # allocations (records, entries, catalog rows) trigger one every few saves.  Measured on
    # the 1024-sample rollout: a full collection cost 0.2-0.45 s of a 1.7-3.7 s save.  What a
    # save builds holds no cycles; the codec pauses the GC the same way (`gc_paused`).
    with gc_paused():
        writer = ArchiveWriter(
            pool,
            name,
            rollout_id=rollout_id,
            evaluation=evaluation,
            attrs=attrs,
            supersede=supersede,
            reward_key=reward_key,
            _lazy_renewal=True,
            _expected=len(samples),
        )
        # NOTE: the caller holds ``samples`` until this returns, and every chunk is stored
        # before it does: the tensor blobs may reference the samples' memory instead of a
        # copy (a memcpy of every big tensor would cost pool.save, the headline number).
        writer._copy = False
        try:
            i = 0
            for batch in _batches(samples, pool.chunk_size):
                # A chunk's numeric lists converted together on the snapshot's threads before
                # its samples are encoded, see
                # docs/architecture/save-protocol.md "Lists converted ahead": the caller's
                # thread would otherwise read every number alone, the longest part of its
                # work.  The batch holds its samples (a sequence may make a new object at each
                # access) and the map their lists.  The last chunk's map is let go first: it
                # would otherwise hold that chunk's arrays while this one's are made.
                writer._ahead = None
                writer._ahead = lists_ahead(batch)
                for sample in batch:
                    if task_keys is None:
                        writer.add(sample)
                    elif i < len(keys):
                        writer.add(sample, task_key=keys[i])
                    else:
                        # A sequence that yields more samples than its len() said, which the
                        # keys were counted against.
                        raise InvalidInputError(
                            f"samples yielded more than the {len(keys)} its len() gave, and "
                            f"task_keys has {len(keys)} keys"
                        )
                    i += 1
            writer._ahead = None
        except BaseException:
            writer._ahead = None
            writer.abort()
            raise
        return writer.commit()


def _batches(samples: Sequence[Any], size: int) -> Iterator[list[Any]]:
    """``samples`` in lists of ``size``, iterated once."""
    batch: list[Any] = []
    for sample in samples:
        batch.append(sample)
        if len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch
