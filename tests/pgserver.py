"""A throwaway PostgreSQL server for tests and benchmarks: ``initdb`` + ``pg_ctl`` in a temp dir.

Test support, not part of the package: ``tests/conftest.py`` imports it (pytest puts
``tests/`` on ``sys.path``) and ``tools/bench_pg.py`` adds ``tests/`` to ``sys.path``.

PostgreSQL refuses to run as root, and CI runs as root: there, ``initdb`` and ``pg_ctl`` run
as the ``postgres`` system user (``runuser``) on a data dir it owns.  The server listens on
a free port of 127.0.0.1 only, with its socket in the same temp dir, trusts local
connections (it holds nothing but throwaway test databases) and trades durability for speed
(``fsync=off``): a crash of the machine loses nothing anyone wants back.

Usage::

    with PgServer.start() as server:
        url = server.create_database()       # postgresql+psycopg://postgres@127.0.0.1:PORT/db_...
        ...
        server.drop_database(url)
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import socket
import subprocess
import tempfile
import uuid
from pathlib import Path
from types import TracebackType

__all__ = ["PgServer", "PgServerUnavailable", "find_bindir"]

BINDIR_ENV = "ARCHIVE_MANAGER_PG_BINDIR"
_SERVER_USER = "postgres"  # the system user the server runs as when we are root
_SUPERUSER = "postgres"  # the database superuser initdb creates


class PgServerUnavailable(RuntimeError):
    """No PostgreSQL server can be started here (binaries or the ``postgres`` user missing)."""


def find_bindir() -> Path:
    """The folder holding ``initdb``, ``pg_ctl`` and ``postgres``.

    Looks at ``$ARCHIVE_MANAGER_PG_BINDIR``, then Debian's ``/usr/lib/postgresql/<v>/bin``
    (newest first), then ``PATH``.

    Raises:
        PgServerUnavailable: none of them holds all three.
    """
    candidates: list[Path] = []
    if os.environ.get(BINDIR_ENV):
        candidates.append(Path(os.environ[BINDIR_ENV]))
    debian = glob.glob("/usr/lib/postgresql/*/bin")
    debian.sort(key=lambda p: int(Path(p).parent.name) if Path(p).parent.name.isdigit() else 0)
    candidates += [Path(p) for p in reversed(debian)]
    on_path = shutil.which("initdb")
    if on_path:
        candidates.append(Path(on_path).resolve().parent)
    for folder in candidates:
        if all(os.access(folder / tool, os.X_OK) for tool in ("initdb", "pg_ctl", "postgres")):
            return folder
    looked = ", ".join(str(c) for c in candidates) or "PATH"
    raise PgServerUnavailable(
        f"initdb, pg_ctl and postgres not found (looked in {looked}, ${BINDIR_ENV}); "
        "install them with: apt-get install postgresql"
    )


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _as_server_user() -> list[str]:
    """The command prefix that runs a server binary as a user PostgreSQL accepts."""
    if os.geteuid() != 0:
        return []
    try:
        import pwd

        pwd.getpwnam(_SERVER_USER)
    except KeyError:
        raise PgServerUnavailable(
            f"running as root, and PostgreSQL refuses root, but there is no {_SERVER_USER!r} "
            "system user to run it as (apt-get install postgresql creates one)"
        ) from None
    runuser = shutil.which("runuser")
    if runuser:
        return [runuser, "-u", _SERVER_USER, "--"]
    raise PgServerUnavailable(
        "running as root, and runuser is missing to run PostgreSQL as postgres"
    )


class PgServer:
    """A running throwaway server; `stop` (or leaving the ``with`` block) removes everything."""

    def __init__(self, bindir: Path, base: Path, port: int) -> None:
        self.bindir = bindir
        self.base = base
        self.data = base / "data"
        self.socket_dir = base / "socket"
        self.log = base / "server.log"
        self.port = port
        self.host = "127.0.0.1"
        self._stopped = False
        self._max_connections = 300
        self._durable = False
        self._kept = False  # started by `start_kept`: `stop` leaves the data dir

    # ------------------------------------------------------------------ life cycle

    @classmethod
    def start(
        cls, *, durable: bool = False, max_connections: int = 300, attempts: int = 3
    ) -> PgServer:
        """``initdb`` a new cluster in a temp dir and start it on a free localhost port.

        ``durable`` keeps PostgreSQL's defaults (fsync, synchronous commit), as a production
        server has them: for benchmarks. Tests run without, which costs them nothing.

        Raises:
            PgServerUnavailable: the binaries or a user to run them as are missing.
            RuntimeError: the server did not start (its log's tail is in the message).
        """
        bindir = find_bindir()
        prefix = _as_server_user()
        # NOTE: not under pytest's tmp_path: /tmp/pytest-of-root is 0700, and the postgres
        # user must reach its data dir.
        base = Path(tempfile.mkdtemp(prefix="am-pg-"))
        try:
            _initdb(bindir, prefix, base)
            last_error: Exception | None = None
            for _ in range(attempts):
                server = cls(bindir, base, _free_port())
                server._max_connections, server._durable = max_connections, durable
                try:
                    server._pg_ctl_start(prefix, max_connections, durable)
                    return server
                except RuntimeError as exc:  # e.g. the port was taken meanwhile
                    last_error = exc
            raise RuntimeError(f"the PostgreSQL server did not start: {last_error}")
        except BaseException:
            shutil.rmtree(base, ignore_errors=True)
            raise

    @classmethod
    def start_kept(cls, base: Path, *, max_connections: int = 300) -> PgServer:
        """Start a server on the cluster in ``base`` (``initdb`` it first if ``base`` holds
        none), one that `stop` shuts down cleanly and leaves in place: for a benchmark that
        measures a large pool again after each change without filling it again.  As root,
        ``base``'s parent folders must let the ``postgres`` user through.

        Raises:
            PgServerUnavailable: the binaries or a user to run them as are missing.
            RuntimeError: the server did not start (its log's tail is in the message).
        """
        bindir = find_bindir()
        prefix = _as_server_user()
        base = base.resolve()
        if not (base / "data" / "PG_VERSION").exists():
            base.mkdir(parents=True, exist_ok=True)
            _initdb(bindir, prefix, base)
        server = cls(bindir, base, _free_port())
        server._max_connections, server._kept = max_connections, True
        server._pg_ctl_start(prefix, max_connections, durable=False)
        return server

    def _pg_ctl_start(self, prefix: list[str], max_connections: int, durable: bool) -> None:
        settings = [
            f"-p {self.port}",
            f"-k {self.socket_dir}",
            "-c listen_addresses=127.0.0.1",
            f"-c max_connections={max_connections}",
            # Deadlock tests need not wait the default second.
            "-c deadlock_timeout=200ms",
        ]
        if not durable:
            # Throwaway data: durability buys nothing here and costs a lot of time.
            settings += ["-c fsync=off", "-c synchronous_commit=off", "-c full_page_writes=off"]
        options = " ".join(settings)
        if prefix:
            self.log.touch()
            shutil.chown(self.log, _SERVER_USER, _SERVER_USER)
        result = subprocess.run(
            [
                *prefix,
                str(self.bindir / "pg_ctl"),
                "-D",
                str(self.data),
                "-o",
                options,
                "-l",
                str(self.log),
                "-w",
                "-t",
                "60",
                "start",
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            tail = self.log.read_text(errors="replace")[-2000:] if self.log.exists() else ""
            raise RuntimeError(f"pg_ctl start failed: {result.stderr.strip()} {tail.strip()}")

    def stop_in_place(self, mode: str = "fast") -> None:
        """Stop the server but keep its data dir and port, as in an outage; see `start_in_place`.

        ``mode`` is ``pg_ctl stop``'s: ``fast`` ends every session (rolling back open
        transactions), as a restart or a failover does; ``immediate`` is a crash.
        """
        _run(
            [
                *_as_server_user(),
                str(self.bindir / "pg_ctl"),
                "-D",
                str(self.data),
                "-m",
                mode,
                "-w",
                "stop",
            ],
            "pg_ctl stop",
        )

    def start_in_place(self) -> None:
        """Start the server again on its own data dir and port after `stop_in_place`."""
        self._pg_ctl_start(_as_server_user(), self._max_connections, self._durable)

    def stop(self) -> None:
        """Stop the server at once and remove its folder; idempotent.

        A server of `start_kept` is shut down cleanly instead (its data written out, as
        ``fsync=off`` needs before the next start) and its folder kept.
        """
        if self._stopped:
            return
        self._stopped = True
        if self._kept:
            self.stop_in_place("fast")
            return
        with contextlib.suppress(Exception):
            subprocess.run(
                [
                    *_as_server_user(),
                    str(self.bindir / "pg_ctl"),
                    "-D",
                    str(self.data),
                    "-m",
                    "immediate",
                    "-w",
                    "stop",
                ],
                capture_output=True,
                timeout=60,
                check=False,
            )
        shutil.rmtree(self.base, ignore_errors=True)

    def __enter__(self) -> PgServer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # ------------------------------------------------------------------ databases

    def url(self, database: str = "postgres", driver: str = "psycopg") -> str:
        """The SQLAlchemy URL of ``database`` on this server."""
        return f"postgresql+{driver}://{_SUPERUSER}@{self.host}:{self.port}/{database}"

    def _admin(self, sql: str) -> None:
        import psycopg

        with psycopg.connect(
            host=self.host, port=self.port, user=_SUPERUSER, dbname="postgres", autocommit=True
        ) as conn:
            conn.execute(sql)  # type: ignore[arg-type]

    def create_database(self, name: str | None = None, *, template: str | None = None) -> str:
        """Create a new empty database (or a copy of ``template``); return its URL."""
        name = name or f"db_{uuid.uuid4().hex[:16]}"
        sql = f'CREATE DATABASE "{name}"'
        if template is not None:
            sql += f' TEMPLATE "{template}" STRATEGY FILE_COPY'
        self._admin(sql)
        return self.url(name)

    def ensure_database(self, name: str) -> str:
        """The URL of database ``name``, created empty if it does not exist yet."""
        import psycopg

        with psycopg.connect(
            host=self.host, port=self.port, user=_SUPERUSER, dbname="postgres", autocommit=True
        ) as conn:
            found = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
        return self.url(name) if found else self.create_database(name)

    def drop_database(self, name_or_url: str) -> None:
        """Drop a database, closing whatever connections are still open to it."""
        name = name_or_url.rsplit("/", 1)[-1].split("?", 1)[0]
        self._admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _initdb(bindir: Path, prefix: list[str], base: Path) -> None:
    """A new cluster in ``base/data`` with its socket folder ``base/socket``, both owned by
    the server's user when the tests run as root."""
    (base / "data").mkdir(mode=0o700, exist_ok=True)
    (base / "socket").mkdir(mode=0o700, exist_ok=True)
    if prefix:
        for path in (base, base / "data", base / "socket"):
            shutil.chown(path, _SERVER_USER, _SERVER_USER)
    _run(
        [
            *prefix,
            str(bindir / "initdb"),
            "-D",
            str(base / "data"),
            "-U",
            _SUPERUSER,
            "--auth=trust",
            "--encoding=UTF8",
            "--locale=C",
            "--no-sync",
        ],
        "initdb",
    )


def _run(command: list[str], what: str) -> None:
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"{what} failed ({result.returncode}): {result.stderr.strip()[-2000:]}")
