"""Benchmark: a pool on S3 against a pool on the local disk and against the raw client, in one
run (docs/architecture/object-stores.md, "Blobs on an object store"; issue 20, part 2).

Workload: the realistic 1024-sample rollout of ``tools/bench.py`` (`make_rollout`, seed 1).
Columns:

* ``s3``: `ArchiveManager` on ``s3://bench/<run>`` (a ``juicefs gateway`` on loopback started
  here, `tests/s3server.py`), catalog in SQLite on the local disk;
* ``local``: the same pool on a local folder;
* ``raw``: the same client (boto3) uploading the pool's blobs as they are (same bytes, same
  number of objects, same parallelism as the store's ``put_many``) and downloading them.

Rows: save, load all, one-key load (median of 20 single-sample loads).  Targets: the pool's
save at least 70% of the raw upload rate; one-key load under 20 ms on loopback.

Run::

    PYTHONPATH=. python tools/bench_s3.py [--samples 1024] [--repeat 3] [--stores-in-flight 1]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from s3server import S3Server

from archive_manager import ArchiveManager
from archive_manager.interop.synthetic import make_rollout
from archive_manager.pool import writer

_SERVER_PID: int | None = None


def _server_cpu() -> float:
    """CPU seconds the S3 server (the gateway, all its threads) has used so far: on loopback it
    runs on the same cores as the client, so its work is part of what a save waits for."""
    if _SERVER_PID is None:
        return 0.0
    fields = Path(f"/proc/{_SERVER_PID}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _timed(fn: Any) -> tuple[float, Any]:
    started = time.perf_counter()
    out = fn()
    return time.perf_counter() - started, out


def _costed(fn: Any, what: str) -> tuple[dict[str, float], Any]:
    """Wall time of ``fn`` and the CPU it took in this process and in the server."""
    server, client = _server_cpu(), time.process_time()
    elapsed, out = _timed(fn)
    return {
        f"{what}_s": elapsed,
        f"{what}_client_cpu_s": time.process_time() - client,
        f"{what}_server_cpu_s": _server_cpu() - server,
    }, out


def _pool_run(root: str | Path, url: str, samples: list[Any], name: str) -> dict[str, Any]:
    with ArchiveManager.open(root, catalog_url=url) as pool:
        save, archive = _costed(lambda: pool.save(name, samples, rollout_id=1), "save")
        load_s, loaded = _timed(lambda: archive.load_samples())
        assert len(loaded) == len(samples)
        keys = [k for k, _ in archive.keys()]
        one = []
        for i in range(20):
            key = keys[(i * 97) % len(keys)]
            t, _ = _timed(lambda key=key: pool.open_archive(name).load_samples(sample_key=key))
            one.append(t)
        blobs = [(d, pool.store.get(d)) for d, _, _ in pool.store.iter_stat()]
    return {
        **save,
        "load_all_s": load_s,
        "one_key_ms": statistics.median(one) * 1000,
        "blobs": blobs,
    }


def _raw_run(server: S3Server, bucket: str, blobs: list[tuple[str, bytes]]) -> dict[str, float]:
    client: Any = server.client()
    prefix = f"raw-{uuid.uuid4().hex[:8]}"

    def up(item: tuple[str, bytes]) -> None:
        client.put_object(Bucket=bucket, Key=f"{prefix}/{item[0]}", Body=item[1])

    def down(item: tuple[str, bytes]) -> bytes:
        return client.get_object(Bucket=bucket, Key=f"{prefix}/{item[0]}")["Body"].read()

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        upload, _ = _costed(lambda: list(pool.map(up, blobs)), "upload")
        down_s, _ = _timed(lambda: list(pool.map(down, blobs)))
    return {**upload, "download_s": down_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=1024)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument(
        "--stores-in-flight",
        type=int,
        default=writer._STORES_IN_FLIGHT,
        help="stores (pairs of chunks) a save keeps in flight (1: before the second was added)",
    )
    args = parser.parse_args()
    writer._STORES_IN_FLIGHT = args.stores_in_flight
    samples = make_rollout(args.samples, seed=1)
    results: dict[str, list[dict[str, Any]]] = {"s3": [], "local": [], "raw": []}
    with S3Server.start() as server, tempfile.TemporaryDirectory() as tmp:
        os.environ.update(server.env())
        global _SERVER_PID
        _SERVER_PID = None if server.proc is None else server.proc.pid
        bucket = server.create_bucket("bench")
        for r in range(args.repeat):
            s3 = _pool_run(
                f"s3://{bucket}/run{r}", f"sqlite:///{tmp}/s3-{r}.db", samples, "rollout"
            )
            local = _pool_run(Path(tmp) / f"local{r}", f"sqlite:///{tmp}/l-{r}.db", samples, "r")
            raw = _raw_run(server, bucket, s3.pop("blobs"))
            local.pop("blobs")
            results["s3"].append(s3)
            results["local"].append(local)
            results["raw"].append(raw)
    med = {
        col: {k: statistics.median(run[k] for run in runs) for k in runs[0]}
        for col, runs in results.items()
    }
    ratio = med["raw"]["upload_s"] / med["s3"]["save_s"]
    if args.json:
        print(json.dumps({"median": med, "save_vs_raw_upload": ratio}, indent=1))
        return
    print(
        f"{args.samples} samples, median of {args.repeat} runs, "
        f"{args.stores_in_flight} store(s) in flight; load average {os.getloadavg()[0]:.1f}"
    )
    print(f"{'':12}{'s3':>10}{'local':>10}{'raw s3':>10}")
    print(
        f"{'save s':12}{med['s3']['save_s']:10.3f}{med['local']['save_s']:10.3f}"
        f"{med['raw']['upload_s']:10.3f}"
    )
    print(
        f"{'load all s':12}{med['s3']['load_all_s']:10.3f}{med['local']['load_all_s']:10.3f}"
        f"{med['raw']['download_s']:10.3f}"
    )
    print(f"{'one key ms':12}{med['s3']['one_key_ms']:10.1f}{med['local']['one_key_ms']:10.1f}")
    s3, raw, cores = med["s3"], med["raw"], os.cpu_count() or 1
    print(
        f"{'save CPU s':12}{s3['save_client_cpu_s']:10.3f}{med['local']['save_client_cpu_s']:10.3f}"
        f"{raw['upload_client_cpu_s']:10.3f}   (this process)"
    )
    print(
        f"{'server CPU s':12}{s3['save_server_cpu_s']:10.3f}{'':>10}"
        f"{raw['upload_server_cpu_s']:10.3f}   (the gateway, on the same cores)"
    )
    # NOTE: client and server share this machine's cores, so neither column can take less
    # wall time than its CPU over the cores: the ratio of those floors is the best a save
    # could reach here however well it overlapped encoding with uploading.
    floor_s3 = (s3["save_client_cpu_s"] + s3["save_server_cpu_s"]) / cores
    floor_raw = (raw["upload_client_cpu_s"] + raw["upload_server_cpu_s"]) / cores
    print(
        f"CPU floor on {cores} cores: save {floor_s3:.3f} s, raw upload {floor_raw:.3f} s; "
        f"at best {raw['upload_s'] / max(floor_s3, 1e-9):.0%} of the raw upload rate here"
    )
    print(f"save rate vs raw upload: {ratio:.0%} (target >= 70%)")
    print(f"one-key load on S3: {med['s3']['one_key_ms']:.1f} ms (target < 20 ms)")


if __name__ == "__main__":
    main()
