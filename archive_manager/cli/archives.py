"""Archive verbs: ``ls``, ``show``, ``keys``, ``query``, ``export``, ``import-pt``."""

from __future__ import annotations

from dataclasses import asdict
from datetime import datetime
from pathlib import Path
from typing import Any

import click

from ..archive import ArchiveInfo
from ..manager import ArchiveManager
from ..stats import archive_summary
from ._complete import complete_archive_name
from ._context import CliError, json_option, pass_pool
from ._output import echo, echo_fields, echo_json, echo_table, human_size, local_time
from ._params import ROLLOUT_RANGE, SINCE

__all__ = ["export", "import_pt", "keys", "ls", "query", "show"]

_STATES = ("published", "released", "pending", "all")


def _state(value: str) -> str | None:
    return None if value == "all" else value


def _info_row(info: ArchiveInfo) -> list[object]:
    return [
        info.name,
        info.rollout_id,
        "yes" if info.evaluation else "no",
        info.state,
        info.samples,
        human_size(info.bytes),
        local_time(info.created_at),
    ]


@click.command()
@click.option("--rollout-id", type=int, help="Only archives of this rollout id.")
@click.option(
    "--evaluation/--no-evaluation",
    default=None,
    help="Only evaluation (or only training) archives.",
)
@click.option("--task-key", help="Only archives holding a sample of this task key.")
@click.option(
    "--state",
    type=click.Choice(_STATES),
    default="published",
    show_default=True,
    help="Archive state; 'all' lists every state.",
)
@click.option(
    "--since",
    type=SINCE,
    help="Only archives created since a date/time or a duration ago (2h, 3d).",
)
@click.option("--limit", type=click.IntRange(min=0), help="At most this many archives.")
@click.option(
    "--after",
    metavar="NAME",
    help="Start after this archive (the last of the previous page): pages of --limit.",
)
@json_option
@pass_pool
def ls(
    pool: ArchiveManager,
    rollout_id: int | None,
    evaluation: bool | None,
    task_key: str | None,
    state: str,
    since: datetime | None,
    limit: int | None,
    after: str | None,
    as_json: bool,
) -> None:
    """List archives, by rollout id (none last) then name; --limit and --after page."""
    found = pool.find(
        rollout_id=rollout_id,
        evaluation=evaluation,
        task_key=task_key,
        state=_state(state),
        since=since,
        limit=limit,
        after=after,
    )
    if as_json:
        echo_json([asdict(i) for i in found])
        return
    if not found:
        echo("no archives match")
        return
    echo_table(
        ["NAME", "ROLLOUT", "EVAL", "STATE", "SAMPLES", "SIZE", "CREATED"],
        [_info_row(i) for i in found],
        right={1, 4, 5},
    )


def _stats_line(stats: dict[str, float] | None, fmt: str) -> str:
    if not stats:
        return "-"
    return "  ".join(f"{k} {stats[k]:{fmt}}" for k in ("mean", "p50", "p90", "min", "max"))


@click.command()
@click.argument("name", shell_complete=complete_archive_name)
@json_option
@pass_pool
def show(pool: ArchiveManager, name: str, as_json: bool) -> None:
    """Show one archive: its fields, chunks, owners and a metadata summary (catalog only)."""
    arc = pool.open_archive(name)
    info = arc.info()
    chunks = arc.chunks()
    owners = arc.owners()
    # The web viewer's archive page shows the same summary (one computation, from the catalog).
    summary = archive_summary(pool.context, arc.name).overview()
    if as_json:
        echo_json(
            {
                **asdict(info),
                "attrs": arc.attrs,
                "manifest_digest": arc.manifest_digest,
                "owners": owners,
                "chunks": chunks,
                "metadata": summary,
            }
        )
        return
    echo_fields(
        [
            ("archive", info.name),
            ("rollout id", info.rollout_id),
            ("evaluation", "yes" if info.evaluation else "no"),
            ("state", info.state),
            ("samples", info.samples),
            ("size", f"{human_size(info.bytes)} ({info.bytes} bytes)"),
            ("created", local_time(info.created_at)),
            ("published", local_time(info.published_at)),
            ("released", local_time(info.released_at)),
            ("reference", info.reference),
            ("manifest", arc.manifest_digest),
            ("attrs", arc.attrs or None),
            ("owners", ", ".join(owners) or "none (released; gc may reclaim its payload)"),
        ]
    )
    echo(f"chunks ({len(chunks)})")
    echo_table(
        ["#", "BLOB", "SAMPLES", "SIZE"],
        [[c["ordinal"], c["digest"], c["samples"], human_size(c["size"])] for c in chunks],
        right={0, 2, 3},
        indent=2,
    )
    echo("samples (from the catalog)")
    status = ", ".join(f"{n} {s}" for s, n in sorted(summary["status"].items()))
    echo_fields(
        [
            ("status", status or "-"),
            ("response length", _stats_line(summary["response_length"], ".0f")),
            ("reward", _stats_line(summary["reward"], ".3g")),
        ],
        indent=2,
    )


