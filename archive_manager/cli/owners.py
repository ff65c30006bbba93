"""Retention verbs: ``release``, ``forget``, ``retain``, ``release-owner``, ``owners``."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

import click

from ._complete import complete_archive_name
from ._context import (
    CliError,
    confirm,
    dry_run_option,
    json_option,
    pass_catalog_pool,
    pass_pool,
    yes_option,
)
from ._output import echo, echo_json, echo_table, human_size, local_time
from ._params import DURATION, ROLLOUT_RANGE

# NOTE: imported for typing only (docs/architecture/start-up.md, "Start-up").
if TYPE_CHECKING:
    from ..manager import ArchiveManager
    from ..pool.retention import ForgetPlan, ReleasePlan

__all__ = ["echo_plan", "forget", "owners", "release", "release_owner", "retain"]

# A first hour's stumble: gc right after a release reclaimed nothing, and only then said why.
RECLAIM_HINT = (
    "'archive-manager gc' reclaims the blobs nothing else retains once they are older than "
    "its --grace (1h by default, so a save in flight keeps what it wrote)"
)


def _frees(plan: ReleasePlan) -> str:
    # Only what no other owner (nor a save in flight) retains comes free, and only once gc
    # runs past its grace period.
    return f"the next gc may reclaim {plan.blobs} blob(s), {human_size(plan.bytes)}"


def _plan_rows(plan: ForgetPlan) -> list[list[object]]:
    items = [(i, "keep") for i in plan.keep] + [(i, "release") for i in plan.release]
    items.sort(
        key=lambda p: (p[0].rollout_id is not None, p[0].rollout_id or 0, p[0].created_at),
        reverse=True,
    )
    rows: list[list[object]] = []
    for item, action in items:
        if action == "keep":
            why = ", ".join(item.kept_by)
        elif item.other_owners:
            why = f"still retained by {', '.join(item.other_owners)}: its payload stays"
        else:
            why = ""
        rows.append(
            [
                item.name,
                item.rollout_id,
                "yes" if item.evaluation else "no",
                local_time(item.created_at),
                action,
                why,
            ]
        )
    return rows


def echo_plan(plan: ForgetPlan, *, err: bool) -> None:
    """Print a retention plan as a table, then what it frees (on stderr before a prompt)."""
    verb = "will release" if err else "would release"
    echo(f"keep {len(plan.keep)} archive(s), {verb} {len(plan.release)}", err=err)
    if plan.keep or plan.release:
        echo_table(
            ["NAME", "ROLLOUT", "EVAL", "CREATED", "ACTION", "WHY"],
            _plan_rows(plan),
            right={1},
            indent=2,
            err=err,
        )
    for name in plan.already_released:
        echo(f"archive {name!r} is already released; nothing changes for it", err=err)
    held = plan.still_retained
    if held:
        echo(
            f"{len(held)} archive(s) to release are still retained by other owners, which keep "
            "their payload until they let go ('archive-manager release-owner OWNER')",
            err=err,
        )
    if plan.release:
        echo(
            f"the next gc may reclaim {plan.freed_blobs} blob(s), {human_size(plan.freed_bytes)}",
            err=err,
        )


def _finish(plan: ForgetPlan, as_json: bool) -> None:
    if as_json:
        echo_json(plan.as_dict())
    elif plan.released:
        echo(f"released {len(plan.released)} archive(s); {RECLAIM_HINT}")
    elif not plan.dry_run and plan.release:
        echo("nothing released: another process released them first")


def _names_in(pool: ArchiveManager, bounds: tuple[int | None, int | None]) -> list[str]:
    return [i.name for i in pool.find(rollout_id=bounds, state="published")]


def _release_one(pool: ArchiveManager, name: str, yes: bool, dry_run: bool, as_json: bool) -> None:
    """``release NAME``: one archive, reported as one line (``--json``: one object)."""
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
        confirm(f"Release archive {arc.name!r}?")
    result["released"] = arc.release()
    if as_json:
        echo_json(result)
    else:
        echo(f"released archive {arc.name!r}; {RECLAIM_HINT}")


@click.command()
@click.argument("names", nargs=-1, shell_complete=complete_archive_name)
@click.option(
    "--rollout-id",
    type=ROLLOUT_RANGE,
    help="Also release every published archive of this rollout id or range (A..B, A.., ..B).",
)
@yes_option
@dry_run_option
@json_option
@pass_pool
def release(
    pool: ArchiveManager,
    names: tuple[str, ...],
    rollout_id: tuple[int | None, int | None] | None,
    yes: bool,
    dry_run: bool,
    as_json: bool,
) -> None:
    """Release archives NAMES (and those of --rollout-id): drop each one's own owner so that
    gc may reclaim what nothing else retains.  Their catalog rows stay for inspection.

    Several archives are released in one transaction: a name that does not exist releases
    nothing.  One NAME alone prints one line (--json: one object); several, or
    --rollout-id, print the plan as forget does (--json: the same plan object).
    """
    if not names and rollout_id is None:
        raise click.UsageError("give archive names, --rollout-id, or both")
    if len(names) == 1 and rollout_id is None:
        _release_one(pool, names[0], yes, dry_run, as_json)
        return
    chosen = list(dict.fromkeys([*names, *(_names_in(pool, rollout_id) if rollout_id else [])]))
    if not chosen:
        assert rollout_id is not None
        # NOTE: releasing is idempotent (as one released NAME is): a range whose archives are
        # all released already is a retry of a finished release, not an error; a range with no
        # archive at all is most likely a typo and fails.
        if not pool.find(rollout_id=rollout_id, state="released"):
            raise CliError("no archive has a rollout id in that range; nothing to release")
        if as_json:
            echo_json(pool.release([], dry_run=True).as_dict())
        else:
            echo("every archive in that range is already released; nothing changed")
        return
    # The plan checks every name first (a typo releases nothing) and changes nothing.
    plan = pool.release(chosen, dry_run=True)
    if not plan.release:
        if as_json:
            echo_json(plan.as_dict())
        else:
            echo_plan(plan, err=False)
        return
    if dry_run or not yes:
        if not as_json or not dry_run:
            echo_plan(plan, err=not dry_run)
        if dry_run:
            if as_json:
                echo_json(plan.as_dict())
            return
        confirm(f"Release {len(plan.release)} archive(s)?")
    plan = pool.release(chosen)
    _finish(plan, as_json)


@click.command()
@click.option(
    "--keep-last",
    type=click.IntRange(min=1),
    metavar="N",
    help="Keep the N newest archives (by rollout id, then creation time).",
)
@click.option(
    "--keep-within",
    type=DURATION,
    metavar="DURATION",
    help="Keep archives created within DURATION (2d, 12h) of the newest archive in scope.",
)
@click.option(
    "--keep-every",
    type=click.IntRange(min=1),
    metavar="K",
    help="Keep archives whose rollout id is a multiple of K.",
)
@click.option(
    "--rollout-id",
    type=ROLLOUT_RANGE,
    help="Scope: only archives of this rollout id or range (A..B, A.., ..B).",
)
@click.option(
    "--evaluation/--no-evaluation",
    default=None,
    help="Scope: only evaluation (or only training) archives.",
)
@yes_option
@dry_run_option
@json_option
@pass_pool
def forget(
    pool: ArchiveManager,
    keep_last: int | None,
    keep_within: timedelta | None,
    keep_every: int | None,
    rollout_id: tuple[int | None, int | None] | None,
    evaluation: bool | None,
    yes: bool,
    dry_run: bool,
    as_json: bool,
) -> None:
    """Apply a retention policy (as restic's forget): among the published archives in scope,
    keep those a --keep-* rule keeps and release the rest, in one transaction.

    Archives outside the scope are left alone.  An archive another owner (a checkpoint, a
    queue) still retains is released too, and the plan says so: its payload stays until that
    owner lets go.  Prints the plan and asks first (unless --yes).
    """
    if keep_last is None and keep_within is None and keep_every is None:
        raise click.UsageError(
            "give at least one of --keep-last, --keep-within, --keep-every: a policy without "
            "a rule would release every archive in its scope"
        )
    policy: dict[str, Any] = {
        "keep_last": keep_last,
        "keep_within": keep_within,
        "keep_every": keep_every,
        "rollout_ids": rollout_id,
        "evaluation": evaluation,
    }
    if dry_run or not yes:
        plan = pool.forget(**policy, dry_run=True)
        if dry_run:
            if as_json:
                echo_json(plan.as_dict())
            else:
                echo_plan(plan, err=False)
            return
        if not plan.release:
            if as_json:
                echo_json(plan.as_dict())
            else:
                echo_plan(plan, err=False)
            return
        echo_plan(plan, err=True)
        confirm(f"Release {len(plan.release)} archive(s)?")
        # Exactly what the user saw: archives saved since the plan are not touched.
        done = pool.release([i.name for i in plan.release])
        plan.dry_run = False
        plan.released = done.released
    else:
        plan = pool.forget(**policy)
    _finish(plan, as_json)


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
        confirm(f"Release owner {owner}?")
    result["released"] = count = pool.release_owner(owner)
    if as_json:
        echo_json(result)
    elif count:
        echo(f"released {owner} from {count} archive(s); {RECLAIM_HINT}")
    else:
        echo(f"{owner} retained nothing; nothing changed")


@click.command()
@json_option
@pass_catalog_pool
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
    if report.saves:
        # Who holds each save's lease, and whether that process is alive: a save of the same
        # name rolls back a dead one's at once, and waits out any other (docs/usage.md).
        echo("saves in flight or crashed (their leases):")
        echo_table(
            ["LEASE", "ARCHIVE", "STAGE", "HOLDER", "STATUS", "LAPSES"],
            [
                [
                    s.lease,
                    s.archive,
                    "pending" if s.pending else "storing",
                    _holder_cell(s.host, s.pid),
                    s.status,
                    "lapsed; gc drops it"
                    if s.expired
                    else local_time(datetime.fromtimestamp(s.expires_at, tz=timezone.utc)),
                ]
                for s in report.saves
            ],
            indent=2,
        )
    saves = {s.lease for s in report.saves}
    others = [lease for lease in report.live_leases if lease not in saves]
    if others:
        echo(f"other live leases (gc runs): {', '.join(others)}")
    stale = [lease for lease in report.stale_leases if lease not in saves]
    if stale:
        echo(f"stale leases (gc drops them): {', '.join(stale)}")
    if report.released_with_payload:
        echo(
            "released archives whose payload is still stored: "
            + ", ".join(report.released_with_payload)
        )


def _holder_cell(host: str | None, pid: int | None) -> str:
    if pid is None:
        return "not recorded (an older version)"
    return f"pid {pid} on {host}"


def _archives_cell(names: list[str], limit: int = 3) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" (+{len(names) - limit} more)" if len(names) > limit else "")
