"""Values the CLI and the facade's signatures need before the library's modules are imported: they live here, below everything,
so that parsing a command line (``--help``, a TAB completion) imports no SQLAlchemy
(docs/architecture/start-up.md, "Start-up")."""

from __future__ import annotations

from pathlib import Path

__all__ = [
    "BUSY_TIMEOUT_ENV",
    "CATALOG_FILE",
    "CATALOG_FORMAT_VERSION",
    "CATALOG_URL_ENV",
    "DEFAULT_INLINE_LIMIT",
    "DEFAULT_SEARCH_TIMEOUT",
    "HEAD_REVISION",
    "JOURNAL_CHECKPOINT",
    "JOURNAL_POOL",
    "MAX_SEARCH_LIMIT",
    "SAVE_SEQ",
    "UNINDEXED_BLOBS",
    "VERSION_TABLE",
    "default_catalog_url",
]

CATALOG_URL_ENV = "ARCHIVE_MANAGER_CATALOG_URL"
"""The catalog URL the CLI, the compat facade and ``migrations/env.py`` read."""

DEFAULT_INLINE_LIMIT = 1 << 20
"""Tensors up to this many bytes are stored in their chunk; larger ones as tensor blobs."""

DEFAULT_SEARCH_TIMEOUT = 60.0
"""Default time limit of a search, in seconds."""

MAX_SEARCH_LIMIT = 10_000
"""Most matches one search returns (memory is bounded by it)."""

BUSY_TIMEOUT_ENV = "ARCHIVE_MANAGER_BUSY_TIMEOUT_MS"
"""How long a SQLite catalog's writer waits for another's lock, in ms (default 30 s)."""

CATALOG_FILE = "catalog.db"
"""The SQLite catalog's file name in the pool root, unless a catalog URL is given."""


def default_catalog_url(root: Path) -> str:
    """The catalog of a one-machine pool: SQLite in the pool root."""
    return f"sqlite:///{root / CATALOG_FILE}"


# --- facts of the catalog's schema that its readers check before reading (the SQLite
# listing, `pool/sqlite_listing.py`, reads them without SQLAlchemy; the catalog package re-exports
# them) ----------------------------------------------------------------------------------

HEAD_REVISION = "0012"
"""The newest revision in ``migrations/versions`` (``tests/test_startup.py`` checks it against
Alembic's own head).

NOTE: every open compares the catalog's revision with the head.  Asking Alembic for it
imports Alembic (with Mako and Pygments: about a fifth of the modules a CLI verb loaded) and
parses every migration script; an up-to-date catalog, the common case, needs neither
(docs/architecture/start-up.md, "Start-up").  Alembic is imported only to migrate or to
judge a revision other than this one."""

VERSION_TABLE = "archive_manager_version"
"""Alembic's version table; not ``alembic_version``, so a shared PostgreSQL database's own
Alembic history cannot collide with the catalog's."""

CATALOG_FORMAT_VERSION = 1
"""The pool format this library writes; a pool with a greater one is refused."""

SAVE_SEQ = "save_seq"
"""``pool_info``: the last number the pool's counter gave (saves and journal records)."""

UNINDEXED_BLOBS = "unindexed_blobs"
"""``pool_info`` key set when a catalog took over a blob root that already held blobs (a lost
or emptied catalog, ``recover=True``): GC refuses to run until `rebuild_catalog` has indexed
them, or it would delete every one of them as an orphan."""

JOURNAL_CHECKPOINT = "journal_checkpoint"
"""``pool_info``: ``<seq>-<digest>`` of the newest checkpoint this catalog's state includes."""

JOURNAL_POOL = "journal_pool"
"""``pool_info``: the pool id the catalog's checkpoint was written under."""
