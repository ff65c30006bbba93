"""Retention verbs: ``release``, ``retain``, ``release-owner``, ``owners``."""

from __future__ import annotations

from typing import Any

import click

from ..manager import ArchiveManager
from ..retention import ReleasePlan
from ._complete import complete_archive_name
from ._context import dry_run_option, json_option, pass_pool, yes_option
from ._output import echo, echo_json, echo_table, human_size, terminal_safe

__all__ = ["owners", "release", "release_owner", "retain"]


def _frees(plan: ReleasePlan) -> str:
    # Only what no other owner (nor a save in flight) retains comes free, and only once gc
    # runs past its grace period.
    return f"the next gc may reclaim {plan.blobs} blob(s), {human_size(plan.bytes)}"


@click.command()
@click.argument("name", shell_complete=complete_archive_name)
@yes_option
@dry_run_option
@json_option
@pass_pool
def release(pool: ArchiveManager, name: str, yes: bool, dry_run: bool, as_json: bool) -> None:
    """Release archive NAME: drop its own owner so that gc may reclaim what nothing else
    retains.  Its catalog rows stay for inspection."""
    arc = pool.open_archive(name)
    # The plan changes nothing; it also names the archive's own owner for the output.
    plan = pool.release_plan(name=arc.name)
    result: dict[str, Any] = {"archive": arc.name, "owner": plan.owner, "dry_run": dry_run}
    if arc.state == "released":
        result.update(released=False, already_released=True)
        if as_json:
            echo_json(result)
        else:
            echo(f"archive {arc.name!r} is already released; nothing changed")
        return
    if dry_run or not yes:
        others = plan.still_retained.get(arc.name, [])
        result.update(frees_blobs=plan.blobs, frees_bytes=plan.bytes, other_owners=others)
        if not as_json:
            kept = f"; still retained by {', '.join(others)}" if others else ""
            prefix = "would release" if dry_run else "will release"
            echo(
                f"{prefix} archive {arc.name!r} ({len(arc)} samples){kept}; {_frees(plan)}",
                err=not dry_run,
            )
    if dry_run:
        result["released"] = False
        if as_json:
            echo_json(result)
        return
    if not yes:
        click.confirm(terminal_safe(f"Release archive {arc.name!r}?"), abort=True, err=True)
    result["released"] = arc.release()
    if as_json:
        echo_json(result)
    else:
        echo(f"released archive {arc.name!r}; run 'archive-manager gc' to reclaim space")


@click.command()
@click.argument("owner")
@click.argument("name", shell_complete=complete_archive_name)
@json_option
@pass_pool
def retain(pool: ArchiveManager, owner: str, name: str, as_json: bool) -> None:
    """Make OWNER, such as checkpoint:step-1200, retain archive NAME's blobs."""
    added = pool.retain(owner, name)
    if as_json:
        echo_json({"owner": owner, "archive": name, "added": added})
    elif added:
        echo(f"{owner} now retains archive {name!r}")
    else:
        echo(f"{owner} already retains archive {name!r}; nothing changed")


@click.command("release-owner")
@click.argument("owner")
@yes_option
@dry_run_option
@json_option
@pass_pool
def release_owner(
    pool: ArchiveManager, owner: str, yes: bool, dry_run: bool, as_json: bool
) -> None:
    """Drop every retention of OWNER, such as a checkpoint that was deleted."""
    result: dict[str, Any] = {"owner": owner, "dry_run": dry_run}
    if dry_run or not yes:
        # release_plan validates OWNER as release_owner does: a dry run refuses the same.
        plan = pool.release_plan(owner=owner)
        if not plan.archives:
            result.update(archives=[], released=0)
            if as_json:
                echo_json(result)
            else:
                echo(f"{owner} retains nothing; nothing to do")
            return
        result.update(
            archives=plan.archives,
            still_retained=plan.still_retained,
            frees_blobs=plan.blobs,
            frees_bytes=plan.bytes,
        )
        if not as_json:
            prefix = "would release" if dry_run else "will release"
            kept = "".join(
                f"; {name} stays retained by {', '.join(others)}"
                for name, others in plan.still_retained.items()
            )
            echo(
                f"{prefix} {owner}: it retains {len(plan.archives)} archive(s) "
                f"({', '.join(plan.archives)}){kept}; {_frees(plan)}",
                err=not dry_run,
            )
        if dry_run:
            result["released"] = 0
            if as_json:
                echo_json(result)
            return
        click.confirm(terminal_safe(f"Release owner {owner}?"), abort=True, err=True)
    result["released"] = count = pool.release_owner(owner)
    if as_json:
        echo_json(result)
    elif count:
        echo(f"released {owner} from {count} archive(s); run 'archive-manager gc' to reclaim space")
    else:
        echo(f"{owner} retained nothing; nothing changed")


@click.command()
@json_option
@pass_pool
def owners(pool: ArchiveManager, as_json: bool) -> None:
    """The retention audit: per owner its archives, blobs and bytes (exclusive, shared)."""
    report = pool.owners()
    if as_json:
        echo_json(report.as_dict())
        return
    if report.owners:
        echo_table(
            ["OWNER", "ARCHIVES", "BLOBS", "BYTES", "EXCLUSIVE", "SHARED"],
            [
                [
                    u.owner,
                    _archives_cell(u.archives),
                    u.blobs,
                    human_size(u.bytes),
                    human_size(u.exclusive_bytes),
                    human_size(u.shared_bytes),
                ]
                for u in report.owners
            ],
            right={2, 3, 4, 5},
        )
    else:
        echo("no owners")
    echo(f"unowned blobs awaiting gc: {report.unowned_blobs} ({human_size(report.unowned_bytes)})")
    if report.live_leases:
        echo(f"saves in flight (live leases): {', '.join(report.live_leases)}")
    if report.stale_leases:
        echo(f"stale leases (gc drops them): {', '.join(report.stale_leases)}")
    if report.released_with_payload:
        echo(
            "released archives whose payload is still stored: "
            + ", ".join(report.released_with_payload)
        )


def _archives_cell(names: list[str], limit: int = 3) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" (+{len(names) - limit} more)" if len(names) > limit else "")
