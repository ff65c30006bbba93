"""Maintenance verbs: ``gc``, ``verify``, ``rebuild-catalog``."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING

import click

from ._context import (
    CliError,
    PoolState,
    confirm,
    dry_run_option,
    json_option,
    pass_pool,
    pass_state,
    yes_option,
)
from ._output import (
    echo,
    echo_fields,
    echo_json,
    echo_table,
    human_duration,
    human_size,
    local_time,
    progress_reporter,
)
from ._params import DURATION, check_subset

# NOTE: imported for typing only (docs/architecture/start-up.md, "Start-up").
if TYPE_CHECKING:
    from ..manager import ArchiveManager
    from ..pool.gc import GcReport

__all__ = ["gc", "rebind", "rebuild_catalog", "verify"]


def _has_work(report: GcReport) -> bool:
    return bool(
        report.blobs
        or report.orphans
        or report.temp_files
        or report.rolled_back
        or report.expired_leases
    )


# Past this many archives a GC report lists the largest and sums the rest in one line.
_LISTED = 20


def _echo_gc(report: GcReport, *, err: bool = False) -> None:
    """Print a GC report (or plan); on stderr for the preview before a prompt."""
    verb = "would reclaim" if report.dry_run else "reclaimed"
    echo(f"{verb} {report.blobs} blob(s), {human_size(report.bytes)}", err=err)
    if report.per_archive:
        ranked = sorted(report.per_archive.items(), key=lambda kv: (-kv[1]["bytes"], kv[0]))
        shown, rest = ranked[:_LISTED], ranked[_LISTED:]
        rows: list[list[object]] = [[name, v["blobs"], human_size(v["bytes"])] for name, v in shown]
        if rest:
            rows.append(
                [
                    f"... {len(rest)} more archive(s)",
                    sum(v["blobs"] for _, v in rest),
                    human_size(sum(v["bytes"] for _, v in rest)),
                ]
            )
        echo_table(["ARCHIVE", "BLOBS", "BYTES"], rows, right={1, 2}, indent=2, err=err)
    extras: list[tuple[str, object]] = [
        ("orphan files", f"{report.orphans} ({human_size(report.orphan_bytes)})"),
        ("stale temp files", report.temp_files),
        ("expired leases", report.expired_leases),
        ("dead saves rolled back", ", ".join(report.rolled_back)),
        ("finished from an earlier gc", report.finished_from_earlier),
    ]
    # Only what happened: a line of zeros per kind would bury the one that matters.
    echo_fields([(k, v) for k, v in extras if v not in (0, "", "0 (0 B)")], indent=2, err=err)
    if report.grace_blobs:
        first, last = (
            local_time(datetime.fromtimestamp(t, tz=timezone.utc)) if t is not None else "-"
            for t in (report.grace_first, report.grace_last)
        )
        when = f"after {first}" if first == last else f"from {first}, all of them after {last}"
        echo(
            f"the grace period holds back {report.grace_blobs} unowned blob(s), "
            f"{human_size(report.grace_bytes)}: reclaimable {when}",
            err=err,
        )
    if not err:
        echo(f"took {human_duration(report.duration)}")


@click.command()
@click.option(
    "--grace",
    type=DURATION,
    default="1h",
    show_default=True,
    help="Keep unowned blobs younger than this (a save may still need them).",
)
@yes_option
@dry_run_option
@json_option
@pass_pool
def gc(pool: ArchiveManager, grace: timedelta, yes: bool, dry_run: bool, as_json: bool) -> None:
    """Reclaim the blobs no owner retains (plan first; asks before deleting)."""
    if dry_run or not yes:
        plan = pool.gc(grace=grace, dry_run=True)
        if dry_run:
            if as_json:
                echo_json(plan.as_dict())
            else:
                _echo_gc(plan)
            return
        if _has_work(plan):
            _echo_gc(plan, err=True)
            confirm("Delete them?")
    # The real run recomputes its plan: what changed since the dry run is taken into account.
    with progress_reporter("deleting blobs", enabled=not as_json, unit="bytes") as progress:
        report = pool.gc(grace=grace, progress=progress)
    if as_json:
        echo_json(report.as_dict())
    else:
        _echo_gc(report)


@click.command()
@click.option("--read-data", is_flag=True, help="Also rehash blob contents (reads every byte).")
@click.option(
    "--subset",
    callback=check_subset,
    help="Rehash only part of the blobs: 'n/t' (the n-th of t parts) or 'P%'. Implies --read-data.",
)
@json_option
@pass_pool
def verify(
    pool: ArchiveManager,
    read_data: bool,
    subset: str | None,
    as_json: bool,
) -> None:
    """Check the catalog against the blob files; exit 1 if damage is found."""
    read_data = read_data or subset is not None
    with progress_reporter("verifying blobs", enabled=not as_json, unit="bytes") as progress:
        report = pool.verify(read_data=read_data, subset=subset, progress=progress)
    if as_json:
        echo_json(report.as_dict())
    else:
        for kind, findings in (("problem", report.problems), ("notice", report.notices)):
            for f in findings:
                echo(f"{kind}: [{f.kind}] {f.message}")
        checked = f"{report.blobs_checked} blob(s) checked"
        if read_data:
            checked += f", {human_size(report.bytes_read)} rehashed"
        status = "ok" if report.ok else f"{len(report.problems)} problem(s) found"
        echo(f"{status}: {checked} in {human_duration(report.duration)}")
    if not report.ok:
        click.get_current_context().exit(1)


@click.command("rebuild-catalog")
@click.option(
    "--resolve",
    is_flag=True,
    help="Accept the rebuilt owners although journal files were damaged (lets gc run again).",
)
@yes_option
@json_option
@pass_state
def rebuild_catalog(state: PoolState, resolve: bool, yes: bool, as_json: bool) -> None:
    """Restore what the catalog lacks from the pool: archives from their manifest blobs,
    owners, states and release times from the retention journal.

    For a catalog that was lost (deleted, emptied: the root's blobs are taken over by the
    catalog given), restored from a backup, or failed over to a lagging replica.  Archives
    the catalog lacks are added; archives it has get the owners and states the journal
    recorded since.
    """
    if not yes:
        confirm(
            f"Rebuild the catalog {state.shown_catalog_url()} of the pool at {state.root} "
            "from its blobs and retention journal?"
        )
    pool = state.open(recover=True)
    with progress_reporter("restoring archives", enabled=not as_json) as progress:
        report = pool.rebuild_catalog(progress=progress, resolve=resolve)
    if as_json:
        echo_json(report.as_dict())
        if report.unresolved:
            click.get_current_context().exit(1)
        return
    echo(
        f"indexed {report.blobs} blob file(s); restored {len(report.archives)} archive(s)"
        + (f": {', '.join(report.archives)}" if report.archives else "")
    )
    for restored, was in sorted(report.renamed.items()):
        echo(f"restored {was!r} as {restored!r}: the catalog has another archive of that name")
    for name, changes in sorted(report.brought_forward.items()):
        echo(f"brought forward from the journal: {name}: {'; '.join(changes)}")
    if report.reclaimed:
        echo(
            f"{len(report.reclaimed)} released archive(s) whose payload was reclaimed stay "
            f"gone: {', '.join(report.reclaimed)}"
        )
    for digest, reason in sorted(report.skipped.items()):
        echo(f"not restored: manifest {digest}: {reason}")
    if report.unknown_files:
        echo(f"{len(report.unknown_files)} blob file(s) of unknown kind left alone")
    if report.journal_partial:
        echo(
            "the journal knows these archives only in part (their publication record is "
            f"missing; their own owner was kept): {', '.join(report.journal_partial)}"
        )
    for name in report.journal_foreign:
        echo(f"journal file {name} belongs to another pool: not applied")
    for name, reason in sorted(report.journal_damaged.items()):
        echo(f"journal file {name} not applied: {reason}")
    for reason in report.journal_unreadable.values():
        echo(reason)
    echo(f"took {human_duration(report.duration)}")
    if report.journal_unreadable:
        raise CliError(
            f"{len(report.journal_unreadable)} journal file(s) could not be opened by this "
            "account (permission denied; intact as far as anyone knows, so never discarded, "
            "--resolve included), so owners they hold may be missing: gc stays refused; "
            "have their owner or root make them readable ('archive-manager init "
            "--shared-group GROUP' for a group-shared pool, or chmod a+r), then run "
            "'archive-manager rebuild-catalog' again"
        )
    if report.unresolved:
        raise CliError(
            f"{len(report.journal_damaged)} journal file(s) could not be read, so some owners "
            "may be missing: gc stays refused; check the pool, then accept the rebuilt owners "
            "with 'archive-manager rebuild-catalog --resolve'"
        )


@click.command("rebind")
@yes_option
@json_option
@pass_state
def rebind(state: PoolState, yes: bool, as_json: bool) -> None:
    """Make a copied pool (cp -a pool copy) a pool of its own, with a new identity.

    Run it on the copy, with the copy's catalog (the catalog file inside the copy, or a copy
    of the database).  The original is untouched; the two can never be taken for one another
    afterwards.
    """
    if not yes:
        confirm(
            f"Give the pool at {state.root} (catalog {state.shown_catalog_url()}) a new "
            "identity of its own?"
        )
    pool = state.open(rebind=True)
    identity = pool.identity
    assert identity is not None  # set by every open
    result = {"root": str(pool.root), "pool_id": identity.pool_id, "catalog": identity.catalog}
    if as_json:
        echo_json(result)
        return
    echo(f"the pool at {pool.root} is now pool {identity.pool_id}")
