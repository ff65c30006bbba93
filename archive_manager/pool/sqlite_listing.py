"""`ArchiveManager.find` and `payload_reclaimed` for a SQLite catalog, read with the standard
library's ``sqlite3`` and written nowhere: what ``archive-manager ls`` needs, without
SQLAlchemy (docs/architecture/start-up.md, "Start-up").

`read_listing` answers only when the pool is plainly as a writable open would leave it
unchanged: every check below passes, or it returns None and the caller takes
`ArchiveManager.open` (the full path), whose answer or error then stands.  It checks:

* the catalog: a SQLite file named by the default URL or ``sqlite:///path`` without options,
  a regular file in WAL mode with no rollback journal beside it, on a local filesystem (the
  full open refuses a networked one), at schema revision `HEAD_REVISION` and format
  `CATALOG_FORMAT_VERSION` (anything else is migrated or refused by the full open);
* the pool's identity (`identity.bind_pool`): the root's identity file and the catalog
  name one pool and one catalog, the catalog records this very root, and the spare copy
  of the identity is in place (the full open would write it);
* the retention journal (`journal.adopt`): no rebuild pending, the catalog's checkpoint
  stamped with this pool, and no journal file numbered past the catalog's counter (a
  catalog restored from a backup, behind the pool: the full open writes to it);
* the read itself: opened as every reader opens a SQLite catalog (`_sqlite_read`: nothing
  created or written, not even ``-wal``/``-shm``), one snapshot for every statement, and
  an ``immutable`` read is dropped if the file changed meanwhile.

The statements are `ArchiveManager.find`'s (`catalog.queries.archives_in_order`,
`archive.reclaimed_names`) written for ``sqlite3``; ``tests/pool/test_sqlite_listing.py`` holds
the two paths to the same answers over random pools.
"""

from __future__ import annotations

import os
import sqlite3
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._util.constants import (
    BUSY_TIMEOUT_ENV,
    CATALOG_FILE,
    CATALOG_FORMAT_VERSION,
    HEAD_REVISION,
    JOURNAL_CHECKPOINT,
    JOURNAL_POOL,
    SAVE_SEQ,
    UNINDEXED_BLOBS,
    VERSION_TABLE,
)
from .._util.mounts import filesystem_type, is_network_filesystem, read_mount_table
from .._util.names import name_spellings
from .._util.pool_files import (
    IDENTITY_FILE,
    JOURNAL_DIR,
    SPARE_FILE,
    PoolIdentity,
    parse_journal_name,
    read_identity_file,
)
from .._util.sqlite_read import begin_read_snapshot, connect_reader, file_stamp
from ..errors import ArchiveError
from .listing import ArchiveInfo, ListingFilter, listing_filter

__all__ = ["Listing", "read_listing", "sqlite_catalog_file"]

# SQLite's file header: its magic, and bytes 18-19 (write and read format versions), which
# are 2 in WAL mode.
_MAGIC = b"SQLite format 3\x00"
_WAL_FORMAT = b"\x02\x02"
# IN lists are cut as `catalog.queries.batches` cuts them (SQLite's bound-parameter limit).
_IN_BATCH = 5000
_COLUMNS = (
    "name, rollout_id, evaluation, state, samples, bytes, created_at, published_at, "
    "released_at, reference_name, id, superseded_at, superseded_by"
)


@dataclass(frozen=True)
class Listing:
    """What ``ls`` shows: the archives `ArchiveManager.find` returns, and which of the
    released ones lost payload to GC (`ArchiveManager.payload_reclaimed`)."""

    archives: list[ArchiveInfo]
    reclaimed: set[str]


@dataclass(frozen=True)
class _Row:
    name: str
    rollout_id: int | None
    evaluation: int
    state: str
    samples: int
    bytes: int
    created_at: float
    published_at: float | None
    released_at: float | None
    reference_name: str | None
    id: int
    superseded_at: float | None
    superseded_by: int | None


def sqlite_catalog_file(root: Path, catalog_url: str | None) -> Path | None:
    """The SQLite catalog file of the pool at ``root`` when the catalog is a plain file (the
    default, or ``sqlite:///path`` with no options and no escapes); None otherwise."""
    if catalog_url is None:
        return root / CATALOG_FILE
    plain = catalog_url.startswith("sqlite:///") and not any(c in catalog_url for c in "?%#")
    if not plain or catalog_url == "sqlite:///" or catalog_url.endswith(":memory:"):
        return None
    return Path(catalog_url.removeprefix("sqlite:///")).absolute()


