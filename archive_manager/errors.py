"""The exception tree of archive_manager: every error the library raises on purpose.

Each subclass also inherits the builtin that fits it, so callers that already catch
``LookupError`` or ``ValueError`` keep working.
"""

from __future__ import annotations

__all__ = [
    "ArchiveError",
    "ArchiveExistsError",
    "ArchiveNotFoundError",
    "ArchiveReleasedError",
    "ArchiveRetainedError",
    "BlobCorruptError",
    "BlobDigestMismatchError",
    "BlobNotFoundError",
    "BlobStoreError",
    "BlobStoreTimeoutError",
    "CatalogError",
    "CatalogLockedError",
    "CatalogVersionError",
    "ForeignCatalogError",
    "GcAbortedError",
    "IntegrityError",
    "InvalidInputError",
    "InvalidNameError",
    "JournalDamagedError",
    "LeaseExpiredError",
    "MetadataError",
    "MissingDependencyError",
    "NativeFallbackWarning",
    "OutputWriteError",
    "PoolIdentityError",
    "PoolLayoutError",
    "PoolNotFoundError",
    "PoolRootMissingError",
    "ReadOnlyPoolError",
    "SaveInFlightError",
    "SearchTimeoutError",
    "TransientBlobStoreError",
    "UnencodableError",
    "UnsupportedFilesystemError",
    "UnsupportedFormatError",
    "UnsupportedVersionError",
]


class ArchiveError(Exception):
    """Base class of every error raised by archive_manager."""


class ArchiveExistsError(ArchiveError, FileExistsError):
    """An archive with this name already exists in the pool."""


class SaveInFlightError(ArchiveExistsError):
    """The name is held by a pending save that may be alive: in flight, or crashed where this
    process cannot prove it dead (docs/architecture/save-protocol.md, "Save protocol", Resuming a
    killed save).  The message names the lease, its holder and when the lease lapses.

    Attributes:
        name: the archive name.
        lease: the pending save's lease (``lease:<hex>``).
        holder: the process that recorded itself in the lease (host, pid, ...), or None for
            a lease of an older version.
        holder_status: ``"alive"`` or ``"unknown"`` (a dead holder's save is rolled back, so
            it never raises this).
        expires_at: when the lease lapses unless renewed (seconds since the epoch).
    """

    def __init__(
        self,
        message: str,
        *,
        name: str = "",
        lease: str = "",
        holder: dict[str, object] | None = None,
        holder_status: str = "unknown",
        expires_at: float = 0.0,
    ) -> None:
        # NOTE: keywords with defaults: an exception is unpickled as ``cls(*args)`` and its
        # attributes restored after (a failure carried from another process).
        super().__init__(message)
        self.name = name
        self.lease = lease
        self.holder = holder
        self.holder_status = holder_status
        self.expires_at = expires_at


class ArchiveRetainedError(ArchiveExistsError):
    """A save of a name asked to supersede the archive the name points at (or would reuse a
    released name) while owners still retain that archive (its own owner, while it is
    published): the message names them (docs/architecture/save-protocol.md, "Superseding a name").

    Attributes:
        name: the archive name.
        owners: the owners that retain the archive, sorted.
    """

    def __init__(self, message: str, *, name: str = "", owners: list[str] | None = None) -> None:
        # NOTE: keywords with defaults, as `SaveInFlightError`'s (unpickling).
        super().__init__(message)
        self.name = name
        self.owners = list(owners or [])


class ArchiveNotFoundError(ArchiveError, LookupError):
    """No visible archive has this name (absent, pending or rolled back)."""


class ArchiveReleasedError(ArchiveError):
    """The archive was released and garbage collection reclaimed its payload."""


class PoolNotFoundError(ArchiveError, FileNotFoundError):
    """No pool exists at this root (and creating one was not asked for)."""


class BlobStoreError(ArchiveError, OSError):
    """The blob store could not do what was asked (docs/architecture/blob-store-contract.md, "Blob
    store contract").

    Stores that do not sit on the OS (an object store) raise it, or a subclass, where the
    filesystem store lets the OS's own `OSError` through; both are `OSError`, which is what
    GC's and verify's fail-closed handling catch."""


class TransientBlobStoreError(BlobStoreError):
    """A blob store failure that the same call may not meet again (a timeout, throttling, a
    dropped connection); nothing was changed by the failed call."""


class BlobStoreTimeoutError(TransientBlobStoreError):
    """The blob store did not answer within the deadline of the call (an object store that
    accepts connections and stops answering); the message names the endpoint and the
    deadline, and how to set another."""


class PoolLayoutError(BlobStoreError):
    """A folder of the pool (``blobs/``, ``tmp/``, a fan-out folder) is a symlink, which the pool
    refuses to read, write, list or unlink through: it may lead out of the pool."""


