"""Issue 37's S3 row against its floor: ``pool.save`` to S3 and to a local folder, and the same
bytes uploaded by the fastest client code written here, by turns in each round of one run
(docs/performance.md, "Load at the floor").

Workload: realistic-1024 of ``tools/bench.py`` (its 17 blobs, 23.9 MB); a ``juicefs gateway``
on loopback (`tests/s3server.py`), which shares this machine's cores with the client; each
pool's catalog in SQLite on the local disk.  Columns, each a fresh pool or prefix:

* ``local``: ``pool.save`` to a folder;
* ``s3``: ``pool.save`` to ``s3://``;
* ``s3, fast PUTs``: the same save with every blob PUT sent by the minimal client below
  (``http.client``, SigV4 computed here with the payload's SHA-256, as botocore signs over
  http; one kept connection per thread, no ``Expect: 100-continue``): what boto3 costs;
* ``floor``: the local save while the same objects (count, sizes) are PUT by the minimal
  client on 4 threads, started with the save: the save's encoding and the upload's client
  and gateway CPU on the same cores, with none of the upload waiting for a chunk to be
  encoded and none of the protocol's requests (identity, journal): no S3 save can beat it;
* ``upload, store``: `S3BlobStore.put_new` of the saved blobs (the store's client alone);
* ``upload, fast``: the minimal client alone.

For each: median wall time, this process's CPU, the gateway's CPU (``/proc/<pid>/stat``) and,
for saves, the tail: from the writer's commit (every sample added) to the save's return.

Run::

    PYTHONPATH=. python tools/bench_s3_floor.py [--repeat 7] [--samples 1024]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import datetime
import functools
import hashlib
import hmac
import http.client
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from s3server import ACCESS_KEY, SECRET_KEY, S3Server

from archive_manager import ArchiveManager
from archive_manager.blobs import s3 as s3mod
from archive_manager.interop.synthetic import make_rollout
from archive_manager.pool import writer

_REGION = "us-east-1"


class FastPut:
    """PUT an object with the least client work: SigV4 by hand (payload SHA-256 signed), one
    kept-alive ``http.client`` connection per thread."""

    def __init__(self, endpoint: str) -> None:
        self._host = endpoint.removeprefix("http://")
        name, _, port = self._host.partition(":")
        self._address = (name, int(port))
        self._local = threading.local()

    def _connection(self) -> http.client.HTTPConnection:
        conn: http.client.HTTPConnection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = http.client.HTTPConnection(*self._address)
        return conn

    def put(self, bucket: str, key: str, body: bytes) -> None:
        stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")
        day = stamp[:8]
        payload = hashlib.sha256(body).hexdigest()
        uri = f"/{bucket}/{key}"
        headers = {"host": self._host, "x-amz-content-sha256": payload, "x-amz-date": stamp}
        signed = ";".join(sorted(headers))
        canonical = "\n".join(
            ["PUT", uri, "", *(f"{k}:{headers[k]}" for k in sorted(headers)), "", signed, payload]
        )
        scope = f"{day}/{_REGION}/s3/aws4_request"
        to_sign = "\n".join(
            ["AWS4-HMAC-SHA256", stamp, scope, hashlib.sha256(canonical.encode()).hexdigest()]
        )
        key_ = ("AWS4" + SECRET_KEY).encode()
        for part in (day, _REGION, "s3", "aws4_request"):
            key_ = hmac.new(key_, part.encode(), hashlib.sha256).digest()
        signature = hmac.new(key_, to_sign.encode(), hashlib.sha256).hexdigest()
        headers["Authorization"] = (
            f"AWS4-HMAC-SHA256 Credential={ACCESS_KEY}/{scope}, SignedHeaders={signed}, "
            f"Signature={signature}"
        )
        headers["Content-Length"] = str(len(body))
        conn = self._connection()
        conn.request("PUT", uri, body=body, headers=headers)
        answer = conn.getresponse()
        answer.read()
        if answer.status != 200:
            raise RuntimeError(f"PUT {key}: HTTP {answer.status}")


class Meter:
    """Wall, this process's CPU and the gateway's CPU of a call."""

    def __init__(self, server_pid: int) -> None:
        self._stat = Path(f"/proc/{server_pid}/stat")
        self._tick = os.sysconf("SC_CLK_TCK")

    def _server(self) -> float:
        fields = self._stat.read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / self._tick

    def __call__(self, fn: Callable[[], object]) -> tuple[float, float, float]:
        os.sync()
        server, cpu, started = self._server(), time.process_time(), time.perf_counter()
        fn()
        return (
            time.perf_counter() - started,
            time.process_time() - cpu,
            self._server() - server,
        )


_COMMITS: list[float] = []


@contextlib.contextmanager
def _commit_probe() -> Iterator[None]:
    """Note when each writer's commit begins (every sample added)."""
    commit = writer.ArchiveWriter.commit

    def noted(self: writer.ArchiveWriter) -> Any:
        _COMMITS.append(time.perf_counter())
        return commit(self)

    writer.ArchiveWriter.commit = noted  # type: ignore[method-assign]
    try:
        yield
    finally:
        writer.ArchiveWriter.commit = commit  # type: ignore[method-assign]


