"""The catalog schema: the single source of truth that Alembic revisions are checked against.

Timestamps are UTC epoch seconds (``Float``); the API layer converts them. The tables are
SQLAlchemy Core ``Table`` objects: every statement of the library is Core, and the ORM's
import (a third of SQLAlchemy's, paid by every CLI verb) bought nothing but the declarations
(docs/architecture/start-up.md, "Start-up").
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    text,
)

from .._util.constants import CATALOG_FORMAT_VERSION

__all__ = [
    "ARCHIVE_STATES",
    "BLOB_KINDS",
    "BLOB_STATES",
    "CURRENT_STATES",
    "FORMAT_VERSION",
    "NAMING_CONVENTION",
    "STATUS_LENGTH",
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
    "metadata",
    "pool_info_table",
    "retention_table",
    "sample_metadata_table",
    "sample_rewards_table",
    "task_texts_table",
]

FORMAT_VERSION = CATALOG_FORMAT_VERSION
"""The pool format this library writes; a pool with a greater one is refused."""

BLOB_KINDS = ("chunk", "tensor", "manifest")
BLOB_STATES = ("writing", "live", "deleting")
ARCHIVE_STATES = ("pending", "published", "released", "superseded")
CURRENT_STATES = ("published", "released")
"""The states of the archive a name points at: one row per name at most (revision 0010)."""
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


def _where(condition: str) -> dict[str, Any]:
    """A partial index's condition, for both dialects."""
    return {"sqlite_where": text(condition), "postgresql_where": text(condition)}


metadata = MetaData(naming_convention=NAMING_CONVENTION)
"""Every table of the catalog, with the naming convention (Alembic compares against it)."""


def _archive_fk() -> Column[int]:
    return Column(
        "archive_id", Integer, ForeignKey("archives.id", ondelete="CASCADE"), primary_key=True
    )


pool_info_table = Table(
    # Key/value facts about the pool: ``format_version``, ``blob_root``, ``created_at``.
    "pool_info",
    metadata,
    Column("key", String(64), primary_key=True),
    Column("value", Text),
)

blobs_table = Table(
    # One content-addressed blob and its life-cycle state.
    "blobs",
    metadata,
    Column("digest", _DIGEST, primary_key=True),
    Column("size", BigInteger, nullable=False),
    Column("kind", String(16), nullable=False),
    Column("state", String(16), nullable=False),
    Column("created_at", Float, nullable=False),
    Column("verified_at", Float),
    CheckConstraint(_one_of("kind", BLOB_KINDS), name="kind"),
    CheckConstraint(_one_of("state", BLOB_STATES), name="state"),
    # GC plan: "deleting" rows and unretained "live" rows older than the grace period.
    Index(None, "state", "created_at"),
)

archives_table = Table(
    # One named archive; its rows stay after release for inspection.
    "archives",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    # NOTE: unique among the archives a name points at, not among all rows (revision 0010):
    # a name saved again with ``supersede=True`` keeps its earlier archive, superseded, and
    # a superseding save's pending row stands beside the released archive it replaces
    # (docs/architecture/save-protocol.md, "Superseding a name").
    Column("name", _NAME, nullable=False),
    Column("rollout_id", BigInteger),
    Column("evaluation", Boolean, nullable=False),
    Column("state", String(16), nullable=False),
    Column("manifest_digest", _DIGEST),
    Column("samples", Integer, nullable=False),
    Column("bytes", BigInteger, nullable=False),
    Column("created_at", Float, nullable=False),
    Column("published_at", Float),
    Column("released_at", Float),
    Column("attrs", JSON),
    Column("reference_name", _NAME),
    Column("lease_owner", _LEASE),
    # A superseded archive: the id of the archive that took its name, and when (revision
    # 0010); null otherwise.
    Column("superseded_by", Integer),
    Column("superseded_at", Float),
    # The key of a dict reward whose value is the sample's reward (slime's --reward-key),
    # as given at save (revision 0011); null: none given.
    Column("reward_key", _NAME),
    CheckConstraint(_one_of("state", ARCHIVE_STATES), name="state"),
    Index(None, "name"),
    # One archive a name points at, and one save of a name in flight at a time.
    Index(
        "ix_archives_name_current", "name", unique=True, **_where(_one_of("state", CURRENT_STATES))
    ),
    Index("ix_archives_name_pending", "name", unique=True, **_where("state = 'pending'")),
    Index(None, "rollout_id"),
    # Listings and the sample-query walk page through (state, rollout id, name) in order
    # (docs/architecture/summaries-and-paging.md, "Summaries and paging"); it replaces (state,
    # rollout_id).
    Index(None, "state", "rollout_id", "name"),
    # Ids appear in logs and reports; never hand a deleted archive's id to a new one.
    sqlite_autoincrement=True,
)

