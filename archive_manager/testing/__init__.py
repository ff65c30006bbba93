"""Test support shipped with the package, for archive_manager's own tests and for anyone who
writes a blob store (docs/architecture/blob-store-contract.md, "Blob store contract"):

* `FaultyBlobStore` (`faults`): wraps any store and fails chosen calls, or damages reads;
* `archive_manager.testing.blob_store.BlobStoreContract`: the tests every store must pass; a
  test module subclasses it and gives it a ``store`` fixture (it needs pytest and
  hypothesis, so it is not imported here).
"""

from __future__ import annotations

from .faults import OPERATIONS, Fault, FaultyBlobStore

__all__ = ["OPERATIONS", "Fault", "FaultyBlobStore"]
