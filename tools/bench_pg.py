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

Rounds alternate (sqlite, postgresql, sqlite, ...) so that neither backend always runs on
the warmer machine; the totals add every round up.  The server is durable (fsync and
synchronous commit on, as in production; SQLite's catalogs run with ``synchronous=FULL``).

    python3 tools/bench_pg.py [--savers 8] [--archives 24] [--samples 64] [--rounds 2] [--json]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
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
from archive_manager.interop.synthetic import make_rollout

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


def _run(
    backend: str, base: Path, server: PgServer, args: argparse.Namespace, round_: int
) -> dict[str, Any]:
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(args.savers)
    results = ctx.Queue()
    url = server.create_database() if backend == "postgresql" else None
    roots = [
        base / f"{backend}-{round_}" / ("shared" if url else f"pool-{w}")
        for w in range(args.savers)
    ]
    for root in set(roots):  # create (and migrate) every pool before the clock starts
        ArchiveManager.open(root, catalog_url=url).close()
    # NOTE: the previous run's blob files are still being written back; flushed now, they do
    # not slow down this run's fsyncs (that made whichever backend ran second look slower).
    os.sync()
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

    verified = True
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
            verified &= names == mine and report.ok
    if url is not None:
        server.drop_database(url)
    shutil.rmtree(base / f"{backend}-{round_}", ignore_errors=True)
    return _summary(backend, f"round {round_ + 1}", saved, args.samples, seconds, errors, verified)


def _summary(
    backend: str,
    label: str,
    archives: int,
    samples_per_archive: int,
    seconds: float,
    errors: list[str],
    verified: bool,
) -> dict[str, Any]:
    return {
        "backend": backend,
        "label": label,
        "archives": archives,
        "samples": archives * samples_per_archive,
        "seconds": seconds,
        "archives_per_s": archives / seconds,
        "samples_per_s": archives * samples_per_archive / seconds,
        "errors": len(errors),
        "error_messages": errors,
        "verified": verified,
    }


def _total(rounds: list[dict[str, Any]], samples_per_archive: int) -> dict[str, Any]:
    return _summary(
        rounds[0]["backend"],
        "total",
        sum(r["archives"] for r in rounds),
        samples_per_archive,
        sum(r["seconds"] for r in rounds),
        [e for r in rounds for e in r["error_messages"]],
        all(r["verified"] for r in rounds),
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--savers", type=int, default=8)
    parser.add_argument("--archives", type=int, default=24, help="archives per saver and round")
    parser.add_argument("--samples", type=int, default=64, help="samples per archive")
    parser.add_argument("--rounds", type=int, default=2, help="rounds per backend")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()

    base = Path(tempfile.mkdtemp(prefix="am-bench-pg-"))
    try:
        with PgServer.start(durable=True) as server:
            rounds = [
                _run(backend, base, server, args, round_)
                for round_ in range(args.rounds)
                for backend in ("sqlite", "postgresql")
            ]
    finally:
        shutil.rmtree(base, ignore_errors=True)
    sqlite, pg = (
        _total([r for r in rounds if r["backend"] == b], args.samples)
        for b in ("sqlite", "postgresql")
    )
    ratio = pg["samples_per_s"] / sqlite["samples_per_s"]
    ok = ratio >= TARGET and not pg["errors"] and not sqlite["errors"]
    ok = ok and sqlite["verified"] and pg["verified"]
    if args.json:
        print(json.dumps({"rounds": rounds, "totals": [sqlite, pg], "ratio": ratio, "ok": ok}))
        return 0 if ok else 1
    print(
        f"{args.savers} savers x {args.archives} archives x {args.samples} samples "
        f"(make_rollout, realistic sizes), {args.rounds} round(s) per backend"
    )
    for r in [*rounds, sqlite, pg]:
        where = "one shared pool" if r["backend"] == "postgresql" else "a pool each"
        print(
            f"  {r['label']:<8} {r['backend']:<10} ({where:<15}): {r['archives']:4d} archives "
            f"in {r['seconds']:6.2f} s = {r['archives_per_s']:6.2f} archives/s, "
            f"{r['samples_per_s']:8.1f} samples/s, errors {r['errors']}, "
            f"verify {'ok' if r['verified'] else 'FAILED'}"
        )
        if r["error_messages"] and r["label"] == "total":
            print("    first error:", r["error_messages"][0].strip().splitlines()[-1])
    verdict = "ok" if ok else "MISSED"
    print(f"  postgresql / sqlite = {ratio:.0%} (target >= {TARGET:.0%}, no errors): {verdict}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
