"""The retention journal (docs/architecture/retention-journal.md, "Retention journal"): every
ownership decision, kept in the pool's blob root as well as in the catalog, so that a lost or
restored catalog can be rebuilt with exactly the owners, states and release times it had.

A decision (an archive published, an owner added, an archive released, an owner dropped) is
staged inside the catalog transaction that makes it: the transaction takes the next number
from the pool's one counter (the save number, see `catalog.queries.next_save_seq`), encodes
the record, and inserts it (number, digest, bytes) into the ``journal`` table.  After the
commit, and before the call returns, the record is written to ``journal/<seq>-<digest>.rec``
(temp file, fsync, rename, fsync of the folder).  So:

* a record file exists only for a decision its catalog committed: a healthy catalog knows
  every record file newer than its checkpoint, and one that does not is *behind* the pool
  (restored from a backup, a lagging replica, a lost catalog): GC refuses, and
  `rebuild_catalog` brings it forward;
* a process killed between the commit and the file leaves a *gap* (a ``journal`` row
  without a file): the catalog holds the record's bytes, the next GC writes the file from
  them, and a rebuild replays them.

A checkpoint (``journal/<seq>-<digest>.ckpt``) is the whole retention state at number
``seq``: every published or released archive (name, manifest, state, times) and its owners.
GC writes one when records pile up or the catalog's checkpoint file is missing; what the
checkpoint *before* it supersedes is then removed, so a damaged newest checkpoint falls back.

Record names carry their content's xxh3-128: a file whose bytes do not match its name, or
that does not parse, is damaged and never applied; a record of another pool (its ``pool_id``)
is refused.  Nothing here is unpickled: records are JSON, checkpoints zstd-compressed JSON.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import stat
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import xxhash
from sqlalchemy import delete, select
from sqlalchemy.engine import Connection

from .._util.atomic import AtomicWrite, fsync_dir, write_atomic
from .._util.constants import JOURNAL_CHECKPOINT, JOURNAL_POOL
from .._util.digest import is_digest
from .._util.failpoints import failpoint
from .._util.names import archive_owner, check_archive_name, check_owner
from .._util.permissions import share_like_parent
from .._util.pool_files import JOURNAL_DIR, Entry
from .._util.pool_files import JOURNAL_NAME as _NAME
from .._util.pool_files import parse_journal_name as _parse
from ..blobs.base import ObjectRoot
from ..catalog import (
    Catalog,
    archives_table,
    get_pool_info,
    journal_table,
    retention_table,
    set_pool_info,
)
from ..catalog.queries import next_save_seq, stored_save_seq
from ..errors import ArchiveError, JournalDamagedError, PoolLayoutError

__all__ = [
    "CHECKPOINT_EVERY",
    "JOURNAL_CHECKPOINT",
    "JOURNAL_DIR",
    "JOURNAL_POOL",
    "JOURNAL_UNREADABLE",
    "JOURNAL_UNRESOLVED",
    "ArchiveState",
    "Audit",
    "Entry",
    "Journal",
    "JournalDamagedError",
    "JournalState",
    "ObjectJournal",
    "RecordWrite",
    "Staged",
    "adopt",
    "audit",
    "catalog_position",
    "catalog_state",
    "checkpoint",
    "journal_for",
    "maintain",
    "place_committed",
    "pool_id_of",
    "publish_op",
    "release_op",
    "release_owner_op",
    "replay",
    "retain_op",
    "stage_checkpoint",
    "stage_record",
    "unreadable_reason",
    "write_committed",
]

DAMAGED_DIR = "damaged"
JOURNAL_UNRESOLVED = "journal_unresolved"
"""``pool_info``: JSON list of damaged journal files a rebuild could not apply; GC refuses
until an operator accepts the rebuilt state (`ArchiveManager.rebuild_catalog(resolve=True)`)."""

JOURNAL_UNREADABLE = "journal_unreadable"
"""``pool_info``: JSON list of journal files the last rebuild could not read (permission
denied): intact as far as anyone knows, so never discarded; GC refuses until a rebuild that
can read them applied them."""

CHECKPOINT_EVERY = 1000
"""GC writes a checkpoint once this many records are newer than the last one."""

_FORMAT = "archive_manager.journal"
_VERSION = 1
_CKPT_MAGIC = b"AMJC\x01"
# A record is a few hundred bytes; a release_owner of many archives a few hundred KB.  Files
# past these bounds are not ours, and are not read into memory.
_MAX_RECORD = 64 << 20
_MAX_CHECKPOINT = 1 << 30  # compressed or not: 100,000 archives take ~30 MB
_TEMP_MIN_AGE = 3600.0

_log = logging.getLogger("archive_manager")

OPS = ("publish", "retain", "release", "release_owner")


def _digest(data: bytes) -> str:
    return xxhash.xxh3_128_hexdigest(data)


@dataclass(frozen=True)
class Staged:
    """A record or checkpoint committed (or about to be) in the catalog, to be written to
    the journal folder once the transaction committed."""

    seq: int
    digest: str
    data: bytes
    kind: str  # "rec" | "ckpt"

    @property
    def name(self) -> str:
        return f"{self.seq:020d}-{self.digest}.{self.kind}"


def _encode_json(doc: dict[str, Any]) -> bytes:
    # NOTE: ASCII only and no NaN: names and owners may hold any printable character, and
    # a record must read back exactly on any machine.
    return json.dumps(doc, sort_keys=True, ensure_ascii=True, allow_nan=False).encode()


# Built once: every decision inserts its record (see catalog.queries).
_INSERT_RECORD = journal_table.insert()


def stage_record(
    conn: Connection, pool_id: str, ops: list[dict[str, Any]], now: float, *, floor: int
) -> Staged:
    """Inside a write transaction: number and encode a record of ``ops`` and index it in the
    catalog; write it with `Journal.write` once the transaction committed.  ``floor``: the
    journal's high-water mark (`Journal.high_water`, taken before the transaction), which
    the number must exceed."""
    for op in ops:
        if op.get("op") not in OPS:
            raise ValueError(f"unknown journal op {op!r}")
    seq = next_save_seq(conn, now, floor=floor)
    data = _encode_json(
        {
            "format": _FORMAT,
            "version": _VERSION,
            "kind": "record",
            "pool_id": pool_id,
            "seq": seq,
            "at": now,
            "ops": ops,
        }
    )
    staged = Staged(seq, _digest(data), data, "rec")
    conn.execute(
        _INSERT_RECORD, {"seq": seq, "digest": staged.digest, "created_at": now, "data": data}
    )
    return staged


@dataclass
class ArchiveState:
    """What the journal knows of one archive (keyed by its manifest's digest)."""

    name: str
    state: str  # "published" | "released" | "superseded"
    published_at: float | None = None
    released_at: float | None = None
    owners: dict[str, float] = field(default_factory=dict)
    # Built from a retain or release whose archive's publication the journal does not hold
    # (a gap, or a record superseded and lost): its own owner is assumed, never dropped.
    partial: bool = False
    # A superseded archive: the manifest of the archive that took its name, and when.
    superseded_by: str | None = None
    superseded_at: float | None = None

    def as_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "name": self.name,
            "state": self.state,
            "published_at": self.published_at,
            "released_at": self.released_at,
            "owners": sorted([o, at] for o, at in self.owners.items()),
        }
        if self.state == "superseded":
            # NOTE: written as a released archive with two more keys: a superseded archive
            # was released first, and readers of earlier versions (which know two states)
            # read the checkpoint as before instead of taking it for damaged.
            doc.update(
                state="released",
                superseded_by=self.superseded_by,
                superseded_at=self.superseded_at,
            )
        return doc


