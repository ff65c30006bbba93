"""The pool's own small files, read with the standard library alone: the identity file
(docs/architecture/pool-identity.md, "Pool identity") and the names of the retention journal's files
(docs/architecture/retention-journal.md, "Retention journal").

`identity` and `journal` write and judge them; the SQLite listing (`pool/sqlite_listing.py`), which
must not import SQLAlchemy, checks them before it trusts a catalog (docs/architecture/start-up.md,
"Start-up").
"""

from __future__ import annotations

import json
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

from ..errors import PoolIdentityError

__all__ = [
    "IDENTITY_FILE",
    "IDENTITY_FORMAT",
    "IDENTITY_VERSION",
    "JOURNAL_DIR",
    "JOURNAL_NAME",
    "MAX_JOURNAL_SEQ",
    "SPARE_FILE",
    "Entry",
    "PoolIdentity",
    "parse_identity",
    "parse_journal_name",
    "read_identity_file",
]

IDENTITY_FILE = "archive-pool.json"
# NOTE: a spare copy where operators do not tidy up (the blob listing reads only digest
# names in fan-out folders): a deleted identity file must not let a stale catalog, which
# indexes every blob it knew, bind the root again and lock out the catalog serving it.
SPARE_FILE = ".archive-pool.json"
IDENTITY_FORMAT = "archive_manager.pool"
IDENTITY_VERSION = 1
_MAX_FILE = 64 << 10  # an identity file is ~300 bytes; anything huge is not one


@dataclass(frozen=True)
class PoolIdentity:
    """Who a pool is: its id, the id of the catalog serving it, and that catalog's URL
    (without any password; for messages only)."""

    pool_id: str
    catalog_id: str
    catalog: str = ""
    bound_at: float = 0.0

    def same_as(self, other: PoolIdentity | None) -> bool:
        """One pool served by one catalog (URLs may differ: a database restored elsewhere)."""
        return (
            other is not None
            and other.pool_id == self.pool_id
            and other.catalog_id == self.catalog_id
        )


def read_identity_file(path: Path) -> PoolIdentity | None:
    """The identity in the file ``path`` (None: no such file), read without following a
    symlink.

    Raises:
        PoolIdentityError: it is not a regular file, or not an identity file.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise PoolIdentityError(f"cannot read the pool identity file {path}: {exc}") from exc
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > _MAX_FILE:
            raise PoolIdentityError(f"{path} is not a pool identity file")
        data = os.read(fd, _MAX_FILE)
    finally:
        os.close(fd)
    return parse_identity(data, path)


def parse_identity(data: bytes | None, path: Path | str) -> PoolIdentity | None:
    """The identity an identity file's bytes hold (None: no file)."""
    if data is None:
        return None
    if len(data) > _MAX_FILE:
        raise PoolIdentityError(f"{path} is not a pool identity file")
    try:
        content = json.loads(data)
        if content.get("format") != IDENTITY_FORMAT or type(content.get("version")) is not int:
            raise ValueError("not an identity file")
        if content["version"] > IDENTITY_VERSION:
            raise PoolIdentityError(
                f"{path} was written by a newer archive_manager (identity version "
                f"{content['version']}); upgrade archive_manager"
            )
        pool_id, catalog_id = content["pool_id"], content["catalog_id"]
        if not (isinstance(pool_id, str) and isinstance(catalog_id, str)):
            raise ValueError("ids are not strings")
        catalog = content.get("catalog", "")
        bound_at = content.get("bound_at", 0.0)
        return PoolIdentity(
            pool_id,
            catalog_id,
            catalog if isinstance(catalog, str) else "",
            float(bound_at) if isinstance(bound_at, (int, float)) else 0.0,
        )
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise PoolIdentityError(
            f"the pool identity file {path} is damaged ({exc}); if this folder is the pool's "
            f"blob root, move the file aside and open the pool again with its catalog"
        ) from exc


# --- the retention journal's file names: <seq, 20 digits>-<xxh3-128>.(rec|ckpt)

JOURNAL_DIR = "journal"
JOURNAL_NAME = re.compile(r"^(\d{20})-([0-9a-f]{32})\.(rec|ckpt)$")
# NOTE: numbers are the pool's counter (`catalog.queries.next_save_seq`: microseconds of the
# clock, or the last number + 1 where that is ahead), so ours stay near 1.7e15 for millennia.
# A number past 2**62 (the year ~148,000) is no number of ours (a crafted or mangled name):
# it is no journal file's name, so neither a replay nor the counter ever follows it, and the
# counter keeps 2**62 numbers of room below the end of a BIGINT.  This bound is the format's,
# not a clock's: a number ahead of any host's clock is still a journal file.
MAX_JOURNAL_SEQ = 2**62


@dataclass(frozen=True, order=True)
class Entry:
    """A journal file, as its name describes it."""

    seq: int
    digest: str
    kind: str

    @property
    def name(self) -> str:
        return f"{self.seq:020d}-{self.digest}.{self.kind}"


def parse_journal_name(name: str) -> Entry | None:
    """The journal file a name describes (None: not a journal file's name)."""
    match = JOURNAL_NAME.match(name)
    if match is None or int(match.group(1)) > MAX_JOURNAL_SEQ:
        return None
    return Entry(int(match.group(1)), match.group(2), match.group(3))
