#!/usr/bin/env python3
"""Catalog and protocol benchmark: the save/load figures of the catalog issue, in one run.

* ``pool.save`` of the realistic 1024-sample rollout (docs/architecture/workload.md "Workload")
against the bare codec +
  blob store writing the same samples (`tools/bench_codec.py`'s write path) — the catalog's
  overhead;
* loading one sample by key from that archive (median over random keys, fresh ``Archive``
  each time) against ``torch.load`` of the slime dump of the same rollout;
* ``sample_metadata()`` of the 1024 samples;
* ``find(task_key=...)`` over ``--archives`` archives of 1024 small samples each (1,000 x 1,024
  = 1,048,576 entries by default), each rollout with its own task keys.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from archive_manager import ArchiveManager
from archive_manager.blobs import BlobStore
from archive_manager.codec import RawChunk, build_chunk
from archive_manager.interop.synthetic import make_rollout


def _timed(fn, repeat: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def codec_write(samples: list, root: Path) -> None:
    store = BlobStore(root)

    def put_all(raw: RawChunk) -> None:
        enc = raw.pack()
        blobs = [(b.parts, b.digest) for b in enc.tensor_blobs.values()]
        store.put_many([*blobs, (enc.data, enc.digest)])

    with ThreadPoolExecutor(1) as io:
        pending = None
        for i in range(0, len(samples), 64):
            raw = build_chunk(samples[i : i + 64])
            if pending is not None:
                pending.result()
            pending = io.submit(put_all, raw)
        if pending is not None:
            pending.result()


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument(
        "--archives", type=int, default=1000, help="archives for the find() scale test (0: skip)"
    )
    ap.add_argument("--dir", type=Path, default=None)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-catalog-", dir=args.dir))
    try:
        samples = make_rollout(1024, seed=1)
        counter = iter(range(10**6))
        t_codec, _ = _timed(
            lambda: codec_write(samples, work / f"codec-{next(counter)}"), args.repeat
        )
        pools: list[ArchiveManager] = []

        def save_fresh() -> object:
            # A fresh pool each time: a second save of the same samples would only dedup.
            pools.append(ArchiveManager.open(work / f"pool-{next(counter)}"))
            return pools[-1].save("r", samples, rollout_id=0)

        t_save, arc = _timed(save_fresh, args.repeat)
        pool = pools[-1]
        name = arc.name
        keys = [k for k, _ in arc.keys()]
        rng = random.Random(0)

        def one() -> float:
            key = rng.choice(keys)
            t0 = time.perf_counter()
            got = pool.open_archive(name).load_samples(sample_key=key)
            dt = time.perf_counter() - t0
            assert len(got) == 1
            return dt

        one()
        t_one = statistics.median(one() for _ in range(50))
        t_meta, meta = _timed(
            lambda: pool.open_archive(name).sample_metadata(), max(args.repeat, 5)
        )
        assert len(meta) == 1024
        pt = work / "rollout.pt"
        torch.save({"rollout_id": 0, "samples": [s.to_dict() for s in samples]}, pt)
        t_pt_load, _ = _timed(lambda: torch.load(pt, weights_only=False), args.repeat)

        print("workload: 1024 samples, 512-token prompts, 1400-4200-token responses")
        print(f"{'pool.save':36}{t_save:9.3f} s")
        print(f"{'codec + blob store (same samples)':36}{t_codec:9.3f} s")
        print(f"  -> pool.save keeps {t_codec / t_save * 100:.0f}% of the codec's speed")
        print(f"{'load one sample by key (median)':36}{t_one * 1e3:9.2f} ms")
        print(f"{'torch.load of the whole dump':36}{t_pt_load * 1e3:9.1f} ms")
        print(f"  -> one sample {t_pt_load / t_one:.0f}x faster than torch.load")
        print(f"{'sample_metadata() of 1024 samples':36}{t_meta * 1e3:9.2f} ms")
        for p in pools:
            p.close()

        if args.archives:
            big = ArchiveManager.open(work / "scale")
            t0 = time.perf_counter()
            for i in range(args.archives):
                tiny = make_rollout(
                    1024, seed=i, rollout_id=i, prompt_len=4, response_min=4, response_max=8
                )
                big.save(f"rollout-{i:05d}", tiny, rollout_id=i)
            t_fill = time.perf_counter() - t0
            probes = [
                f"rollout-{rng.randrange(args.archives)}/group-{rng.randrange(128)}"
                for _ in range(50)
            ]
            for key in probes[:3]:
                big.find(task_key=key)
            times = []
            for key in probes:
                t0 = time.perf_counter()
                found = big.find(task_key=key)
                times.append(time.perf_counter() - t0)
                assert len(found) == 1, (key, found)
            entries = args.archives * 1024
            print(
                f"find(task_key=...) over {args.archives} archives / {entries:,} entries: "
                f"{statistics.median(times) * 1e3:.2f} ms median (pool filled in {t_fill:.0f} s)"
            )
            size = os.path.getsize(work / "scale" / "catalog.db")
            print(f"  catalog size: {size / 1e6:.0f} MB")
            big.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
