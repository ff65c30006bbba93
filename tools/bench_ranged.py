"""Benchmark: one-key loads by ranged reads against whole-chunk reads, on S3 and on the local
disk, at several chunk sizes, in one run (docs/architecture/reading.md, "Reading", "Ranged reads of
a few records"; issue 20).

Workload: the 1024-sample rollout of ``tools/bench.py`` saved at each chunk size on a pool on
S3 (a ``juicefs gateway`` on loopback, `tests/s3server.py`) and on a local folder; then
``--loads`` single-key loads (keys spread over the archive) with the ranged path forced on,
then forced off (`Archive._ranged_pays`), twice each.  Prints the median load time per
(chunk size, store, path, round) and the load average.

Run::

    PYTHONPATH=. python tools/bench_ranged.py [--chunk-sizes 256,64,16,4] [--loads 60]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from s3server import S3Server

from archive_manager import ArchiveManager
from archive_manager.interop.synthetic import make_rollout
from archive_manager.pool import archive as archive_mod


def _one_key_ms(pool: ArchiveManager, ranged: bool, loads: int) -> float:
    archive_mod.Archive._ranged_pays = lambda self, size, wanted: ranged  # type: ignore[method-assign]
    arc = pool.open_archive("x")
    keys = [k for k, _ in arc.keys()]
    times = []
    for i in range(loads):
        key = keys[(i * 97) % len(keys)]
        started = time.perf_counter()
        arc.load_samples(sample_key=key)
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chunk-sizes", default="256,64,16,4")
    parser.add_argument("--loads", type=int, default=60)
    args = parser.parse_args()
    samples: list[Any] = make_rollout(1024, seed=1)
    with S3Server.start() as server, tempfile.TemporaryDirectory() as tmp:
        os.environ.update(server.env())
        bucket = server.create_bucket("bench")
        for cs in (int(c) for c in args.chunk_sizes.split(",")):
            for kind, root in (("s3", f"s3://{bucket}/c{cs}"), ("local", f"{tmp}/l{cs}")):
                url = f"sqlite:///{tmp}/{kind}{cs}.db"
                with ArchiveManager.open(root, catalog_url=url, chunk_size=cs) as pool:
                    arc = pool.save("x", samples, rollout_id=1)
                    size = statistics.median(c["size"] for c in arc.chunks())
                    figures = []
                    for _ in range(2):
                        for ranged in (False, True):
                            figures.append(_one_key_ms(pool, ranged, args.loads))
                print(
                    f"chunk_size {cs:4} ({size / 1e3:6.0f} KB) {kind:6} one-key ms, "
                    f"whole/ranged, two rounds: "
                    + "  ".join(f"{f:6.2f}" for f in figures)
                    + f"   load average {os.getloadavg()[0]:.1f}"
                )


if __name__ == "__main__":
    main()
