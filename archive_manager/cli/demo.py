"""``demo``: the main job end to end on synthetic, slime-shaped rollouts, step by step."""

from __future__ import annotations

import functools
import shlex
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from .._util.lazy_torch import torch_installed
from ..errors import ArchiveReleasedError
from ..samples import Sample
from ._context import CliError, PoolState, one_line, pass_state
from ._output import echo_fields, echo_table, human_duration, human_size

# NOTE: imported for typing only (docs/architecture/start-up.md, "Start-up").
if TYPE_CHECKING:
    from ..manager import ArchiveManager

__all__ = ["demo"]

T = TypeVar("T")

_ROLLOUTS = 3
_STEPS = 8
# Routing replay ("R3") tensors on the last rollout: [tokens - 1, layers, topk] int32, kept
# small so the demo stays quick while showing a real tensor field.
_R3_LAYERS, _R3_TOPK = 4, 2
# Typical shapes (docs/architecture/workload.md, "Workload").
_PROMPT_LEN, _RESPONSE_MIN, _RESPONSE_MAX = 512, 1400, 4200
_TASK_KEY = "rollout-1/group-3"
_SAMPLE_KEY = "sample:5"


def _timed(fn: Callable[[], T]) -> tuple[T, float]:
    started = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - started


def _step(n: int, title: str, seconds: float | None = None) -> None:
    click.echo()
    took = "" if seconds is None else f" ({human_duration(seconds)})"
    click.echo(f"[{n}/{_STEPS}] {title}{took}")


def _shape(value: Any) -> str:
    dtype = str(getattr(value, "dtype", "?")).removeprefix("torch.")
    return f"{dtype} {list(getattr(value, 'shape', []))}"


def _pick_root(state: PoolState) -> None:
    """Point ``state`` at the demo's pool: --root if given (and empty), else a new temp dir."""
    if not state.root_given:
        state.root = Path(tempfile.mkdtemp(prefix="archive-manager-demo-"))
        state.root_given = True
        return
    if state.exists():
        held = len(state.open().find(state=None))
        if held:
            raise CliError(
                f"the demo needs an empty pool, and {state.root} holds {held} archive(s); "
                "omit --root to run it in a new temporary folder"
            )


@click.command()
@click.option(
    "--samples",
    type=click.IntRange(min=16),
    default=64,
    show_default=True,
    help="Samples per rollout.",
)
@pass_state
def demo(state: PoolState, samples: int) -> None:
    """Run the main job on synthetic rollouts: save, query, load, release, gc, verify.

    Uses --root if given (it must hold no archives), else a new temporary folder, and leaves
    the pool there for the commands it suggests at the end.
    """
    started = time.perf_counter()
    _pick_root(state)
    click.echo("archive-manager demo: synthetic rollouts shaped like slime's, step by step")

    pool, took = _timed(lambda: state.open(create=True))
    summary = pool.info()
    _step(1, "open a pool", took)
    echo_fields(
        [
            ("root", pool.root),
            ("catalog", summary.catalog_url),
            ("format", f"{summary.format_version} (catalog revision {summary.catalog_revision})"),
        ],
        indent=4,
    )

    _save_rollouts(pool, samples)
    _query(pool)
    _load(pool)
    _release(pool)
    _gc(pool)
    ok = _verify(pool)

    summary = pool.info()
    _step(8, "the pool now")
    echo_fields(
        [
            ("archives", ", ".join(f"{n} {s}" for s, n in sorted(summary.archives.items()))),
            ("samples", f"{summary.samples} (in published archives)"),
            (
                "stored",
                f"{human_size(summary.stored_bytes)} in {summary.blobs.get('live', 0)} blobs",
            ),
        ],
        indent=4,
    )
    click.echo()
    click.echo(f"done in {human_duration(time.perf_counter() - started)}. Try next, on this pool:")
    base = f"archive-manager --root {shlex.quote(str(pool.root))}"
    # A .pt export needs torch: a lean install is shown the export it can run.
    suffix = ".pt" if torch_installed() else ".jsonl"
    for args in (
        "info",
        "ls --state all",
        "show rollout-2",
        f"query --task-key {_TASK_KEY} --min-reward 1",
        "keys rollout-1",
        "owners",
        "retain checkpoint:step-1 rollout-1",
        f"export rollout-1 rollout-1{suffix}",
        "release rollout-1 --dry-run",
        "gc --dry-run",
        "verify --read-data",
    ):
        click.echo(f"  {base} {args}")
    if not ok:
        raise CliError("verify found damage in the demo pool (see step 7)")


