#!/usr/bin/env python3
"""Web viewer benchmark: the targets of the viewer issue on a pool of 100 archives of 1024
samples (102,400 samples in the catalog).

Times, through Flask's test client (median of ``--repeat`` warm requests): the pool page,
the statistics over all rollouts (``/stats?format=json&per_page=1000``, one page of up to
1,000 rows, and ``pool.stats()``), an archive page and a sample page; and counts the blob
reads of each page (a sample page must read the one chunk it shows and nothing else; the
others none).

Targets: pool page and stats < 200 ms, archive page < 100 ms, sample page < 50 ms.

The pool is built cheaply: ``--bases`` realistic rollouts (docs/architecture/workload.md "Workload"
shapes: 512-token prompts, 1400-4200-token responses, a routed-expert tensor per sample stored as
its own blob), and every other archive a reference to one of them (it shares their chunks, and has
its own catalog rows: entries and sample metadata).  ``--root`` reuses a pool built before.
"""

from __future__ import annotations

import argparse
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
from archive_manager.interop.synthetic import make_rollout
from archive_manager.web import create_app

TARGETS_MS = {
    "pool page": 200.0,
    "stats (all rollouts)": 200.0,
    "archive page": 100.0,
    "sample page": 50.0,
}


def build(root: Path, archives: int, samples: int, bases: int) -> None:
    """Fill ``root`` with ``archives`` archives of ``samples`` samples (rollout ids 0..)."""
    # A small inline limit turns each sample's routed-expert tensor into a blob of its own,
    # so the sample page's promise (its chunk only, tensors lazy) is measured.
    with ArchiveManager.open(root, inline_limit=4096) as pool:
        sources = []
        for i in range(min(bases, archives)):
            rollout = make_rollout(samples, seed=i, rollout_id=i, r3_layers=1, r3_topk=2)
            sources.append(pool.save(f"rollout-{i:04d}", rollout, rollout_id=i))
        for i in range(len(sources), archives):
            pool.save(f"rollout-{i:04d}", None, rollout_id=i, reference=sources[i % len(sources)])


def _has_archives(root: Path) -> bool:
    if not ArchiveManager.exists(root):
        return False
    with ArchiveManager.open(root, create=False) as pool:
        return bool(pool.find())


def median_ms(fn: Callable[[], Any], repeat: int) -> float:
    fn()  # warm
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--root", type=Path, help="pool to use (built there if it holds none)")
    ap.add_argument("--archives", type=int, default=100)
    ap.add_argument("--samples", type=int, default=1024)
    ap.add_argument("--bases", type=int, default=4, help="archives with payload of their own")
    ap.add_argument("--repeat", type=int, default=25)
    args = ap.parse_args()
    work = None
    root = args.root
    if root is None:
        work = Path(tempfile.mkdtemp(prefix="bench-web-"))
        root = work / "pool"
    try:
        if not _has_archives(root):
            t0 = time.perf_counter()
            build(root, args.archives, args.samples, args.bases)
            print(
                f"built {args.archives} archives x {args.samples} samples in "
                f"{time.perf_counter() - t0:.1f} s at {root}"
            )
        with ArchiveManager.open(root, create=False) as pool:
            return run(pool, args.repeat)
    finally:
        if work is not None:
            shutil.rmtree(work, ignore_errors=True)


def run(pool: ArchiveManager, repeat: int) -> int:
    infos = pool.find()
    total = sum(i.samples for i in infos)
    print(f"pool: {len(infos)} archives, {total:,} samples")
    reads: dict[str, list[int]] = {"get": [], "open": []}
    for method in reads:
        real = getattr(pool.store, method)

        def counted(digest: str, *a: Any, _real: Any = real, _m: str = method, **k: Any) -> Any:
            out = _real(digest, *a, **k)
            reads[_m].append(len(out))
            return out

        setattr(pool.store, method, counted)

    t0 = time.perf_counter()
    pool.stats()
    cold_stats = (time.perf_counter() - t0) * 1e3
    client = create_app(pool).test_client()
    rng = random.Random(0)
    middle = infos[len(infos) // 2]

    def page(url_of: Callable[[], str]) -> Callable[[], None]:
        def fetch() -> None:
            response = client.get(url_of())
            assert response.status_code == 200, (response.status_code, response.text[:300])

        return fetch

    def sample_url() -> str:
        info = infos[rng.randrange(len(infos))]
        return f"/archive/{info.name}/sample/{rng.randrange(info.samples)}"

    cases: list[tuple[str, Callable[[], None]]] = [
        ("pool page", page(lambda: "/")),
        ("stats (all rollouts)", page(lambda: "/stats?format=json&per_page=1000")),
        ("pool.stats() (library)", pool.stats),
        ("archive page", page(lambda: f"/archive/{middle.name}")),
        (
            "archive page, filtered + sorted",
            page(lambda: f"/archive/{middle.name}?status=completed&sort=reward&order=desc"),
        ),
        ("sample page", page(sample_url)),
    ]
    failed = False
    print(f"{'request':34}{'median':>10}{'target':>9}{'blobs read':>12}{'bytes read':>12}")
    for name, fn in cases:
        ms = median_ms(fn, repeat)
        reads["get"].clear()
        reads["open"].clear()
        fn()
        blob_reads = len(reads["get"]) + len(reads["open"])
        read_bytes = sum(reads["get"]) + sum(reads["open"])
        target = TARGETS_MS.get(name)
        # A sample page reads exactly its one chunk (through get), never a tensor blob.
        wanted = 1 if name == "sample page" else 0
        ok = (target is None or ms < target) and len(reads["get"]) == wanted and not reads["open"]
        failed |= not ok
        shown = f"< {target:.0f}" if target else "-"
        print(
            f"{name:34}{ms:7.1f} ms{shown:>9}{blob_reads:>12}{read_bytes / 1e6:>9.2f} MB"
            f"  {'ok' if ok else 'MISSED'}"
        )
    print(f"pool.stats() cold (no cache, first call): {cold_stats:.0f} ms")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