@dataclass
class JournalState:
    """The retention state a checkpoint and the records after it describe."""

    archives: dict[str, ArchiveState] = field(default_factory=dict)  # manifest -> state
    seq: int = 0


def stage_checkpoint(
    conn: Connection,
    pool_id: str,
    state: JournalState,
    now: float,
    *,
    journal: Journal | None = None,
) -> Staged:
    """Inside a write transaction that read ``state`` from the catalog: encode it as a
    checkpoint at the newest number given so far, record it as this catalog's checkpoint and
    forget the records it supersedes.

    ``journal``: when it already holds a checkpoint at that number describing another state
    (`_other_state_at`), this one takes the next number instead: one number, one state.
    """
    seq = max(state.seq, stored_save_seq(conn))
    archives = {m: a.as_json() for m, a in sorted(state.archives.items())}
    if journal is not None and _other_state_at(journal, pool_id, seq, archives):
        # NOTE: the state changed with no decision numbered since that checkpoint (a rebuild
        # of a lost catalog leaves out the released archives GC reclaimed, and the owned
        # ones whose manifest is gone).  Under the same number the two files would differ
        # only by digest, and a replay, which takes the highest (number, digest), would pick
        # one by chance: a later rebuild reported reclaimed archives again, or not.
        seq = next_save_seq(conn, now, floor=max(seq, journal.floor))
    doc = {
        "format": _FORMAT,
        "version": _VERSION,
        "kind": "checkpoint",
        "pool_id": pool_id,
        "seq": seq,
        "at": now,
        "archives": archives,
    }
    import zstandard  # imported on use (docs/architecture/start-up.md, "Start-up")

    data = _CKPT_MAGIC + zstandard.ZstdCompressor(level=3).compress(_encode_json(doc))
    staged = Staged(seq, _digest(data), data, "ckpt")
    set_pool_info(conn, JOURNAL_CHECKPOINT, f"{seq:020d}-{staged.digest}")
    set_pool_info(conn, JOURNAL_POOL, pool_id)
    conn.execute(delete(journal_table).where(journal_table.c.seq <= seq))
    return staged


def _other_state_at(journal: Journal, pool_id: str, seq: int, archives: dict[str, Any]) -> bool:
    """Whether the journal holds a checkpoint of this pool numbered ``seq`` whose archives
    are not ``archives`` (or one this account may not read, which a later rebuild that can
    read it might take).  Damaged files and other pools' are no rivals: replay passes over
    them."""
    wanted = _encode_json(archives)
    for entry in journal._after(seq - 1):
        if entry.seq != seq or entry.kind != "ckpt":
            continue
        try:
            doc = journal.read(entry, pool_id)
        except PermissionError:
            return True
        except (OSError, JournalDamagedError):
            continue  # gone, or damaged: replay passes over it too
        other = doc.get("archives")
        if isinstance(other, dict) and _encode_json(other) != wanted:
            return True  # (not an object: damaged, replay passes over it)
    return False


def parse_position(value: str | None) -> Entry | None:
    """The ``journal_checkpoint`` value as an `Entry` (None when unset or malformed)."""
    if value is None:
        return None
    match = _NAME.match(value + ".ckpt")
    if match is None:
        return None
    return Entry(int(match.group(1)), match.group(2), "ckpt")


