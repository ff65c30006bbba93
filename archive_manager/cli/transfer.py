"""Getting data out and in: ``export`` (one archive, or one file per archive of a rollout id
range) and ``import`` (Parquet and JSONL files)."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from click.shell_completion import CompletionItem

from ._complete import complete_archive_name
from ._context import CliError, json_option, pass_pool, save_reward_key_option
from ._output import counted, echo, echo_json, human_size, progress_reporter
from ._params import ROLLOUT_RANGE

# NOTE: imported for typing only (docs/architecture/start-up.md, "Start-up").
if TYPE_CHECKING:
    from ..manager import ArchiveManager

__all__ = ["export", "import_file"]

_FORMATS = click.Choice(["parquet", "jsonl", "pt"])


def _complete_name_then_path(
    ctx: click.Context, param: click.Parameter, incomplete: str
) -> list[CompletionItem]:
    """An archive name first (NAME), then a path (FILE or DIR)."""
    if ctx.params.get("args") or ctx.params.get("rollout_id") is not None:
        return [CompletionItem(incomplete, type="file")]
    return complete_archive_name(ctx, param, incomplete)


@click.command()
@click.argument(
    "args",
    nargs=-1,
    required=True,
    metavar="NAME FILE | DIR",
    shell_complete=_complete_name_then_path,
)
@click.option(
    "--format",
    "fmt",
    type=_FORMATS,
    help="File format (default: from FILE's suffix; parquet for DIR).",
)
@click.option(
    "--rollout-id",
    type=ROLLOUT_RANGE,
    help="Export every archive of this rollout id or range A..B into DIR, one file each.",
)
@click.option(
    "--evaluation/--no-evaluation",
    default=None,
    help="With DIR: only evaluation (or only training) archives.",
)
@click.option("--force", "-f", is_flag=True, help="Overwrite files that exist.")
@json_option
@pass_pool
def export(
    pool: ArchiveManager,
    args: tuple[str, ...],
    fmt: str | None,
    rollout_id: tuple[int | None, int | None] | None,
    evaluation: bool | None,
    force: bool,
    as_json: bool,
) -> None:
    """Write archive NAME to FILE (.parquet, .jsonl, or .pt: slime's dump format), or every
    archive of --rollout-id A..B to DIR, one file per archive.

    On a terminal a bar shows the stored bytes read, with an ETA (none with --json or -q).
    """
    # --evaluation selects archives: with NAME FILE it would be silently ignored
    many = rollout_id is not None or evaluation is not None
    if many:
        if len(args) != 1:
            raise click.UsageError("with --rollout-id or --evaluation, give one DIR (no NAME)")
        with progress_reporter("exporting archives", enabled=not as_json, unit="bytes") as progress:
            paths = pool.export_many(
                Path(args[0]),
                format=fmt or "parquet",
                rollout_ids=rollout_id,
                evaluation=evaluation,
                overwrite=force,
                progress=progress,
            )
        sizes = [p.stat().st_size for p in paths]
        if as_json:
            echo_json([{"path": str(p), "bytes": n} for p, n in zip(paths, sizes, strict=True)])
        else:
            total = sum(sizes)
            echo(f"exported {counted(len(paths), 'archive')} to {args[0]} ({human_size(total)})")
        return
    if len(args) != 2:
        raise click.UsageError("give NAME FILE, or --rollout-id A..B DIR")
    name, out = args[0], Path(args[1])
    arc = pool.open_archive(name)
    with progress_reporter("exporting", enabled=not as_json, unit="bytes") as progress:
        path = pool.export(arc.name, out, format=fmt, overwrite=force, progress=progress)
    result: dict[str, Any] = {
        "archive": arc.name,
        "samples": len(arc),
        "path": str(path),
        "bytes": path.stat().st_size,
    }
    if as_json:
        echo_json(result)
    else:
        echo(
            f"exported {counted(len(arc), 'sample')} of {arc.name!r} to {path} "
            f"({human_size(result['bytes'])})"
        )


def _mapping(ctx: click.Context, param: click.Parameter, value: tuple[str, ...]) -> dict[str, str]:
    out: dict[str, str] = {}
    for part in (p for v in value for p in v.split(",")):
        field, sep, column = part.partition("=")
        if not sep or not field.strip() or not column.strip():
            raise click.BadParameter(f"{part!r} is not FIELD=COLUMN", ctx, param)
        out[field.strip()] = column.strip()
    return out


@click.command("import")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "--name", help="Archive name (default: the exported archive's; required for other files)."
)
@click.option("--rollout-id", type=int, help="The archive's rollout id (default: the export's).")
@click.option(
    "--rollout-id-column",
    metavar="COLUMN",
    help="Take the rollout id from this column (TRL's and verl's step); one value per file.",
)
@click.option(
    "--evaluation/--no-evaluation",
    default=None,
    help="Mark the archive an evaluation (default: the export's; else no).",
)
@click.option(
    "--map",
    "mapping",
    multiple=True,
    callback=_mapping,
    help="Sample field from a column: prompt=input,response=output,reward=score (repeatable).",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["parquet", "jsonl"]),
    help="File format (default: from FILE's suffix).",
)
@save_reward_key_option
@json_option
@pass_pool
def import_file(
    pool: ArchiveManager,
    file: Path,
    name: str | None,
    rollout_id: int | None,
    rollout_id_column: str | None,
    evaluation: bool | None,
    mapping: dict[str, str],
    fmt: str | None,
    reward_key: str | None,
    as_json: bool,
) -> None:
    """Import a Parquet or JSONL file as a new archive: an export of this tool comes back
    whole; other frameworks' rows (verl's rollout_data_dir dumps...) become samples, their
    columns renamed to sample fields by --map."""
    if file.suffix.lower() == ".pt" and fmt is None:
        raise CliError(f"{file} is a .pt dump: import it with 'archive-manager import-pt'")
    arc = pool.import_table(
        file,
        name=name,
        rollout_id=rollout_id,
        evaluation=evaluation,
        mapping=mapping or None,
        format=fmt,
        rollout_id_column=rollout_id_column,
        reward_key=reward_key,
    )
    info = arc.info()
    if as_json:
        echo_json(asdict(info))
        return
    echo(
        f"imported {counted(info.samples, 'sample')} from {file} as archive {info.name!r} "
        f"(rollout id {info.rollout_id}, {human_size(info.bytes)})"
    )
