"""``import-straw``: the seed's (vime/slime straw) archive indexes into the pool."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from ._context import (
    CliError,
    is_reportable,
    json_option,
    one_line,
    pass_pool,
    save_reward_key_option,
)
from ._output import counted, echo, echo_json, progress_reporter

if TYPE_CHECKING:
    from ..manager import ArchiveManager


@click.command("import-straw")
@click.argument("indexes", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("--name", help="The new archive's name (one INDEX only); default: its file name.")
@save_reward_key_option
@json_option
@pass_pool
def import_straw(
    pool: ArchiveManager,
    indexes: tuple[str, ...],
    name: str | None,
    reward_key: str | None,
    as_json: bool,
) -> None:
    """Import seed archive INDEX files (vime's or slime's ``*.straw.json``, read with
    straw-queue: the straw extra) as new archives, one per index, each
    verified sample by sample against its source before it is kept.  The first failure stops
    the run; a damaged or foreign index leaves the pool as it was."""
    if name is not None and len(indexes) > 1:
        raise click.UsageError("--name names one archive: give one INDEX with it")
    imported: list[dict[str, object]] = []
    for index in indexes:
        with progress_reporter(f"importing {index}", enabled=not as_json, unit="chunks") as bar:
            try:
                arc = pool.import_straw(index, name, progress=bar, reward_key=reward_key)
            except Exception as exc:
                if is_reportable(exc):
                    before = ", ".join(str(i["name"]) for i in imported) or "none"
                    raise CliError(
                        f"{index}: {one_line(exc)} (imported before it: {before})"
                    ) from exc
                raise
        imported.append({"index": index, "name": arc.name, "samples": len(arc)})
        if not as_json:
            echo(f"imported {counted(len(arc), 'sample')} from {index} as archive {arc.name!r}")
    if as_json:
        echo_json(imported)
