#!/usr/bin/env python3
"""What the retention journal costs a decision (docs/architecture/retention-journal.md, "Retention
journal").

Times `retain`, `Archive.release` and `release_owner` on a pool of small archives, and, in the
same calls, the part spent writing the journal record (the file, its two fsyncs); counts the
fsyncs per decision; times a checkpoint and a rebuild of a lost catalog from the journal.

    python3 tools/bench_journal.py [--archives 200] [--root DIR] [--catalog-url URL] [--json F]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from archive_manager import ArchiveManager
from archive_manager.pool import journal as journal_module


class Meter:
    """Wraps `Journal.write` and `os.fsync` to attribute time and fsyncs to the journal."""

    def __init__(self) -> None:
        self.write_seconds: list[float] = []
        self.fsyncs = 0
        self._write = journal_module.Journal.write
        self._fsync = os.fsync

    def __enter__(self) -> Meter:
        meter = self

        def write(journal: Any, staged: Any) -> None:
            started = time.perf_counter()
            meter._write(journal, staged)
            meter.write_seconds.append(time.perf_counter() - started)

        def fsync(fd: int) -> None:
            meter.fsyncs += 1
            meter._fsync(fd)

        journal_module.Journal.write = write  # type: ignore[method-assign]
        os.fsync = fsync
        return self

    def __exit__(self, *exc: Any) -> None:
        journal_module.Journal.write = self._write  # type: ignore[method-assign]
        os.fsync = self._fsync


def _ms(values: list[float]) -> float:
    return round(statistics.median(values) * 1e3, 3)


def run(root: Path, url: str | None, archives: int) -> dict[str, Any]:
    out: dict[str, Any] = {"archives": archives, "catalog": "postgresql" if url else "sqlite"}
    with ArchiveManager.open(root, url) as pool:
        for i in range(archives):
            pool.save(f"r{i}", [{"tokens": [i, i + 1], "reward": float(i)}], rollout_id=i)
        for what, call in (
            ("retain", lambda i: pool.retain("checkpoint:bench", f"r{i}")),
            ("release", lambda i: pool.open_archive(f"r{i}").release()),
        ):
            totals: list[float] = []
            with Meter() as meter:
                for i in range(archives):
                    started = time.perf_counter()
                    call(i)
                    totals.append(time.perf_counter() - started)
            out[what] = {
                "median_ms": _ms(totals),
                "journal_write_median_ms": _ms(meter.write_seconds),
                "fsyncs_per_decision": meter.fsyncs / archives,
            }
        with Meter() as meter:
            started = time.perf_counter()
            pool.release_owner("checkpoint:bench")
            out["release_owner_of_all"] = {
                "ms": round((time.perf_counter() - started) * 1e3, 3),
                "journal_write_ms": round(sum(meter.write_seconds) * 1e3, 3),
            }
        started = time.perf_counter()
        journal_module.checkpoint(pool.catalog, pool.journal, pool.clock)
        out["checkpoint_ms"] = round((time.perf_counter() - started) * 1e3, 3)
        sizes = [p.stat().st_size for p in (root / "journal").iterdir()]
        out["journal_bytes"] = sum(sizes)
    if url is None:
        for path in root.glob("catalog.db*"):
            path.unlink()
        started = time.perf_counter()
        with ArchiveManager.open(root, recover=True) as pool:
            report = pool.rebuild_catalog()
        out["rebuild_ms"] = round((time.perf_counter() - started) * 1e3, 3)
        out["rebuild_restored"] = len(report.archives)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--archives", type=int, default=200)
    parser.add_argument("--root", type=Path)
    parser.add_argument("--catalog-url")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-journal-", dir=args.root))
    try:
        result = run(work / "pool", args.catalog_url, args.archives)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    text = json.dumps(result, indent=2)
    print(text)
    if args.json is not None:
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