@dataclass(frozen=True)
class CatalogPosition:
    """What a catalog knows of the journal: its checkpoint and the records committed since."""

    checkpoint: Entry | None
    records: frozenset[tuple[int, str]]
    unresolved: tuple[str, ...] = ()
    unreadable: tuple[str, ...] = ()

    def knows(self, entry: Entry) -> bool:
        """Whether the catalog's state includes ``entry`` (or something newer supersedes it)."""
        if self.checkpoint is not None:
            if entry.kind == "ckpt":
                # NOTE: numbers only rise, every decision is numbered past the journal's
                # newest intact file (`Journal.high_water`), and GC, which checkpoints,
                # refuses a catalog behind the journal, so another history never issues
                # this catalog's checkpoint number; two GCs of one catalog may each
                # checkpoint at the same number (nothing was decided in between).
                return entry.seq <= self.checkpoint.seq
            if entry.seq <= self.checkpoint.seq:
                return True
        return entry.kind == "rec" and (entry.seq, entry.digest) in self.records

    def superseded(self, entry: Entry) -> bool:
        """A file the catalog's checkpoint replaces (safe to remove)."""
        cp = self.checkpoint
        return cp is not None and entry.seq <= cp.seq and entry != cp


def catalog_records(conn: Connection) -> dict[Entry, bytes]:
    """The records the catalog committed since its checkpoint, with their bytes."""
    t = journal_table
    return {
        Entry(int(seq), str(digest), "rec"): bytes(data)
        for seq, digest, data in conn.execute(select(t.c.seq, t.c.digest, t.c.data))
    }


def catalog_position(conn: Connection) -> CatalogPosition:
    """Read what the catalog knows of the journal."""
    checkpoint = parse_position(get_pool_info(conn, JOURNAL_CHECKPOINT))
    records = frozenset(
        (int(s), str(d))
        for s, d in conn.execute(select(journal_table.c.seq, journal_table.c.digest))
    )
    return CatalogPosition(
        checkpoint,
        records,
        _names(get_pool_info(conn, JOURNAL_UNRESOLVED)),
        _names(get_pool_info(conn, JOURNAL_UNREADABLE)),
    )


def _names(raw: str | None) -> tuple[str, ...]:
    """A ``pool_info`` JSON list of file names (empty when unset or malformed)."""
    if raw:
        with contextlib.suppress(ValueError, TypeError):
            return tuple(str(x) for x in json.loads(raw))
    return ()


def unreadable_reason(name: str, exc: OSError) -> str:
    """Why a journal file that this account may not open is not applied, and what to do.

    NOTE: a permission error says nothing of the file's bytes: it is the record of a member
    whose umask (077) hid it, or of a pool copied without its modes.  Calling it damaged
    would let ``--resolve`` move a decision away for good (and GC then reclaim what it held).
    """
    return (
        f"journal file {name} cannot be read by this account ({exc.strerror or exc}): "
        "not applied, and never discarded; have its owner or root make it readable "
        "('archive-manager init --shared-group GROUP' for a group-shared pool, or chmod "
        "a+r), then run rebuild-catalog again"
    )


