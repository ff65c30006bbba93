"""Shell completion of archive names (``archive-manager show <TAB>``).

Click asks a parameter's ``shell_complete`` while it parses a partial command line in
resilient mode: the group's callback does not run, so the pool is found from the root
context's parsed ``--root`` / ``--catalog-url`` (flag, environment or default), as the verb
itself would find it.  Completion reads the catalog only, through a read-only open: it
creates, migrates and writes nothing, and never imports torch (docs/architecture.md, Layers).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
from click.shell_completion import CompletionItem

__all__ = ["complete_archive_name"]


def _pool_location(ctx: click.Context) -> tuple[Path, str | None] | None:
    params = ctx.find_root().params
    root = params.get("root")
    if not isinstance(root, (str, Path)):
        return None
    url = params.get("catalog_url")
    return Path(root), url if isinstance(url, str) and url else None


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
    # NOTE: imported here: the library pulls in the catalog's dependencies, which `--help`
    # and the completion of verbs and options do not need.
    from ..manager import ArchiveManager

    root, url = location
    try:
        if not ArchiveManager.exists(root, url):
            return []
        with ArchiveManager.open(root, url, read_only=True) as pool:
            found = pool.find(state=None)
    except Exception:
        return []
    items: dict[str, Any] = {}
    for info in found:
        if info.name.startswith(incomplete) and info.name not in items:
            shown = info.state if info.rollout_id is None else f"rollout {info.rollout_id}"
            items[info.name] = f"{shown}, {info.state}" if shown != info.state else shown
    return [CompletionItem(name, help=help_text) for name, help_text in sorted(items.items())]
