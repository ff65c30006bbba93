"""Archive verbs: ``ls``, ``show``, ``keys``, ``query``, ``import-pt`` (``export`` and
``import``: cli/transfer.py)."""

from __future__ import annotations

import glob
import json
import os
from dataclasses import asdict
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from ..samples import Sample
from ._complete import complete_archive_name
from ._context import (
    CliError,
    PoolState,
    is_reportable,
    json_option,
    listing_options,
    one_line,
    pass_catalog_pool,
    pass_pool,
    pass_state,
    reward_key_option,
    save_reward_key_option,
)
from ._output import (
    counted,
    echo,
    echo_fields,
    echo_json,
    echo_records,
    echo_table,
    human_size,
    local_time,
    progress_reporter,
)
from ._params import ROLLOUT_RANGE, SINCE

# NOTE: the library's modules are imported for typing only, or inside the verb that runs:
# loading the CLI (``--help``, a TAB completion) must not import SQLAlchemy or numpy
# (docs/architecture/start-up.md, "Start-up").
if TYPE_CHECKING:
    from ..manager import ArchiveManager
    from ..pool.archive import ArchiveInfo

__all__ = ["import_pt", "keys", "ls", "query", "show"]

_STATES = ("published", "released", "pending", "superseded", "all")


def _state(value: str) -> str | None:
    return None if value == "all" else value


def _state_shown(info: ArchiveInfo, reclaimed: set[str]) -> str:
    """A released archive's state says whether its payload is still there."""
    if info.state != "released":
        return info.state
    return "released, reclaimed" if info.name in reclaimed else "released, payload kept"


def _info_row(info: ArchiveInfo, reclaimed: set[str]) -> list[object]:
    return [
        info.name,
        info.rollout_id,
        "yes" if info.evaluation else "no",
        _state_shown(info, reclaimed),
        info.samples,
        human_size(info.bytes),
        local_time(info.created_at),
    ]


@click.command()
@click.option(
    "--rollout-id",
    type=ROLLOUT_RANGE,
    help="Only archives of this rollout id or range (A..B, A.., ..B).",
)
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
    help="Archive state; 'all' lists every state ('superseded': archives a name pointed at "
    "before it was saved again).",
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
@listing_options
@pass_state
def ls(
    pool_state: PoolState,
    rollout_id: tuple[int | None, int | None] | None,
    evaluation: bool | None,
    task_key: str | None,
    state: str,
    since: datetime | None,
    limit: int | None,
    after: str | None,
    as_json: bool,
    fmt: str,
) -> None:
    """List archives, by rollout id (none last) then name; --limit and --after page."""
    from ..pool.sqlite_listing import read_listing

    filters: dict[str, Any] = dict(
        # One id is the same filter, with find's own wording of an id out of range.
        rollout_id=rollout_id[0] if rollout_id and rollout_id[0] == rollout_id[1] else rollout_id,
        evaluation=evaluation,
        task_key=task_key,
        state=_state(state),
        since=since,
        limit=limit,
        after=after,
    )
    # NOTE: a SQLite catalog is read with sqlite3 when the pool is plainly as an open would
    # leave it; anything else (and every error) goes through the open: SQLAlchemy alone
    # cost ls more than the 0.3 s start-up target (docs/architecture/start-up.md, "Start-up").
    listing = read_listing(pool_state.root, pool_state.catalog_url, **filters)
    if listing is not None:
        found, reclaimed = listing.archives, listing.reclaimed
    else:
        pool = pool_state.open_catalog()
        found = pool.find(**filters)
        reclaimed = pool.payload_reclaimed([i.name for i in found if i.state == "released"])
    records = [
        {**asdict(i), "payload_reclaimed": i.name in reclaimed}
        if i.state == "released"
        else asdict(i)
        for i in found
    ]
    if _structured(records, as_json, fmt):
        return
    if not found:
        echo("no archives match")
        return
    echo_table(
        ["NAME", "ROLLOUT", "EVAL", "STATE", "SAMPLES", "SIZE", "CREATED"],
        [_info_row(i, reclaimed) for i in found],
        right={1, 4, 5},
    )


# describe_sample records these payload fields' lengths under the fields' own names (the API's
# contract); machine output names the counts apart, so "tokens" is never a number there.
_COUNTED = ("tokens", "loss_mask", "rollout_log_probs")


def _row_out(row: dict[str, Any]) -> dict[str, Any]:
    meta = row.get("metadata")
    if isinstance(meta, dict):
        row["metadata"] = {
            (f"{k}_length" if k in _COUNTED and not isinstance(v, (list, dict)) else k): v
            for k, v in meta.items()
        }
    return row