class Journal:
    """The journal folder under a pool's blob root."""

    def __init__(self, root: Path) -> None:
        self._root = root
        self.folder = root / JOURNAL_DIR
        self._init_floor()

    def _init_floor(self) -> None:
        self._floor = 0
        self._rejected: set[Entry] = set()
        self._floor_lock = threading.Lock()

    @property
    def floor(self) -> int:
        """The highest number this process has found on an intact journal file of this pool
        (its own records included): every number it gives must exceed it."""
        return self._floor

    def note_counter(self, seq: int) -> None:
        """The catalog's counter is at ``seq``: journal files up to it need no reading before
        a decision (its numbers are past them whatever the files hold)."""
        self._raise_floor(seq)

    def _raise_floor(self, seq: int) -> None:
        with self._floor_lock:
            self._floor = max(self._floor, seq)

    def _after(self, seq: int) -> list[Entry]:
        """The journal files numbered above ``seq``, oldest first."""
        folder = self._checked(create=False)
        if folder is None:
            return []
        # Names are zero-padded: a string comparison skips the rest without parsing them.
        bound = f"{seq:020d}~"
        found = (_parse(n) for n in os.listdir(folder) if n[:21] > bound)
        return sorted(e for e in found if e is not None and e.seq > seq)

    def high_water(self, pool_id: str | None) -> int:
        """Before a decision's transaction: the number of the newest intact journal file of
        this pool, which the decision's number must exceed (`stage_record`'s ``floor``).

        NOTE: the catalog's counter alone is not enough: a catalog restored from a backup
        while this process kept the pool open, or a PostgreSQL failover to a lagging replica,
        holds a counter below records already in the journal (a host whose clock ran ahead
        numbers far ahead), and a decision numbered below them would be replayed before them
        by a rebuild.  Only files read and verified (digest, format, number, pool id) count:
        a stray name, however high, never moves the counter.  Usually one listing: files
        already verified, rejected, or this process's own are not read again.

        Raises:
            JournalDamagedError: the newest file numbered above the floor cannot be read by
                this account (it may be a decision: the number could not be put after it).
        """
        for entry in reversed(self._after(self._floor)):
            if entry in self._rejected:
                continue
            try:
                self.read(entry, pool_id)
            except FileNotFoundError:
                continue  # superseded by a checkpoint meanwhile: that one is listed too
            except PermissionError as exc:
                raise JournalDamagedError(
                    f"journal file {entry.name} cannot be read by this account "
                    f"({exc.strerror or exc}) and is newer than this catalog's last decision: "
                    "this decision, which must be numbered after it, is refused; have its "
                    "owner or root make it readable ('archive-manager init --shared-group "
                    "GROUP' for a group-shared pool, or chmod a+r)"
                ) from exc
            except JournalDamagedError:
                self._rejected.add(entry)  # names are digests: the same name stays damaged
                continue
            self._raise_floor(entry.seq)
            break
        return self._floor

    def _checked(self, *, create: bool) -> Path | None:
        """The folder, refusing a symlink or a non-folder in its place (a link could lead
        the journal's writes, and GC's removals, outside the pool)."""
        try:
            st = os.lstat(self.folder)
        except FileNotFoundError:
            if not create:
                return None
            with contextlib.suppress(FileExistsError):
                self.folder.mkdir()
            share_like_parent(self.folder)  # a group-shared pool stays shared
            fsync_dir(self._root)
            st = os.lstat(self.folder)
        if not stat.S_ISDIR(st.st_mode):
            raise PoolLayoutError(
                f"{self.folder} is not a real folder (a symlink or a file): the journal is "
                "never read or written through one; put a real folder there"
            )
        return self.folder

    def ready(self) -> None:
        """Check the folder (creating it if missing) before a decision is made: one that
        could not be recorded is refused up front, not found out after its commit.

        Raises:
            PoolLayoutError: a symlink or a file where the folder should be.
        """
        self._checked(create=True)

    def write(self, staged: Staged) -> None:
        """Write a committed record or checkpoint durably (temp, fsync, rename, fsync dir)."""
        folder = self._checked(create=True)
        assert folder is not None
        failpoint("journal.before_write")
        # share: read by every member whatever this writer's umask (a 0400 record would
        # hide a decision from another member's rebuild).
        write_atomic(folder / staged.name, staged.data, mode=0o444, share=True)
        self._raise_floor(staged.seq)
        failpoint("journal.after_write")

    def begin_write(self, staged: Staged) -> RecordWrite:
        """Inside the transaction that stages ``staged``, just before its commit: start
        writing the record's temp file (synced on a sync thread while the commit waits on the
        disk); `RecordWrite.place` makes it the record once the transaction committed.

        NOTE: the record file still appears only after the commit (only its temp file, which
        no reader takes for a record, before it), and is durable before the call returns; its
        fsync no longer follows the commit's (docs/architecture/retention-journal.md,
        "Retention journal")."""
        folder = self._checked(create=True)
        assert folder is not None
        return _LocalRecordWrite(
            self, staged, AtomicWrite(folder / staged.name, staged.data, mode=0o444, share=True)
        )

    def entries(self) -> list[Entry]:
        """Every journal file with a well-formed name, oldest first (temp files and other
        names are left out: see `strays`)."""
        folder = self._checked(create=False)
        if folder is None:
            return []
        found = []
        for name in os.listdir(folder):
            entry = _parse(name)
            if entry is not None:
                found.append(entry)
        return sorted(found)

    def strays(self) -> list[str]:
        """Names in the folder that are neither journal files nor temp files."""
        folder = self._checked(create=False)
        if folder is None:
            return []
        return sorted(
            n
            for n in os.listdir(folder)
            if _parse(n) is None
            and not (n.startswith(".") and n.endswith(".tmp"))
            and n != DAMAGED_DIR
        )

    def read(self, entry: Entry, pool_id: str | None) -> dict[str, Any]:
        """The decoded file, checked against its name and ``pool_id``.

        Raises:
            JournalDamagedError: damaged, not a journal file, or another pool's.
            OSError: it cannot be read (vanished: superseded by a checkpoint meanwhile).
        """
        path = self.folder / entry.name
        limit = _MAX_CHECKPOINT if entry.kind == "ckpt" else _MAX_RECORD
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_size > limit:
                raise JournalDamagedError(f"journal file {entry.name} is not a regular file")
            chunks = []
            while chunk := os.read(fd, 1 << 20):
                chunks.append(chunk)
        finally:
            os.close(fd)
        return decode(entry, b"".join(chunks), pool_id)

    def remove(self, entries: Iterable[Entry]) -> int:
        """Unlink superseded files; return how many went."""
        folder = self._checked(create=False)
        if folder is None:
            return 0
        removed = 0
        for entry in entries:
            try:
                os.unlink(folder / entry.name)
                removed += 1
            except FileNotFoundError:
                continue
            except OSError as exc:  # a folder or something else under a journal file's name
                _log.warning("journal/%s was not removed: %s", entry.name, exc)
        return removed

    def quarantine(self, names: Iterable[str]) -> list[str]:
        """Move damaged or foreign files into ``journal/damaged/`` (kept as evidence, out of
        every listing); return the names moved."""
        folder = self._checked(create=False)
        if folder is None:
            return []
        target = folder / DAMAGED_DIR
        with contextlib.suppress(FileExistsError):
            target.mkdir()
        share_like_parent(target)
        moved = []
        for name in names:
            with contextlib.suppress(OSError):
                os.replace(folder / name, target / name)
                moved.append(name)
        fsync_dir(target)
        fsync_dir(folder)
        return moved

    def sweep_temps(self, now: float) -> int:
        """Remove temp files of writers dead for an hour; return how many."""
        folder = self._checked(create=False)
        if folder is None:
            return 0
        removed = 0
        for name in os.listdir(folder):
            if not (name.startswith(".") and name.endswith(".tmp")):
                continue
            with contextlib.suppress(OSError):
                st = os.lstat(folder / name)
                if stat.S_ISREG(st.st_mode) and st.st_mtime <= now - _TEMP_MIN_AGE:
                    os.unlink(folder / name)
                    removed += 1
        return removed


