#!/usr/bin/env python3
"""Arrow reads of some columns against a whole read (docs/architecture/getting-data-out.md, "Getting
data out", "Columns from the catalog").

Saves realistic rollouts (``archive_manager.interop.synthetic``: 512-token prompts,
1400-4200-token responses; ``--sizes`` samples each, one archive per size, streamed through
`pool.writer` 64 samples at a time), then times, by turns in one process after a warm-up,
medians of ``--repeat``:

* ``pool.arrow_reader(names=[archive]).read_all()``: every column (the whole read);
* ``pool.arrow_reader(names=[archive], columns=C).read_all()`` for ``C`` = ``reward``,
  ``status``, the keys (``sample_key``, ``task_key``), ``reward`` + ``status`` + keys
  (catalog columns: no chunk read), ``response_length`` (idem), ``tokens`` and
  ``prompt`` (chunk columns: only that field decoded);

and checks that each gives the whole read's columns.  Prints seconds and the ratio to the
whole read.

    python3 tools/bench_arrow_columns.py [--sizes 1024,8192] [--repeat 3] [--root DIR] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

READS: dict[str, list[str] | None] = {
    "whole": None,
    "reward": ["reward"],
    "status": ["status"],
    "keys": ["sample_key", "task_key"],
    "reward+status+keys": ["reward", "status", "sample_key", "task_key"],
    "response_length": ["response_length"],
    "tokens": ["tokens"],
    "prompt": ["prompt"],
}


def save(pool: Any, name: str, samples: int) -> None:
    from archive_manager.interop.synthetic import make_rollout

    with pool.writer(name, rollout_id=samples) as writer:
        for start in range(0, samples, 64):
            for s in make_rollout(min(64, samples - start), seed=start):
                s.index += start
                writer.add(s)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1024,8192", help="samples per archive, comma-separated")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--root", type=Path, help="work folder (default: a temp folder)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    from archive_manager import ArchiveManager

    sizes = [int(n) for n in args.sizes.split(",")]
    figures: dict[str, Any] = {}
    with (
        tempfile.TemporaryDirectory(dir=args.root) as work,
        ArchiveManager.open(Path(work) / "pool") as pool,
    ):
        for n in sizes:
            save(pool, f"rollout-{n}", n)
        for n in sizes:
            name = f"rollout-{n}"
            whole = pool.arrow_reader(names=[name]).read_all()  # warm-up, and the reference
            times: dict[str, list[float]] = {k: [] for k in READS}
            for _ in range(args.repeat):
                for label, columns in READS.items():  # by turns: load hits all alike
                    start = time.perf_counter()
                    table = pool.arrow_reader(names=[name], columns=columns).read_all()
                    times[label].append(time.perf_counter() - start)
                    expected = whole.select(table.schema.names)
                    assert table.equals(expected), f"{label} differs from the whole read"
            medians = {k: statistics.median(v) for k, v in times.items()}
            figures[name] = {
                "samples": n,
                "seconds": medians,
                "x_faster": {k: medians["whole"] / v for k, v in medians.items()},
            }
    if args.json:
        print(json.dumps(figures, indent=2))
        return
    for name, fig in figures.items():
        print(f"{name}: {fig['samples']} samples, median of {args.repeat}")
        for label, seconds in fig["seconds"].items():
            print(f"  {label:<20} {seconds * 1000:9.1f} ms  {fig['x_faster'][label]:7.1f}x")


if __name__ == "__main__":
    main()
