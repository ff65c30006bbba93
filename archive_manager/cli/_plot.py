"""Drift figures for ``archive-manager stats --plot``: presentation, so it lives with the CLI
(docs/architecture/index.md, "Layers"); the numbers come from `archive_manager.lens.stats`."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._util.output import Output, write_output
from ..errors import InvalidInputError, MissingDependencyError, extra_hint

# NOTE: imported for typing only (docs/architecture/start-up.md, "Start-up").
if TYPE_CHECKING:
    from ..lens.stats import RolloutStats

__all__ = ["check_plot_path", "plot_stats"]


def _figure_class() -> Any:
    try:
        from matplotlib.figure import Figure
    except ModuleNotFoundError as exc:
        raise MissingDependencyError(
            "plotting needs matplotlib, which is not installed; " + extra_hint("plot")
        ) from exc
    return Figure


def check_plot_path(path: str | Path) -> Path:
    """Check that a figure can be written to ``path`` before any work is done.

    Raises:
        MissingDependencyError: matplotlib is not installed.
        InvalidInputError: matplotlib cannot write the file's format (its suffix).
    """
    figure = _figure_class()
    target = Path(path)
    formats = figure().canvas.get_supported_filetypes()
    suffix = target.suffix.lower().lstrip(".")
    if suffix not in formats:
        raise InvalidInputError(
            f"cannot plot to {target.name!r}: give a file ending in one of "
            + ", ".join(f".{f}" for f in sorted(formats))
        )
    return target


def plot_stats(rows: Sequence[RolloutStats], path: str | Path) -> Path:
    """Draw reward and response length against rollout id into an image file (matplotlib).

    Training and evaluation rollouts are separate series; rows without a rollout id are left
    out (they have no place on the axis).  The format follows the file's suffix (``.png``,
    ``.svg``, ``.pdf``, ...); missing folders are made.

    Raises:
        MissingDependencyError: matplotlib is not installed.
        InvalidInputError: an unknown format, or no row has a rollout id to draw.
        OutputWriteError: the file could not be written (a full disk, a read-only folder).
    """
    target = check_plot_path(path)
    drawn = [r for r in rows if r.rollout_id is not None]
    if not drawn:
        raise InvalidInputError("no rollout with a rollout id to plot")
    # NOTE: a bare Figure (no pyplot) keeps the process's global backend and figure registry
    # untouched; matplotlib recommends it for programs that only write files.
    fig = _figure_class()(figsize=(9, 6.5), layout="constrained")
    reward_ax, length_ax = fig.subplots(2, 1, sharex=True)
    for evaluation, label, marker in ((False, "training", "o"), (True, "evaluation", "s")):
        series = [r for r in drawn if r.evaluation is evaluation]
        if not series:
            continue
        x = [r.rollout_id for r in series]

        def values(name: str, series: list[RolloutStats] = series) -> list[float]:
            return [math.nan if getattr(r, name) is None else getattr(r, name) for r in series]

        reward_ax.plot(x, values("reward_mean"), marker=marker, ms=3, label=f"{label}: mean")
        reward_ax.plot(x, values("reward_p50"), ls="--", lw=1, label=f"{label}: p50")
        reward_ax.plot(x, values("reward_p90"), ls=":", lw=1, label=f"{label}: p90")
        length_ax.plot(x, values("length_mean"), marker=marker, ms=3, label=f"{label}: mean")
        length_ax.plot(x, values("length_p90"), ls=":", lw=1, label=f"{label}: p90")
    reward_ax.set_ylabel("reward")
    reward_ax.set_title("reward by rollout")
    length_ax.set_ylabel("response length (tokens)")
    length_ax.set_title("response length by rollout")
    length_ax.set_xlabel("rollout id")
    for ax in (reward_ax, length_ax):
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small", loc="best")
    suffix = target.suffix.lower().lstrip(".")

    def draw(output: Output) -> None:
        # format: the temp file's own suffix is .tmp
        with output.writing():
            fig.savefig(output.path, dpi=120, format=suffix)

    # Written as every export is: a full disk or a read-only folder is one line, and no
    # partial image is left.
    return write_output(target, draw)
