"""Values the CLI and the facade's signatures need before the library's modules are imported: they live here, below everything,
so that parsing a command line (``--help``, a TAB completion) imports no SQLAlchemy
(docs/architecture.md, Start-up)."""

from __future__ import annotations

from pathlib import Path

__all__ = [
    "CATALOG_FILE",
    "CATALOG_URL_ENV",
    "DEFAULT_INLINE_LIMIT",
    "DEFAULT_SEARCH_TIMEOUT",
    "MAX_SEARCH_LIMIT",
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

CATALOG_FILE = "catalog.db"
"""The SQLite catalog's file name in the pool root, unless a catalog URL is given."""


def default_catalog_url(root: Path) -> str:
    """The catalog of a one-machine pool: SQLite in the pool root."""
    return f"sqlite:///{root / CATALOG_FILE}"
