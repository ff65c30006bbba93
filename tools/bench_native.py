#!/usr/bin/env python3
"""The codec's C extension against its pure-Python fallback, in one process.

Encodes the same samples into chunks of 64 (`build_chunk`, as ``pool.save`` does; no
compression, no I/O) with the extension and without it (``codec._native_numbers`` and
``codec._native_first_leaves`` set to None, as ``ARCHIVE_MANAGER_NO_NATIVE=1`` does), the two
alternating within each round so that other processes' load spreads over both; prints median
wall and CPU seconds and checks that both wrote the same chunk digests.

Workloads: ``realistic`` (tools/bench.py's rollout: make_rollout, seed 1) and ``leaves``
(lists of short float lists, big ints and short strings: the values the expansion bound
counts one by one, docs/architecture.md "Native list conversion").

Run: ``python3 tools/bench_native.py [--samples 1024] [--repeat 7]``.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time

from archive_manager import codec
from archive_manager.synthetic import make_rollout

CHUNK = 64


def leaf_samples(n: int) -> list[dict]:
    rng = random.Random(1)
    return [
        {
            "top_logprobs": [[-rng.expovariate(3.0) for _ in range(5)] for _ in range(500)],
            "ids": [[rng.randrange(10**9, 10**12) for _ in range(4)] for _ in range(100)],
            "pieces": [[f"tok{rng.randrange(10**5)}" for _ in range(4)] for _ in range(100)],
        }
        for _ in range(n)
    ]


def encode_all(samples: list) -> list[str]:
    return [
        codec.build_chunk(samples[i : i + CHUNK]).pack().digest
        for i in range(0, len(samples), CHUNK)
    ]


def measure(samples: list, repeat: int) -> dict[str, tuple[float, float]]:
    native = (codec._native_numbers, codec._native_first_leaves)
    modes = ("native", "python")
    walls: dict[str, list[float]] = {m: [] for m in modes}
    cpus: dict[str, list[float]] = {m: [] for m in modes}
    digests: dict[str, list[str]] = {}
    try:
        for _ in range(repeat):
            for mode in modes:
                on = mode == "native"
                codec._native_numbers, codec._native_first_leaves = native if on else (None, None)
                w, c = time.perf_counter(), time.process_time()
                digests[mode] = encode_all(samples)
                cpus[mode].append(time.process_time() - c)
                walls[mode].append(time.perf_counter() - w)
    finally:
        codec._native_numbers, codec._native_first_leaves = native
    if digests["native"] != digests["python"]:
        raise SystemExit("the chunk digests differ with and without the extension")
    return {m: (statistics.median(walls[m]), statistics.median(cpus[m])) for m in modes}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=1024)
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args()
    if codec._native_numbers is None:
        raise SystemExit("the extension is not built: python setup.py build_ext --inplace")
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"encode into chunks of {CHUNK}, medians of {args.repeat}, load average {load}")
    for name, samples in (
        ("realistic", make_rollout(args.samples, seed=1)),
        ("leaves", leaf_samples(max(args.samples // 4, 1))),
    ):
        r = measure(samples, args.repeat)
        (nw, nc), (pw, pc) = r["native"], r["python"]
        print(
            f"{name:10} {len(samples):5} samples  native {nw:6.3f} s wall {nc:6.3f} s CPU  "
            f"python {pw:6.3f} s wall {pc:6.3f} s CPU  python/native {pw / nw:.2f}x wall "
            f"{pc / nc:.2f}x CPU  (same digests)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