class OutputWriteError(ArchiveError, OSError):
    """A file outside the pool (an export, a figure) could not be written where it was asked
    for: the disk is full, a quota or file size limit was reached, the filesystem is
    read-only, permission was denied, the device failed.  ``errno`` and ``filename`` are
    the OS's and the target's; the message says what to do.  The target is as it was before
    and no temp file is left."""

    def __init__(self, message: str, code: int | None = None, filename: str | None = None):
        super().__init__(message)
        self.errno = code
        self.filename = filename

    def __str__(self) -> str:
        return str(self.args[0])


class ReadOnlyPoolError(ArchiveError, PermissionError):
    """The pool is open read-only here (asked for, or this process cannot write it): a save,
    release, retain, GC or rebuild is refused before it changes anything."""


class IntegrityError(ArchiveError):
    """Stored bytes are missing, truncated or do not match their digest."""


class BlobNotFoundError(IntegrityError, FileNotFoundError):
    """A blob that should exist is not in the blob store."""


class BlobCorruptError(IntegrityError):
    """A stored blob does not hash to its digest, has another size than the data put again
    under that digest, or is no blob at all (a FIFO or a symlink in its place)."""


class BlobDigestMismatchError(BlobCorruptError):
    """A verified read found a blob's bytes not hashing to its digest: damage, or on a shared
    filesystem an old copy a stale cache still shows, which `blobs.retry.RetryingReads`
    reads again before it raises this."""


class JournalDamagedError(IntegrityError):
    """A retention journal file whose bytes do not match its name, that does not parse, or
    that belongs to another pool; it is never applied."""


class UnsupportedFormatError(ArchiveError, ValueError):
    """Bytes, a pointer file or a pool use a format or version this library cannot read."""


class MetadataError(ArchiveError, ValueError):
    """Sample metadata does not fit the training run's settings, or disagrees with the catalog."""


class InvalidNameError(ArchiveError, ValueError):
    """A name, owner or digest is malformed or would escape the pool."""


class InvalidInputError(ArchiveError, ValueError):
    """An argument is malformed: wrong length, wrong type, contradictory options."""


class SearchTimeoutError(InvalidInputError, TimeoutError):
    """A search ran past its time limit (a regular expression that backtracks without end)."""


class UnencodableError(ArchiveError, TypeError):
    """A sample holds a value the codec cannot store losslessly and safely."""


class LeaseExpiredError(ArchiveError):
    """A save's lease lapsed before it could commit, so it refuses to publish."""


class CatalogError(ArchiveError):
    """The catalog cannot be opened or used as asked."""


class CatalogVersionError(CatalogError):
    """The catalog was written by a newer library, or has an unknown revision."""


class CatalogLockedError(CatalogError, TimeoutError):
    """The catalog stayed locked by another process for longer than the busy timeout."""


class PoolIdentityError(CatalogError):
    """The catalog and the blob root are not one pool's (another catalog, a copy, a lost catalog)."""


class PoolRootMissingError(PoolIdentityError, OSError):
    """The pool is not at its blob root any more, or not yet: the root was moved, deleted or
    unmounted since it was opened, or it is an empty folder (a mount point whose mount
    failed) where the catalog records a pool.  Refused before anything was written there
    (docs/architecture/pool-identity.md, "Pool identity"); an `OSError` too, so that a blob store
    may raise it where its contract says failures of the medium are `OSError`."""


class ForeignCatalogError(CatalogError):
    """A pointer file names a catalog the caller did not configure, or a file that is no
    catalog; it was neither connected to nor opened."""


class UnsupportedFilesystemError(CatalogError):
    """A SQLite catalog was asked to live on a network filesystem whose locking is unsafe."""


class MissingDependencyError(ArchiveError, ImportError):
    """An optional feature needs a package that is not installed (the message names the extra)."""


def extra_hint(extra: str) -> str:
    """How to install one of this project's extras, for a `MissingDependencyError`'s message.

    The distribution (``rollout-archive-manager``) is not on PyPI: a bare ``pip install
    'rollout-archive-manager[X]'`` fails on a fresh machine, and would install whoever
    registers the name.  So the hint names the checkout's install first, and the
    distribution's only where it is already installed (pip then adds the extra to it).
    """
    return (
        f"install the '{extra}' extra: pip install -e '.[{extra}]' in a checkout of "
        f"archive_manager (or pip install 'rollout-archive-manager[{extra}]' where that "
        "distribution is installed)"
    )


class UnsupportedVersionError(MissingDependencyError):
    """An integration's framework is installed at a version it was not written against (the
    message names the installed version and the supported ones): the integration reads the
    framework's own batches, whose layout changes between releases, so it refuses to guess."""


class GcAbortedError(ArchiveError):
    """Garbage collection stopped before deleting anything because a check failed."""


class NativeFallbackWarning(RuntimeWarning):
    """The codec's C extension could not be imported: numeric lists are converted in Python.

    Warned once, at import; the bytes written are the same, only slower
    (docs/architecture/samples-and-values.md, "Native list conversion").
    """


class UnregisteredClassWarning(UserWarning):
    """A load met values of a class the loading process has not registered: they come back as
    plain dicts (enum members as their values); `register_sample_class` brings the class back."""
