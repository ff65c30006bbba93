"""``archive-manager grep``: the samples whose prompt or response holds a pattern."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from .._util.constants import MAX_SEARCH_LIMIT
from ._context import json_option, pass_pool
from ._output import echo, echo_json, echo_table
from ._params import ROLLOUT_RANGE

# NOTE: imported for typing only (docs/architecture/start-up.md, "Start-up").
if TYPE_CHECKING:
    from ..manager import ArchiveManager

__all__ = ["grep"]


@click.command()
@click.argument("pattern")
@click.option("--regex", "-E", is_flag=True, help="PATTERN is a regular expression.")
@click.option("--ignore-case", "-i", is_flag=True, help="Match regardless of case.")
@click.option(
    "--field",
    type=click.Choice(["prompt", "response", "all"]),
    default="all",
    show_default=True,
    help="Which text to search.",
)
@click.option("--rollout-id", type=ROLLOUT_RANGE, help="Only these rollouts (5, 3..7, 3.., ..7).")
@click.option("--evaluation/--no-evaluation", default=None, help="Evaluation rollouts or not.")
@click.option(
    "--limit",
    type=click.IntRange(1, MAX_SEARCH_LIMIT),
    default=100,
    show_default=True,
    help="Stop after this many matching samples.",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0, min_open=True, max=24 * 3600),
    default=60.0,
    show_default=True,
    help="Seconds before the search stops and shows what it found.",
)
@json_option
@pass_pool
def grep(
    pool: ArchiveManager,
    pattern: str,
    regex: bool,
    ignore_case: bool,
    field: str,
    rollout_id: tuple[int | None, int | None] | None,
    evaluation: bool | None,
    limit: int,
    timeout: float,
    as_json: bool,
) -> None:
    """Published samples whose prompt or response contains PATTERN (a literal unless
    --regex), first match per sample, with archive, position, keys, reward and the line."""
    result = pool.search(
        pattern,
        regex=regex,
        ignore_case=ignore_case,
        fields=field,
        rollout_ids=rollout_id,
        evaluation=evaluation,
        limit=limit,
        timeout=timeout,
    )
    if as_json:
        echo_json(result.as_dict())
        return
    if result.matches:
        echo_table(
            ["ARCHIVE", "POS", "SAMPLE KEY", "TASK KEY", "REWARD", "FIELD", "LINE", "MATCH"],
            [
                [
                    m.archive,
                    m.position,
                    m.sample_key,
                    m.task_key,
                    None if m.reward is None else format(m.reward, ".4g"),
                    m.field,
                    m.line_number,
                    m.line,
                ]
                for m in result.matches
            ],
            right={1, 4, 6},
        )
    more = f", stopped at --limit {limit}" if result.limited else ""
    if result.timed_out:
        more += f", stopped at --timeout {timeout:g} s (later archives not scanned)"
    echo(
        f"{len(result.matches)} matching sample(s){more}; scanned {result.samples:,} samples "
        f"of {result.archives} archive(s) in {result.seconds:.2f} s"
    )
