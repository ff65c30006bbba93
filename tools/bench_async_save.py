#!/usr/bin/env python3
"""How long `pool.save_async` blocks the training loop, against a synchronous `pool.save`,
and how much the save it hands off slows a loop running beside it (docs/performance.md,
"Saving in the background").

On the realistic rollout (``make_rollout(1024)``, docs/architecture/workload.md "Workload"), each
round times, in one process:

* ``pool.save``: the whole synchronous save;
* ``pool.save_async``: the time until it returns (the caller is blocked that long), and until
  its future resolves (end to end);
* the same with a CPU-bound Python loop run right after the call until the future resolves:
  the loop's speed against the same loop alone (the worker holds the GIL while it encodes);
* the snapshots, without saving: ``take`` (what `save_async` takes now,
  `codec.snapshot.take_samples`: the copy, each numeric list converted to its array on
  ``codec.snapshot.THREADS`` threads), ``prepare`` (what it took before: every sample encoded
  on the caller's thread, `writer.prepare_sample`), and two floors: ``numbers`` (only reading
  every number of every numeric list once, `codec._native.numbers`, one thread: the least any
  snapshot of those lists costs on one thread) and ``fill`` (converting the same lists on the
  snapshot's threads alone, batch by batch as the snapshot converts them, without the rest of
  the copy).

Before each timed save the previous archive is released and collected (``gc(grace=0)``) and
``os.sync()`` runs, untimed, so every save writes its blobs anew; the order of the saves
alternates between rounds.  Medians of ``--rounds`` are printed with the load average before
and after.  Beside wall time, CPU time: the process's during a synchronous save (every thread
of it), the caller thread's and the process's during ``save_async`` and each snapshot; on a
machine shared with other jobs the CPU figures are the steadier ones (wall time then counts
the waits for a core).  And the process's minor page faults during ``save_async`` and each
snapshot (memory written for the first time since the system gave it to the process).

    python3 tools/bench_async_save.py [--samples 1024] [--rounds 5] [--root DIR] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
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

from archive_manager import ArchiveManager  # noqa: E402
from archive_manager.codec import snapshot  # noqa: E402
from archive_manager.codec.values import TakenList, gc_paused  # noqa: E402
from archive_manager.interop.synthetic import make_rollout  # noqa: E402
from archive_manager.pool import background  # noqa: E402
from archive_manager.pool.writer import prepare_sample  # noqa: E402


def numeric_lists(samples: list[Any]) -> list[list[Any]]:
    return [v for sample in samples for v in vars(sample).values() if type(v) is list and v]


def read_numbers(lists: list[list[Any]]) -> None:
    from archive_manager.codec._accel import native_numbers as numbers

    if numbers is None:
        raise SystemExit("the C extension is not built: no 'numbers' floor")
    for value in lists:
        numbers(value)


def fill_lists(batches: list[list[list[Any]]]) -> None:
    for lists in batches:
        pending = []
        for value in lists:
            taken = TakenList()
            taken.length = len(value)
            pending.append((value, taken))
        snapshot.fill(pending)


def spin(n: int = 200_000) -> int:
    """A CPU-bound step of pure Python (a training loop's own work, holding the GIL)."""
    total = 0
    for i in range(n):
        total += i * i
    return total


def faults() -> int:
    """The process's minor page faults so far."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


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
    lists = numeric_lists(samples)
    # the lists of each batch the snapshot takes at a time, as it converts them
    batches = [
        numeric_lists(samples[i : i + background._BATCH])
        for i in range(0, len(samples), background._BATCH)
    ]
    load_before = os.getloadavg()
    base = Path(tempfile.mkdtemp(prefix="bench-async-", dir=args.root))
    keys = ("save", "blocked", "async_total", "beside_total", "take", "prepare", "numbers", "fill")
    times: dict[str, list[float]] = {k: [] for k in keys}
    cpu: dict[str, list[float]] = {
        k: [] for k in ("save", "blocked", "take", "prepare", "numbers", "fill")
    }
    process: dict[str, list[float]] = {k: [] for k in ("blocked", "take", "fill")}
    faulted: dict[str, list[float]] = {k: [] for k in ("blocked", "take", "numbers", "fill")}
    steps: dict[str, list[float]] = {"alone": [], "beside": []}
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
            start_faults = faults()
            start, start_cpu, start_process = (
                time.perf_counter(),
                time.thread_time(),
                time.process_time(),
            )
            future = pool.save_async(f"a{r}", samples, rollout_id=r)
            times["blocked"].append(time.perf_counter() - start)
            faulted["blocked"].append(faults() - start_faults)
            cpu["blocked"].append(time.thread_time() - start_cpu)
            process["blocked"].append(time.process_time() - start_process)
            future.result()
            times["async_total"].append(time.perf_counter() - start)

        def beside(r: int) -> None:
            """A loop of `spin` steps from the call until the future resolves."""
            fresh()
            for _ in range(5):
                steps["alone"].append(timed(spin)[0])
            start = time.perf_counter()
            future = pool.save_async(f"b{r}", samples, rollout_id=r)
            while True:  # one step at least: a tiny save may be done at once
                steps["beside"].append(timed(spin)[0])
                if future.done():
                    break
            future.result()
            times["beside_total"].append(time.perf_counter() - start)

        def take() -> None:
            with gc_paused():
                for i in range(0, len(samples), background._BATCH):  # as save_async takes them
                    snapshot.take_samples(samples[i : i + background._BATCH])

        def prepare() -> None:
            with gc_paused():
                for i, sample in enumerate(samples):
                    prepare_sample(pool.context, sample, i)

        saves = (sync_save, async_save, beside)
        for r in range(args.rounds):
            for save in saves if r % 2 == 0 else saves[::-1]:
                save(r)
            for key, fn in (
                ("take", take),
                ("prepare", prepare),
                ("numbers", lambda: read_numbers(lists)),
                ("fill", lambda: fill_lists(batches)),
            ):
                start_process, start_faults = time.process_time(), faults()
                wall, used = timed(fn)
                if key in faulted:
                    faulted[key].append(faults() - start_faults)
                times[key].append(wall)
                cpu[key].append(used)
                if key in process:
                    process[key].append(time.process_time() - start_process)
    shutil.rmtree(base)
    load_after = os.getloadavg()
    medians = {k: statistics.median(v) for k, v in times.items()}
    cpu_medians = {k: statistics.median(v) for k, v in cpu.items()}
    process_medians = {k: statistics.median(v) for k, v in process.items()}
    fault_medians = {k: statistics.median(v) for k, v in faulted.items()}
    step_medians = {k: statistics.median(v) for k, v in steps.items()}
    figures = {
        "samples": args.samples,
        "rounds": args.rounds,
        "threads": snapshot.THREADS,
        "load_before": load_before,
        "load_after": load_after,
        "median_seconds": medians,
        "median_cpu_seconds": cpu_medians,
        "median_process_cpu_seconds": process_medians,
        "median_page_faults": fault_medians,
        "median_step_seconds": step_medians,
        "seconds": times,
        "cpu_seconds": cpu,
        "blocked_share": medians["blocked"] / medians["save"],
        "blocked_cpu_share": cpu_medians["blocked"] / cpu_medians["save"],
        "loop_slowdown": step_medians["beside"] / step_medians["alone"],
    }
    if args.json:
        print(json.dumps(figures, indent=2))
        return 0
    print(
        f"realistic rollout of {args.samples} samples, medians of {args.rounds}; "
        f"{snapshot.THREADS} snapshot threads; load average {load_before[0]:.1f} before, "
        f"{load_after[0]:.1f} after"
    )
    save, save_cpu = medians["save"], cpu_medians["save"]
    rows = [
        ("pool.save (synchronous)", "save"),
        ("pool.save_async: caller blocked", "blocked"),
        ("pool.save_async: until its future resolves", "async_total"),
        ("  the same, a CPU-bound loop beside it", "beside_total"),
        ("snapshot 'take' (what save_async takes)", "take"),
        ("snapshot 'prepare' (what it took before)", "prepare"),
        ("floor: reading every number once, 1 thread", "numbers"),
        ("floor: the numeric lists alone, its threads", "fill"),
    ]
    print(
        f"{'':48}{'wall':>9}  {'of a save':>9}  {'CPU':>9}  {'of a save':>9}  {'process':>9}"
        f"  {'faults':>7}"
    )
    for label, key in rows:
        line = f"{label:48}{medians[key] * 1e3:6.1f} ms  {medians[key] / save:9.1%}"
        if key in cpu_medians:
            line += f"  {cpu_medians[key] * 1e3:6.1f} ms  {cpu_medians[key] / save_cpu:9.1%}"
        if key in process_medians:
            line += f"  {process_medians[key] * 1e3:6.1f} ms"
        elif key in fault_medians:
            line += " " * 11
        if key in fault_medians:
            line += f"  {fault_medians[key]:7.0f}"
        print(line)
    print(
        f"a CPU-bound loop's step: {step_medians['alone'] * 1e3:.1f} ms alone, "
        f"{step_medians['beside'] * 1e3:.1f} ms while the background save runs "
        f"({figures['loop_slowdown']:.2f}x)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