@contextlib.contextmanager
def _fast_puts(fast: FastPut) -> Iterator[None]:
    """Send the store's blob PUTs through ``fast`` (objects below the multipart threshold)."""
    put = s3mod.S3BlobStore._put

    def fast_put(self: s3mod.S3BlobStore, data: Any, digest: str | None, *, look: bool) -> str:
        views, digest = s3mod._prepare(data, digest)
        fast.put(self.bucket, self._key(digest), b"".join(views))
        return digest

    s3mod.S3BlobStore._put = fast_put  # type: ignore[method-assign]
    try:
        yield
    finally:
        s3mod.S3BlobStore._put = put  # type: ignore[method-assign]


COLUMNS = ("local", "s3", "s3, fast PUTs", "floor", "upload, store", "upload, fast")
Blobs = list[tuple[str, bytes]]


def _upload(column: str, bucket: str, prefix: str, blobs: Blobs, fast: FastPut) -> None:
    if column == "upload, store":
        store = s3mod.S3BlobStore(bucket, prefix)
        store.put_new([(data, digest) for digest, data in blobs])
        return
    with concurrent.futures.ThreadPoolExecutor(4) as ex:
        list(ex.map(lambda b: fast.put(bucket, f"{prefix}/{b[0]}", b[1]), blobs))


def _save(pool: ArchiveManager, samples: list[Any], side: Callable[[], object] | None) -> None:
    """``pool.save``; with ``side``, that runs beside it, from the save's start to its end."""
    ex = concurrent.futures.ThreadPoolExecutor(1)
    beside = None if side is None else ex.submit(side)
    pool.save("rollout-0", samples, rollout_id=0)
    if beside is not None:
        beside.result()
    ex.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=1024)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    samples = make_rollout(n_samples=args.samples, seed=1)
    rows: dict[str, list[tuple[float, float, float]]] = {c: [] for c in COLUMNS}
    tails: dict[str, list[float]] = {c: [] for c in COLUMNS[:4]}
    loads = [os.getloadavg()[0]]
    work = Path(tempfile.mkdtemp(prefix="bench-s3-floor-"))
    saved_env = dict(os.environ)
    blobs: Blobs = []
    try:
        with S3Server.start() as server, _commit_probe():
            assert server.proc is not None
            meter = Meter(server.proc.pid)
            os.environ.update(server.env())
            bucket = server.create_bucket("floor")
            fast = FastPut(server.endpoint)
            for r in range(args.repeat):
                for n, column in enumerate(COLUMNS):
                    prefix = f"c{n}-{r}"
                    if column.startswith("upload"):
                        rows[column].append(
                            meter(functools.partial(_upload, column, bucket, prefix, blobs, fast))
                        )
                        continue
                    root = f"s3://{bucket}/{prefix}" if column.startswith("s3") else work / prefix
                    with ArchiveManager.open(
                        root, catalog_url=f"sqlite:///{work}/{prefix}.db"
                    ) as pool:
                        side = None
                        if column == "floor":
                            side = functools.partial(
                                _upload, "upload, fast", bucket, prefix, blobs, fast
                            )
                        _COMMITS.clear()
                        with (
                            _fast_puts(fast)
                            if column == "s3, fast PUTs"
                            else contextlib.nullcontext()
                        ):
                            rows[column].append(
                                meter(functools.partial(_save, pool, samples, side))
                            )
                        tails[column].append(time.perf_counter() - _COMMITS[0])
                        if column == "s3" and not blobs:
                            blobs = [(d, pool.store.get(d)) for d, _, _ in pool.store.iter_stat()]
                    shutil.rmtree(work / prefix, ignore_errors=True)
                loads.append(os.getloadavg()[0])
    finally:
        os.environ.clear()
        os.environ.update(saved_env)
        shutil.rmtree(work, ignore_errors=True)
    mb = sum(len(b) for _, b in blobs) / 1e6
    print(
        f"{args.samples} samples, {len(blobs)} objects, {mb:.1f} MB; medians of {args.repeat}, "
        f"by turns; load average {min(loads):.1f}-{max(loads):.1f}"
    )
    print(f"{'':16}{'wall s':>9}{'CPU s':>8}{'gateway s':>11}{'tail ms':>9}   walls")
    local = statistics.median(w for w, _, _ in rows["local"])
    for column in COLUMNS:
        got = rows[column]
        wall, cpu, server_cpu = (statistics.median(x[i] for x in got) for i in range(3))
        tail = f"{statistics.median(tails[column]) * 1000:9.1f}" if column in tails else " " * 9
        ratio = f"   {wall / local:.2f}x local" if column in COLUMNS[1:4] else ""
        print(
            f"{column:16}{wall:9.3f}{cpu:8.3f}{server_cpu:11.3f}{tail}   "
            + " ".join(f"{w:.3f}" for w, _, _ in got)
            + ratio
        )


if __name__ == "__main__":
    main()
