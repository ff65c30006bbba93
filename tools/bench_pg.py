#!/usr/bin/env python3
"""Concurrent savers on one PostgreSQL-backed pool vs the same savers on separate SQLite pools.

``--savers`` processes (default 8) each save ``--archives`` archives of ``--samples``
(default 64) realistic samples (``make_rollout``, WORKLOAD sizes: 1,400-4,200-token responses),
every archive with content of its own:

* **postgresql**: every saver into one pool, whose catalog is a database on a throwaway local
  server (started here as the tests start theirs: ``tests/pgserver.py``);
* **sqlite**: every saver into a pool of its own (its own ``catalog.db``): no saver ever waits
  for another's catalog lock, so this is the ceiling a shared catalog is measured against.

The samples are built before the clock starts; the time is from the moment every saver is
ready (a barrier) until the last one finished.  Prints archives/s, samples/s and errors per
backend and the ratio (target: PostgreSQL >= 70% of the SQLite aggregate), then checks that
every archive saved is listed and that ``verify(read_data=True)`` finds nothing wrong.

    python3 tools/bench_pg.py [--savers 8] [--archives 12] [--samples 64] [--json]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from pgserver import PgServer  # test support, shared with tests/conftest.py

from archive_manager import ArchiveManager
from archive_manager.synthetic import make_rollout

TARGET = 0.70


def _saver(
    root: str,
    url: str | None,
    worker: int,
    archives: int,
    samples: int,
    barrier: Any,
    results: Any,
) -> None:
    outcome: dict[str, Any] = {"worker": worker, "saved": 0, "errors": []}
    try:
        rollouts = [
            make_rollout(samples, seed=worker * 1000 + k, rollout_id=k) for k in range(archives)
        ]
        with ArchiveManager.open(root, catalog_url=url) as pool:
            barrier.wait(timeout=600)
            outcome["start"] = time.time()
            for k, rollout in enumerate(rollouts):
                try:
                    pool.save(f"w{worker}-r{k}", rollout, rollout_id=k)
                    outcome["saved"] += 1
                except Exception:
                    outcome["errors"].append(traceback.format_exc(limit=3))
            outcome["end"] = time.time()
    except BaseException:
        outcome["errors"].append(traceback.format_exc())
    results.put(outcome)


def _run(backend: str, base: Path, server: PgServer, args: argparse.Namespace) -> dict[str, Any]:
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(args.savers)
    results = ctx.Queue()
    url = server.create_database() if backend == "postgresql" else None
    roots = [base / backend / ("shared" if url else f"pool-{w}") for w in range(args.savers)]
    for root in set(roots):  # create (and migrate) every pool before the clock starts
        ArchiveManager.open(root, catalog_url=url).close()
    procs = [
        ctx.Process(
            target=_saver,
            args=(str(roots[w]), url, w, args.archives, args.samples, barrier, results),
        )
        for w in range(args.savers)
    ]
    for proc in procs:
        proc.start()
    outcomes = [results.get(timeout=3600) for _ in procs]
    for proc in procs:
        proc.join(timeout=60)
    errors = [e for o in outcomes for e in o["errors"]]
    saved = sum(o["saved"] for o in outcomes)
    starts = [o["start"] for o in outcomes if "start" in o]
    ends = [o["end"] for o in outcomes if "end" in o]
    seconds = max(ends) - min(starts) if starts and ends else float("nan")

    checked_ok = True
    for root in sorted(set(roots)):
        with ArchiveManager.open(root, catalog_url=url) as pool:
            names = {i.name for i in pool.find()}
            mine = {
                f"w{w}-r{k}"
                for w in range(args.savers)
                if roots[w] == root
                for k in range(args.archives)
            }
            report = pool.verify(read_data=True)
            checked_ok &= names == mine and report.ok
    if url is not None:
        server.drop_database(url)
    return {
        "backend": backend,
        "savers": args.savers,
        "archives": saved,
        "samples": saved * args.samples,
        "seconds": seconds,
        "archives_per_s": saved / seconds,
        "samples_per_s": saved * args.samples / seconds,
        "errors": len(errors),
        "first_error": errors[0] if errors else None,
        "verified": checked_ok,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--savers", type=int, default=8)
    parser.add_argument("--archives", type=int, default=12, help="archives per saver")
    parser.add_argument("--samples", type=int, default=64, help="samples per archive")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()

    base = Path(tempfile.mkdtemp(prefix="am-bench-pg-"))
    try:
        with PgServer.start() as server:
            # SQLite first, then PostgreSQL: neither profits from the other's warm caches more.
            results = [_run(b, base, server, args) for b in ("sqlite", "postgresql")]
    finally:
        shutil.rmtree(base, ignore_errors=True)
    sqlite, pg = results
    ratio = pg["samples_per_s"] / sqlite["samples_per_s"]
    ok = (
        ratio >= TARGET
        and not pg["errors"]
        and not sqlite["errors"]
        and all(r["verified"] for r in results)
    )
    if args.json:
        print(json.dumps({"results": results, "ratio": ratio, "target": TARGET, "ok": ok}))
        return 0 if ok else 1
    print(
        f"{args.savers} savers x {args.archives} archives x {args.samples} samples "
        "(make_rollout, realistic sizes)"
    )
    for r in results:
        where = "one shared pool" if r["backend"] == "postgresql" else "a pool each"
        print(
            f"  {r['backend']:<10} ({where:<15}): {r['archives']:4d} archives in "
            f"{r['seconds']:6.2f} s = {r['archives_per_s']:6.2f} archives/s, "
            f"{r['samples_per_s']:8.1f} samples/s, errors {r['errors']}, "
            f"verify {'ok' if r['verified'] else 'FAILED'}"
        )
        if r["first_error"]:
            print("    first error:", r["first_error"].strip().splitlines()[-1])
    print(
        f"  postgresql / sqlite = {ratio:.0%} (target >= {TARGET:.0%}): {'ok' if ok else 'MISSED'}"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
