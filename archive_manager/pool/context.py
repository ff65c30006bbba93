"""`PoolContext`: what the protocols below `manager.py` need of an open pool.

The facade (`ArchiveManager`) builds one when a pool is opened and hands it down; GC, verify,
the writer, the read side, recovery and the catalog-only questions take it instead of the
facade, so no module below `manager.py` imports it (docs/architecture/index.md, "Layers").  The
attribute names are the facade's own, so ``pool.store`` reads the same either side.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from ..blobs import AbstractBlobStore
from ..blobs.base import ObjectRoot
from ..catalog import Catalog
from .identity import PoolIdentity, check_identity
from .journal import Journal

__all__ = ["HasContext", "PoolContext", "context_of"]


@dataclass(frozen=True, eq=False)
class PoolContext:
    """One open pool's parts and settings.

    Frozen, but it holds the pool's live objects, not copies: a change made to ``store`` or
    ``catalog`` (a test replacing a store method, a closed catalog) is seen by every holder.
    Compared by identity, as the pool it belongs to is (two opens are two pools).
    """

    root: Path | ObjectRoot  # a folder, or a pool on an object store (blobs/s3.py)
    catalog: Catalog
    store: AbstractBlobStore
    journal: Journal
    clock: Callable[[], float]
    lease_ttl: float
    chunk_size: int
    inline_limit: int
    identity: PoolIdentity | None = None

    @property
    def catalog_url(self) -> str:
        """The catalog's SQLAlchemy URL."""
        return self.catalog.url

    def check_in_place(self, what: str) -> None:
        """Refuse ``what`` unless the root still holds the pool opened (`check_identity`):
        called before a write that would go astray if the pool moved, vanished or was
        re-bound since (a save's first blob and its publication, a retention decision,
        GC's deletions)."""
        check_identity(self.root, self.identity, what=what)

    def journal_floor(self) -> int:
        """Before a decision's transaction (a listing may be a request): the number the
        decision's must exceed, the journal's newest verified one (`Journal.high_water`)."""
        return self.journal.high_water(self.identity.pool_id if self.identity else None)


class HasContext(Protocol):
    """An open pool as its users hold it (`ArchiveManager`): public constructors such as
    `ArchiveWriter(pool, ...)` keep taking it, and read its context."""

    @property
    def context(self) -> PoolContext: ...


def context_of(pool: PoolContext | HasContext) -> PoolContext:
    """The context of ``pool``, given either the context itself or the pool that holds it."""
    return pool if isinstance(pool, PoolContext) else pool.context
