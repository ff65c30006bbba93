#!/usr/bin/env python3
"""Codec benchmark: this codec + blob store against torch.save/torch.load and the raw disk.

Workload (docs/architecture/workload.md "Workload", seeded): 1024 samples in groups of 8 sharing a
512-token prompt, responses 1400-4200 tokens; tokens, loss_mask and rollout_log_probs as Python
lists, reward, status, metadata.  ``--r3`` adds int32 routed-expert tensors ``[T-1, 48, 8]`` per
sample.

Measured, in one run, medians of ``--repeat`` runs:
  * archive_manager: encode chunks of 64 samples + compress + hash + write every blob (temp,
    fsync, rename, fsync dir), chunk i written on an I/O thread while chunk i+1 is encoded, as
    pool.save does; then read every blob (digest-checked) + decode every sample (tensor refs
    materialized, so both sides return the same data);
  * torch.save of {"rollout_id", "samples": [to_dict]} to a file + fsync (slime's debug dump),
    and torch.load(weights_only=False) of it;
  * raw: one write + fsync of as many bytes as archive_manager wrote, and reading them back.
Reads come from the page cache on both sides (the files were just written).
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
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from archive_manager.blobs import BlobStore
from archive_manager.codec import RawChunk, build_chunk, decode_chunk, decode_tensor_blob
from archive_manager.interop.synthetic import make_rollout

CHUNK = 64


def _median_time(fn: Callable[[], object], repeat: int) -> tuple[float, object]:
    times, result = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), result


def _sample_bytes(samples: list) -> int:
    """Approximate in-memory payload size: what the numbers and text amount to as raw arrays."""
    total = 0
    for s in samples:
        total += 8 * len(s.tokens) + 8 * len(s.loss_mask) + 8 * len(s.rollout_log_probs)
        total += len(s.response) + len(s.prompt)
        r3 = getattr(s, "rollout_routed_experts", None)
        if isinstance(r3, torch.Tensor):
            total += r3.numel() * r3.element_size()
    return total


def run(n: int, r3: bool, repeat: int, workdir: Path) -> dict:
    samples = make_rollout(n, seed=1, r3_layers=48 if r3 else None)
    payload = _sample_bytes(samples)

    def am_write() -> tuple[BlobStore, list[str], int]:
        root = workdir / f"pool-{time.monotonic_ns()}"
        store = BlobStore(root)
        digests, written = [], 0

        def put_all(raw: RawChunk) -> int:
            enc = raw.pack()
            digests.append(enc.digest)
            blobs = [(b.parts, b.digest) for b in enc.tensor_blobs.values()]
            store.put_many([*blobs, (enc.data, enc.digest)])
            return len(enc.data) + sum(b.size for b in enc.tensor_blobs.values())

        # As pool.save does: chunk i is written on an I/O thread while chunk i+1 is encoded.
        with ThreadPoolExecutor(1) as io:
            pending = None
            for i in range(0, len(samples), CHUNK):
                raw = build_chunk(samples[i : i + CHUNK])
                if pending is not None:
                    written += pending.result()
                pending = io.submit(put_all, raw)
            if pending is not None:
                written += pending.result()
        return store, digests, written

    t_am_write, (store, digests, am_bytes) = _median_time(am_write, repeat)

    def am_read() -> int:
        count = 0
        for d in digests:
            for s in decode_chunk(
                store.get(d), digest=d, loader=lambda h: decode_tensor_blob(store.get(h), h)
            ):
                r = getattr(s, "rollout_routed_experts", None)
                if r is not None and not isinstance(r, torch.Tensor):
                    r.materialize()
                count += 1
        return count

    t_am_read, count = _median_time(am_read, repeat)
    assert count == n

    pt = workdir / "rollout.pt"

    def torch_write() -> int:
        with open(pt, "wb") as f:
            torch.save({"rollout_id": 0, "samples": [s.to_dict() for s in samples]}, f)
            f.flush()
            os.fsync(f.fileno())
        return pt.stat().st_size

    t_pt_write, pt_bytes = _median_time(torch_write, repeat)
    t_pt_read, _ = _median_time(lambda: torch.load(pt, weights_only=False), repeat)

    raw = workdir / "raw.bin"
    block = os.urandom(1 << 20)

    def raw_write() -> None:
        with open(raw, "wb") as f:
            left = am_bytes
            while left > 0:
                left -= f.write(block[: min(left, len(block))])
            f.flush()
            os.fsync(f.fileno())

    def raw_read() -> int:
        with open(raw, "rb") as f:
            return sum(len(b) for b in iter(lambda: f.read(1 << 22), b""))

    t_raw_write, _ = _median_time(raw_write, repeat)
    t_raw_read, _ = _median_time(raw_read, repeat)
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True, exist_ok=True)
    return {
        "workload": f"{n} samples{' + R3 [T-1,48,8] int32' if r3 else ''}",
        "payload_mb": payload / 1e6,
        "am": {"write_s": t_am_write, "read_s": t_am_read, "bytes": am_bytes},
        "torch": {"write_s": t_pt_write, "read_s": t_pt_read, "bytes": pt_bytes},
        "raw": {"write_s": t_raw_write, "read_s": t_raw_read, "bytes": am_bytes},
    }


def report(r: dict) -> str:
    am, pt, raw = r["am"], r["torch"], r["raw"]
    lines = [
        f"workload: {r['workload']} (~{r['payload_mb']:.0f} MB of payload as raw arrays)",
        f"{'':28}{'seconds':>9}{'MB/s':>9}{'MB on disk':>12}",
    ]
    for label, s, b in (
        ("archive_manager write", am["write_s"], am["bytes"]),
        ("torch.save + fsync", pt["write_s"], pt["bytes"]),
        ("raw write + fsync", raw["write_s"], raw["bytes"]),
        ("archive_manager read", am["read_s"], am["bytes"]),
        ("torch.load", pt["read_s"], pt["bytes"]),
        ("raw read", raw["read_s"], raw["bytes"]),
    ):
        lines.append(f"{label:28}{s:9.3f}{b / 1e6 / s:9.0f}{b / 1e6:12.1f}")
    lines += [
        f"write: {pt['write_s'] / am['write_s']:.1f}x faster than torch.save; "
        f"{(am['bytes'] / am['write_s']) / (raw['bytes'] / raw['write_s']) * 100:.0f}% of raw "
        "write throughput",
        f"read:  {pt['read_s'] / am['read_s']:.1f}x faster than torch.load",
        f"size:  {am['bytes'] / pt['bytes']:.2f}x of torch.save's bytes",
    ]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--samples", type=int, default=1024)
    ap.add_argument("--r3", action="store_true", help="add routed-expert tensors [T-1, 48, 8]")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dir", type=Path, default=None, help="work folder (default: a temp dir)")
    ap.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="bench-codec-", dir=args.dir))
    try:
        result = run(args.samples, args.r3, args.repeat, base)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print(report(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
