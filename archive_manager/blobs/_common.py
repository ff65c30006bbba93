"""What every blob store does the same way: turn data into byte views, hash it, and word the
errors of the contract (docs/architecture/blob-store-contract.md, "Blob store contract")."""

from __future__ import annotations

from collections.abc import Sequence

import xxhash

from .._util.digest import Buffer, check_digest, digest_of
from ..errors import (
    BlobCorruptError,
    BlobDigestMismatchError,
    BlobNotFoundError,
    IntegrityError,
    ReadOnlyPoolError,
)

__all__ = ["check_size", "corrupt", "missing", "prepare", "verify", "views_of"]


def views_of(data: Buffer | Sequence[Buffer]) -> list[memoryview]:
    """Flat byte views of ``data`` (one buffer or a sequence of parts), never a copy."""
    parts = [data] if isinstance(data, (bytes, bytearray, memoryview)) else list(data)
    views = []
    for part in parts:
        view = memoryview(part)
        if not view.c_contiguous:
            raise TypeError("blob parts must be C-contiguous buffers")
        views.append(view if view.format == "B" and view.ndim == 1 else view.cast("B"))
    return views


def prepare(data: Buffer | Sequence[Buffer], digest: str | None) -> tuple[list[memoryview], str]:
    """Views of ``data`` and its digest; IntegrityError if it differs from ``digest``."""
    if digest is not None:
        check_digest(digest)
    views = views_of(data)
    # NOTE: hashed even when the digest is given, so a wrong digest can never pass as a
    # duplicate of an existing blob; at ~20 GB/s this costs far less than the write.
    actual = digest_of(views)
    if digest is not None and digest != actual:
        raise IntegrityError(f"blob data hashes to {actual}, not to the given digest {digest}")
    return views, actual


def check_size(digest: str, stored: int, views: list[memoryview]) -> None:
    """BlobCorruptError unless the stored blob's size is the data's (a put that dedups)."""
    total = sum(view.nbytes for view in views)
    if stored != total:
        raise BlobCorruptError(
            f"blob {digest} is corrupt or truncated: it holds {stored} bytes, the data {total}"
        )


def verify(digest: str, data: Buffer) -> None:
    """BlobCorruptError unless ``data`` hashes to ``digest``."""
    actual = xxhash.xxh3_128_hexdigest(data)
    if actual != digest:
        raise corrupt(digest, memoryview(data).nbytes, actual)


def corrupt(digest: str, size: int, actual: str) -> BlobDigestMismatchError:
    """The error for a blob whose ``size`` stored bytes hash to ``actual``."""
    return BlobDigestMismatchError(
        f"blob {digest} is corrupt or truncated: its {size} bytes hash to {actual}"
    )


def missing(digest: str) -> BlobNotFoundError:
    """The error for a blob the store does not hold."""
    return BlobNotFoundError(f"blob {digest} is missing")


def read_only_refusal(where: object, reason: str, what: str) -> ReadOnlyPoolError:
    """The error of a read-only pool's store refusing ``what`` (one wording for every store's
    read-only view and an object store's read-only root; docs/architecture/shared-pools.md,
    "Shared pools")."""
    return ReadOnlyPoolError(
        f"the pool at {where} is read-only here ({reason}): refusing to {what}; nothing was changed"
    )
