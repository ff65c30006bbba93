#!/usr/bin/env python3
"""The codec's C extension against its pure-Python fallback, in one process.

Encodes the same samples into chunks of 64 (`build_chunk`, as ``pool.save`` does; no
compression, no I/O) with the extension and without it (``codec._native_numbers``,
``codec._native_first_leaves`` and ``codec._native_dict_items`` set to None, as ``ARCHIVE_MANAGER_NO_NATIVE=1`` does), the two
alternating within each round so that other processes' load spreads over both; prints median
wall and CPU seconds and checks that both wrote the same chunk digests.

Workloads: ``realistic`` (tools/bench.py's rollout: make_rollout, seed 1) and ``leaves``
(lists of short float lists, big ints and short strings: the values the expansion bound
counts one by one, docs/architecture/samples-and-values.md "Native list conversion").

``--bound`` also times `encode_sample` with the expansion bound's accounting in Python, with
its leaf marks in C (as shipped), and switched off, to show what the accounting costs.

Run: ``python3 tools/bench_native.py [--samples 1024] [--repeat 7] [--bound]``.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time
from typing import Any

from archive_manager import codec
from archive_manager.interop.synthetic import make_rollout

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
    native = (codec._native_numbers, codec._native_first_leaves, codec._native_dict_items)
    modes = ("native", "python")
    walls: dict[str, list[float]] = {m: [] for m in modes}
    cpus: dict[str, list[float]] = {m: [] for m in modes}
    digests: dict[str, list[str]] = {}
    try:
        for _ in range(repeat):
            for mode in modes:
                on = mode == "native"
                (
                    codec._native_numbers,
                    codec._native_first_leaves,
                    codec._native_dict_items,
                ) = native if on else (None, None, None)
                w, c = time.perf_counter(), time.process_time()
                digests[mode] = encode_all(samples)
                cpus[mode].append(time.process_time() - c)
                walls[mode].append(time.perf_counter() - w)
    finally:
        codec._native_numbers, codec._native_first_leaves, codec._native_dict_items = native
    if digests["native"] != digests["python"]:
        raise SystemExit("the chunk digests differ with and without the extension")
    return {m: (statistics.median(walls[m]), statistics.median(cpus[m])) for m in modes}


def bound_cost(samples: list, repeat: int) -> dict[str, float]:
    """CPU medians of `encode_sample` over ``samples``: the expansion bound's accounting done
    in Python, with the leaf marks in C (as shipped), and switched off (its methods replaced
    by no-ops, the cycle check kept): what the accounting costs."""
    values = codec.values
    enc = values._Encoder
    names = ("_again", "_count", "_extra", "_enter", "_long_text")
    shipped = {n: enc.__dict__[n] for n in names}

    def enter(self: Any, value: Any) -> None:  # the cycle check alone
        if id(value) in self.active:
            raise codec.UnencodableError("a sample holds a reference cycle")
        self.active.add(id(value))

    off = {
        "_again": lambda self, v: None,
        "_count": lambda self, v, k: None,
        "_extra": lambda self, n: None,
        "_enter": enter,
        "_long_text": lambda self, v: v.encode("utf-8", "surrogatepass"),
    }
    leaves = codec._native_first_leaves
    configs = {"python": (shipped, None), "shipped": (shipped, leaves), "off": (off, None)}
    cpus: dict[str, list[float]] = {k: [] for k in configs}
    try:
        for _ in range(repeat):
            for name, (methods, first) in configs.items():
                for n, f in methods.items():
                    setattr(enc, n, f)
                codec._native_first_leaves = first
                c = time.process_time()
                for s in samples:
                    values.encode_sample(s)
                cpus[name].append(time.process_time() - c)
    finally:
        for n, f in shipped.items():
            setattr(enc, n, f)
        codec._native_first_leaves = leaves
    return {k: statistics.median(v) for k, v in cpus.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=1024)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--bound", action="store_true", help="also: what the bound's accounting costs")
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
        if args.bound:
            b = bound_cost(samples, args.repeat)
            print(
                f"{'':10} expansion bound, encode_sample CPU: in Python {b['python']:.3f} s "
                f"({b['python'] / b['off']:.2f}x), leaf marks in C {b['shipped']:.3f} s "
                f"({b['shipped'] / b['off']:.2f}x), accounting off {b['off']:.3f} s"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
