"""Tests of the catalog's Alembic migrations and version checks."""

from __future__ import annotations

import io
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.operations import Operations
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Engine, func, insert, inspect, select, text

from archive_manager.catalog import (
    FORMAT_VERSION,
    Catalog,
    archive_blobs_table,
    archive_summaries_table,
    archives_table,
    blobs_table,
    chunks_table,
    current_revision,
    entries_table,
    head_revision,
    lease_blobs_table,
    leases_table,
    make_engine,
    metadata,
    migrate,
    pool_info_table,
    retention_table,
    sample_metadata_table,
    upgrade,
)
from archive_manager.catalog.migrate import VERSION_TABLE, migration_connection, script_location
from archive_manager.errors import CatalogError, CatalogVersionError

ALL_TABLES = [
    pool_info_table,
    blobs_table,
    archives_table,
    chunks_table,
    entries_table,
    sample_metadata_table,
    archive_blobs_table,
    retention_table,
    leases_table,
    lease_blobs_table,
]


@pytest.fixture
def url(tmp_path: Path, backend) -> str:
    """A catalog URL with nothing in it yet: a SQLite file, or a new PostgreSQL database."""
    return f"sqlite:///{tmp_path / 'catalog.db'}" if backend.name == "sqlite" else backend.new_url()


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'catalog.db'}"


@pytest.fixture
def engine(url: str) -> Iterator[Engine]:
    engine = make_engine(url)
    yield engine
    engine.dispose()


def test_script_location_and_head() -> None:
    assert (script_location() / "env.py").is_file()
    assert head_revision() == "0012"
    assert migrate.known_revisions() == {
        "0001",
        "0002",
        "0003",
        "0004",
        "0005",
        "0006",
        "0007",
        "0008",
        "0009",
        "0010",
        "0011",
        "0012",
    }


def test_new_catalog_is_created_at_head(url: str) -> None:
    with Catalog.open(url) as catalog:
        assert current_revision(catalog.engine) == head_revision()
        assert catalog.get_pool_info("format_version") == str(FORMAT_VERSION)
        tables = set(inspect(catalog.engine).get_table_names())
        if catalog.dialect_name == "sqlite":
            # Revision 0006: the per-sample tables are stored in primary-key order.
            with catalog.read() as conn:
                for table in ("entries", "sample_metadata"):
                    sql = conn.exec_driver_sql(
                        f"SELECT sql FROM sqlite_master WHERE name = '{table}'"
                    ).scalar_one()
                    assert sql.rstrip().endswith("WITHOUT ROWID"), sql
    assert tables == set(metadata.tables) | {VERSION_TABLE}


def test_empty_database_has_no_revision(engine: Engine) -> None:
    assert current_revision(engine) is None


def test_models_and_head_migration_agree(engine: Engine) -> None:
    upgrade(engine)
    with engine.connect() as conn, conn.begin():
        context = MigrationContext.configure(
            conn, opts={"version_table": VERSION_TABLE, "compare_type": True}
        )
        assert compare_metadata(context, metadata) == []


def _rows_of_every_table() -> dict[str, list[dict[str, Any]]]:
    digest = "0123456789abcdef0123456789abcdef"
    return {
        "pool_info": [{"key": "blob_root", "value": "/pool/blobs"}],
        "blobs": [
            {"digest": digest, "size": 7, "kind": "chunk", "state": "live", "created_at": 1.5}
        ],
        "archives": [
            {
                "id": 1,
                "name": "rollout_3",
                "rollout_id": 3,
                "evaluation": True,
                "state": "published",
                "manifest_digest": digest,
                "samples": 1,
                "bytes": 7,
                "created_at": 1.5,
                "published_at": 2.5,
                "released_at": None,
                "attrs": {"model": "m", "steps": [1, 2]},
                "reference_name": None,
                "lease_owner": "lease:abc",
            }
        ],
        "chunks": [{"archive_id": 1, "ordinal": 0, "digest": digest, "samples": 1, "size": 7}],
        "entries": [
            {
                "archive_id": 1,
                "position": 0,
                "sample_key": "sample:0",
                "task_key": "task-9",
                "chunk_ordinal": 0,
                "offset": 0,
            }
        ],
        "sample_metadata": [
            {
                "archive_id": 1,
                "position": 0,
                "status": "completed",
                "reward": 0.25,
                "response_length": 12,
                "description": {"index": 0, "tensors": {"x": {"shape": [2], "dtype": "int32"}}},
            }
        ],
        "archive_blobs": [{"archive_id": 1, "digest": digest, "kind": "chunk"}],
        "retention": [{"owner": "archive:rollout_3", "archive_id": 1, "created_at": 2.5}],
        "leases": [
            {
                "owner": "lease:abc",
                "expires_at": 9.0,
                "generation": 2,
                "created_at": 1.0,
                "archive_name": "rollout_3",
            }
        ],
        "lease_blobs": [{"lease": "lease:abc", "digest": digest}],
    }


