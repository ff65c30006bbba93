#!/usr/bin/env python3
"""Parquet export benchmark: `ArchiveManager.export` against the obvious hand-written path.

Workload (docs/architecture/workload.md "Workload", seeded): the realistic 1024-sample rollout of
`make_rollout` (groups of 8 sharing a 512-token prompt, responses 1400-4200 tokens).

Measured in one run, each path in its own fresh process (so peak memory is its own), median
of ``--repeat`` runs after one untimed warm-up run:
  * archive_manager: ``pool.export(name, "x.parquet")`` (chunk by chunk, numeric lists as
    Arrow list columns built from the stored arrays);
  * hand-written: ``arc.load_samples()``, ``Sample.to_dict()`` per sample,
    ``pyarrow.Table.from_pylist`` + ``pyarrow.parquet.write_table``.  As written that path
    fails on slime's empty ``apply_chat_template_kwargs`` dict ("Cannot write struct type
    ... with no child field"); the benchmark gives it the fix a user would make (that field
    as JSON text) and reports the failure.
Peak memory: the process's peak RSS (ru_maxrss) above its RSS before the export, with the
same modules imported and the same pool open on both sides.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

NAME = "rollout-0"


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _cpu() -> float:
    """CPU seconds of this process, every thread's (the export reads and writes on two)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _child(path: str, root: Path, out: Path, repeat: int) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from archive_manager import ArchiveManager

    times, cpus = [], []
    with ArchiveManager.open(root, read_only=True) as pool:
        arc = pool.open_archive(NAME)
        base = _rss_mib()
        failure = None
        for run in range(repeat + 1):  # run 0 warms up (imports, codecs, page cache): untimed
            t0, c0 = time.perf_counter(), _cpu()
            if path == "archive_manager":
                pool.export(NAME, out, overwrite=True)
            else:
                rows = [s.to_dict() for s in arc.load_samples()]
                try:
                    pq.write_table(pa.Table.from_pylist(rows), out)
                except pa.ArrowNotImplementedError as exc:
                    failure = str(exc).splitlines()[0]
                    for row in rows:
                        row["apply_chat_template_kwargs"] = json.dumps(
                            row["apply_chat_template_kwargs"]
                        )
                    pq.write_table(pa.Table.from_pylist(rows), out)
                del rows
            if run:
                times.append(time.perf_counter() - t0)
                cpus.append(_cpu() - c0)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    table = pq.read_table(out, columns=["tokens"])
    print(
        json.dumps(
            {
                "seconds": times,
                "cpu_seconds": cpus,
                "peak_mib": peak - base,
                "rows": table.num_rows,
                "tokens": int(
                    pa.compute.sum(pa.compute.list_value_length(table["tokens"])).as_py()
                ),
                "bytes": out.stat().st_size,
                "failure": failure,
            }
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=1024)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=None, help="work folder (default: a temp one)")
    parser.add_argument("--json", type=Path, default=None, help="write the figures here too")
    parser.add_argument(
        "--child", choices=["archive_manager", "hand-written"], help=argparse.SUPPRESS
    )
    parser.add_argument("--root", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args.child, args.root, args.out, args.repeat)
        return
    from archive_manager import ArchiveManager
    from archive_manager.interop.synthetic import make_rollout

    work = Path(tempfile.mkdtemp(prefix="bench-export-", dir=args.dir))
    try:
        with ArchiveManager.open(work / "pool") as pool:
            pool.save(NAME, make_rollout(args.samples, seed=0), rollout_id=0)
        results = {}
        for path in ("archive_manager", "hand-written"):
            done = subprocess.run(
                [sys.executable, __file__, "--child", path, "--root", str(work / "pool"),
                 "--out", str(work / f"{path}.parquet"), "--repeat", str(args.repeat)],
                capture_output=True, text=True, check=False,
            )  # fmt: skip
            if done.returncode != 0:
                sys.exit(f"{path} failed:\n{done.stderr}")
            results[path] = json.loads(done.stdout.strip().splitlines()[-1])
        ours, hand = results["archive_manager"], results["hand-written"]
        assert ours["rows"] == hand["rows"] == args.samples and ours["tokens"] == hand["tokens"]
        t_ours, t_hand = statistics.median(ours["seconds"]), statistics.median(hand["seconds"])
        c_ours, c_hand = (
            statistics.median(ours["cpu_seconds"]),
            statistics.median(hand["cpu_seconds"]),
        )
        print(
            f"== Parquet export of a {args.samples}-sample realistic rollout (median of {args.repeat})"
        )
        for label, r, t, c in (
            ("archive_manager", ours, t_ours, c_ours),
            ("hand-written", hand, t_hand, c_hand),
        ):
            print(
                f"{label:16s} {t:7.3f} s wall {c:7.3f} s CPU   peak +{r['peak_mib']:7.1f} MiB   "
                f"file {r['bytes'] / 2**20:6.1f} MiB"
            )
        print(
            f"speed-up {t_hand / t_ours:.1f}x wall, {c_hand / c_ours:.1f}x CPU; peak memory "
            f"{ours['peak_mib'] / hand['peak_mib']:.2f}x of the hand-written path's"
        )
        if hand["failure"]:
            print(f"(the hand-written path as written fails: {hand['failure']})")
        if args.json:
            args.json.write_text(
                json.dumps(
                    {
                        "results": results,
                        "speedup": t_hand / t_ours,
                        "cpu_speedup": c_hand / c_ours,
                    },
                    indent=2,
                )
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
