"""Shell completion of archive names (``archive-manager show <TAB>``).

Click asks a parameter's ``shell_complete`` while it parses a partial command line in
resilient mode: the group's callback does not run, so the pool is found from the root
context's parsed ``--root`` / ``--catalog-url`` (flag, environment or default), as the verb
itself would find it.  Completion reads the catalog only, through a read-only open: it
creates, migrates and writes nothing, and never imports torch (docs/architecture/index.md,
"Layers").

A SQLite catalog is read with the standard library's ``sqlite3``, opened as the library's
readers open it (`sqlite_read_mode`: nothing created or written, not even -wal/-shm), without
SQLAlchemy or the library: a completion is a hint the user waits for at each TAB, and the
library's import costs more than the whole answer (docs/architecture/start-up.md, "Start-up").  Any
other catalog, or a SQLite file that cannot be read that way, goes through a read-only open.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import click
from click.shell_completion import CompletionItem

from .._util.constants import CATALOG_FILE
from .._util.sqlite_read import reader_uri, sqlite_read_mode
from ..errors import ArchiveError

__all__ = ["complete_archive_name"]


def _pool_location(ctx: click.Context) -> tuple[Path, str | None] | None:
    params = ctx.find_root().params
    root = params.get("root")
    if not isinstance(root, (str, Path)):
        return None
    url = params.get("catalog_url")
    return Path(root), url if isinstance(url, str) and url else None


def _sqlite_file(root: Path, url: str | None) -> Path | None:
    """The SQLite catalog file of the pool, or None when the catalog is not a plain file."""
    if url is None:
        return root.expanduser() / CATALOG_FILE
    # sqlite:///relative or sqlite:////absolute; a URL with options takes the library's path.
    if url.startswith("sqlite:///") and "?" not in url:
        return Path(url.removeprefix("sqlite:///")).expanduser()
    return None


def _names_from_sqlite(file: Path) -> list[tuple[str, int | None, str]] | None:
    """Every archive's (name, rollout id, state) but pending saves', read as the library's
    readers read (`sqlite_read_mode`); None when the file cannot be read so (the library then
    decides: it knows WAL recovery and damaged files)."""
    if not file.is_file():
        return []  # no catalog: no pool here, nothing to offer
    try:
        # NOTE: not a plain mode=ro open: on a WAL file without -wal/-shm that creates both,
        # and beside a dead writer's it rebuilds the wal-index in -shm
        # (docs/architecture/shared-pools.md, "Shared pools").
        conn = sqlite3.connect(reader_uri(file, sqlite_read_mode(file)), uri=True, timeout=0.5)
    except (sqlite3.Error, ArchiveError):
        return None
    try:
        # A pending row is a save in progress or one that died before publishing: no verb
        # can open it by that name.
        rows = conn.execute(
            "SELECT name, rollout_id, state FROM archives WHERE state IN ('published', 'released')"
        ).fetchall()
    except sqlite3.Error:
        return None
    finally:
        conn.close()
    return [(str(name), rollout_id, str(state)) for name, rollout_id, state in rows]


def _names_from_library(root: Path, url: str | None) -> list[tuple[str, int | None, str]]:
    # NOTE: imported here: the library pulls in the catalog's dependencies, which `--help`
    # and the completion of verbs and options do not need.
    from ..manager import ArchiveManager

    if not ArchiveManager.exists(root, url):
        return []
    with ArchiveManager.open(root, url, read_only=True) as pool:
        return [
            (i.name, i.rollout_id, i.state)
            for state in ("published", "released")
            for i in pool.find(state=state)
        ]


def complete_archive_name(
    ctx: click.Context, param: click.Parameter, incomplete: str
) -> list[CompletionItem]:
    """The names of the pool's archives that start with ``incomplete``, by name.

    Anything that goes wrong (no pool, a catalog that cannot be read) completes nothing: a
    completion must never print an error into the user's command line.
    """
    location = _pool_location(ctx)
    if location is None:
        return []
    root, url = location
    try:
        file = _sqlite_file(root, url)
        found = _names_from_sqlite(file) if file is not None else None
        if found is None:
            found = _names_from_library(root, url)
    except Exception:
        return []
    items: dict[str, Any] = {}
    for name, rollout_id, state in found:
        if name.startswith(incomplete) and name not in items:
            shown = state if rollout_id is None else f"rollout {rollout_id}"
            items[name] = f"{shown}, {state}" if shown != state else shown
    return [CompletionItem(name, help=help_text) for name, help_text in sorted(items.items())]