def _dump(engine: Engine) -> dict[str, list[dict[str, Any]]]:
    dumped = {}
    with engine.connect() as conn, conn.begin():
        for table in ALL_TABLES:
            # Columns added after 0001 (checked to be null after the upgrade).
            added = ("verified_at", "holder", "superseded_by", "superseded_at", "reward_key")
            columns = [c for c in table.c if c.name not in added]
            rows = conn.execute(select(*columns).order_by(*table.primary_key.columns))
            dumped[table.name] = [dict(row._mapping) for row in rows]
    return dumped


def test_upgrade_from_0001_keeps_every_row(engine: Engine, url: str) -> None:
    upgrade(engine, "0001")
    assert current_revision(engine) == "0001"
    assert "verified_at" not in {c["name"] for c in inspect(engine).get_columns("blobs")}
    rows = _rows_of_every_table()
    with engine.connect() as conn, conn.begin():
        for table in ALL_TABLES:
            # Core compiles the INSERT from the rows' keys: only columns that 0001 has.
            conn.execute(insert(table), rows[table.name])

    with Catalog.open(url) as catalog:  # upgrades to head
        assert current_revision(catalog.engine) == head_revision()
        dumped = _dump(catalog.engine)
        expected = dict(rows)
        expected["pool_info"] = sorted(
            [*rows["pool_info"], {"key": "format_version", "value": str(FORMAT_VERSION)}],
            key=lambda r: r["key"],
        )
        assert dumped == expected
        with catalog.read() as conn:
            assert conn.execute(select(blobs_table.c.verified_at)).scalar_one() is None
            # 0008: a lease taken before records no holder.
            assert conn.execute(select(leases_table.c.holder)).scalar_one() is None
            # 0010: an archive saved before was given no reward key, nor counts of rewards
            # that are not numbers.
            assert conn.execute(select(archives_table.c.reward_key)).scalar_one() is None
            # 0005: the archive got its summary from its sample rows during the upgrade.
            t = archive_summaries_table
            summary = conn.execute(
                select(t.c.archive_id, t.c.samples, t.c.status, t.c.reward_p50, t.c.length_max)
            ).one()
            assert tuple(summary) == (1, 1, {"completed": 1}, 0.25, 12.0)
            assert conn.execute(select(t.c.unscored, t.c.reward_components)).one() == (0, None)
            if catalog.dialect_name == "sqlite":
                assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
        # 0003: the longest archive name's own owner fits (PostgreSQL enforces the width).
        with catalog.write() as conn:
            owner = "archive:" + "x" * 255
            conn.execute(insert(retention_table).values(owner=owner, archive_id=1, created_at=3.0))
        # Foreign keys are back on and still cascade after the upgrade.
        with catalog.write() as conn:
            conn.execute(archives_table.delete())
        with catalog.read() as conn:
            for table in (chunks_table, entries_table, retention_table, archive_blobs_table):
                assert conn.execute(select(func.count()).select_from(table)).scalar_one() == 0


def _archive(archive_id: int | None, name: str, state: str) -> dict[str, Any]:
    row = {"name": name, "evaluation": False, "state": state, "samples": 0, "bytes": 0}
    row["created_at"] = 1.0
    return row if archive_id is None else {"id": archive_id, **row}


def test_upgrade_to_0010_lets_a_name_be_saved_again(engine: Engine, url: str) -> None:
    """Revision 0010: a name is unique among the archives it points at (published, released)
    and among pending saves, not among superseded ones; every row keeps its id, and SQLite's
    AUTOINCREMENT counter is carried over the table's rebuild (no deleted id is reused)."""
    from sqlalchemy.exc import IntegrityError

    upgrade(engine, "0009")
    with engine.connect() as conn, conn.begin():
        for name in ("a", "y", "z"):
            conn.execute(insert(archives_table).values(_archive(None, name, "released")))
        kept = conn.execute(select(archives_table.c.id).where(archives_table.c.name == "a"))
        first = kept.scalar_one()
        conn.execute(archives_table.delete().where(archives_table.c.name != "a"))
    with Catalog.open(url) as catalog:
        with catalog.read() as conn:
            rows = conn.execute(
                select(archives_table.c.id, archives_table.c.name, archives_table.c.superseded_by)
            ).all()
        assert [tuple(r) for r in rows] == [(first, "a", None)]
        for state in ("published", "released"):
            with pytest.raises(IntegrityError), catalog.write() as conn:
                conn.execute(insert(archives_table).values(_archive(None, "a", state)))
        with catalog.write() as conn:
            conn.execute(insert(archives_table).values(_archive(None, "a", "pending")))
            for _ in range(2):
                conn.execute(insert(archives_table).values(_archive(None, "a", "superseded")))
        with pytest.raises(IntegrityError), catalog.write() as conn:
            conn.execute(insert(archives_table).values(_archive(None, "a", "pending")))
        with pytest.raises(IntegrityError), catalog.write() as conn:
            conn.execute(insert(archives_table).values(_archive(None, "b", "bogus")))
        with catalog.read() as conn:
            ids = conn.execute(select(archives_table.c.id).order_by(archives_table.c.id)).scalars()
            assert min(list(ids)[1:]) > first + 2  # after the deleted ones, on both catalogs


