#!/usr/bin/env python3
"""Scaling: how ``find``, loading one key, ``gc`` and ``verify`` grow with the pool.

Pools of 10, 100 and 1,000 archives (``--sizes``) of 1024 samples each are filled cheaply:
every archive saves the same small samples (the shape of docs/architecture.md "Workload", 4-token prompts, 4-8-token
responses) under its own name, rollout id and task keys (``task_keys=``, one prompt group of 8
per key), so the chunk blobs are stored once and referenced by every archive (a handful of
real blobs), while the catalog holds every archive's own chunks, entries, metadata, owner and
manifest, as a pool of distinct rollouts would.  The pool grows in place from one size to the
next.  At each size, medians of ``--repeat`` runs:

* ``find(task_key=...)`` for the key of one prompt group of a random archive (one match);
* ``open_archive`` + ``load_samples(sample_key=...)`` of one sample of a random archive;
* ``gc()`` with nothing to delete (default grace; every blob is owned);
* ``verify()`` (catalog against the files, no data read).

Each is printed in total and per archive: lookups should stay flat in total, gc and verify
flat per archive.

Run: ``python3 tools/bench_scaling.py [--sizes 10,100,1000] [--quick] [--json FILE]``.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from archive_manager import ArchiveManager
from archive_manager.synthetic import make_rollout

GROUP = 8


def _median_time(fn: Callable[[], Any], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def task_key(archive: int, group: int) -> str:
    return f"rollout-{archive}/group-{group}"


def fill(pool: ArchiveManager, start: int, stop: int, samples: list) -> None:
    """Archives ``start`` .. ``stop - 1``: the same samples, their own names and task keys."""
    for i in range(start, stop):
        keys = [task_key(i, j // GROUP) for j in range(len(samples))]
        pool.save(f"rollout-{i:05d}", samples, rollout_id=i, task_keys=keys)


def measure(pool: ArchiveManager, archives: int, per_archive: int, repeat: int) -> dict:
    rng = random.Random(archives)
    groups = per_archive // GROUP

    def find() -> None:
        i = rng.randrange(archives)
        found = pool.find(task_key=task_key(i, rng.randrange(groups)))
        assert [f.name for f in found] == [f"rollout-{i:05d}"], found

    def load_one() -> None:
        arc = pool.open_archive(f"rollout-{rng.randrange(archives):05d}")
        assert len(arc.load_samples(sample_key=f"sample:{rng.randrange(per_archive)}")) == 1

    def gc() -> None:
        report = pool.gc()
        assert report.blobs == 0, report

    def verify() -> None:
        assert pool.verify().ok

    for warm in (find, load_one, gc, verify):  # connection pool and caches, once
        warm()
    lookups = max(repeat, 15)
    out = {
        "find": _median_time(find, lookups),
        "load_one": _median_time(load_one, lookups),
        "gc": _median_time(gc, repeat),
        "verify": _median_time(verify, repeat),
    }
    return {"archives": archives, "entries": archives * per_archive, "seconds": out}


def report(rows: list[dict]) -> str:
    ops = ("find", "load_one", "gc", "verify")
    head = f"{'archives':>9}{'entries':>11}" + "".join(
        f"{op + ' total':>16}{'per archive':>13}" for op in ops
    )
    lines = [head]
    for row in rows:
        n = row["archives"]
        cells = "".join(
            f"{row['seconds'][op] * 1e3:13.2f} ms{row['seconds'][op] / n * 1e6:10.1f} us"
            for op in ops
        )
        lines.append(f"{n:9d}{row['entries']:11,d}{cells}")
    first, last = rows[0], rows[-1]
    growth = last["archives"] / first["archives"]
    lines.append(
        f"from {first['archives']} to {last['archives']} archives ({growth:.0f}x): "
        + ", ".join(
            f"{op} {last['seconds'][op] / first['seconds'][op]:.1f}x in total, "
            f"{last['seconds'][op] / last['archives'] / (first['seconds'][op] / first['archives']):.2f}x"
            " per archive"
            for op in ops
        )
    )
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--sizes", default="10,100,1000", help="pool sizes in archives, ascending")
    ap.add_argument("--samples", type=int, default=1024, help="samples per archive")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="pools of 2 and 6 archives of 64 samples")
    ap.add_argument("--dir", type=Path, default=None, help="work folder (default: a temp dir)")
    ap.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = ap.parse_args()
    if args.quick:
        args.sizes, args.samples, args.repeat = "2,6", 64, 1
    try:
        sizes = [int(s) for s in args.sizes.split(",")]
    except ValueError:
        ap.error("--sizes takes comma-separated integers")
    if sizes != sorted(sizes) or sizes[0] < 1 or args.samples < GROUP or args.repeat < 1:
        ap.error("--sizes must ascend from >= 1; --samples >= 8; --repeat >= 1")
    samples = make_rollout(args.samples, seed=1, prompt_len=4, response_min=4, response_max=8)
    work = Path(tempfile.mkdtemp(prefix="bench-scaling-", dir=args.dir))
    rows = []
    try:
        with ArchiveManager.open(work / "pool") as pool:
            filled = 0
            for size in sizes:
                t0 = time.perf_counter()
                fill(pool, filled, size, samples)
                print(
                    f"filled to {size} archives in {time.perf_counter() - t0:.1f} s",
                    file=sys.stderr,
                )
                filled = size
                rows.append(measure(pool, size, args.samples, args.repeat))
            blobs = sum(pool.info().blobs.values())
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(
        f"pools of {', '.join(map(str, sizes))} archives of {args.samples} samples sharing "
        f"their chunk blobs ({blobs} blobs at the end); medians of {args.repeat} runs "
        f"(lookups: of {max(args.repeat, 15)} random keys)"
    )
    print(report(rows))
    if args.json:
        args.json.write_text(json.dumps({"samples": args.samples, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
