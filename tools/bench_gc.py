#!/usr/bin/env python3
"""GC and verify at scale: a pool of ``--blobs`` blobs (default 100,000).

The pool is filled cheaply: archives of small samples, each with one distinct int32 tensor
stored as its own blob (``inline_limit=0``), so every sample adds one blob.  Then, in one run:

* ``pool.gc()`` with nothing to delete (default grace: everything is owned anyway);
* ``pool.verify()`` (catalog against file listing, no data read);
* ``pool.verify(read_data=True)`` against a plain loop that reads every blob file and hashes it
  with xxh3-128 (the speed limit of rehashing).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch
import xxhash

from archive_manager import ArchiveManager, Sample


def fill(pool: ArchiveManager, blobs: int, per_archive: int) -> int:
    made = 0
    archive = 0
    while made < blobs:
        n = min(per_archive, blobs - made)
        samples = []
        for i in range(n):
            k = made + i
            s = Sample(index=k, tokens=[k % 1000] * 8, response_length=4, loss_mask=[1] * 4)
            s.extra = torch.full((64,), k, dtype=torch.int32)  # 256 bytes, a blob of its own
            samples.append(s)
        pool.save(f"a{archive:05d}", samples, rollout_id=archive)
        made += n
        archive += 1
    return archive


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--blobs", type=int, default=100_000)
    ap.add_argument("--per-archive", type=int, default=2_000)
    ap.add_argument("--dir", type=Path, default=None)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-gc-", dir=args.dir))
    try:
        pool = ArchiveManager.open(work / "pool", inline_limit=0)
        t0 = time.perf_counter()
        archives = fill(pool, args.blobs, args.per_archive)
        t_fill = time.perf_counter() - t0
        info = pool.info()
        total = sum(info.blobs.values())
        print(
            f"pool: {archives} archives, {total:,} blobs, {info.stored_bytes / 1e6:.0f} MB (filled in {t_fill:.0f} s)"
        )

        t0 = time.perf_counter()
        report = pool.gc()
        t_gc = time.perf_counter() - t0
        assert report.blobs == 0, report
        print(f"gc, nothing to delete:        {t_gc:7.2f} s")

        t0 = time.perf_counter()
        v = pool.verify()
        t_verify = time.perf_counter() - t0
        assert v.ok, v.problems[:3]
        print(f"verify() (no data):           {t_verify:7.2f} s")

        t0 = time.perf_counter()
        v = pool.verify(read_data=True)
        t_read = time.perf_counter() - t0
        assert v.ok, v.problems[:3]

        t0 = time.perf_counter()
        nbytes = 0
        for digest in pool.store.iter_digests():
            with open(pool.store.path(digest), "rb") as f:
                data = f.read()
            nbytes += len(data)
            xxhash.xxh3_128_hexdigest(data)
        t_plain = time.perf_counter() - t0
        print(f"verify(read_data=True):       {t_read:7.2f} s ({v.bytes_read / 1e6:.0f} MB)")
        print(f"plain read + xxh3 loop:       {t_plain:7.2f} s ({nbytes / 1e6:.0f} MB)")
        print(f"  -> verify(read_data) at {t_plain / t_read * 100:.0f}% of the plain loop's speed")
        pool.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
