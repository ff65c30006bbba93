"""What every catalog database shares, and what each must provide (`CatalogDialect`).

The registry of the supported ones is `catalog.engine`'s; a dialect module
(`dialects.sqlite`, `dialects.postgresql`) imports only this module and `catalog.urls`
(docs/architecture/index.md, "Layers").
"""

from __future__ import annotations

import json
import os
import threading
import weakref
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from itertools import islice
from pathlib import Path
from typing import Any, ClassVar

from sqlalchemy import Table, insert
from sqlalchemy.engine import URL, Connection, Engine

from ...errors import ArchiveError, CatalogError

__all__ = [
    "LAZY_COMMIT_OPTION",
    "WRITE_OPTION",
    "CatalogDialect",
    "CatalogUnreachableError",
    "compact_json",
    "track_for_fork",
]


def compact_json(value: Any) -> str:
    """The text a JSON column stores: ``json.dumps`` without the blanks after ``,`` and ``:``.

    NOTE: every engine's ``json_serializer``: each sample's metadata row holds a JSON
    description of about 180 bytes, 19 of them blanks, a tenth of its row; compact, a sample
    costs about 20 bytes less catalog on SQLite and 24 on PostgreSQL, whose rows are aligned
    to 8 bytes (docs/architecture/summaries-and-paging.md, "Summaries and paging").  Rows written
    before keep their blanks; JSON reads them alike.
    """
    if _MAKE_ENCODER is None:
        return json.dumps(value, separators=(",", ":"))
    # NOTE: what ``json.dumps`` runs for these options (`json.JSONEncoder.iterencode`: a
    # fresh markers dict for its circular check, the C string encoder), without building a
    # `json.JSONEncoder` at every call: 6.4 -> 4.2 us a sample's description, ~1,100 calls
    # in the ownership transaction of a 1024-sample save (docs/performance.md, "Load at the
    # floor").
    return "".join(
        _MAKE_ENCODER({}, _DEFAULT, _ENCODE_STR, None, ":", ",", False, False, True)(value, 0)
    )


# The pieces of `compact_json`: None where this Python's json has no C encoder.
_MAKE_ENCODER: Any = getattr(json.encoder, "c_make_encoder", None)
_DEFAULT = json.JSONEncoder().default
_ENCODE_STR = json.encoder.encode_basestring_ascii


WRITE_OPTION = "archive_manager_write"
"""Connection execution option: when true, the ``begin`` event emits ``BEGIN IMMEDIATE``
(SQLite) or takes the `PG_WRITE_LOCK` advisory lock (PostgreSQL)."""

LAZY_COMMIT_OPTION = "archive_manager_lazy_commit"
"""Connection execution option, with `WRITE_OPTION`: the transaction's commit does not wait
for the disk (SQLite ``synchronous = NORMAL`` for it, PostgreSQL ``synchronous_commit =
off``).  It is made durable by the next durable commit of the catalog, whatever its
connection, as both keep one log written in order (docs/architecture/save-protocol.md, "Save
protocol", Durability of the lease)."""


class CatalogUnreachableError(CatalogError):
    """The catalog server could not be reached, or went away (restart, shutdown, network), or
    ended this session (a write transaction left idle too long).

    Only the engine raises it; callers catch `CatalogError`. `Catalog.write` waits through it
    while no statement of its transaction has run yet, and a save's lease heartbeat retries
    through it: a server restart is an outage to wait out, not a reason to fail.
    """


class CatalogDialect(ABC):
    """What one database needs so that the save and GC protocols hold on it
    (docs/architecture/safety-rules.md, "Safety rules": the catalog serialises writers).

    A database is supported with all of it or not at all: an engine whose ``begin`` event
    takes the one write lock for writers (``WRITE_OPTION``) and whose ``handle_error`` event
    turns the driver's errors into `CatalogError`s (`translate_error`), and the answers the
    generic code asks of it (read-only detection, bulk inserts, the write lock's pinning).
    """

    name: ClassVar[str]
    """The backend name in URLs (``sqlite``, ``postgresql``)."""
    write_lock: ClassVar[str]
    """How its writers take turns, for the message that refuses other databases."""

    @abstractmethod
    def make_engine(self, url: URL, busy_timeout_ms: int, *, read_only: bool) -> Engine:
        """The catalog's engine: writers serialised at ``begin``, errors translated; a
        reader's engine (``read_only``) writes nothing at all (docs/architecture/shared-pools.md,
        "Shared pools")."""

    @abstractmethod
    def translate_error(
        self, exc: BaseException, where: str, busy_timeout_ms: int, *, read_only: bool = False
    ) -> ArchiveError | None:
        """The `CatalogError` a raw driver error stands for, or None to let it through."""

    def catalog_file(self, url: URL) -> Path | None:
        """The local file the catalog lives in (checked to be on a local filesystem), or
        None for a server."""
        return None

    def unwritable_reason(self, url: URL) -> str | None:
        """Why this process cannot write the catalog, as far as is known before an engine
        exists (None: it can, or only the server can tell)."""
        return None

    def server_unwritable_reason(self, engine: Engine) -> str | None:
        """Why a writer's ``engine`` may not write the catalog, as its server answers (None:
        it may, or the catalog does not exist yet and this open creates it)."""
        return None

    def pin_write_lock(self, conn: Connection) -> None:
        """Keep this write transaction's lock until it ends, however long the process stops
        (see `catalog.engine.pin_write_lock`)."""
        return None

    def check_read_unchanged(self, conn: Connection) -> None:
        """At the end of a reader's read transaction: raise `CatalogError` if what it read
        cannot be trusted (see `catalog.engine.check_read_unchanged`)."""
        return None

    def bulk_insert(
        self,
        conn: Connection,
        table: Table,
        columns: Sequence[str],
        rows: Iterator[Sequence[Any]],
        batch_size: int,
    ) -> int:
        """Insert ``rows`` (checked by `catalog.bulk.insert_rows`); return how many.

        Core ``INSERT``s in batches: correct on every database, which a dialect overrides
        with its driver's fast path."""
        total = 0
        statement = insert(table)
        while batch := list(islice(rows, batch_size)):
            conn.execute(statement, [dict(zip(columns, row, strict=True)) for row in batch])
            total += len(batch)
        return total


_engines: weakref.WeakSet[Engine] = weakref.WeakSet()
_fork_hook_lock = threading.Lock()
_fork_hook_installed = False


def _dispose_after_fork() -> None:
    # A forked child must never touch its parent's pooled connections (a SQLite handle or a
    # server socket shared by two processes corrupts state); close=False leaves them to the
    # parent.
    for engine in list(_engines):
        engine.dispose(close=False)


def track_for_fork(engine: Engine) -> None:
    """Have a forked child drop ``engine``'s pooled connections (they are its parent's)."""
    global _fork_hook_installed
    with _fork_hook_lock:
        if not _fork_hook_installed and hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=_dispose_after_fork)
            _fork_hook_installed = True
        _engines.add(engine)
