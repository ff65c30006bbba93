"""``archive-manager groups`` and ``prompts``: the RL lens over the catalog (no payload read,
unless ``--group-by`` names a field the catalog does not hold)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from ._complete import complete_archive_name
from ._context import json_option, pass_catalog_pool, reward_key_option
from ._output import echo, echo_json, echo_table
from ._params import ROLLOUT_RANGE

# NOTE: imported for typing only (docs/architecture/start-up.md, "Start-up").
if TYPE_CHECKING:
    from ..lens.groups import Group
    from ..manager import ArchiveManager

__all__ = ["groups", "prompts"]


def _num(value: float | None, fmt: str = ".3f") -> str | None:
    return None if value is None else format(value, fmt)


def _key_shown(key: str | None, text: str | None) -> str | None:
    """A task key as a table shows it: the key, or the beginning of the whole text whose
    digest it is (on one line; ``--json`` holds both whole)."""
    if text is None:
        return key
    line = " ".join(text.split())
    return line if len(line) <= _TEXT_SHOWN else line[: _TEXT_SHOWN - 1] + "…"


_TEXT_SHOWN = 60  # characters of a long task key's text a table shows


def _group_name(group: Group) -> str:
    """A group as the table names it: its task key (the text of a long one), ``group_index=N``,
    ``FIELD=value``, or ``(ungrouped)``."""
    if group.field is None:
        return "(ungrouped)"
    if group.field == "task_key":
        return str(_key_shown(group.task_key, group.task_text))
    return f"{group.field}={group.value}"


@click.command()
@click.argument("name", shell_complete=complete_archive_name)
@click.option(
    "--sort",
    type=click.Choice(["position", "std", "mean", "size"]),
    default="position",
    show_default=True,
    help="Order of the groups (std: largest reward spread first).",
)
@click.option("--members", is_flag=True, help="Also list each completion with its advantage.")
@click.option(
    "--group-by",
    metavar="FIELD",
    help="Group by this field instead of task key, else group_index: task_key, group_index, "
    "or any field of the samples (label, metadata.source_name: read from the payload).",
)
@reward_key_option
@json_option
@pass_catalog_pool
def groups(
    pool: ArchiveManager,
    name: str,
    sort: str,
    members: bool,
    group_by: str | None,
    reward_key: str | None,
    as_json: bool,
) -> None:
    """The prompt groups of archive NAME: size, reward mean/std/min/max, GRPO advantages,
    and which groups have zero reward variance (they teach a GRPO step nothing).

    Samples are grouped by task key, else by group_index (slime's), or by --group-by."""
    found = pool.groups(name, group_by=group_by, reward_key=reward_key)
    if sort != "position":
        attr = {"std": "reward_std", "mean": "reward_mean", "size": "size"}[sort]
        found.sort(key=lambda g: (getattr(g, attr) is None, -(getattr(g, attr) or 0)))
    if as_json:
        echo_json([g.as_dict() for g in found])
        return
    if not found:
        echo(f"archive {name!r} has no samples")
        return
    rows = [
        [
            _group_name(g),
            g.size,
            _num(g.reward_mean),
            _num(g.reward_std),
            _num(g.reward_min, ".3g"),
            _num(g.reward_max, ".3g"),
            _num(g.length_mean, ".0f"),
            "yes" if g.zero_variance else "no",
            ", ".join(f"{s} {n}" for s, n in sorted(g.statuses.items())),
        ]
        for g in found
    ]
    echo_table(
        ["GROUP", "SIZE", "REWARD", "STD", "MIN", "MAX", "LENGTH", "ZERO VAR", "STATUS"],
        rows,
        right={1, 2, 3, 4, 5, 6},
    )
    flat = sum(g.zero_variance for g in found)
    used = found[0].reward_key
    echo(
        f"{len(found)} group(s), {flat} with zero reward variance"
        + (f"; rewards read with the key {used!r}" if used is not None else "")
    )
    if group_by not in (None, "task_key", "group_index") and all(g.field is None for g in found):
        # A mistyped field (--group-by lable) puts every sample in one "(ungrouped)" group.
        echo(
            f"note: no sample of {name!r} has a value for {group_by!r}: all are ungrouped "
            "(is the field's name right?)"
        )
    unscored = sum(g.unscored for g in found)
    if unscored:
        echo(
            f"note: {unscored} sample(s) have a reward that is not a number"
            + (f" and no key {used!r}" if used is not None else "")
            + ": no advantage; choose the key of their dict reward with --reward-key KEY "
            "('archive-manager stats' lists the keys)"
        )
    if members:
        for g in found:
            echo(f"group {_group_name(g)}:")
            echo_table(
                ["POSITION", "SAMPLE KEY", "REWARD", "ADVANTAGE", "NORMALIZED", "LENGTH", "STATUS"],
                [
                    [
                        m.position,
                        m.sample_key,
                        _num(m.reward, ".3g"),
                        _num(m.advantage),
                        _num(m.normalized_advantage),
                        m.response_length,
                        m.status,
                    ]
                    for m in g.members
                ],
                right={0, 2, 3, 4, 5},
                indent=2,
            )


@click.command()
@click.option("--task-key", help="The history of one prompt across rollouts.")
@click.option(
    "--from", "before", type=ROLLOUT_RANGE, help="Rollout id or range A..B to compare from."
)
@click.option("--to", "after", type=ROLLOUT_RANGE, help="Rollout id or range A..B to compare to.")
# NOTE: two flags, not one destination with two flag values: given both, that took the last
# one silently (tests/lens/test_lens.py); both are now a usage error.
@click.option("--regressed", is_flag=True, help="Only prompts that got worse.")
@click.option("--improved", is_flag=True, help="Only prompts that got better.")
@click.option("--rollout-id", type=ROLLOUT_RANGE, help="With --task-key: only these rollouts.")
@click.option("--evaluation/--no-evaluation", default=None, help="Evaluation rollouts or not.")
@click.option("--pass-threshold", type=float, default=0.0, show_default=True)
# min 1: --limit 0 printed "no prompt with rewards in both ranges", which is not what it meant
@click.option("--limit", type=click.IntRange(min=1), default=20, show_default=True)
@json_option
@pass_catalog_pool
def prompts(
    pool: ArchiveManager,
    task_key: str | None,
    before: tuple[int | None, int | None] | None,
    after: tuple[int | None, int | None] | None,
    regressed: bool,
    improved: bool,
    rollout_id: tuple[int | None, int | None] | None,
    evaluation: bool | None,
    pass_threshold: float,
    limit: int,
    as_json: bool,
) -> None:
    """Prompts across training: one prompt's history (--task-key K), or the prompts whose mean
    reward changed most between two rollout ranges (--from A..B --to C..D)."""
    if regressed and improved:
        raise click.UsageError("give --regressed or --improved, not both")
    direction = "regressed" if regressed else "improved" if improved else None
    if task_key is not None:
        if before is not None or after is not None or direction is not None:
            raise click.UsageError("--task-key shows one prompt's history: no --from/--to")
        history = pool.prompt_history(
            task_key, rollout_id, evaluation=evaluation, pass_threshold=pass_threshold
        )
        if as_json:
            echo_json([h.as_dict() for h in history])
        elif not history:
            echo(f"no rollout saw task key {task_key!r}")
        else:
            echo_table(
                ["ROLLOUT", "EVAL", "SIZE", "REWARD", "PASS", "LENGTH", "ARCHIVES"],
                [
                    [
                        h.rollout_id,
                        "yes" if h.evaluation else "no",
                        h.size,
                        _num(h.reward_mean),
                        None if h.pass_rate is None else f"{h.pass_rate:.0%}",
                        _num(h.length_mean, ".0f"),
                        ", ".join(h.archives),
                    ]
                    for h in history
                ],
                right={0, 2, 3, 4, 5},
            )
        return
    if before is None or after is None:
        raise click.UsageError("give --task-key K, or both --from A..B and --to C..D")
    changes = pool.prompt_changes(
        before, after, evaluation=evaluation, direction=direction, limit=limit
    )
    if as_json:
        echo_json([c.as_dict() for c in changes])
    elif not changes:
        echo("no prompt with rewards in both ranges" + (f" {direction}" if direction else ""))
    else:
        echo_table(
            ["TASK KEY", "FROM", "TO", "CHANGE", "SAMPLES"],
            [
                [
                    _key_shown(c.task_key, c.task_text),
                    _num(c.before),
                    _num(c.after),
                    f"{c.change:+.3f}",
                    f"{c.before_samples} -> {c.after_samples}",
                ]
                for c in changes
            ],
            right={1, 2, 3},
        )
