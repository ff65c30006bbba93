"""A real PostgreSQL catalog server stopped (``pg_ctl stop -m fast``) and started again on the
same port and data dir in the middle of a streaming save in another process: an outage
shorter than the lease loses no save.

Two ways the save meets the outage: (``heartbeat``) the producer is busy elsewhere and only
the lease heartbeat tries the catalog; with a busy timeout (1 s) shorter than the outage,
`Catalog.write` stops waiting for the server and the heartbeat must retry by itself until the
server is back; (``chunk stores``) the producer goes on adding samples, so chunk stores begin
their catalog transactions while the server is down and wait for it (`Catalog.write`, up to
the default busy timeout of 30 s).

The server is this module's own, since it is stopped: the session's shared one stays up.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import REQUIRE_PG_ENV, assert_loads, tiny_rollout
from pgserver import PgServer, PgServerUnavailable
from sqlalchemy import select

from archive_manager import ArchiveManager
from archive_manager.catalog import leases_table

pytestmark = pytest.mark.timeout(180)

TESTS = Path(__file__).resolve().parents[1]

#: The lease: the heartbeat renews every TTL / 3 = 5 s, so an outage of OUTAGE > 5 s always
#: meets at least one renewal, with TTL - 5 - OUTAGE - (restart) s of lease left to spare.
TTL = 15.0
OUTAGE = 6.0

_SLOW_SAVER = """
import sys
sys.path.insert(0, sys.argv[3])
from archive_manager import ArchiveManager
from helpers import tiny_rollout

root, url, ttl = sys.argv[1], sys.argv[2], float(sys.argv[4])
samples = tiny_rollout(48, seed=5)
try:
    with ArchiveManager.open(root, catalog_url=url, chunk_size=8, lease_ttl=ttl) as pool:
        with pool.writer("b", rollout_id=5) as w:
            for sample in samples[:24]:
                w.add(sample)
            w.wait_stored()  # three chunks stored: the lease holds them
            print("stored", flush=True)
            assert sys.stdin.readline().strip() == "go"
            for sample in samples[24:]:
                w.add(sample)
            print("added", flush=True)
            assert sys.stdin.readline().strip() == "commit"
except Exception as exc:
    print(f"failed {type(exc).__name__}: {exc}", flush=True)
    sys.exit(1)
print("published", flush=True)
"""


@pytest.fixture(scope="module")
def own_server() -> Iterator[PgServer]:
    try:
        import psycopg  # noqa: F401
    except ModuleNotFoundError:
        pytest.skip("psycopg is not installed")
    try:
        server = PgServer.start()
    except PgServerUnavailable as exc:
        if os.environ.get(REQUIRE_PG_ENV):
            pytest.fail(f"PostgreSQL server binaries not found: {exc}")
        pytest.skip(f"PostgreSQL server binaries not found: {exc}")
    try:
        yield server
    finally:
        server.stop()


class Saver:
    def __init__(self, root: Path, url: str, busy_timeout_ms: int | None) -> None:
        env = dict(os.environ)
        env.pop("ARCHIVE_MANAGER_BUSY_TIMEOUT_MS", None)
        if busy_timeout_ms is not None:
            env["ARCHIVE_MANAGER_BUSY_TIMEOUT_MS"] = str(busy_timeout_ms)
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _SLOW_SAVER, str(root), url, str(TESTS), str(TTL)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )

    def say(self, word: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(word + "\n")
        self.proc.stdin.flush()

    def expect(self, word: str) -> None:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().strip()
        if line != word:
            self.proc.kill()
            _, err = self.proc.communicate()
            raise AssertionError(f"expected {word!r}, the saver said {line!r} {err[-3000:]}")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.communicate()


@pytest.mark.parametrize("during_outage", ["heartbeat", "chunk stores"])
def test_a_catalog_restart_mid_save_loses_nothing(
    own_server: PgServer, tmp_path: Path, during_outage: str
) -> None:
    url = own_server.create_database()
    root = tmp_path / "pool"
    with ArchiveManager.open(root, catalog_url=url) as pool:
        pool.save("a", tiny_rollout(8, seed=1), rollout_id=1)
    saver = Saver(root, url, 1000 if during_outage == "heartbeat" else None)
    try:
        saver.expect("stored")
        own_server.stop_in_place("fast")
        down = time.monotonic()
        if during_outage == "chunk stores":
            saver.say("go")  # its next chunk stores find the server down, and wait
        time.sleep(max(0.0, down + OUTAGE - time.monotonic()))
        own_server.start_in_place()
        if during_outage == "heartbeat":
            saver.say("go")
        saver.expect("added")
        saver.say("commit")
        saver.expect("published")
        assert saver.proc.wait(timeout=60) == 0
    finally:
        saver.close()
    with ArchiveManager.open(root, catalog_url=url) as pool:
        assert_loads(pool, "b", tiny_rollout(48, seed=5))
        assert_loads(pool, "a", tiny_rollout(8, seed=1))
        with pool.catalog.read() as conn:
            assert conn.execute(select(leases_table)).all() == []
        assert pool.verify(read_data=True).ok
    own_server.drop_database(url)