def read_listing(
    root: str | os.PathLike[str], catalog_url: str | None, **filters: Any
) -> Listing | None:
    """What ``ArchiveManager.open(root, catalog_url).find(**filters)`` returns, and which of
    the released archives in it were reclaimed, read from the pool's SQLite catalog writing
    nothing; None where the full open must answer (see the module docstring), a filter it
    refuses included (the open comes first there, and its errors with it)."""
    if isinstance(root, str) and "://" in root:
        return None  # an object store's root: its catalog is a server or elsewhere
    try:
        listing = listing_filter(**filters)
        path = Path(root).expanduser().resolve()
        file = sqlite_catalog_file(path, catalog_url)
        if file is None or not _plain_file(file):
            return None
        timeout_ms = _busy_timeout_ms()
        if timeout_ms is None:
            return None
        return _read(path, file, timeout_ms, listing)
    except (OSError, sqlite3.Error, ArchiveError, ValueError):
        # Whatever went wrong, the full open says it in its own words (or reads the pool).
        return None


def _busy_timeout_ms() -> int | None:
    raw = os.environ.get(BUSY_TIMEOUT_ENV, "").strip()
    if not raw:
        return 30_000
    try:
        value = int(raw)
    except ValueError:
        return None
    return value if value >= 0 else None


def _plain_file(file: Path) -> bool:
    """A regular catalog file in WAL mode, with no rollback journal beside it, on a local
    filesystem."""
    st = os.stat(file)  # follows a symlink, as SQLite does
    if not stat.S_ISREG(st.st_mode):
        return False
    database = os.path.realpath(file)
    if os.path.lexists(f"{database}-journal"):
        # A hot rollback journal: an immutable read would see half a transaction.
        return False
    with open(database, "rb") as handle:
        header = handle.read(20)
    if header[:16] != _MAGIC or header[18:20] != _WAL_FORMAT:
        return False  # not WAL: the full open switches it (a write)
    table = read_mount_table()
    if table is not None:
        fstype = filesystem_type(os.path.dirname(database), table)
        if fstype is not None and is_network_filesystem(fstype):
            return False  # refused by the full open (catalog.engine.check_local_filesystem)
    return True


def _read(path: Path, file: Path, timeout_ms: int, listing: ListingFilter) -> Listing | None:
    database = str(file.absolute())
    conn = connect_reader(database, timeout_ms)
    try:
        begin_read_snapshot(conn, database, timeout_ms)
        info = _pool_info(conn)
        if info is None or not _pool_as_opened(path, info):
            return None
        found = _archives(conn, listing)
        if found is None:
            return None
        released = [r.name for r in found if r.state == "released"]
        reclaimed = _reclaimed(conn, released)
        if conn.read_mode == "immutable" and file_stamp(database) != conn.stamp:
            return None  # a writer opened the file meanwhile: what was read may mix states
        conn.execute("ROLLBACK")
    finally:
        conn.close()
    return Listing([ArchiveInfo.from_row(r) for r in found], reclaimed)


def _pool_info(conn: sqlite3.Connection) -> dict[str, str | None] | None:
    """Every ``pool_info`` value, if the catalog is at this library's revision and format."""
    revisions = conn.execute(f"SELECT version_num FROM {VERSION_TABLE}").fetchall()
    if revisions != [(HEAD_REVISION,)]:
        return None
    info: dict[str, str | None] = dict(conn.execute("SELECT key, value FROM pool_info"))
    if info.get("format_version") != str(CATALOG_FORMAT_VERSION):
        return None
    return info


def _pool_as_opened(path: Path, info: dict[str, str | None]) -> bool:
    """Whether a writable open of ``path`` would find the pool as it is and change nothing:
    `identity.bind_pool` with both sides one pool's at the recorded root, and
    `journal.adopt` with nothing to write."""
    pool_id, catalog_id = info.get("pool_id"), info.get("catalog_id")
    if not pool_id or not catalog_id or info.get("blob_root") != str(path):
        return False
    if UNINDEXED_BLOBS in info:
        return False  # a recovered catalog awaiting its rebuild
    found = read_identity_file(path / IDENTITY_FILE)
    if not PoolIdentity(pool_id, catalog_id).same_as(found):
        return False
    blobs = path / "blobs"
    if blobs.is_symlink() or not (blobs / SPARE_FILE).is_file():
        return False
    if info.get(JOURNAL_CHECKPOINT) is None or info.get(JOURNAL_POOL) != pool_id:
        return False
    try:
        counter = int(info.get(SAVE_SEQ) or 0)
    except ValueError:
        return False
    return _journal_within(path / JOURNAL_DIR, counter)


def _journal_within(folder: Path, counter: int) -> bool:
    """Whether no journal file is numbered past ``counter`` (the catalog is not behind the
    pool), the folder being a real one (or absent: a pool without decisions yet)."""
    try:
        st = os.lstat(folder)
    except FileNotFoundError:
        return True
    if not stat.S_ISDIR(st.st_mode):
        return False
    for name in os.listdir(folder):
        entry = parse_journal_name(name)
        if entry is not None and counter < entry.seq:
            return False
    return True