def _save_rollouts(pool: ArchiveManager, samples: int) -> None:
    from ..interop.synthetic import make_rollout

    rows: list[list[object]] = []
    total = 0.0
    for rollout_id in range(_ROLLOUTS):
        r3 = _R3_LAYERS if rollout_id == _ROLLOUTS - 1 else None
        batch = make_rollout(
            samples,
            seed=rollout_id,
            rollout_id=rollout_id,
            prompt_len=_PROMPT_LEN,
            response_min=_RESPONSE_MIN,
            response_max=_RESPONSE_MAX,
            r3_layers=r3,
            r3_topk=_R3_TOPK,
            # A lean install (no torch extra) shows the same field as numpy arrays.
            r3_numpy=not torch_installed(),
        )
        arc, took = _timed(
            functools.partial(pool.save, f"rollout-{rollout_id}", batch, rollout_id=rollout_id)
        )
        total += took
        tokens = sum(len(s.tokens) for s in batch if isinstance(s, Sample))
        rows.append(
            [
                arc.name,
                len(arc),
                f"{tokens:,}",
                "routed experts" if r3 else "-",
                human_size(arc.info().bytes),
                human_duration(took),
            ]
        )
    _step(2, f"save {_ROLLOUTS} rollouts of {samples} samples", total)
    click.echo(
        f"    prompts of {_PROMPT_LEN} tokens shared by groups of 8, responses of "
        f"{_RESPONSE_MIN}-{_RESPONSE_MAX} tokens; routed experts: int32 "
        f"[tokens-1, {_R3_LAYERS}, {_R3_TOPK}] per sample"
    )
    echo_table(
        ["ARCHIVE", "SAMPLES", "TOKENS", "EXTRA", "STORED", "TIME"],
        rows,
        right={1, 2, 4, 5},
        indent=4,
    )


def _query(pool: ArchiveManager) -> None:
    def run() -> tuple[list[Any], list[Any]]:
        return pool.find(task_key=_TASK_KEY), pool.query(task_key=_TASK_KEY)

    (found, rows), took = _timed(run)
    _step(3, f"find task key {_TASK_KEY!r} (catalog only, no blob read)", took)
    click.echo(f"    in archive(s): {', '.join(i.name for i in found)}; {len(rows)} samples:")
    echo_table(
        ["ARCHIVE", "SAMPLE KEY", "STATUS", "REWARD", "LENGTH"],
        [[r.archive, r.sample_key, r.status, f"{r.reward:g}", r.response_length] for r in rows],
        right={3, 4},
        indent=4,
    )


def _load(pool: ArchiveManager) -> None:
    def run() -> Any:
        arc = pool.open_archive(f"rollout-{_ROLLOUTS - 1}")
        try:
            return arc.load_samples(sample_key=_SAMPLE_KEY)[0]
        except KeyError as exc:
            raise CliError(one_line(exc)) from exc

    sample, took = _timed(run)
    _step(4, f"load sample {_SAMPLE_KEY!r} of rollout-{_ROLLOUTS - 1} (reads only its chunk)", took)
    prompt_tokens = len(sample.tokens) - sample.response_length
    status = getattr(sample.status, "value", sample.status)
    experts = getattr(sample, "rollout_routed_experts", None)
    echo_fields(
        [
            ("type", type(sample).__name__),
            ("index / group", f"{sample.index} / {sample.group_index}"),
            ("status, reward", f"{status}, {sample.reward}"),
            (
                "tokens",
                f"{len(sample.tokens)} ({prompt_tokens} prompt + {sample.response_length} response)",
            ),
            ("loss_mask", f"{len(sample.loss_mask)} values"),
            (
                "rollout_log_probs",
                f"{len(sample.rollout_log_probs)} values, first {sample.rollout_log_probs[0]:.4f}",
            ),
            ("response", f"{sample.response[:48]!r}..."),
            ("routed experts", _shape(experts) if experts is not None else "-"),
        ],
        indent=4,
    )


def _release(pool: ArchiveManager) -> None:
    name = "rollout-0"
    plan = pool.release_plan(name=name)
    _, took = _timed(lambda: pool.open_archive(name).release())
    _step(5, f"release {name}", took)
    click.echo(f"    its owner {plan.owner} is dropped; its catalog rows stay")
    click.echo(
        f"    nothing else retains {plan.blobs} of its blobs ({human_size(plan.bytes)}): "
        "gc may reclaim them"
    )


def _gc(pool: ArchiveManager) -> None:
    # NOTE: grace 0 only because nothing else writes to this demo pool; the real default
    # (1h) protects blobs that a save in flight has written but not yet committed.
    report, took = _timed(lambda: pool.gc(grace=0))
    _step(6, "garbage collection (grace 0 for the demo; default 1h)", took)
    click.echo(f"    reclaimed {report.blobs} blob(s), {human_size(report.bytes)}")
    try:
        pool.open_archive("rollout-0").load_samples()
    except ArchiveReleasedError:
        click.echo(
            "    loading rollout-0 now raises ArchiveReleasedError; 'show rollout-0' still works"
        )


def _verify(pool: ArchiveManager) -> bool:
    report, took = _timed(lambda: pool.verify(read_data=True))
    _step(7, "verify, rehashing every blob", took)
    status = "ok" if report.ok else f"{len(report.problems)} problem(s)"
    click.echo(
        f"    {status}: {report.blobs_checked} blob(s), {human_size(report.bytes_read)} rehashed, "
        f"{len(report.notices)} notice(s)"
    )
    for finding in report.problems:
        click.echo(f"    problem: {finding.message}")
    return report.ok
