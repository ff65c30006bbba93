"""The catalog schema: the single source of truth that Alembic revisions are checked against.

Timestamps are UTC epoch seconds (``Float``); the API layer converts them. Core ``Table``
objects are exported next to the mapped classes because the hot paths (bulk inserts of
entries, the GC reachability query) use Core, not ORM sessions.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    CheckConstraint,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

__all__ = [
    "ARCHIVE_STATES",
    "BLOB_KINDS",
    "BLOB_STATES",
    "FORMAT_VERSION",
    "NAMING_CONVENTION",
    "STATUS_LENGTH",
    "Archive",
    "ArchiveBlob",
    "ArchiveSketch",
    "ArchiveSummaryRow",
    "Base",
    "Blob",
    "Chunk",
    "Entry",
    "JournalRecord",
    "Lease",
    "LeaseBlob",
    "PoolInfo",
    "Retention",
    "SampleMetadata",
    "archive_blobs_table",
    "archive_sketches_table",
    "archive_summaries_table",
    "archives_table",
    "blobs_table",
    "chunks_table",
    "entries_table",
    "journal_table",
    "lease_blobs_table",
    "leases_table",
    "pool_info_table",
    "retention_table",
    "sample_metadata_table",
]

FORMAT_VERSION = 1
"""The pool format this library writes; a pool with a greater one is refused."""

BLOB_KINDS = ("chunk", "tensor", "manifest")
BLOB_STATES = ("writing", "live", "deleting")
ARCHIVE_STATES = ("pending", "published", "released")
STATUS_LENGTH = 16
"""Characters of ``sample_metadata.status`` (slime's statuses are 6 to 9)."""

# NOTE: stable constraint names are what lets Alembic batch mode (SQLite "move and copy")
# find and recreate constraints, and what keeps autogenerate diffs empty across backends.
NAMING_CONVENTION: dict[str, str] = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

_DIGEST = String(32)
# NOTE: an archive owner is "archive:" + a name of up to 255 characters (revision 0003).
_OWNER = String(512)
_LEASE = String(128)
_NAME = String(255)


def _one_of(column: str, values: tuple[str, ...]) -> str:
    quoted = ", ".join(f"'{v}'" for v in values)
    return f"{column} IN ({quoted})"


class Base(DeclarativeBase):
    """Declarative base whose metadata carries the naming convention."""

    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class PoolInfo(Base):
    """Key/value facts about the pool: ``format_version``, ``blob_root``, ``created_at``."""

    __tablename__ = "pool_info"

    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[str | None] = mapped_column(Text)


class Blob(Base):
    """One content-addressed blob and its life-cycle state."""

    __tablename__ = "blobs"
    __table_args__ = (
        CheckConstraint(_one_of("kind", BLOB_KINDS), name="kind"),
        CheckConstraint(_one_of("state", BLOB_STATES), name="state"),
        # GC plan: "deleting" rows and unretained "live" rows older than the grace period.
        Index(None, "state", "created_at"),
    )

    digest: Mapped[str] = mapped_column(_DIGEST, primary_key=True)
    size: Mapped[int] = mapped_column(BigInteger, nullable=False)
    kind: Mapped[str] = mapped_column(String(16), nullable=False)
    state: Mapped[str] = mapped_column(String(16), nullable=False)
    created_at: Mapped[float] = mapped_column(Float, nullable=False)
    verified_at: Mapped[float | None] = mapped_column(Float)


class Archive(Base):
    """One named archive; its rows stay after release for inspection."""

    __tablename__ = "archives"
    __table_args__ = (
        CheckConstraint(_one_of("state", ARCHIVE_STATES), name="state"),
        Index(None, "rollout_id"),
        # Listings and the sample-query walk page through (state, rollout id, name) in order
        # (docs/architecture.md, "Summaries and paging"); it replaces (state, rollout_id).
        Index(None, "state", "rollout_id", "name"),
        # Ids appear in logs and reports; never hand a deleted archive's id to a new one.
        {"sqlite_autoincrement": True},
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(_NAME, nullable=False, unique=True)
    rollout_id: Mapped[int | None] = mapped_column(BigInteger)
    evaluation: Mapped[bool] = mapped_column(Boolean, nullable=False)
    state: Mapped[str] = mapped_column(String(16), nullable=False)
    manifest_digest: Mapped[str | None] = mapped_column(_DIGEST)
    samples: Mapped[int] = mapped_column(Integer, nullable=False)
    bytes: Mapped[int] = mapped_column(BigInteger, nullable=False)
    created_at: Mapped[float] = mapped_column(Float, nullable=False)
    published_at: Mapped[float | None] = mapped_column(Float)
    released_at: Mapped[float | None] = mapped_column(Float)
    attrs: Mapped[Any | None] = mapped_column(JSON)
    reference_name: Mapped[str | None] = mapped_column(_NAME)
    lease_owner: Mapped[str | None] = mapped_column(_LEASE)


def _archive_fk() -> Any:
    return mapped_column(Integer, ForeignKey("archives.id", ondelete="CASCADE"), primary_key=True)


class Chunk(Base):
    """One chunk blob of an archive; no FK to ``blobs``, whose rows GC deletes."""

    __tablename__ = "chunks"
    __table_args__ = (Index(None, "digest"),)

    archive_id: Mapped[int] = _archive_fk()
    ordinal: Mapped[int] = mapped_column(Integer, primary_key=True)
    digest: Mapped[str] = mapped_column(_DIGEST, nullable=False)
    samples: Mapped[int] = mapped_column(Integer, nullable=False)
    size: Mapped[int] = mapped_column(BigInteger, nullable=False)


class Entry(Base):
    """One sample's place in an archive: keys, chunk ordinal and offset in the chunk."""

    __tablename__ = "entries"
    __table_args__ = (
        # Lookups across archives ("every archive holding task t") and within one.
        Index(None, "task_key", "archive_id"),
        Index(None, "sample_key", "archive_id"),
        # Stored in primary-key order: no hidden rowid beside (archive_id, position), nor an
        # automatic index repeating it (revision 0006; docs/architecture.md, "Summaries and
        # paging").  PostgreSQL ignores the option.
        {"sqlite_with_rowid": False},
    )

    archive_id: Mapped[int] = _archive_fk()
    position: Mapped[int] = mapped_column(Integer, primary_key=True)
    sample_key: Mapped[str] = mapped_column(_NAME, nullable=False)
    task_key: Mapped[str | None] = mapped_column(_NAME)
    chunk_ordinal: Mapped[int] = mapped_column(Integer, nullable=False)
    offset: Mapped[int] = mapped_column(Integer, nullable=False)


class SampleMetadata(Base):
    """Per-sample metadata (``describe_sample``), queryable without reading a blob."""

    __tablename__ = "sample_metadata"
    __table_args__ = (
        Index(None, "status"),
        Index(None, "reward"),
        Index(None, "response_length"),
        # As ``entries`` (revision 0006).
        {"sqlite_with_rowid": False},
    )

    archive_id: Mapped[int] = _archive_fk()
    position: Mapped[int] = mapped_column(Integer, primary_key=True)
    # The status column is an index for queries; longer statuses stay in the description only.
    status: Mapped[str | None] = mapped_column(String(STATUS_LENGTH))
    reward: Mapped[float | None] = mapped_column(Float)
    response_length: Mapped[int | None] = mapped_column(Integer)
    description: Mapped[Any] = mapped_column(JSON, nullable=False)


class ArchiveSummaryRow(Base):
    """What the statistics need of one archive's samples, computed once when its rows are
    written (``archive_manager/summary.py``; docs/architecture.md, "Summaries and paging")."""

    __tablename__ = "archive_summaries"

    archive_id: Mapped[int] = _archive_fk()
    samples: Mapped[int] = mapped_column(Integer, nullable=False)
    # {status: samples}; statuses the catalog does not index count under "none".
    status: Mapped[Any] = mapped_column(JSON, nullable=False)
    rewarded: Mapped[int] = mapped_column(Integer, nullable=False)
    reward_mean: Mapped[float | None] = mapped_column(Float)
    reward_min: Mapped[float | None] = mapped_column(Float)
    reward_max: Mapped[float | None] = mapped_column(Float)
    reward_p50: Mapped[float | None] = mapped_column(Float)
    reward_p90: Mapped[float | None] = mapped_column(Float)
    measured: Mapped[int] = mapped_column(Integer, nullable=False)
    length_mean: Mapped[float | None] = mapped_column(Float)
    length_min: Mapped[float | None] = mapped_column(Float)
    length_max: Mapped[float | None] = mapped_column(Float)
    length_p50: Mapped[float | None] = mapped_column(Float)
    length_p90: Mapped[float | None] = mapped_column(Float)
    groups: Mapped[int] = mapped_column(Integer, nullable=False)
    zero_variance_groups: Mapped[int] = mapped_column(Integer, nullable=False)
    group_stds: Mapped[int] = mapped_column(Integer, nullable=False)
    group_std_mean: Mapped[float | None] = mapped_column(Float)


class ArchiveSketch(Base):
    """The quantile sketches of one archive's rewards and response lengths, merged when
    several archives share a rollout id; apart from its summary, whose row they made ten
    times larger (revision 0007; docs/architecture.md, "Summaries and paging")."""

    __tablename__ = "archive_sketches"

    archive_id: Mapped[int] = _archive_fk()
    # Little-endian float64 values (summary.sketch_of).
    reward_sketch: Mapped[bytes] = mapped_column(LargeBinary, nullable=False)
    length_sketch: Mapped[bytes] = mapped_column(LargeBinary, nullable=False)


class ArchiveBlob(Base):
    """Every blob an archive needs: chunks, tensor blobs and its manifest."""

    __tablename__ = "archive_blobs"
    # (digest, archive_id) covers GC's "is this digest needed by a retained archive" probe
    # without touching the table.
    __table_args__ = (Index(None, "digest", "archive_id"),)

    archive_id: Mapped[int] = _archive_fk()
    digest: Mapped[str] = mapped_column(_DIGEST, primary_key=True)
    kind: Mapped[str] = mapped_column(String(16), nullable=False)


class Retention(Base):
    """An owner (``archive:<name>``, ``checkpoint:...``) retains every blob of an archive."""

    __tablename__ = "retention"
    __table_args__ = (Index(None, "archive_id"),)

    owner: Mapped[str] = mapped_column(_OWNER, primary_key=True)
    archive_id: Mapped[int] = _archive_fk()
    created_at: Mapped[float] = mapped_column(Float, nullable=False)


class Lease(Base):
    """A temporary owner (``lease:<uuid>``, ``gc:<uuid>``) held by a save or GC in flight."""

    __tablename__ = "leases"

    owner: Mapped[str] = mapped_column(_LEASE, primary_key=True)
    expires_at: Mapped[float] = mapped_column(Float, nullable=False)
    generation: Mapped[int] = mapped_column(Integer, nullable=False)
    created_at: Mapped[float] = mapped_column(Float, nullable=False)
    archive_name: Mapped[str | None] = mapped_column(_NAME)


class LeaseBlob(Base):
    """A blob digest retained by a lease; dropped with the lease."""

    __tablename__ = "lease_blobs"
    __table_args__ = (Index(None, "digest"),)

    lease: Mapped[str] = mapped_column(
        _LEASE, ForeignKey("leases.owner", ondelete="CASCADE"), primary_key=True
    )
    digest: Mapped[str] = mapped_column(_DIGEST, primary_key=True)


class JournalRecord(Base):
    """A retention record this catalog committed since its last journal checkpoint
    (docs/architecture.md, "Retention journal"): a record file on disk that is not here, and
    not older than the checkpoint, is one this catalog never saw (it is behind the pool)."""

    __tablename__ = "journal"

    seq: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    digest: Mapped[str] = mapped_column(_DIGEST, nullable=False)
    created_at: Mapped[float] = mapped_column(Float, nullable=False)
    # The record itself (a few hundred bytes): a file that could not be written, or not yet,
    # is written again from here, and a rebuild replays this catalog's own decisions exactly.
    data: Mapped[bytes] = mapped_column(LargeBinary, nullable=False)


pool_info_table: Table = PoolInfo.__table__  # type: ignore[assignment]
blobs_table: Table = Blob.__table__  # type: ignore[assignment]
archives_table: Table = Archive.__table__  # type: ignore[assignment]
chunks_table: Table = Chunk.__table__  # type: ignore[assignment]
entries_table: Table = Entry.__table__  # type: ignore[assignment]
sample_metadata_table: Table = SampleMetadata.__table__  # type: ignore[assignment]
archive_blobs_table: Table = ArchiveBlob.__table__  # type: ignore[assignment]
archive_summaries_table: Table = ArchiveSummaryRow.__table__  # type: ignore[assignment]
archive_sketches_table: Table = ArchiveSketch.__table__  # type: ignore[assignment]
retention_table: Table = Retention.__table__  # type: ignore[assignment]
leases_table: Table = Lease.__table__  # type: ignore[assignment]
lease_blobs_table: Table = LeaseBlob.__table__  # type: ignore[assignment]
journal_table: Table = JournalRecord.__table__  # type: ignore[assignment]
