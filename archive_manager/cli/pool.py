"""Pool-level verbs: ``init``, ``db current``, ``db upgrade``, ``info``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from ._context import CliError, PoolState, json_option, pass_catalog_pool, pass_state
from ._output import echo, echo_fields, echo_json, human_size

# NOTE: imported for typing only (docs/architecture/start-up.md, "Start-up").
if TYPE_CHECKING:
    from ..manager import ArchiveManager, CatalogStatus

__all__ = ["db", "info", "init"]


@click.command()
@click.option(
    "--shared-group",
    metavar="GROUP",
    help="Let every account of GROUP save into, release from and collect the pool: folders "
    "get the group, its write bit and set-group-id, the catalog file group read and write. "
    "Run it again to repair what 'verify' reports.",
)
@pass_state
def init(state: PoolState, shared_group: str | None) -> None:
    """Create a pool at --root (a catalog and a blob folder); harmless if one is there."""
    if state.read_only:
        raise CliError("init writes the pool; it cannot run with --read-only")
    existed = state.exists()
    pool = state.open(create=True)
    if pool.read_only:
        raise CliError(
            f"the pool at {pool.root} is read-only here ({pool.read_only_reason}); init "
            "needs write access"
        )
    shared = pool.share_with_group(shared_group) if shared_group is not None else None
    summary = pool.info()
    verb = "pool already exists at" if existed else "created pool at"
    echo(f"{verb} {pool.root}")
    fields: list[tuple[str, Any]] = [
        ("catalog", summary.catalog_url),
        ("format version", summary.format_version),
        ("catalog revision", summary.catalog_revision),
    ]
    if shared is not None:
        fields.append(
            (
                "shared with group",
                f"{shared.group} ({shared.folders} folder(s), {shared.files} file(s) changed)",
            )
        )
    echo_fields(fields, indent=2)


def _catalog_status(state: PoolState) -> CatalogStatus:
    """The catalog's revision, read without migrating it (opening the pool would)."""
    # A writer may let SQLite recover a log left without its -shm, as the open would.
    from ..manager import ArchiveManager

    return ArchiveManager.catalog_status(state.root, state.catalog_url, recover=not state.read_only)


def _revision_status(status: CatalogStatus) -> str:
    if status.current is None:
        return "no catalog"
    if status.up_to_date:
        return "up to date"
    from ..catalog.migrate import known_revisions

    if status.current in known_revisions():
        return "behind: run 'archive-manager db upgrade'"
    return "newer than this archive_manager: upgrade the library"


@click.group()
def db() -> None:
    """The catalog's schema revision (Alembic migrations)."""


@db.command("current")
@json_option
@pass_state
def db_current(state: PoolState, as_json: bool) -> None:
    """Show the catalog's revision and the newest one this library knows."""
    status = _catalog_status(state)
    result = {
        "catalog_url": state.shown_catalog_url(),
        "current": status.current,
        "head": status.head,
        "up_to_date": status.up_to_date,
        "status": _revision_status(status),
    }
    if as_json:
        echo_json(result)
        return
    echo_fields(
        [
            ("catalog", result["catalog_url"]),
            ("current", status.current or "-"),
            ("head", status.head),
            ("status", result["status"]),
        ]
    )


@db.command("upgrade")
@json_option
@pass_state
def db_upgrade(state: PoolState, as_json: bool) -> None:
    """Migrate the catalog of an existing pool to the newest revision."""
    before = _catalog_status(state).current
    # Opening the pool is the upgrade: it migrates under the catalog's write lock (so
    # concurrent openers take turns) and records the pool's format version.
    pool: ArchiveManager = state.open()
    after = pool.info().catalog_revision
    result: dict[str, Any] = {"before": before, "after": after, "upgraded": before != after}
    if as_json:
        echo_json(result)
    elif before == after:
        echo(f"catalog already at the newest revision {after}")
    else:
        echo(f"catalog upgraded from revision {before} to {after}")


@click.command()
@json_option
@pass_catalog_pool
def info(pool: ArchiveManager, as_json: bool) -> None:
    """Summarize the pool: archives by state, samples, blobs, bytes, dedup ratio."""
    summary = pool.info()
    if as_json:
        echo_json(summary.as_dict())
        return

    def counts(by_state: dict[str, int]) -> str:
        return ", ".join(f"{n} {s}" for s, n in sorted(by_state.items())) or "none"

    echo_fields(
        [
            ("pool", summary.root),
            ("catalog", summary.catalog_url),
            ("format version", summary.format_version),
            ("catalog revision", summary.catalog_revision),
            ("archives", counts(summary.archives)),
            ("samples", f"{summary.samples} (in published archives)"),
            ("blobs", counts(summary.blobs)),
            ("stored", human_size(summary.stored_bytes)),
            ("referenced", f"{human_size(summary.logical_bytes)} (by published archives)"),
            (
                "dedup ratio",
                f"{summary.dedup_ratio:.2f}x (referenced over the {human_size(summary.unique_bytes)} "
                "of distinct blobs they need)",
            ),
            ("access", f"read-only ({pool.read_only_reason})" if pool.read_only else "read-write"),
        ]
    )
