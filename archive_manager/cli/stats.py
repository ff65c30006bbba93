"""``archive-manager stats``: training-drift statistics per rollout, as a table, JSON or a
figure."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from ._context import json_option, pass_catalog_pool, reward_key_option
from ._output import echo, echo_json, echo_table, human_size
from ._params import ROLLOUT_RANGE
from ._plot import check_plot_path, plot_stats

# NOTE: imported for typing only (docs/architecture/start-up.md, "Start-up").
if TYPE_CHECKING:
    from ..lens.stats import RolloutStats
    from ..manager import ArchiveManager

__all__ = ["stats"]


def _number(value: float | None, fmt: str) -> str | None:
    return None if value is None else format(value, fmt)


def _share(value: float | None) -> str | None:
    return None if value is None else f"{value:.0%}"


def unscored_note(rows: list[RolloutStats], reward_key: str | None) -> str | None:
    """One line on the samples whose reward gave no number, the keys to choose from and how
    (None when there are none): the lens does not go blank in silence."""
    unscored = [r for r in rows if r.unscored]
    if not unscored:
        return None
    count = sum(r.unscored for r in unscored)
    keys = sorted({k for r in unscored for k in r.reward_components})
    shown = ", ".join(keys[:12]) + (", ..." if len(keys) > 12 else "")
    what = f"a dict of {shown}" if keys else "not a dict"
    lacking = f" without the key {reward_key!r}" if reward_key is not None else ""
    return (
        f"note: {count} sample(s) in {len(unscored)} rollout(s) have a reward that is not a "
        f"number ({what}){lacking}, left out of REWARD: choose the key that is the reward "
        "with --reward-key KEY (or reward_key= when saving)"
    )


def _row(r: RolloutStats) -> list[object]:
    archives = str(r.archives) + (f" ({r.released} released)" if r.released else "")
    status = ", ".join(f"{s} {n / r.samples:.0%}" for s, n in r.status) if r.samples else None
    return [
        r.rollout_id,
        "yes" if r.evaluation else "no",
        archives,
        r.samples,
        _number(r.reward_mean, ".3f"),
        _number(r.reward_p50, ".3g"),
        _number(r.reward_p90, ".3g"),
        _number(r.length_mean, ".0f"),
        _number(r.length_p90, ".0f"),
        _share(r.truncated_share),
        _share(r.zero_variance_share),
        _number(r.group_std_mean, ".3f"),
        human_size(r.bytes),
        ", ".join(r.reward_keys) or None,
        status,
    ]


@click.command()
@click.option("--rollout-id", type=ROLLOUT_RANGE, help="A rollout id or a range A..B (A.., ..B).")
@click.option(
    "--evaluation/--no-evaluation",
    default=None,
    help="Only evaluation (or only training) rollouts.",
)
@click.option(
    "--plot",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Also draw reward and response length against rollout id into this image "
    "(.png, .svg, .pdf; needs matplotlib: the plot extra).",
)
@click.option(
    "--group-by",
    metavar="FIELD",
    help="Count prompt groups by this field instead of task key, else group_index: task_key, "
    "group_index, or any field of the samples (read from the payload).",
)
@reward_key_option
@json_option
@pass_catalog_pool
def stats(
    pool: ArchiveManager,
    rollout_id: tuple[int | None, int | None] | None,
    evaluation: bool | None,
    plot: Path | None,
    group_by: str | None,
    reward_key: str | None,
    as_json: bool,
) -> None:
    """Reward, response length and status per rollout, from the catalog (no payload read).

    Published and released archives count; ARCHIVES says how many were released.  FLAT is
    the share of prompt groups (samples of one archive sharing a task key, else a
    group_index, or the --group-by field; two or more rewards) whose rewards are all equal;
    GROUP STD the mean reward std within a group.  KEY is the key of dict rewards the
    rewards were read with (--reward-key, else the one each archive was saved with); a
    note says how many samples have a reward that gave no number, and which keys to choose.
    """
    if plot is not None:
        check_plot_path(plot)  # before any work: a missing matplotlib says how to install it
    rows = pool.stats(rollout_id, evaluation, group_by=group_by, reward_key=reward_key)
    if as_json:
        echo_json([r.as_dict() for r in rows])
    elif not rows:
        echo("no archives match")
    else:
        echo_table(
            [
                "ROLLOUT",
                "EVAL",
                "ARCHIVES",
                "SAMPLES",
                "REWARD",
                "P50",
                "P90",
                "LENGTH",
                "P90",
                "TRUNC",
                "FLAT",
                "GROUP STD",
                "SIZE",
                "KEY",
                "STATUS",
            ],
            [_row(r) for r in rows],
            right={0, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12},
        )
        note = unscored_note(rows, reward_key)
        if note:
            echo(note)
        if group_by not in (None, "task_key", "group_index") and not any(r.groups for r in rows):
            # A mistyped field (--group-by lable) groups nothing, which reads as no groups.
            echo(
                f"note: no two rewarded samples share a value of {group_by!r}, so no group "
                "is counted: is the field's name right?"
            )
    if plot is not None:
        # With --json, stdout holds only the JSON document.
        if rows:
            echo(f"wrote {plot_stats(rows, plot)}", err=as_json)
        else:
            echo("nothing to plot", err=True)
