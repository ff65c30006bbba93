"""`ReadOnlyBlobStore`: the blob store of a pool opened read-only (docs/architecture.md,
Shared pools).

It reads, verifies and lists as `BlobStore` does and refuses every write (put, delete, temp
file removal) with `ReadOnlyPoolError` before touching anything: the second gate after
`Catalog.write`, for a write path that would reach the files first.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from typing import NoReturn

from ._digest import Buffer
from .blobs import BlobStore
from .blobs.base import IncompleteWrite
from .errors import ReadOnlyPoolError

__all__ = ["ReadOnlyBlobStore"]


class ReadOnlyBlobStore(BlobStore):
    """A `BlobStore` that only reads; ``reason`` says why (for the error)."""

    def __init__(
        self, root: str | os.PathLike[str], reason: str, *, read_retry: float | None = None
    ) -> None:
        super().__init__(root, read_retry=read_retry)
        self.reason = reason

    def _refuse(self, what: str) -> NoReturn:
        raise ReadOnlyPoolError(
            f"the pool at {self.root} is read-only here ({self.reason}): refusing to {what}; "
            "nothing was changed"
        )

    def put(self, data: Buffer | Sequence[Buffer], digest: str | None = None) -> str:
        """Refused: `ReadOnlyPoolError`."""
        self._refuse("write a blob")

    def put_many(
        self, items: Sequence[tuple[Buffer | Sequence[Buffer], str | None]], *, workers: int = 4
    ) -> list[str]:
        """Refused: `ReadOnlyPoolError`."""
        self._refuse("write blobs")

    def delete(self, digest: str) -> bool:
        """Refused: `ReadOnlyPoolError`."""
        self._refuse("delete a blob")

    def remove_temp(self, path: str | os.PathLike[str]) -> bool:
        """Refused: `ReadOnlyPoolError`."""
        self._refuse("remove a temp file")

    def delete_many(self, digests: Iterable[str]) -> int:
        """Refused: `ReadOnlyPoolError`."""
        self._refuse("delete blobs")

    def remove_incomplete(self, write: IncompleteWrite) -> bool:
        """Refused: `ReadOnlyPoolError`."""
        self._refuse("remove an incomplete write")

    def sweep_incomplete(self, older_than: float) -> int:
        """Refused: `ReadOnlyPoolError`."""
        self._refuse("sweep incomplete writes")