def test_unknown_future_revision_is_refused(engine: Engine, url: str) -> None:
    upgrade(engine)
    with engine.connect() as conn, conn.begin():
        conn.execute(text(f"UPDATE {VERSION_TABLE} SET version_num = '0099_from_the_future'"))
    with pytest.raises(CatalogVersionError, match="newer than this library") as info:
        Catalog.open(url)
    assert "upgrade archive_manager" in str(info.value)
    with pytest.raises(CatalogVersionError):
        upgrade(engine)
    assert current_revision(engine) == "0099_from_the_future"  # left as it was


def test_newer_pool_format_is_refused(url: str) -> None:
    with Catalog.open(url) as catalog:
        catalog.set_pool_info("format_version", str(FORMAT_VERSION + 1))
    with pytest.raises(CatalogVersionError, match="format version 2"):
        Catalog.open(url)


def test_older_pool_format_is_raised_to_current(url: str) -> None:
    with Catalog.open(url) as catalog:
        catalog.set_pool_info("format_version", "0")
    with Catalog.open(url) as catalog:
        assert catalog.get_pool_info("format_version") == str(FORMAT_VERSION)


def test_unstamped_catalog_tables_are_refused(engine: Engine, url: str) -> None:
    with engine.connect() as conn, conn.begin():
        conn.execute(text("CREATE TABLE blobs (digest TEXT PRIMARY KEY)"))
    with pytest.raises(CatalogError, match="no revision stamp"):
        Catalog.open(url)


def test_concurrent_first_opens_all_succeed(url: str) -> None:
    errors: list[BaseException] = []

    def open_it() -> None:
        try:
            Catalog.open(url).close()
        except BaseException as exc:  # collected for the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=open_it) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    with Catalog.open(url) as catalog, catalog.read() as conn:
        assert current_revision(conn) == head_revision()
        rows = conn.execute(select(pool_info_table)).all()
        assert [tuple(r) for r in rows] == [("format_version", str(FORMAT_VERSION))]


def test_batch_move_and_copy_does_not_cascade(sqlite_url: str) -> None:
    """A batch migration that rebuilds ``archives`` must not delete the rows referring to it
    (SQLite's "move and copy"; PostgreSQL alters tables in place)."""
    with Catalog.open(sqlite_url) as catalog:
        with catalog.write() as conn:
            for table in ALL_TABLES:
                rows = _rows_of_every_table()[table.name]
                conn.execute(insert(table), rows)
        before = _dump(catalog.engine)
        with migration_connection(catalog.engine) as conn:
            operations = Operations(MigrationContext.configure(conn))
            with operations.batch_alter_table("archives", recreate="always") as batch:
                batch.alter_column("lease_owner", existing_type=archives_table.c.lease_owner.type)
        assert _dump(catalog.engine) == before
        with catalog.read() as conn:
            assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1


def test_downgrade_to_0001_and_back(engine: Engine) -> None:
    upgrade(engine)
    with migration_connection(engine) as conn:
        command.downgrade(migrate._config(conn), "0001")
    assert current_revision(engine) == "0001"
    upgrade(engine)
    assert current_revision(engine) == head_revision()


def test_offline_sql_for_postgresql_has_no_sqlite_specifics() -> None:
    out = io.StringIO()
    config = migrate._config()
    config.output_buffer = out
    config.set_main_option("sqlalchemy.url", "postgresql://")
    command.upgrade(config, "head", sql=True)
    sql = out.getvalue()
    assert "CREATE TABLE entries" in sql
    assert "ALTER TABLE blobs ADD COLUMN verified_at FLOAT" in sql
    assert "AUTOINCREMENT" not in sql and "PRAGMA" not in sql
    assert "_alembic_tmp" not in sql  # no SQLite move-and-copy on a real ALTER backend