@click.command()
@click.argument("name", shell_complete=complete_archive_name)
@json_option
@pass_pool
def keys(pool: ArchiveManager, name: str, as_json: bool) -> None:
    """List the sample key and task key of every sample, in archive order."""
    pairs = pool.open_archive(name).keys()
    if as_json:
        echo_json(
            [{"position": i, "sample_key": sk, "task_key": tk} for i, (sk, tk) in enumerate(pairs)]
        )
        return
    echo_table(
        ["POS", "SAMPLE KEY", "TASK KEY"],
        [[i, sk, tk] for i, (sk, tk) in enumerate(pairs)],
        right={0},
    )


@click.command()
@click.option("--task-key", help="Samples of this task key.")
@click.option("--sample-key", help="Samples of this sample key (e.g. sample:12).")
@click.option("--status", multiple=True, help="Sample status (repeatable: any of them).")
@click.option("--min-reward", type=float)
@click.option("--max-reward", type=float)
@click.option("--min-length", type=click.IntRange(min=0), help="Minimum response length.")
@click.option("--max-length", type=click.IntRange(min=0), help="Maximum response length.")
@click.option("--rollout-id", type=ROLLOUT_RANGE, help="A rollout id or a range A..B.")
@click.option("--evaluation/--no-evaluation", default=None, help="Evaluation archives or not.")
@click.option("--state", type=click.Choice(_STATES), default="published", show_default=True)
@click.option("--limit", type=click.IntRange(min=0), help="At most this many samples.")
@json_option
@pass_pool
def query(
    pool: ArchiveManager,
    task_key: str | None,
    sample_key: str | None,
    status: tuple[str, ...],
    min_reward: float | None,
    max_reward: float | None,
    min_length: int | None,
    max_length: int | None,
    rollout_id: tuple[int | None, int | None] | None,
    evaluation: bool | None,
    state: str,
    limit: int | None,
    as_json: bool,
) -> None:
    """Find samples across archives by key, status, reward, length (catalog only)."""
    low, high = rollout_id or (None, None)
    rows = pool.query(
        task_key=task_key,
        sample_key=sample_key,
        status=list(status) or None,
        min_reward=min_reward,
        max_reward=max_reward,
        min_length=min_length,
        max_length=max_length,
        min_rollout_id=low,
        max_rollout_id=high,
        evaluation=evaluation,
        state=_state(state),
        limit=limit,
    )
    if as_json:
        echo_json([r.as_dict() for r in rows])
        return
    if not rows:
        echo("no samples match")
        return
    echo_table(
        ["ARCHIVE", "ROLLOUT", "POS", "SAMPLE KEY", "TASK KEY", "STATUS", "REWARD", "LENGTH"],
        [
            [
                r.archive,
                r.rollout_id,
                r.position,
                r.sample_key,
                r.task_key,
                r.status,
                None if r.reward is None else f"{r.reward:g}",
                r.response_length,
            ]
            for r in rows
        ],
        right={1, 2, 6, 7},
    )


@click.command()
@click.argument("name", shell_complete=complete_archive_name)
@click.argument("out", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--force", "-f", is_flag=True, help="Overwrite OUT if it exists.")
@json_option
@pass_pool
def export(pool: ArchiveManager, name: str, out: Path, force: bool, as_json: bool) -> None:
    """Write archive NAME as a self-contained torch.save file (slime's dump format)."""
    if out.exists() and not force:
        raise CliError(f"{out} exists; pass --force to overwrite it")
    arc = pool.open_archive(name)
    path = arc.export_pt(out)
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
            f"exported {len(arc)} samples of {arc.name!r} to {path} ({human_size(result['bytes'])})"
        )


@click.command("import-pt")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--name", help="Archive name (default: the file's stem).")
@click.option(
    "--trust-pickle",
    is_flag=True,
    help="Allow full unpickling, which can run code: only for files you trust.",
)
@json_option
@pass_pool
def import_pt(
    pool: ArchiveManager, file: Path, name: str | None, trust_pickle: bool, as_json: bool
) -> None:
    """Import one of slime's torch.save rollout dumps as a new archive."""
    arc = pool.import_pt(file, name=name, trust_pickle=trust_pickle)
    info = arc.info()
    if as_json:
        echo_json(asdict(info))
        return
    echo(
        f"imported {info.samples} samples from {file} as archive {info.name!r} "
        f"(rollout id {info.rollout_id}, {human_size(info.bytes)})"
    )
