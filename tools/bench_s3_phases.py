"""Where an S3 save's time goes: wall time in each stage of the save pipeline, for a pool on S3
and on the local disk, beside the raw upload of the same bytes (docs/architecture/object-stores.md,
"Blobs on an object store", Benchmark; issue 20).

Workload: the 1024-sample rollout of ``tools/bench_s3.py``.  The writer's stages are wrapped
with timers (summed over calls, per stage; stages run on three threads, so they overlap):
the caller's thread encodes each sample (``encode_sample``), describes it and lets go of the
GIL every millisecond (``GilHandOver``); the packer compresses and hashes each chunk
(``RawChunk.pack``); the I/O thread claims each chunk's rows in the catalog and writes its
blobs (``_store``, of which ``put_many``); then the commit.  Also: the same chunks encoded on
one thread with nothing else running, and the raw upload with 4 threads and one at a time.
``--no-hand-over`` makes the GIL hand-over a no-op (what the encoder's waits become then).

Run::

    PYTHONPATH=. python tools/bench_s3_phases.py [--samples 1024] [--repeat 3] [--no-hand-over]
        [--stores-in-flight 1]
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from s3server import S3Server

from archive_manager import ArchiveManager, codec
from archive_manager.interop.synthetic import make_rollout
from archive_manager.pool import writer

_SPENT: dict[str, float] = collections.defaultdict(float)
_CPU: dict[str, float] = collections.defaultdict(float)
_LOCK = threading.Lock()


def _timed(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        started, cpu = time.perf_counter(), time.thread_time()
        try:
            return fn(*args, **kwargs)
        finally:
            with _LOCK:
                _SPENT[name] += time.perf_counter() - started
                _CPU[name] += time.thread_time() - cpu

    return wrapper


def _instrument(hand_over: bool) -> None:
    w = writer.ArchiveWriter
    codec.encode_sample = _timed("caller: encode_sample", codec.encode_sample)
    writer.describe_sample = _timed("caller: describe_sample", writer.describe_sample)
    gil: Callable[..., Any] = codec.GilHandOver.__call__ if hand_over else (lambda self: None)
    codec.GilHandOver.__call__ = _timed("caller: GilHandOver", gil)  # type: ignore[method-assign]
    w._flush = _timed("caller: _flush (waits for the I/O thread)", w._flush)  # type: ignore[method-assign]
    w.add = _timed("caller: add, all of it", w.add)  # type: ignore[method-assign]
    codec.RawChunk.pack = _timed("packer: RawChunk.pack", codec.RawChunk.pack)  # type: ignore[method-assign]
    w._store = _timed("io: _store (catalog + put_many)", w._store)  # type: ignore[method-assign]
    w._wait = _timed("commit: drain the pipeline", w._wait)  # type: ignore[method-assign]
    w._commit_ownership = _timed("commit: ownership", w._commit_ownership)  # type: ignore[method-assign]
    w._publish = _timed("commit: publish", w._publish)  # type: ignore[method-assign]


def _save(
    root: str, url: str, samples: list[Any]
) -> tuple[dict[str, float], dict[str, float], list[bytes]]:
    _SPENT.clear()
    _CPU.clear()
    with ArchiveManager.open(root, catalog_url=url) as pool:
        store = pool.store
        store.put_many = _timed("io: put_many", store.put_many)  # type: ignore[method-assign]
        started, cpu = time.perf_counter(), time.process_time()
        pool.save("rollout", samples, rollout_id=1)
        total, total_cpu = time.perf_counter() - started, time.process_time() - cpu
        blobs = [store.get(d) for d, _, _ in store.iter_stat()]
    return {"save, total": total, **_SPENT}, {"save, total": total_cpu, **_CPU}, blobs


def _upload(server: S3Server, bucket: str, blobs: list[bytes], threads: int) -> tuple[float, float]:
    client: Any = server.client()
    prefix = f"raw-{uuid.uuid4().hex[:8]}"

    def up(i: int) -> None:
        client.put_object(Bucket=bucket, Key=f"{prefix}/{i}", Body=blobs[i])

    started, cpu = time.perf_counter(), time.process_time()
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        list(pool.map(up, range(len(blobs))))
    return time.perf_counter() - started, time.process_time() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=1024)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--no-hand-over", action="store_true", help="GilHandOver a no-op")
    parser.add_argument(
        "--stores-in-flight",
        type=int,
        default=writer._STORES_IN_FLIGHT,
        help="stores (pairs of chunks) a save keeps in flight (1: before the second was added)",
    )
    args = parser.parse_args()
    writer._STORES_IN_FLIGHT = args.stores_in_flight
    samples = make_rollout(args.samples, seed=1)
    # Before the timers go in (`encode_chunk` hands over too), warm (imports, zstd contexts).
    encode_alone = []
    for _ in range(args.repeat + 1):
        started = time.thread_time()
        for i in range(0, len(samples), 64):
            codec.encode_chunk(samples[i : i + 64])
        encode_alone.append(time.thread_time() - started)
    _instrument(not args.no_hand_over)
    runs: dict[str, list[dict[str, float]]] = {"s3": [], "local": []}
    cpus: dict[str, list[dict[str, float]]] = {"s3": [], "local": []}
    raw: dict[int, list[tuple[float, float]]] = {4: [], 1: []}
    with S3Server.start() as server, tempfile.TemporaryDirectory() as tmp:
        os.environ.update(server.env())
        bucket = server.create_bucket("bench")
        for r in range(args.repeat):
            s3, s3_cpu, blobs = _save(
                f"s3://{bucket}/run{r}", f"sqlite:///{tmp}/s3-{r}.db", samples
            )
            local, local_cpu, _ = _save(
                str(Path(tmp) / f"local{r}"), f"sqlite:///{tmp}/l-{r}.db", samples
            )
            runs["s3"].append(s3)
            runs["local"].append(local)
            cpus["s3"].append(s3_cpu)
            cpus["local"].append(local_cpu)
            for threads in raw:
                raw[threads].append(_upload(server, bucket, blobs, threads))
    size = sum(len(b) for b in blobs) / 1e6
    print(f"{args.samples} samples, {len(blobs)} blobs, {size:.1f} MB, median of {args.repeat}, "
          f"{args.stores_in_flight} store(s) in flight; "
          f"load average {os.getloadavg()[0]:.1f}")  # fmt: skip
    print(f"{'seconds (wall; CPU: process for totals, thread for stages)':44}"
          f"{'s3':>8}{'cpu':>8}{'local':>8}{'cpu':>8}")  # fmt: skip

    def med(rows: list[dict[str, float]], stage: str) -> float:
        return statistics.median(row.get(stage, 0.0) for row in rows)

    for stage in runs["s3"][0]:
        figures = [med(rows[col], stage) for col in ("s3", "local") for rows in (runs, cpus)]
        print(f"{stage:44}" + "".join(f"{f:8.3f}" for f in figures))
    alone = statistics.median(encode_alone[1:])
    print(f"{'the chunks encoded alone, one thread (CPU)':44}{'':8}{alone:8.3f}")
    for threads, label in ((4, "raw upload, 4 threads"), (1, "raw upload, one at a time")):
        wall = statistics.median(w for w, _ in raw[threads])
        cpu = statistics.median(c for _, c in raw[threads])
        print(f"{label:44}{wall:8.3f}{cpu:8.3f}")
    up4 = statistics.median(w for w, _ in raw[4])
    save = statistics.median(run["save, total"] for run in runs["s3"])
    print(f"save vs raw upload (4 threads): {up4 / save:.0%}")


if __name__ == "__main__":
    main()
