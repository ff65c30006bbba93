"""Blob stores: content-addressed, immutable blobs behind one interface
(docs/architecture/blob-store-contract.md, "Blob store contract").

* `AbstractBlobStore` (`base`): the interface and its error contract, with `Capabilities`,
  `BlobStat` and `IncompleteWrite`;
* `layout`: the one mapping from a digest to its location, ``ab/cd/abcd…``;
* `LocalBlobStore` (`local`, also named `BlobStore`): files on a POSIX filesystem under the
  pool root, written durably; a pool on a folder uses it as `local_pool_store` makes it,
  with its reads retried;
* `MemoryBlobStore` (`memory`): a dict, for tests;
* `ReadOnlyView` (`readonly`): any store with every write refused, as a pool opened read-only
  sees it (`AbstractBlobStore.read_only_view`);
* `RetryingReads` (`retry`): any store with its reads tried again past a shared filesystem's
  stale caches.

The contract suite every store passes, and a fault-injecting wrapper, are in
`archive_manager.testing`.
"""

from __future__ import annotations

from .base import AbstractBlobStore, BlobStat, Capabilities, IncompleteWrite, PutItem
from .layout import blob_key
from .local import BlobStore, LocalBlobStore, local_pool_store
from .memory import MemoryBlobStore
from .readonly import ReadOnlyView
from .retry import RetryingReads

__all__ = [
    "AbstractBlobStore",
    "BlobStat",
    "BlobStore",
    "Capabilities",
    "IncompleteWrite",
    "LocalBlobStore",
    "MemoryBlobStore",
    "PutItem",
    "ReadOnlyView",
    "RetryingReads",
    "blob_key",
    "local_pool_store",
]