chunks_table = Table(
    # One chunk blob of an archive; no FK to ``blobs``, whose rows GC deletes.
    "chunks",
    metadata,
    _archive_fk(),
    Column("ordinal", Integer, primary_key=True),
    Column("digest", _DIGEST, nullable=False),
    Column("samples", Integer, nullable=False),
    Column("size", BigInteger, nullable=False),
    Index(None, "digest"),
)

entries_table = Table(
    # One sample's place in an archive: keys, chunk ordinal and offset in the chunk.
    "entries",
    metadata,
    _archive_fk(),
    Column("position", Integer, primary_key=True),
    Column("sample_key", _NAME, nullable=False),
    Column("task_key", _NAME),
    Column("chunk_ordinal", Integer, nullable=False),
    Column("offset", Integer, nullable=False),
    # Lookups across archives ("every archive holding task t") and within one.
    Index(None, "task_key", "archive_id"),
    Index(None, "sample_key", "archive_id"),
    # Stored in primary-key order: no hidden rowid beside (archive_id, position), nor an
    # automatic index repeating it (revision 0006; docs/architecture/summaries-and-paging.md,
    # "Summaries and paging").  PostgreSQL ignores the option.
    sqlite_with_rowid=False,
)

sample_metadata_table = Table(
    # Per-sample metadata (``describe_sample``), queryable without reading a blob.
    "sample_metadata",
    metadata,
    _archive_fk(),
    Column("position", Integer, primary_key=True),
    # The status column is an index for queries; longer statuses stay in the description only.
    Column("status", String(STATUS_LENGTH)),
    Column("reward", Float),
    Column("response_length", Integer),
    Column("description", JSON, nullable=False),
    Index(None, "status"),
    Index(None, "reward"),
    Index(None, "response_length"),
    # As ``entries`` (revision 0006).
    sqlite_with_rowid=False,
)

sample_rewards_table = Table(
    # The numeric parts of the samples' rewards that are not a number (a dict of named rewards,
    # slime's --reward-key picks one), so that any key can be chosen later from the catalog
    # (revision 0011).  A row of ``component`` "" marks a sample whose reward is not a scalar;
    # the other rows of a dict reward are its numeric values, by key.  Samples with a number
    # or no reward have no row.
    "sample_rewards",
    metadata,
    _archive_fk(),
    Column("position", Integer, primary_key=True),
    Column("component", _NAME, primary_key=True),
    Column("value", Float),
    sqlite_with_rowid=False,
)

task_texts_table = Table(
    # The whole text of each task key of an archive that is the digest of a long text (a
    # prompt over 255 bytes: `samples.task_key_and_text`), to show it (revision 0012).
    "task_texts",
    metadata,
    _archive_fk(),
    Column("task_key", _NAME, primary_key=True),
    Column("text", Text, nullable=False),
    Index(None, "task_key"),
)