def _archives(conn: sqlite3.Connection, f: ListingFilter) -> list[_Row] | None:
    """`ArchiveManager.find`'s rows (`catalog.queries.archives_in_order`); None when
    ``after`` names no archive (the full path raises, with its "did you mean")."""
    where: list[str] = []
    params: list[Any] = []
    if f.rollout_low is not None:
        where.append("rollout_id >= ?")
        params.append(f.rollout_low)
    if f.rollout_high is not None:
        where.append("rollout_id <= ?")
        params.append(f.rollout_high)
    if f.evaluation is not None:
        where.append("evaluation = ?")
        params.append(int(f.evaluation))
    if f.task_key is not None:
        where.append("id IN (SELECT archive_id FROM entries WHERE task_key = ?)")
        params.append(f.task_key)
    if f.created_since is not None:
        where.append("created_at >= ?")
        params.append(f.created_since)
    if f.state is not None:
        where.append("state = ?")
        params.append(f.state)
    after: tuple[int | None, str] | None = None
    if f.after is not None:
        after = _archive_key(conn, f.after)
        if after is None:
            return None
    rows: list[_Row] = []
    if after is None or after[0] is not None:
        part, values = [*where, "rollout_id IS NOT NULL"], list(params)
        if after is not None:
            part.append("(rollout_id > ? OR (rollout_id = ? AND name > ?))")
            values += [after[0], after[0], after[1]]
        rows += _select(conn, part, values, "rollout_id, name, id", f.limit)
    if f.limit is None or len(rows) < f.limit:
        part, values = [*where, "rollout_id IS NULL"], list(params)
        if after is not None and after[0] is None:
            part.append("name > ?")
            values.append(after[1])
        left = None if f.limit is None else f.limit - len(rows)
        rows += _select(conn, part, values, "name, id", left)
    if f.limit is not None and rows and len(rows) == f.limit:
        rows = _whole_last_name(conn, where, params, rows)
    return rows


def _whole_last_name(
    conn: sqlite3.Connection, where: list[str], params: list[Any], rows: list[_Row]
) -> list[_Row]:
    """`catalog.queries.archives_in_order`'s: a full page holds every archive of its last
    key, ending before them or, when they are the whole page, holding them all."""
    last = rows[-1]
    key = "rollout_id IS NULL" if last.rollout_id is None else "rollout_id = ?"
    values = [*params] + ([] if last.rollout_id is None else [last.rollout_id])
    more = _select(
        conn, [*where, key, "name = ?", "id > ?"], [*values, last.name, last.id], "id", None
    )
    if not more:
        return rows
    first = next(
        i for i, r in enumerate(rows) if (r.rollout_id, r.name) == (last.rollout_id, last.name)
    )
    return rows[:first] if first else [*rows, *more]


def _select(
    conn: sqlite3.Connection, where: list[str], params: list[Any], order: str, limit: int | None
) -> list[_Row]:
    sql = f"SELECT {_COLUMNS} FROM archives WHERE {' AND '.join(where)} ORDER BY {order}"
    if limit is not None:
        sql += " LIMIT ?"
        params = [*params, limit]
    return [_Row(*row) for row in conn.execute(sql, params)]


def _archive_key(conn: sqlite3.Connection, name: str) -> tuple[int | None, str] | None:
    """``(rollout_id, name)`` of the archive the name ``name`` points at, else of its pending
    save, tried as given, then in NFC and NFD (`catalog.queries.archive_by_name`)."""
    spellings = name_spellings(name)
    marks = ", ".join("?" * len(spellings))
    by_name: dict[str, tuple[int | None, str]] = {}
    for rollout_id, stored, _ in conn.execute(
        f"SELECT rollout_id, name, state FROM archives WHERE name IN ({marks}) "
        "AND state IN ('published', 'released', 'pending') ORDER BY state = 'pending'",
        spellings,
    ):
        by_name.setdefault(stored, (rollout_id, stored))
    return next((by_name[s] for s in spellings if s in by_name), None)


def _reclaimed(conn: sqlite3.Connection, names: Sequence[str]) -> set[str]:
    """`archive.reclaimed_names`: which archives lack a live row for a blob they need."""
    out: set[str] = set()
    for i in range(0, len(names), _IN_BATCH):
        batch = list(names[i : i + _IN_BATCH])
        marks = ", ".join("?" * len(batch))
        out.update(
            name
            for (name,) in conn.execute(
                f"SELECT a.name FROM archives AS a WHERE a.name IN ({marks}) "
                "AND a.state != 'superseded' AND EXISTS ("
                "SELECT ab.digest FROM archive_blobs AS ab LEFT OUTER JOIN blobs AS b "
                "ON b.digest = ab.digest WHERE ab.archive_id = a.id "
                "AND (b.digest IS NULL OR b.state != 'live'))",
                batch,
            )
        )
    return out