class ObjectJournal(Journal):
    """The journal of a pool on an object store: the same files, as objects
    ``<prefix>/journal/<name>`` read and written through the pool's `ObjectRoot`
    (docs/architecture/object-stores.md, "Blobs on an object store").

    An object PUT is atomic (visible whole or not at all) and durable when it returns, so a
    write needs no temp file, fsync or rename, and there are no temp files to sweep.  There is
    no folder to check either: a key cannot be a symlink.
    """

    def __init__(self, root: ObjectRoot) -> None:
        self._objects = root
        self.folder = Path(JOURNAL_DIR)  # for messages only; nothing is read through it
        self._root = Path(".")
        self._init_floor()

    def _after(self, seq: int) -> list[Entry]:
        """The journal objects numbered above ``seq`` (one short listing: the store starts
        it after that number)."""
        found = (_parse(n) for n, _ in self._objects.list(JOURNAL_DIR, after=f"{seq:020d}~"))
        return sorted(e for e in found if e is not None and e.seq > seq)

    def ready(self) -> None:
        """Nothing to prepare: a journal object needs no folder."""

    def begin_write(self, staged: Staged) -> RecordWrite:
        """Nothing to start: the record is one PUT, made by `RecordWrite.place` after the
        commit."""
        return RecordWrite(self, staged)

    def write(self, staged: Staged) -> None:
        """Write a committed record or checkpoint (one PUT: durable and whole when it returns)."""
        failpoint("journal.before_write")
        self._objects.write(f"{JOURNAL_DIR}/{staged.name}", staged.data)
        self._raise_floor(staged.seq)
        failpoint("journal.after_write")

    def entries(self) -> list[Entry]:
        """Every journal object with a well-formed name, oldest first."""
        found = (_parse(name) for name, _ in self._objects.list(JOURNAL_DIR))
        return sorted(e for e in found if e is not None)

    def strays(self) -> list[str]:
        """Objects in ``journal/`` that are not journal files."""
        return sorted(n for n, _ in self._objects.list(JOURNAL_DIR) if _parse(n) is None)

    def read(self, entry: Entry, pool_id: str | None) -> dict[str, Any]:
        """The decoded object, checked against its name and ``pool_id`` (see `Journal.read`)."""
        data = self._objects.read(f"{JOURNAL_DIR}/{entry.name}")
        if data is None:
            raise FileNotFoundError(f"journal object {entry.name} is gone")
        limit = _MAX_CHECKPOINT if entry.kind == "ckpt" else _MAX_RECORD
        if len(data) > limit:
            raise JournalDamagedError(f"journal file {entry.name} is too large to be one")
        return decode(entry, data, pool_id)

    def remove(self, entries: Iterable[Entry]) -> int:
        """Delete superseded objects; return how many went."""
        return sum(1 for e in entries if self._objects.delete(f"{JOURNAL_DIR}/{e.name}"))

    def quarantine(self, names: Iterable[str]) -> list[str]:
        """Move damaged or foreign objects to ``journal/damaged/`` (copy, then delete)."""
        moved = []
        for name in names:
            if _parse(name) is None and "/" in name:
                continue
            data = self._objects.read(f"{JOURNAL_DIR}/{name}")
            if data is None:
                continue
            self._objects.write(f"{JOURNAL_DIR}/{DAMAGED_DIR}/{name}", data)
            self._objects.delete(f"{JOURNAL_DIR}/{name}")
            moved.append(name)
        return moved

    def sweep_temps(self, now: float) -> int:
        """None to sweep: object writes leave no temp files."""
        return 0


def journal_for(root: Path | ObjectRoot) -> Journal:
    """The journal of the pool at ``root``: files in a folder, or objects on a bucket."""
    return Journal(root) if isinstance(root, Path) else ObjectJournal(root)


def decode(entry: Entry, data: bytes, pool_id: str | None) -> dict[str, Any]:
    """A journal file's bytes decoded, checked against its name and ``pool_id``.

    Raises:
        JournalDamagedError: damaged, not a journal file, or another pool's.
    """
    import zstandard  # imported on use (docs/architecture/start-up.md, "Start-up")

    if _digest(data) != entry.digest:
        raise JournalDamagedError(
            f"journal file {entry.name} is damaged: its bytes do not match its digest"
        )
    try:
        if entry.kind == "ckpt":
            if not data.startswith(_CKPT_MAGIC):
                raise ValueError("not a checkpoint")
            raw = zstandard.ZstdDecompressor().decompress(
                data[len(_CKPT_MAGIC) :], max_output_size=_MAX_CHECKPOINT
            )
        else:
            raw = data
        doc = json.loads(raw)
        if not isinstance(doc, dict):
            raise ValueError("not an object")
        if doc.get("format") != _FORMAT or doc.get("version") != _VERSION:
            raise ValueError(f"format {doc.get('format')!r} version {doc.get('version')!r}")
        if doc.get("kind") != ("checkpoint" if entry.kind == "ckpt" else "record"):
            raise ValueError(f"kind {doc.get('kind')!r}")
        if doc.get("seq") != entry.seq:
            raise ValueError(f"number {doc.get('seq')!r} is not the one in its name")
    except (ValueError, RecursionError, zstandard.ZstdError) as exc:
        # RecursionError: JSON nested past the interpreter's limit (a crafted file whose
        # name matches its bytes all the same).
        raise JournalDamagedError(f"journal file {entry.name} is not readable: {exc}") from exc
    if pool_id is not None and doc.get("pool_id") != pool_id:
        raise JournalDamagedError(
            f"journal file {entry.name} belongs to another pool ({doc.get('pool_id')!r}); "
            "it was never applied"
        )
    return doc


# --------------------------------------------------------------------------- replay