archive_summaries_table = Table(
    # What the statistics need of one archive's samples, computed once when its rows are
    # written (``archive_manager/pool/summary.py``; docs/architecture/summaries-and-paging.md, "Summaries
    # and paging").
    "archive_summaries",
    metadata,
    _archive_fk(),
    Column("samples", Integer, nullable=False),
    # {status: samples}; statuses the catalog does not index count under "none".
    Column("status", JSON, nullable=False),
    Column("rewarded", Integer, nullable=False),
    Column("reward_mean", Float),
    Column("reward_min", Float),
    Column("reward_max", Float),
    Column("reward_p50", Float),
    Column("reward_p90", Float),
    Column("measured", Integer, nullable=False),
    Column("length_mean", Float),
    Column("length_min", Float),
    Column("length_max", Float),
    Column("length_p50", Float),
    Column("length_p90", Float),
    Column("groups", Integer, nullable=False),
    Column("zero_variance_groups", Integer, nullable=False),
    Column("group_stds", Integer, nullable=False),
    Column("group_std_mean", Float),
    # Samples whose reward is not a number and gave none (a dict without a chosen key), and
    # the keys the archive's dict rewards hold, to say which key to choose (revision 0011).
    Column("unscored", Integer, nullable=False, server_default="0"),
    Column("reward_components", JSON),
)

archive_sketches_table = Table(
    # The quantile sketches of one archive's rewards and response lengths, merged when
    # several archives share a rollout id; apart from its summary, whose row they made ten
    # times larger (revision 0007; docs/architecture/summaries-and-paging.md, "Summaries and
    # paging").
    "archive_sketches",
    metadata,
    _archive_fk(),
    # Little-endian float64 values (summary.sketch_of).
    Column("reward_sketch", LargeBinary, nullable=False),
    Column("length_sketch", LargeBinary, nullable=False),
)

archive_blobs_table = Table(
    # Every blob an archive needs: chunks, tensor blobs and its manifest.
    "archive_blobs",
    metadata,
    _archive_fk(),
    Column("digest", _DIGEST, primary_key=True),
    Column("kind", String(16), nullable=False),
    # (digest, archive_id) covers GC's "is this digest needed by a retained archive" probe
    # without touching the table.
    Index(None, "digest", "archive_id"),
)

retention_table = Table(
    # An owner (``archive:<name>``, ``checkpoint:...``) retains every blob of an archive.
    "retention",
    metadata,
    Column("owner", _OWNER, primary_key=True),
    _archive_fk(),
    Column("created_at", Float, nullable=False),
    Index(None, "archive_id"),
)

leases_table = Table(
    # A temporary owner (``lease:<uuid>``, ``gc:<uuid>``) held by a save or GC in flight.
    "leases",
    metadata,
    Column("owner", _LEASE, primary_key=True),
    Column("expires_at", Float, nullable=False),
    Column("generation", Integer, nullable=False),
    Column("created_at", Float, nullable=False),
    Column("archive_name", _NAME),
    # The process that holds a save's lease: {"host", "pid", "start"} (revision 0008), so a
    # new save of the name can tell a crashed save from one in flight
    # (docs/architecture/save-protocol.md, "Save protocol"); null for GC's leases and those of older
    # versions.
    Column("holder", JSON),
)

lease_blobs_table = Table(
    # A blob digest retained by a lease; dropped with the lease.
    "lease_blobs",
    metadata,
    Column("lease", _LEASE, ForeignKey("leases.owner", ondelete="CASCADE"), primary_key=True),
    Column("digest", _DIGEST, primary_key=True),
    Index(None, "digest"),
)

journal_table = Table(
    # A retention record this catalog committed since its last journal checkpoint
    # (docs/architecture/retention-journal.md, "Retention journal"): a record file on disk that is
    # not here, and not older than the checkpoint, is one this catalog never saw (it is behind the
    # pool).
    "journal",
    metadata,
    Column("seq", BigInteger, primary_key=True, autoincrement=False),
    Column("digest", _DIGEST, nullable=False),
    Column("created_at", Float, nullable=False),
    # The record itself (a few hundred bytes): a file that could not be written, or not yet,
    # is written again from here, and a rebuild replays this catalog's own decisions exactly.
    Column("data", LargeBinary, nullable=False),
)
