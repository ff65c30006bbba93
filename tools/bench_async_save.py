#!/usr/bin/env python3
"""How long `pool.save_async` blocks the training loop, against a synchronous `pool.save`
(docs/performance.md, "Saving in the background").

On the realistic rollout (``make_rollout(1024)``, docs/architecture/workload.md "Workload"), each
round times, in one process:

* ``pool.save``: the whole synchronous save;
* ``pool.save_async``: the time until it returns (the caller is blocked that long), and until
  its future resolves (end to end);
* the snapshots a background save could take on the caller's thread, without saving:
  ``prepare`` (what `save_async` does: every sample encoded, its values copied, and
  described, `writer.prepare_sample`), ``copy`` (a structural copy: every list, dict, tensor
  and array copied, each sample object copied) and ``numbers`` (only reading every number of
  every numeric list once, `codec._native.numbers`: a floor for any snapshot of those lists).

Before each timed save the previous archive is released and collected (``gc(grace=0)``) and
``os.sync()`` runs, untimed, so every save writes its blobs anew; the order of the two saves
alternates between rounds.  Medians of ``--rounds`` are printed with the load average before
and after.  Beside wall time, CPU time: the process's during a synchronous save (every thread
of it), the caller thread's during ``save_async`` and each snapshot; on a machine shared with
other jobs the CPU figures are the steadier ones (wall time then counts the waits for a core).

    python3 tools/bench_async_save.py [--samples 1024] [--rounds 5] [--root DIR] [--json]
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from archive_manager import ArchiveManager  # noqa: E402
from archive_manager.codec.values import gc_paused  # noqa: E402
from archive_manager.interop.synthetic import make_rollout  # noqa: E402
from archive_manager.pool.writer import prepare_sample  # noqa: E402


def structural_copy(value: Any) -> Any:
    """A copy sharing nothing mutable with ``value`` (the "copy" snapshot)."""
    kind = type(value)
    if kind is list:
        if value and type(value[0]) in (int, float):
            return value.copy()  # numbers are immutable: the list is what must be copied
        return [structural_copy(v) for v in value]
    if kind is dict:
        return {k: structural_copy(v) for k, v in value.items()}
    if kind is tuple:
        return tuple(structural_copy(v) for v in value)
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, np.ndarray):
        return value.copy()
    if hasattr(value, "__dict__") and not isinstance(value, type):
        other = copy.copy(value)
        other.__dict__ = structural_copy(value.__dict__)
        return other
    return value


def read_numbers(samples: list[Any]) -> None:
    from archive_manager.codec._accel import native_numbers as numbers

    if numbers is None:
        raise SystemExit("the C extension is not built: no 'numbers' floor")
    for sample in samples:
        for value in vars(sample).values():
            if type(value) is list and value:
                numbers(value)


def timed(
    fn: Callable[[], Any], cpu: Callable[[], float] = time.thread_time
) -> tuple[float, float]:
    """Wall and CPU seconds of ``fn()`` (CPU by ``cpu``: this thread's by default)."""
    start, start_cpu = time.perf_counter(), cpu()
    fn()
    return time.perf_counter() - start, cpu() - start_cpu


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--samples", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument(
        "--root", type=Path, default=None, help="where its temp pool goes (default: the system's)"
    )
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = ap.parse_args(argv)

    samples = make_rollout(args.samples, seed=1)
    load_before = os.getloadavg()
    base = Path(tempfile.mkdtemp(prefix="bench-async-", dir=args.root))
    keys = ("save", "blocked", "async_total", "prepare", "copy", "numbers")
    times: dict[str, list[float]] = {k: [] for k in keys}
    cpu: dict[str, list[float]] = {k: [] for k in keys if k != "async_total"}
    with ArchiveManager.open(base / "pool") as pool:

        def fresh() -> None:
            for info in pool.find():
                pool.open_archive(info.name).release()
            pool.gc(grace=0)
            os.sync()

        def sync_save(r: int) -> None:
            fresh()
            wall, used = timed(
                lambda: pool.save(f"s{r}", samples, rollout_id=r), cpu=time.process_time
            )
            times["save"].append(wall)
            cpu["save"].append(used)

        def async_save(r: int) -> None:
            fresh()
            start, start_cpu = time.perf_counter(), time.thread_time()
            future = pool.save_async(f"a{r}", samples, rollout_id=r)
            times["blocked"].append(time.perf_counter() - start)
            cpu["blocked"].append(time.thread_time() - start_cpu)
            future.result()
            times["async_total"].append(time.perf_counter() - start)

        def prepare() -> None:
            with gc_paused():
                for i, sample in enumerate(samples):
                    prepare_sample(pool.context, sample, i)

        def structural() -> None:
            with gc_paused():
                structural_copy(samples)

        for r in range(args.rounds):
            for save in (sync_save, async_save) if r % 2 == 0 else (async_save, sync_save):
                save(r)
            for key, fn in (
                ("prepare", prepare),
                ("copy", structural),
                ("numbers", lambda: read_numbers(samples)),
            ):
                wall, used = timed(fn)
                times[key].append(wall)
                cpu[key].append(used)
    shutil.rmtree(base)
    load_after = os.getloadavg()
    medians = {k: statistics.median(v) for k, v in times.items()}
    cpu_medians = {k: statistics.median(v) for k, v in cpu.items()}
    figures = {
        "samples": args.samples,
        "rounds": args.rounds,
        "load_before": load_before,
        "load_after": load_after,
        "median_seconds": medians,
        "median_cpu_seconds": cpu_medians,
        "seconds": times,
        "cpu_seconds": cpu,
        "blocked_share": medians["blocked"] / medians["save"],
        "blocked_cpu_share": cpu_medians["blocked"] / cpu_medians["save"],
    }
    if args.json:
        print(json.dumps(figures, indent=2))
        return 0
    print(
        f"realistic rollout of {args.samples} samples, medians of {args.rounds}; load average "
        f"{load_before[0]:.1f} before, {load_after[0]:.1f} after"
    )
    save, save_cpu = medians["save"], cpu_medians["save"]
    rows = [
        ("pool.save (synchronous)", "save"),
        ("pool.save_async: caller blocked", "blocked"),
        ("pool.save_async: until its future resolves", "async_total"),
        ("snapshot 'prepare' (what save_async takes)", "prepare"),
        ("snapshot 'copy' (lists, dicts, tensors copied)", "copy"),
        ("floor: reading every number once", "numbers"),
    ]
    print(f"{'':48}{'wall':>9}  {'of a save':>9}  {'CPU':>9}  {'of a save':>9}")
    for label, key in rows:
        line = f"{label:48}{medians[key] * 1e3:6.1f} ms  {medians[key] / save:9.1%}"
        if key in cpu_medians:
            line += f"  {cpu_medians[key] * 1e3:6.1f} ms  {cpu_medians[key] / save_cpu:9.1%}"
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