def _structured(records: list[dict[str, Any]], as_json: bool, fmt: str) -> bool:
    """Print ``records`` as ``--json`` or ``--format json|ndjson|csv`` asked; False for a
    table, which the command prints itself."""
    fmt = fmt.lower()
    if as_json and fmt not in ("table", "json"):
        raise click.UsageError(f"--json and --format {fmt} contradict each other: give one")
    if as_json or fmt == "json":
        echo_json(records)
    elif fmt in ("ndjson", "csv"):
        echo_records(records, fmt)
    else:
        return False
    return True


def _stats_line(stats: dict[str, float] | None, fmt: str) -> str:
    if not stats:
        return "-"
    return "  ".join(f"{k} {stats[k]:{fmt}}" for k in ("mean", "p50", "p90", "min", "max"))


@click.command()
@click.argument("name", shell_complete=complete_archive_name)
@json_option
@pass_catalog_pool
def show(pool: ArchiveManager, name: str, as_json: bool) -> None:
    """Show one archive: its fields, chunks, owners and a metadata summary (catalog only)."""
    arc = pool.open_archive(name)
    info = arc.info()
    chunks = arc.chunks()
    owners = arc.owners()
    from ..lens.stats import archive_summary

    # The web viewer's archive page shows the same summary (one computation, from the catalog).
    summary = archive_summary(pool.context, arc.name).overview()
    reclaimed = pool.payload_reclaimed([arc.name])
    # The archives this name pointed at before it was saved again (audit; they count nowhere).
    earlier = [i for i in pool.history(arc.name) if i.state == "superseded"]
    if as_json:
        echo_json(
            {
                **asdict(info),
                "payload_reclaimed": arc.name in reclaimed,
                "attrs": arc.attrs,
                "reward_key": arc.reward_key,
                "manifest_digest": arc.manifest_digest,
                "owners": owners,
                "chunks": chunks,
                "metadata": summary,
                "superseded": [asdict(i) for i in earlier],
            }
        )
        return
    echo_fields(
        [
            ("archive", info.name),
            ("rollout id", info.rollout_id),
            ("evaluation", "yes" if info.evaluation else "no"),
            ("state", _state_shown(info, reclaimed)),
            ("samples", info.samples),
            ("size", f"{human_size(info.bytes)} ({info.bytes} bytes)"),
            ("created", local_time(info.created_at)),
            ("published", local_time(info.published_at)),
            ("released", local_time(info.released_at)),
            ("reference", info.reference),
            ("reward key", arc.reward_key),
            ("manifest", arc.manifest_digest),
            ("attrs", json.dumps(arc.attrs, ensure_ascii=False) if arc.attrs else None),
            ("owners", ", ".join(owners) or "none (released; gc may reclaim its payload)"),
            ("id", info.id),
            *([("supersedes", _superseded_text(earlier))] if earlier else []),
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


def _superseded_text(earlier: list[ArchiveInfo]) -> str:
    return "; ".join(
        f"#{i.id} ({i.samples} samples, created {local_time(i.created_at)}, superseded "
        f"{local_time(i.superseded_at)})"
        for i in earlier
    )


@click.command()
@click.argument("name", shell_complete=complete_archive_name)
@listing_options
@pass_catalog_pool
def keys(pool: ArchiveManager, name: str, as_json: bool, fmt: str) -> None:
    """List the sample key and task key of every sample, in archive order."""
    pairs = pool.open_archive(name).keys()
    records = [
        {"position": i, "sample_key": sk, "task_key": tk} for i, (sk, tk) in enumerate(pairs)
    ]
    if _structured(records, as_json, fmt):
        return
    echo_table(
        ["POS", "SAMPLE KEY", "TASK KEY"],
        [[i, sk, tk] for i, (sk, tk) in enumerate(pairs)],
        right={0},
    )


@click.command()
@click.option("--task-key", help="Samples of this task key.")
@click.option("--sample-key", help="Samples of this sample key (e.g. sample:12).")
@click.option(
    "--status",
    multiple=True,
    type=click.Choice([s.value for s in Sample.Status], case_sensitive=False),
    help="Sample status (repeatable: any of them).",
)
@click.option("--min-reward", type=float)
@click.option("--max-reward", type=float)
@click.option("--min-length", type=click.IntRange(min=0), help="Minimum response length.")
@click.option("--max-length", type=click.IntRange(min=0), help="Maximum response length.")
@click.option("--rollout-id", type=ROLLOUT_RANGE, help="A rollout id or a range A..B.")
@click.option("--evaluation/--no-evaluation", default=None, help="Evaluation archives or not.")
@click.option("--state", type=click.Choice(_STATES), default="published", show_default=True)
@click.option("--limit", type=click.IntRange(min=0), help="At most this many samples.")
@reward_key_option
@listing_options
@pass_catalog_pool
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
    reward_key: str | None,
    as_json: bool,
    fmt: str,
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
        reward_key=reward_key,
    )
    if _structured([_row_out(r.as_dict()) for r in rows], as_json, fmt):
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


def _expand(patterns: tuple[str, ...]) -> list[Path]:
    """The files named, a glob pattern (``debug/rollout_*.pt``) standing for its matches in
    sorted order (for shells that pass a pattern unexpanded, or quoted ones); each once."""
    files: list[Path] = []
    for pattern in patterns:
        # A file that exists is itself, even when its name holds glob characters ([1], *).
        if glob.has_magic(pattern) and not Path(pattern).expanduser().is_file():
            matches = sorted(Path(m) for m in glob.glob(os.path.expanduser(pattern)))
            matches = [m for m in matches if m.is_file()]
            if not matches:
                raise click.BadParameter(f"no file matches {pattern!r}", param_hint="FILES")
            files.extend(matches)
        else:
            path = Path(pattern).expanduser()
            if not path.is_file():
                raise click.BadParameter(f"{pattern!r} is not a file", param_hint="FILES")
            files.append(path)
    return list(dict.fromkeys(files))


@click.command("import-pt")
@click.argument("files", nargs=-1, required=True)
@click.option(
    "--name",
    help="Archive name (one file only; default: the exported archive's, else the file's stem).",
)
@click.option(
    "--rollout-id",
    type=int,
    default=None,
    help="Rollout id of the new archive (default: the dump's).",
)
@click.option(
    "--evaluation/--no-evaluation",
    default=None,
    help="Mark the archive as an evaluation rollout or not (default: as exported, else not).",
)
@click.option(
    "--task-key-field",
    metavar="FIELD",
    help="Take each sample's task key from this field: a name (index, group_index) or a "
    "dotted path into a dict field (metadata.prompt_id).",
)
@click.option(
    "--trust-pickle",
    is_flag=True,
    help="Allow full unpickling, which can run code: only for files you trust.",
)
@save_reward_key_option
@json_option
@pass_pool
def import_pt(
    pool: ArchiveManager,
    files: tuple[str, ...],
    name: str | None,
    rollout_id: int | None,
    evaluation: bool | None,
    task_key_field: str | None,
    trust_pickle: bool,
    reward_key: str | None,
    as_json: bool,
) -> None:
    """Import torch.save rollout dumps FILES (paths or glob patterns; slime's, or exports) as
    new archives, one per file.

    What an export recorded (name, evaluation, attrs, sample and task keys) comes back; the
    options override it, and a plain dump is named after its file's stem. Each file is its own
    archive and its own save: they are imported in order, and the first failure stops the run
    (the files imported before it stay, and are listed).
    """
    paths = _expand(files)
    if name is not None and len(paths) > 1:
        raise click.UsageError("--name names one archive: give one file with it")
    options: dict[str, Any] = {}
    if rollout_id is not None:
        options["rollout_id"] = rollout_id
    total = sum(p.stat().st_size for p in paths)
    imported: list[dict[str, Any]] = []
    done = 0
    with progress_reporter(
        "importing", enabled=not as_json and len(paths) > 1, unit="bytes"
    ) as progress:
        for path in paths:
            try:
                arc = pool.import_pt(
                    path,
                    name=name,
                    trust_pickle=trust_pickle,
                    evaluation=evaluation,
                    task_key_field=task_key_field,
                    reward_key=reward_key,
                    **options,
                )
            except Exception as exc:
                if imported and is_reportable(exc):
                    done_names = ", ".join(i["name"] for i in imported)
                    raise CliError(
                        f"{path}: {one_line(exc)} (imported before it: {done_names})"
                    ) from exc
                raise
            info = arc.info()
            imported.append({**asdict(info), "file": str(path)})
            done += path.stat().st_size
            if progress is not None:
                progress(done, total)
            if not as_json:
                echo(
                    f"imported {counted(info.samples, 'sample')} from {path} as archive "
                    f"{info.name!r} "
                    f"(rollout id {info.rollout_id}, {human_size(info.bytes)})"
                )
    if as_json:
        echo_json(imported[0] if len(files) == 1 and len(paths) == 1 else imported)