def _text(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{what} is not a string")
    return value


def _time(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError("a time is not a number")
    try:
        seconds = float(value)
    except OverflowError as exc:
        raise ValueError("a time is out of range") from exc
    if not math.isfinite(seconds):
        raise ValueError("a time is not finite")
    return seconds


def _name(value: Any) -> str:
    """An archive name from a journal file, held to the rules every name is (a crafted file
    must not bring in a name the library would refuse)."""
    return check_archive_name(_text(value, "an archive name"))


def _owner(value: Any) -> str:
    # External or the pool's own (``archive:<name>``): both are in the journal.
    return check_owner(_text(value, "an owner"), external=False)


def _manifest(value: Any) -> str:
    if not is_digest(value):
        raise ValueError(f"{value!r:.80} is not a manifest digest")
    return str(value)


def _owner_of(name: str) -> str:
    return archive_owner(name)


def load_checkpoint(doc: dict[str, Any]) -> JournalState:
    """A checkpoint document as a `JournalState`.

    Raises:
        ValueError: a field has the wrong shape.
    """
    archives = doc.get("archives")
    if not isinstance(archives, dict):
        raise ValueError("archives is not an object")
    state = JournalState(seq=int(doc["seq"]))
    for manifest, a in archives.items():
        if not isinstance(a, dict) or a.get("state") not in ("published", "released"):
            raise ValueError(f"archive {manifest!r} is malformed")
        owners: dict[str, float] = {}
        for pair in a.get("owners", []):
            if not isinstance(pair, list) or len(pair) != 2:
                raise ValueError(f"an owner of {manifest!r} is malformed")
            owners[_owner(pair[0])] = _time(pair[1]) or 0.0
        entry = state.archives[_manifest(manifest)] = ArchiveState(
            name=_name(a.get("name")),
            state=a["state"],
            published_at=_time(a.get("published_at")),
            released_at=_time(a.get("released_at")),
            owners=owners,
        )
        if a.get("superseded_by") is not None and a["state"] == "released":
            entry.state = "superseded"
            entry.superseded_by = _manifest(a["superseded_by"])
            entry.superseded_at = _time(a.get("superseded_at"))
    return state


def apply_record(state: JournalState, doc: dict[str, Any]) -> None:
    """Apply one record document to ``state`` (decisions in the order they were made).

    Raises:
        ValueError: the record is malformed (then ``state`` may hold part of it).
    """
    ops = doc.get("ops")
    if not isinstance(ops, list):
        raise ValueError("ops is not a list")
    for op in ops:
        if not isinstance(op, dict):
            raise ValueError("an op is not an object")
        kind = op.get("op")
        at = _time(op.get("at")) or 0.0
        if kind == "release_owner":
            owner = _owner(op.get("owner"))
            for held in state.archives.values():
                held.owners.pop(owner, None)
            continue
        manifest = _manifest(op.get("manifest"))
        name = _name(op.get("archive"))
        a = state.archives.get(manifest)
        if kind == "publish":
            if a is None:
                a = state.archives[manifest] = ArchiveState(name, "published", published_at=at)
            a.name = name
            if a.state == "published":
                a.owners.setdefault(_owner_of(name), _time(op.get("owned_at")) or at)
            a.published_at = at
            a.partial = False
            if op.get("supersedes") is not None:
                # The released archive the name pointed at (docs/architecture/save-protocol.md,
                # "Superseding a name"); known even when its own records were lost.
                earlier = _manifest(op["supersedes"])
                old = state.archives.get(earlier)
                if old is None:
                    old = state.archives[earlier] = ArchiveState(name, "released")
                old.state, old.superseded_by, old.superseded_at = "superseded", manifest, at
        elif kind == "retain":
            if a is None:
                a = state.archives[manifest] = ArchiveState(name, "published", partial=True)
                a.owners[_owner_of(name)] = at
            a.owners.setdefault(_owner(op.get("owner")), at)
        elif kind == "release":
            if a is None:
                a = state.archives[manifest] = ArchiveState(name, "released", partial=True)
            a.owners.pop(_owner_of(a.name), None)
            if a.state == "published":
                a.state, a.released_at = "released", at
        else:
            raise ValueError(f"unknown op {kind!r}")
    state.seq = max(state.seq, int(doc["seq"]))


@dataclass
class Replay:
    """The journal read whole: the state it describes and what could not be used."""

    state: JournalState
    checkpoint: Entry | None
    applied: list[Entry] = field(default_factory=list)
    damaged: dict[str, str] = field(default_factory=dict)  # file name -> reason
    foreign: list[str] = field(default_factory=list)
    # Files this account may not open (permission denied): not damaged, see `unreadable_reason`.
    unreadable: dict[str, str] = field(default_factory=dict)
    highest_seq: int = 0


def replay(
    journal: Journal,
    pool_id: str | None,
    entries: list[Entry] | None = None,
    own: dict[Entry, bytes] | None = None,
) -> Replay:
    """The newest readable checkpoint and every readable record after it, applied in order.

    ``own``: records the catalog holds itself (`catalog_records`), used instead of their files
    (which may not be written yet, or were lost).  A damaged checkpoint is passed over for an
    older one (and reported); damaged records are reported and skipped; records of another
    pool are refused; files this account may not open are reported apart (`unreadable`),
    never as damaged.  A number ahead of this host's clock is no sign of damage: numbers are
    the counter's order, which a clock ahead moves on (`catalog.queries.next_save_seq`).
    """
    entries = journal.entries() if entries is None else entries
    own = own or {}
    every = sorted(set(entries) | set(own))
    out = Replay(JournalState(), None)

    def load(entry: Entry) -> dict[str, Any]:
        if entry in own:
            return decode(entry, own[entry], pool_id)
        return journal.read(entry, pool_id)

    for entry in sorted((e for e in every if e.kind == "ckpt"), reverse=True):
        try:
            state = load_checkpoint(load(entry))
        except FileNotFoundError:
            continue
        except PermissionError as exc:
            out.unreadable[entry.name] = unreadable_reason(entry.name, exc)
            continue
        except (JournalDamagedError, OSError, ValueError, KeyError, TypeError, MemoryError) as exc:
            _note_bad(out, entry, exc)
            continue
        out.state, out.checkpoint = state, entry
        out.highest_seq = entry.seq
        break
    base = out.checkpoint.seq if out.checkpoint is not None else -1
    for entry in every:
        if entry.kind != "rec" or entry.seq <= base:
            continue
        try:
            apply_record(out.state, load(entry))
        except FileNotFoundError:
            continue
        except PermissionError as exc:
            out.unreadable[entry.name] = unreadable_reason(entry.name, exc)
            continue
        except (JournalDamagedError, OSError, ValueError, KeyError, TypeError) as exc:
            _note_bad(out, entry, exc)
            continue
        out.applied.append(entry)
        out.highest_seq = max(out.highest_seq, entry.seq)
    return out


def _note_bad(out: Replay, entry: Entry, exc: BaseException) -> None:
    if isinstance(exc, JournalDamagedError) and "another pool" in str(exc):
        out.foreign.append(entry.name)
    else:
        out.damaged[entry.name] = str(exc)


# --------------------------------------------------------------------------- the decisions


def publish_op(
    name: str, manifest: str, *, at: float, owned_at: float, supersedes: str | None = None
) -> dict[str, Any]:
    """An archive published, retained by its own owner since ``owned_at``; ``supersedes``:
    the manifest of the released archive the name pointed at before, superseded by it
    (docs/architecture/save-protocol.md, "Superseding a name")."""
    op = {"op": "publish", "archive": name, "manifest": manifest, "at": at, "owned_at": owned_at}
    if supersedes is not None:
        # NOTE: an optional key, which readers of earlier versions pass over: they see a
        # publication of the name, as before.
        op["supersedes"] = supersedes
    return op


def retain_op(owner: str, name: str, manifest: str, *, at: float) -> dict[str, Any]:
    """``owner`` retains the archive."""
    return {"op": "retain", "owner": owner, "archive": name, "manifest": manifest, "at": at}


def release_op(name: str, manifest: str, *, at: float) -> dict[str, Any]:
    """The archive released (its own owner dropped)."""
    return {"op": "release", "archive": name, "manifest": manifest, "at": at}


def release_owner_op(owner: str, archives: list[tuple[str, str]], *, at: float) -> dict[str, Any]:
    """Every retention of ``owner`` dropped (``archives``: name and manifest, for readers)."""
    return {
        "op": "release_owner",
        "owner": owner,
        "archives": [list(a) for a in archives],
        "at": at,
    }


# --------------------------------------------------------------------------- catalog side


def pool_id_of(conn: Connection) -> str:
    """The pool id records are stamped with (empty for a catalog without an identity)."""
    return get_pool_info(conn, "pool_id") or ""


def catalog_state(conn: Connection) -> JournalState:
    """The retention state the catalog holds: every published, released or superseded
    archive with a manifest, and its owners (what a checkpoint records)."""
    a, r = archives_table, retention_table
    state = JournalState()
    by_id: dict[int, ArchiveState] = {}
    manifests: dict[int, str] = {}
    superseded: dict[int, int] = {}
    for row in conn.execute(
        select(
            a.c.id,
            a.c.name,
            a.c.state,
            a.c.manifest_digest,
            a.c.published_at,
            a.c.released_at,
            a.c.superseded_by,
            a.c.superseded_at,
        ).where(
            a.c.state.in_(("published", "released", "superseded")),
            a.c.manifest_digest.is_not(None),
        )
    ):
        entry = ArchiveState(
            name=row.name,
            state=row.state,
            published_at=row.published_at,
            released_at=row.released_at,
            superseded_at=row.superseded_at,
        )
        by_id[row.id] = state.archives[row.manifest_digest] = entry
        manifests[row.id] = row.manifest_digest
        if row.superseded_by is not None:
            superseded[row.id] = row.superseded_by
    for archive_id, by in superseded.items():
        by_id[archive_id].superseded_by = manifests.get(by)
    for owner, archive_id, created_at in conn.execute(
        select(r.c.owner, r.c.archive_id, r.c.created_at)
    ):
        held = by_id.get(archive_id)
        if held is not None:
            held.owners[owner] = created_at
    return state


def checkpoint(catalog: Catalog, journal: Journal, clock: Callable[[], float]) -> Staged:
    """Write a checkpoint of the catalog's retention state and remove what it supersedes.

    The checkpoint is committed as the catalog's position first and written after (as every
    record is), so a file exists only for what a catalog committed.  Then only what the
    checkpoint *before* it supersedes is removed: the previous checkpoint and the records
    since it stay, so a damaged newest checkpoint still has one to fall back to.
    """
    now = clock()
    with catalog.write("journal.checkpoint") as conn:
        staged = stage_checkpoint(conn, pool_id_of(conn), catalog_state(conn), now, journal=journal)
    journal.write(staged)
    journal.remove(removable(journal.entries(), Entry(staged.seq, staged.digest, "ckpt")))
    return staged


def removable(entries: list[Entry], newest: Entry) -> list[Entry]:
    """The files that the checkpoint before ``newest`` (a durable one) supersedes: every file
    at or below that one's number but itself.  Nothing without an earlier checkpoint."""
    older = [e for e in entries if e.kind == "ckpt" and e != newest and e.seq <= newest.seq]
    if not older:
        return []
    keep = max(older)
    return [e for e in entries if e.seq <= keep.seq and e not in (keep, newest)]


class RecordWrite:
    """A record whose transaction is committing (`Journal.begin_write`): `place` writes it
    once the transaction committed, `discard` forgets it when it did not."""

    def __init__(self, journal: Journal, staged: Staged) -> None:
        self.journal = journal
        self.staged = staged

    def place(self) -> None:
        """Write the record (its transaction committed); raises as `Journal.write`."""
        self.journal.write(self.staged)

    def discard(self) -> None:
        """The transaction did not commit: nothing of the record may stay."""


class _LocalRecordWrite(RecordWrite):
    """A record of a journal folder whose temp file is being written (`Journal.begin_write`)."""

    def __init__(self, journal: Journal, staged: Staged, temp: AtomicWrite) -> None:
        super().__init__(journal, staged)
        self._temp = temp

    def place(self) -> None:
        failpoint("journal.before_write")
        self._temp.place()
        self.journal._raise_floor(self.staged.seq)
        failpoint("journal.after_write")

    def discard(self) -> None:
        self._temp.discard()


def place_committed(pending: RecordWrite | None) -> None:
    """`write_committed` of a record begun with `Journal.begin_write`: a failure is logged,
    not raised, and its temp file removed."""
    if pending is None:
        return
    try:
        pending.place()
    except BaseException as exc:
        pending.discard()
        if not isinstance(exc, (OSError, ArchiveError)):
            raise
        _log.warning(
            "journal record %s was not written (%s); the catalog holds it, and the next gc "
            "writes it",
            pending.staged.name,
            exc,
        )


def write_committed(journal: Journal, staged: Staged | None) -> None:
    """Write a record its transaction committed.  A failure is logged, not raised: the
    decision is made, the catalog holds the record's bytes, and the next GC writes the file
    from them (docs/architecture/retention-journal.md, "Retention journal")."""
    if staged is None:
        return
    try:
        journal.write(staged)
    except (OSError, ArchiveError) as exc:
        _log.warning(
            "journal record %s was not written (%s); the catalog holds it, and the next gc "
            "writes it",
            staged.name,
            exc,
        )


@dataclass
class Audit:
    """The journal folder compared with what the catalog knows of it."""

    entries: list[Entry]
    position: CatalogPosition
    unknown: list[Entry] = field(default_factory=list)  # files the catalog never committed
    gaps: list[int] = field(default_factory=list)  # committed records without a file
    missing_checkpoint: bool = False
    strays: list[str] = field(default_factory=list)

    @property
    def behind(self) -> bool:
        """The catalog lacks decisions the pool's journal holds."""
        return bool(self.unknown)


def audit(catalog: Catalog, journal: Journal) -> Audit:
    """Compare the journal folder with the catalog.

    The folder is listed *before* the catalog is read: a record's file appears only after its
    transaction committed, so every file listed is one the catalog already knows, unless the
    catalog is behind the pool.
    """
    entries = journal.entries()
    strays = journal.strays()
    with catalog.read() as conn:
        position = catalog_position(conn)
    found = Audit(entries, position, strays=strays)
    present = set(entries)
    found.unknown = [e for e in entries if not position.knows(e)]
    found.gaps = sorted(
        seq for seq, digest in position.records if Entry(seq, digest, "rec") not in present
    )
    found.missing_checkpoint = (
        position.checkpoint is not None and position.checkpoint not in present
    )
    return found


def adopt(catalog: Catalog, journal: Journal, clock: Callable[[], float]) -> bool:
    """Write a checkpoint at open where the journal needs one; return whether it did:

    * a catalog without a journal position (a new pool, or one written before the journal
      existed), unless the journal folder already holds files: then this catalog never saw
      them (a lost catalog's replacement, or one behind), and `rebuild_catalog` brings it
      forward;
    * a catalog whose checkpoint was written under another pool id (a copy given an identity
      of its own by a rebind): a rebuild of the copy would refuse the original's files.

    Never while a recovered catalog awaits its rebuild.
    """
    from .identity import UNINDEXED_BLOBS

    with catalog.read() as conn:
        # Files up to the catalog's counter need no reading before a decision: its numbers
        # are past them already (`Journal.high_water` reads only the newer ones).
        journal.note_counter(stored_save_seq(conn))
        if get_pool_info(conn, UNINDEXED_BLOBS) is not None:
            return False
        position = get_pool_info(conn, JOURNAL_CHECKPOINT)
        stamped = get_pool_info(conn, JOURNAL_POOL)
        pool_id = pool_id_of(conn)
    try:
        entries = journal.entries()
    except OSError:
        # Unlistable (a symlink in its place: PoolLayoutError): reading the pool needs no
        # journal; every decision checks the folder first and refuses.
        return False
    if position is not None and stamped == pool_id:
        return False
    if position is None and entries:
        return False
    checkpoint(catalog, journal, clock)
    return True


def maintain(catalog: Catalog, journal: Journal, clock: Callable[[], float]) -> Staged | None:
    """After a GC: write the files of committed records that have none (a process stopped
    between its commit and its record, or could not write it), from the bytes the catalog
    holds; write a checkpoint when records piled up or the catalog's checkpoint file is
    missing; remove superseded files and stale temp files.  Returns the new checkpoint."""
    found = audit(catalog, journal)
    if found.gaps:
        with catalog.read() as conn:
            own = catalog_records(conn)
        for entry, data in sorted(own.items()):
            if entry.seq in found.gaps:
                journal.write(Staged(entry.seq, entry.digest, data, "rec"))
    written = None
    cp = found.position.checkpoint
    if found.missing_checkpoint or cp is None or len(found.position.records) >= CHECKPOINT_EVERY:
        written = checkpoint(catalog, journal, clock)
    else:
        journal.remove(removable(found.entries, cp))
    journal.sweep_temps(clock())
    return written
