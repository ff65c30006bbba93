"""Engine set-up in one place: SQLite pragmas, BEGIN IMMEDIATE for writers, error mapping.

SQLite follows SQLAlchemy's recipe for taking over transaction control from the sqlite3
driver (``isolation_level = None`` on connect, our own ``BEGIN`` from the ``begin`` event),
so that every transaction, reads included, is a real SQLite transaction and writers take the
write lock up front with ``BEGIN IMMEDIATE``: a second writer then waits in the busy handler
instead of failing mid-transaction with an unretryable ``SQLITE_BUSY_SNAPSHOT``.

PostgreSQL gets the same semantics on purpose, so that the save and GC protocols' correctness
argument (docs/architecture.md) carries over word for word: every write transaction first takes one
transaction-scoped advisory lock (`PG_WRITE_LOCK`), so writers take turns exactly as under
``BEGIN IMMEDIATE``, waiting up to the busy timeout (``lock_timeout``); writers run at READ
COMMITTED, so each statement after the lock sees every commit made before it; readers get one
REPEATABLE READ snapshot per transaction and never wait for writers. As for SQLite, the
driver's own BEGIN is off and the ``begin`` event sends ours (with the lock: one round trip).

A process stopped inside a write transaction (Ctrl-Z, a suspended batch job, a debugger)
holds the write lock until it resumes. PostgreSQL bounds that: every write transaction sets
``idle_in_transaction_session_timeout`` (`idle_in_transaction_timeout_ms`: half the busy
timeout), so the server ends a session that sits idle inside one and other writers go on; the
stopped process finds its transaction gone when it resumes, and a save's lease fences out
the rest (docs/architecture.md, "Save protocol"). A transaction that unlinks blob files under the lock
calls `pin_write_lock` first, because other writers rely on those unlinks happening while it
holds the lock. SQLite cannot bound it: when the busy timeout runs out, `CatalogLockedError`
names the processes holding the lock (`sqlite_lock_holders`, from ``/proc/locks``).

A reader's engine (``read_only=True``) never writes: on SQLite it opens the file ``mode=ro``
or ``immutable=1`` as `sqlite_read_mode` decides, without the WAL switch or any pragma that
writes, and refuses a write transaction at BEGIN; on PostgreSQL its reads are READ ONLY
(docs/architecture.md, Shared pools).

NOTE: no retry of serialization failures or deadlocks (SQLSTATE 40001, 40P01). With one lock
taken first by every writer, two archive_manager writers never hold row locks at once, so
they cannot deadlock; READ COMMITTED writers never get 40001, and REPEATABLE READ readers,
which only read, never do either. Such an error therefore means a foreign program (or a
migration racing a reader) touched the tables; it is reported as a `CatalogError` saying so.
A transparent retry would have to re-run the caller's block, which may have done file I/O
(GC unlinks inside it), and a context manager cannot re-run its body anyway.
"""

from __future__ import annotations

import os
import re
import sqlite3
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import URL, Connection, Engine, create_engine, make_url
from sqlalchemy.engine.interfaces import ExceptionContext
from sqlalchemy.exc import ArgumentError, DisconnectionError, NoSuchModuleError
from sqlalchemy.pool import ConnectionPoolEntry, QueuePool

from ..errors import (
    ArchiveError,
    CatalogError,
    CatalogLockedError,
    ReadOnlyPoolError,
    UnsupportedFilesystemError,
)

__all__ = [
    "BUSY_TIMEOUT_ENV",
    "DEFAULT_BUSY_TIMEOUT_MS",
    "NETWORK_FILESYSTEMS",
    "PG_WRITE_LOCK",
    "POSTGRES_EXTRA_HINT",
    "WRITE_OPTION",
    "CatalogUnreachableError",
    "LockHolder",
    "catalog_identity",
    "check_journal_mode",
    "check_local_filesystem",
    "check_read_unchanged",
    "dialect_of",
    "filesystem_type",
    "idle_in_transaction_timeout_ms",
    "is_network_filesystem",
    "make_engine",
    "parse_lock_table",
    "parse_url",
    "pin_write_lock",
    "public_url",
    "read_mount_table",
    "resolve_busy_timeout_ms",
    "shown_url",
    "sqlite_lock_holders",
    "sqlite_locked_message",
    "sqlite_path",
    "sqlite_read_mode",
]

BUSY_TIMEOUT_ENV = "ARCHIVE_MANAGER_BUSY_TIMEOUT_MS"
DEFAULT_BUSY_TIMEOUT_MS = 30_000

WRITE_OPTION = "archive_manager_write"
"""Connection execution option: when true, the ``begin`` event emits ``BEGIN IMMEDIATE``
(SQLite) or takes the `PG_WRITE_LOCK` advisory lock (PostgreSQL)."""

PG_WRITE_LOCK = 0x61726368_6D677231  # b"archmgr1": fixed, so every process agrees on it
"""The key of the advisory lock every PostgreSQL write transaction takes first: PostgreSQL's
``BEGIN IMMEDIATE``. Advisory locks are per database, so pools in different databases never
wait for each other."""

POSTGRES_EXTRA_HINT = "pip install 'archive_manager[postgres]'"

NETWORK_FILESYSTEMS = frozenset(
    {
        "nfs",
        "nfs4",
        "cifs",
        "smb3",
        "smbfs",
        "lustre",
        "gpfs",
        "beegfs",
        "ceph",
        "glusterfs",
        "9p",
        "afs",
        "fuse",
    }
)
# NOTE: every fuse.* type counts as networked (juicefs, sshfs, s3fs, gcsfuse, ...), except
# these, which are local by construction (rootless container root filesystems).
_LOCAL_FUSE = frozenset({"fuse.fuse-overlayfs"})

_SQLITE_BUSY = 5
_SQLITE_LOCKED = 6
_SQLITE_READONLY = 8
_SQLITE_IOERR = 10
_SQLITE_CORRUPT = 11
_SQLITE_FULL = 13
_SQLITE_CANTOPEN = 14
_SQLITE_NOTADB = 26
_CORRUPT_MESSAGES = ("file is not a database", "database disk image is malformed")


class CatalogUnreachableError(CatalogError):
    """The catalog server could not be reached, or went away (restart, shutdown, network), or
    ended this session (a write transaction left idle too long).

    Only the engine raises it; callers catch `CatalogError`. `Catalog.write` waits through it
    while no statement of its transaction has run yet, and a save's lease heartbeat retries
    through it: a server restart is an outage to wait out, not a reason to fail.
    """


def resolve_busy_timeout_ms(value: int | None = None) -> int:
    """The busy timeout to use: ``value``, else ``$ARCHIVE_MANAGER_BUSY_TIMEOUT_MS``, else 30 s."""
    if value is None:
        raw = os.environ.get(BUSY_TIMEOUT_ENV, "").strip()
        if not raw:
            return DEFAULT_BUSY_TIMEOUT_MS
        try:
            value = int(raw)
        except ValueError:
            raise CatalogError(f"{BUSY_TIMEOUT_ENV} must be an integer (ms), not {raw!r}") from None
    if value < 0:
        raise CatalogError(f"busy timeout must be >= 0 ms, not {value}")
    return value


# --- filesystem detection: a pure parser plus a thin reader ------------------------------

_OCTAL_ESCAPE = re.compile(r"\\([0-7]{3})")


def _unescape_mount_field(field: str) -> str:
    # The kernel writes space, tab, newline and backslash in mount points as \040 etc.
    return _OCTAL_ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), field)


def _mount_lines(mount_table: str) -> list[tuple[str, str]]:
    """(mount point, filesystem type) per line of ``/proc/self/mountinfo`` or ``/proc/mounts``."""
    mounts: list[tuple[str, str]] = []
    for line in mount_table.splitlines():
        fields = line.split()
        if len(fields) >= 10 and "-" in fields[6:]:
            # mountinfo: id parent major:minor root mount-point options [optional...] - type src
            sep = fields.index("-", 6)
            if sep + 1 < len(fields):
                mounts.append((_unescape_mount_field(fields[4]), fields[sep + 1]))
        elif len(fields) >= 3:
            # mounts / fstab style: source mount-point type options dump pass
            mounts.append((_unescape_mount_field(fields[1]), fields[2]))
    return mounts


def _is_under(path: str, mount_point: str) -> bool:
    if mount_point == "/":
        return path.startswith("/")
    mount_point = mount_point.rstrip("/")
    return path == mount_point or path.startswith(mount_point + "/")


def filesystem_type(path: str, mount_table: str) -> str | None:
    """The filesystem type holding absolute ``path``, from a mount table's text.

    Args:
        path: An absolute, symlink-free path.
        mount_table: The text of ``/proc/self/mountinfo`` or ``/proc/mounts``.

    Returns:
        The type of the mount with the longest matching mount point (the last one listed
        when several are stacked on one point), or None when no mount matches.
    """
    best_len, best_type = -1, None
    for mount_point, fstype in _mount_lines(mount_table):
        if _is_under(path, mount_point) and len(mount_point) >= best_len:
            best_len, best_type = len(mount_point), fstype
    return best_type


def is_network_filesystem(fstype: str) -> bool:
    """True for filesystem types on which SQLite's file locking cannot be trusted."""
    fstype = fstype.lower()
    if fstype in _LOCAL_FUSE:
        return False
    return fstype in NETWORK_FILESYSTEMS or fstype.startswith("fuse.")


def read_mount_table() -> str | None:
    """The text of this process's mount table, or None where there is none (not Linux)."""
    for candidate in ("/proc/self/mountinfo", "/proc/mounts"):
        try:
            return Path(candidate).read_text(encoding="utf-8", errors="surrogateescape")
        except OSError:
            continue
    return None


def check_local_filesystem(folder: str | os.PathLike[str], mount_table: str | None = None) -> None:
    """Raise `UnsupportedFilesystemError` if ``folder`` lies on a network filesystem.

    Args:
        folder: The folder that holds (or will hold) a SQLite catalog file.
        mount_table: The mount table's text; read from ``/proc`` when None. Where no mount
            table exists, nothing can be told and the check passes.
    """
    if mount_table is None:
        mount_table = read_mount_table()
        if mount_table is None:
            return
    path = os.path.realpath(folder)
    fstype = filesystem_type(path, mount_table)
    if fstype is not None and is_network_filesystem(fstype):
        raise UnsupportedFilesystemError(
            f"refusing to put a SQLite catalog on {path}: it is on a {fstype} filesystem, where "
            "SQLite's file locking is unreliable and concurrent writers can corrupt the "
            "catalog; keep the catalog on a local disk, or use a server catalog "
            "(catalog_url='postgresql+psycopg://user@host/dbname')"
        )


# --- who holds a SQLite catalog's write lock: a pure parser plus a thin reader ------------

# NOTE: SQLite's unix VFS keeps a WAL database's write lock as an fcntl (POSIX) lock on one
# byte of the -shm file, byte 120 (UNIX_SHM_BASE + WAL_WRITE_LOCK), held exclusively from
# BEGIN IMMEDIATE to the end of the transaction. A database a foreign program took out of WAL
# mode is locked through the database file itself: any exclusive lock on it counts.
_SHM_WRITE_LOCK_BYTE = 120
_STOPPED_STATES = ("T", "t")  # stopped by a signal (Ctrl-Z, SIGSTOP) or by a tracer
_URL_PASSWORD = re.compile(r"(://[^:/@\s]*:)[^@\s]*@")
_COMMAND_SHOWN = 200


@dataclass(frozen=True)
class LockHolder:
    """A process that holds a SQLite catalog's write lock, as ``/proc`` tells it."""

    pid: int
    command: str | None
    """Its command line (passwords in URLs masked, cut short), None when unreadable."""
    stopped: bool
    """True when a signal or a debugger stopped it: it holds the lock until it resumes."""


def parse_lock_table(
    lock_table: str, shm: tuple[int, int, int] | None, database: tuple[int, int, int] | None
) -> list[int]:
    """The pids holding a SQLite catalog's write lock, from the text of ``/proc/locks``.

    Args:
        lock_table: The text of ``/proc/locks``: per line ``N: POSIX ADVISORY WRITE pid
            major:minor:inode start end``, with the device numbers in hex; waiting requests
            (``N: -> ...``) hold nothing and are skipped.
        shm: (major, minor, inode) of the catalog's ``-shm`` file, None if it has none.
        database: (major, minor, inode) of the catalog file.

    Returns:
        Each pid once, in the order listed, that holds an exclusive POSIX lock covering the
        WAL write-lock byte of ``shm`` or any part of ``database``.
    """
    pids: list[int] = []
    for line in lock_table.splitlines():
        fields = line.split()
        if len(fields) < 8 or fields[1] != "POSIX" or fields[3] != "WRITE":  # "->": waiting
            continue
        try:
            pid = int(fields[4])
            major, minor, inode = fields[5].split(":")
            where = (int(major, 16), int(minor, 16), int(inode))
            start = int(fields[6])
            end = None if fields[7] == "EOF" else int(fields[7])
        except ValueError:
            continue
        covers_write_byte = start <= _SHM_WRITE_LOCK_BYTE and (
            end is None or end >= _SHM_WRITE_LOCK_BYTE
        )
        holds = (where == shm and covers_write_byte) or where == database
        if pid > 0 and holds and pid not in pids:
            pids.append(pid)
    return pids


def _file_id(path: str) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return os.major(st.st_dev), os.minor(st.st_dev), st.st_ino


def _describe_process(pid: int) -> LockHolder:
    command: str | None = None
    stopped = False
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
        # One line whatever the arguments hold (a ``python -c`` script has newlines).
        text = " ".join(raw.replace(b"\0", b" ").decode("utf-8", "replace").split())
        if text:
            text = _URL_PASSWORD.sub(r"\1***@", text)
            command = text if len(text) <= _COMMAND_SHOWN else text[: _COMMAND_SHOWN - 3] + "..."
    except OSError:
        pass
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(errors="replace")
        # "pid (comm) state ...": comm may hold spaces and parentheses, so split after it.
        state = stat.rpartition(")")[2].split()[:1]
        stopped = bool(state) and state[0] in _STOPPED_STATES
    except OSError:
        pass
    return LockHolder(pid, command, stopped)


def sqlite_lock_holders(database: str | os.PathLike[str]) -> list[LockHolder] | None:
    """The processes holding the write lock of the SQLite catalog file ``database``.

    Returns:
        The holders (usually one), an empty list when ``/proc/locks`` names none (the lock
        was just released, or its holder lives in another pid namespace), or None where
        there is no ``/proc/locks`` to read (not Linux).
    """
    try:
        lock_table = Path("/proc/locks").read_text(errors="replace")
    except OSError:
        return None
    path = os.fspath(database)
    pids = parse_lock_table(lock_table, _file_id(f"{path}-shm"), _file_id(path))
    return [_describe_process(pid) for pid in pids]


def _describe_holder(holder: LockHolder) -> str:
    facts = []
    if holder.pid == os.getpid():
        facts.append("this process: another of its connections")
    if holder.stopped:
        facts.append("stopped")
    if holder.command:
        facts.append(holder.command)
    return f"pid {holder.pid}" + (f" ({'; '.join(facts)})" if facts else "")


def sqlite_locked_message(
    database: str, busy_timeout_ms: int, reason: str, holders: Sequence[LockHolder] | None
) -> str:
    """The text of the `CatalogLockedError` for a SQLite catalog whose busy timeout ran out.

    It names who holds the write lock when ``holders`` does, and else says how to find out.
    """
    head = (
        f"the catalog {database} stayed locked for longer than the busy timeout "
        f"({busy_timeout_ms} ms): "
    )
    if not holders:
        return head + (
            f"another process holds its write lock; find it with 'fuser -v {database}-shm' or "
            f"'lsof {database}-shm' (a stopped process, state T in ps, holds it until it "
            f"resumes or ends); retry later ({reason})"
        )
    named = ", ".join(_describe_holder(h) for h in holders)
    stopped = [h.pid for h in holders if h.stopped]
    if stopped:
        advice = (
            "a stopped process (Ctrl-Z, a suspended job, a debugger) holds it until it resumes "
            f"(kill -CONT {' '.join(map(str, stopped))}) or ends"
        )
    else:
        advice = "wait for it to finish, or end it"
    return head + f"its write lock is held by {named}; {advice}, then retry ({reason})"


# --- engines ----------------------------------------------------------------------------


def parse_url(url: str | URL) -> URL:
    """``url`` as a SQLAlchemy `URL`; `CatalogError` if it is not one.

    The text is not echoed: an unparsable URL may still hold a password.
    """
    try:
        parsed = make_url(url)
    except ArgumentError as exc:
        raise CatalogError(
            "the catalog URL is not a SQLAlchemy URL (expected e.g. "
            "sqlite:////abs/path/catalog.db or postgresql+psycopg://user@host/dbname)"
        ) from exc
    if parsed.host is not None and "@" in parsed.host:
        # NOTE: a password holding a bare '@' ends at its first one for SQLAlchemy, and the
        # rest of it becomes part of the host, which every message would then show.
        raise CatalogError(
            "the catalog URL holds an '@' that is not percent-encoded (in its password?): "
            "write it as %40; the URL is not shown, since it may hold a password"
        )
    return parsed


#: Query parameters in which a driver takes a password (libpq's ``password`` and
#: ``sslpassword``, MySQL drivers' ``passwd``): as secret as the password field itself.
_SECRET_QUERY_KEYS = frozenset({"password", "passwd", "sslpassword"})

#: The server's port when a URL names none, so that ``host`` and ``host:5432`` are one catalog.
_DEFAULT_PORTS = {"postgresql": 5432, "mysql": 3306, "mariadb": 3306, "mssql": 1433}


def _without_secrets(url: URL) -> URL:
    query = {k: v for k, v in url.query.items() if k.lower() not in _SECRET_QUERY_KEYS}
    return URL.create(url.drivername, url.username, None, url.host, url.port, url.database, query)


def shown_url(url: str | URL) -> str:
    """``url`` as messages, logs, ``--json`` and pages may show it: no password.

    The password reads ``***``; password query parameters are left out; a URL that does
    not parse is not echoed at all (its text may hold a password).
    """
    try:
        parsed = make_url(url)
    except ArgumentError:
        return "<unparsable catalog URL>"
    if parsed.host is not None and "@" in parsed.host:
        return "<catalog URL with an unencoded '@'>"  # the host would show a password's tail
    masked = _without_secrets(parsed)
    if parsed.password is not None:
        masked = masked.set(password="***")
    return masked.render_as_string(hide_password=True)


def public_url(url: str | URL) -> str:
    """``url`` with its password removed (not masked): what may be written to a file."""
    return _without_secrets(parse_url(url)).render_as_string(hide_password=False)


def catalog_identity(url: str | URL) -> tuple[str, ...]:
    """Which database ``url`` reaches, whoever logs in: backend, host, port and database
    (a SQLite file by its real path); never the user, password or driver."""
    parsed = parse_url(url)
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        path = sqlite_path(parsed)
        return ("sqlite", os.path.realpath(path) if path is not None else ":memory:")
    host = parsed.host or parsed.query.get("host") or ""
    port = parsed.port or parsed.query.get("port") or _DEFAULT_PORTS.get(backend, "")
    return (backend, str(host).lower(), str(port), parsed.database or "")


def sqlite_path(url: str | URL) -> Path | None:
    """The file of a SQLite URL, or None for other databases and in-memory SQLite."""
    url = parse_url(url)
    if url.get_backend_name() != "sqlite":
        return None
    database = url.database
    if not database or database == ":memory:" or url.query.get("mode") == "memory":
        return None
    if database.startswith("file:"):
        database = database[len("file:") :].split("?", 1)[0]
    return Path(database)


def check_journal_mode(row: tuple[Any, ...] | None, database: str) -> None:
    """Raise `CatalogError` unless SQLite answered ``PRAGMA journal_mode = WAL`` with ``wal``.

    SQLite does not fail when it cannot switch modes (read-only media, no shared memory): it
    silently answers with the mode it kept, so the answer must be checked.
    """
    mode = None if not row else str(row[0]).lower()
    if mode != "wal":
        raise CatalogError(
            f"SQLite refused WAL journal mode for the catalog {database} (it kept {mode!r}); "
            "the catalog needs WAL so that readers and writers in several processes do not "
            "block each other"
        )


def _set_wal(cursor: Any, timeout_ms: int) -> tuple[Any, ...] | None:
    """``PRAGMA journal_mode = WAL``, retried while another connection holds the file.

    NOTE: switching a new file to WAL needs an exclusive lock, and SQLite answers BUSY at once
    instead of calling the busy handler; two processes creating one pool at the same moment
    hit that (seen: a save racing another's first open).  WAL persists in the file, so only a
    new catalog ever gets here with contention.
    """
    deadline = time.monotonic() + timeout_ms / 1000
    delay = 0.002
    while True:
        try:
            return cursor.execute("PRAGMA journal_mode = WAL").fetchone()
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) and "busy" not in str(exc):
                raise
            if time.monotonic() + delay > deadline:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 0.1)


def _error_code(exc: BaseException) -> int | None:
    code = getattr(exc, "sqlite_errorcode", None)
    return None if code is None else code & 0xFF


def _translate_sqlite_error(
    exc: BaseException, database: str, busy_timeout_ms: int, *, read_only: bool = False
) -> ArchiveError | None:
    """The `CatalogError` a raw sqlite3 error stands for, or None to let it through."""
    if not isinstance(exc, sqlite3.Error):
        return None
    code, message = _error_code(exc), str(exc)
    if code in (_SQLITE_BUSY, _SQLITE_LOCKED) or (code is None and "database is locked" in message):
        # Looked up now, while the holder still holds the lock: the usual holder is a process
        # stopped inside a write transaction, and only a name tells the operator which.
        holders = sqlite_lock_holders(database)
        return CatalogLockedError(
            sqlite_locked_message(database, busy_timeout_ms, message, holders)
        )
    if code in (_SQLITE_CORRUPT, _SQLITE_NOTADB) or any(m in message for m in _CORRUPT_MESSAGES):
        return CatalogError(
            f"the catalog file {database} is not a usable SQLite database ({message}): it is "
            "truncated or corrupt; restore it from a backup or rebuild it from the manifests"
        )
    if code == _SQLITE_FULL or "database or disk is full" in message:
        return CatalogError(
            f"the catalog file {database} cannot grow: the disk (or a quota) is full "
            f"({message}); nothing was committed, free some space and retry"
        )
    if code == _SQLITE_IOERR or "disk I/O error" in message:
        return CatalogError(
            f"the catalog file {database} could not be read or written: {message}; nothing "
            "was committed (check the disk and its free space)"
        )
    if read_only and (code == _SQLITE_READONLY or "readonly database" in message):
        return ReadOnlyPoolError(
            f"the catalog {database} is open read-only here; nothing was written ({message})"
        )
    if code == _SQLITE_READONLY or "readonly database" in message:
        return CatalogError(
            f"the catalog file {database} is read-only ({message}); the catalog needs write "
            "access to the file and its folder (for the -wal and -shm files), even to read"
        )
    if code == _SQLITE_CANTOPEN or "unable to open database file" in message:
        return CatalogError(f"cannot open the catalog file {database} ({message})")
    return None


_engines: weakref.WeakSet[Engine] = weakref.WeakSet()
_fork_hook_lock = threading.Lock()
_fork_hook_installed = False


def _dispose_after_fork() -> None:
    # A forked child must never touch its parent's pooled connections (a SQLite handle or a
    # server socket shared by two processes corrupts state); close=False leaves them to the
    # parent.
    for engine in list(_engines):
        engine.dispose(close=False)


def _track_for_fork(engine: Engine) -> None:
    global _fork_hook_installed
    with _fork_hook_lock:
        if not _fork_hook_installed and hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=_dispose_after_fork)
            _fork_hook_installed = True
        _engines.add(engine)


@dataclass(frozen=True)
class _Dialect:
    """What one database needs so that the save and GC protocols hold on it: an engine whose
    ``begin`` event takes the one write lock for writers and whose ``handle_error`` event
    turns the driver's errors into `CatalogError` (bulk inserts: `catalog.bulk`)."""

    write_lock: str
    make_engine: Callable[[URL, int, bool, bool], Engine]  # url, busy ms, check fs, read-only


def dialect_of(url: str | URL) -> str:
    """The name of the catalog database ``url`` names (``sqlite``, ``postgresql``).

    Raises:
        CatalogError: the URL is malformed, or names a database this library does not support:
            the protocols rely on the write lock each supported dialect sets up, which a
            plain engine of another database would run without.
    """
    parsed = parse_url(url)
    name = parsed.get_backend_name()
    if name not in _DIALECTS:
        supported = ", ".join(f"{n} ({d.write_lock})" for n, d in sorted(_DIALECTS.items()))
        raise CatalogError(
            f"the catalog URL {shown_url(parsed)} names a {name!r} database, which archive_manager "
            f"does not support: saves and GC need a catalog that serialises writers, and only "
            f"these are set up to: {supported}"
        )
    return name


def make_engine(
    url: str | URL,
    *,
    busy_timeout_ms: int | None = None,
    check_filesystem: bool = True,
    read_only: bool = False,
) -> Engine:
    """Create the catalog's engine; the only place engines are made.

    Args:
        url: A SQLAlchemy URL. SQLite must be a file; PostgreSQL (``postgresql+psycopg://``;
            a bare ``postgresql://`` means psycopg 3 too) gets the write lock described above;
            other databases are refused.
        busy_timeout_ms: How long a writer waits for another's lock; None reads
            ``$ARCHIVE_MANAGER_BUSY_TIMEOUT_MS`` or uses 30 s.
        check_filesystem: Refuse a SQLite file on a network filesystem.
        read_only: A reader's engine: it never creates, switches or migrates anything (see
            `sqlite_read_mode` for SQLite; PostgreSQL reads in READ ONLY transactions).

    Raises:
        UnsupportedFilesystemError: The SQLite file's folder is on a network filesystem.
        CatalogError: The URL is malformed, names a database other than SQLite and
            PostgreSQL (`dialect_of`), an in-memory SQLite database, or its driver is
            missing.
    """
    name = dialect_of(url)
    return _DIALECTS[name].make_engine(
        parse_url(url), resolve_busy_timeout_ms(busy_timeout_ms), check_filesystem, read_only
    )


def _make_sqlite_engine(
    url: URL, timeout_ms: int, check_filesystem: bool, read_only: bool = False
) -> Engine:
    path = sqlite_path(url)
    if path is None:
        raise CatalogError(
            "an in-memory SQLite catalog is not supported: every connection would see its own "
            "empty database; give a file (sqlite:///path/to/catalog.db)"
        )
    if check_filesystem:
        check_local_filesystem(path.absolute().parent)
    database = str(path)
    if read_only:
        return _make_sqlite_reader(url, path, timeout_ms)

    # NOTE: QueuePool keeps connection set-up out of every transaction, and a save opens
    # several: measured, a read transaction takes 43 us pooled vs 300 us with NullPool, a
    # write 0.22 ms vs 1.4 ms. Processes never share it: forked children drop it (above).
    engine = create_engine(
        url,
        poolclass=QueuePool,
        pool_size=5,
        max_overflow=64,
        connect_args={"timeout": timeout_ms / 1000.0},
    )

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, record: ConnectionPoolEntry) -> None:
        # Take BEGIN/COMMIT away from the sqlite3 driver; the "begin" event emits our own.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute(f"PRAGMA busy_timeout = {timeout_ms:d}")
            check_journal_mode(_set_wal(cursor, timeout_ms), database)
            cursor.execute("PRAGMA synchronous = FULL")
            cursor.execute("PRAGMA foreign_keys = ON")
        except BaseException as exc:
            cursor.close()
            # The pool forgets a connection whose set-up failed; release its file handle now.
            dbapi_connection.close()
            translated = _translate_sqlite_error(exc, database, timeout_ms)
            if translated is None:
                raise
            raise translated from exc
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        if conn.get_execution_options().get(WRITE_OPTION):
            conn.exec_driver_sql("BEGIN IMMEDIATE")
        else:
            conn.exec_driver_sql("BEGIN")

    @event.listens_for(engine, "handle_error")
    def _on_error(context: ExceptionContext) -> None:
        translated = _translate_sqlite_error(context.original_exception, database, timeout_ms)
        if translated is not None:
            raise translated from context.original_exception

    _track_for_fork(engine)
    return engine


# --- SQLite readers that write nothing -----------------------------------------------------

# Bytes of a WAL file's header: a shorter -wal holds no commit (docs/architecture.md, Shared
# pools).
_WAL_HEADER = 32


def sqlite_read_mode(path: str | os.PathLike[str]) -> str:
    """How a reader that must write nothing opens the SQLite catalog ``path``: ``"ro"`` or
    ``"immutable"`` (docs/architecture.md, Shared pools).

    NOTE: SQLite reads a WAL database it may not write only if its ``-wal`` and ``-shm``
    files already exist, or as ``immutable`` (https://www.sqlite.org/wal.html#readonly,
    https://www.sqlite.org/walformat.html); a plain ``mode=ro`` open of a WAL file without
    them fails ("unable to open database file") where they cannot be created, and creates
    them where they can.  So:

    * both exist: a process has the catalog open (or died with it open).  ``mode=ro`` reads
      through them under the writers' locks: each read transaction is a consistent snapshot
      of the last commit before it began, as for any WAL reader.
    * no ``-wal`` (or an empty one, which holds no commit): no process has the catalog open
      and the file holds every commit.  ``immutable=1`` reads it with no lock and no side
      file; since SQLite then assumes nobody changes it, `check_read_unchanged` watches the
      file for a writer that opens it meanwhile.

    Raises:
        CatalogError: a ``-wal`` that holds commits but no ``-shm`` (a writer died in a state
            only a writable open recovers): reading the file alone could return half a
            checkpoint.
    """
    # SQLite puts -wal and -shm beside the file a symlink names: look there.
    database = os.path.realpath(os.fspath(path))
    try:
        wal_size = os.stat(f"{database}-wal").st_size
    except FileNotFoundError:
        return "immutable"
    if os.path.exists(f"{database}-shm"):
        return "ro"
    if wal_size < _WAL_HEADER:
        return "immutable"
    raise CatalogError(
        f"the catalog {database} has a write-ahead log ({database}-wal) but no -shm file: a "
        "process that wrote it died, and only a process that may write the pool can recover "
        "it; open the pool once with write access (any read verb does), then read it here"
    )


class _ReaderConnection(sqlite3.Connection):
    """A reader's sqlite3 connection, with how it was opened (see `sqlite_read_mode`)."""

    read_mode: str = "ro"
    database: str = ""
    stamp: tuple[int, ...] | None = None


def _stamp(database: str) -> tuple[int, ...] | None:
    """What changes when anything writes the file: inode, size, mtime, ctime."""
    try:
        st = os.stat(database)
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def check_read_unchanged(conn: Connection) -> None:
    """At the end of a read transaction: refuse what an ``immutable`` connection read if the
    catalog file changed meanwhile (a writer opened the catalog and checkpointed into it).

    NOTE: SQLite trusts an immutable file not to change and keeps its pages cached across
    transactions; a changed file could give rows that mix two states.  An unchanged file
    (inode, size, mtime, ctime) proves the pages read were one state, however stale.

    Raises:
        CatalogError: the file changed; the connection is dropped, so a retry reads anew (and
            through the writer's WAL, see `sqlite_read_mode`).
    """
    try:
        raw = conn.connection.dbapi_connection
    except Exception:  # an invalidated connection: nothing was read through it
        return
    if not isinstance(raw, _ReaderConnection) or raw.read_mode != "immutable":
        return
    if _stamp(raw.database) == raw.stamp:
        return
    conn.invalidate()
    raise CatalogError(
        f"the catalog {raw.database} changed while this process read it (it was read as an "
        "unchanging file because no process had it open; a writer opened it meanwhile): "
        "what was read cannot be trusted; retry, and the read follows the writer's log"
    )


def _make_sqlite_reader(url: URL, path: Path, timeout_ms: int) -> Engine:
    """The engine of a reader that writes nothing: no WAL switch, no side files, no lock
    taken for writing (see `sqlite_read_mode`)."""
    database = str(path.absolute())

    def connect() -> sqlite3.Connection:
        mode = sqlite_read_mode(database)
        stamp = _stamp(database)
        query = "mode=ro" if mode == "ro" else "immutable=1"
        try:
            raw = sqlite3.connect(
                f"{Path(database).as_uri()}?{query}",
                uri=True,
                timeout=timeout_ms / 1000.0,
                factory=_ReaderConnection,
                check_same_thread=False,
            )
        except sqlite3.Error as exc:
            translated = _translate_sqlite_error(exc, database, timeout_ms, read_only=True)
            if translated is None:
                raise
            raise translated from exc
        assert isinstance(raw, _ReaderConnection)
        raw.read_mode, raw.database, raw.stamp = mode, database, stamp
        raw.isolation_level = None  # BEGIN comes from the "begin" event, as for writers
        return raw

    engine = create_engine(url, creator=connect, poolclass=QueuePool, pool_size=5, max_overflow=64)

    @event.listens_for(engine, "checkout")
    def _on_checkout(dbapi_connection: Any, record: ConnectionPoolEntry, proxy: Any) -> None:
        # A pooled connection opened in the other mode, or an immutable one whose file changed
        # since (its page cache is stale), is replaced by a new one.
        if not isinstance(dbapi_connection, _ReaderConnection):
            return
        try:
            mode = sqlite_read_mode(database)
        except CatalogError:
            raise DisconnectionError() from None  # the new connection reports it
        stale = dbapi_connection.read_mode == "immutable" and (
            _stamp(database) != dbapi_connection.stamp
        )
        if mode != dbapi_connection.read_mode or stale:
            raise DisconnectionError()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        if conn.get_execution_options().get(WRITE_OPTION):
            raise ReadOnlyPoolError(f"the catalog {database} is open read-only here")
        conn.exec_driver_sql("BEGIN")

    @event.listens_for(engine, "handle_error")
    def _on_error(context: ExceptionContext) -> None:
        translated = _translate_sqlite_error(
            context.original_exception, database, timeout_ms, read_only=True
        )
        if translated is not None:
            raise translated from context.original_exception

    _track_for_fork(engine)
    return engine


def _create_engine(url: URL, **kwargs: Any) -> Engine:
    try:
        return create_engine(url, **kwargs)
    except ModuleNotFoundError as exc:
        extra = POSTGRES_EXTRA_HINT if url.get_backend_name() == "postgresql" else "install it"
        raise CatalogError(
            f"the catalog URL {shown_url(url)} needs the Python "
            f"module {exc.name!r}, which is not installed: {extra}"
        ) from exc
    except NoSuchModuleError as exc:
        raise CatalogError(
            f"the catalog URL {shown_url(url)} names a database or "
            f"driver SQLAlchemy does not know ({exc})"
        ) from exc


# --- PostgreSQL ---------------------------------------------------------------------------

_PG_LOCK_NOT_AVAILABLE = "55P03"
_PG_NO_PRIVILEGE = "42501"
_PG_READ_ONLY_TRANSACTION = "25006"
_PG_SERIALIZATION_FAILURE = "40001"
_PG_DEADLOCK = "40P01"
_PG_BAD_AUTH = ("28000", "28P01")
_PG_NO_DATABASE = "3D000"
_PG_TOO_MANY_CONNECTIONS = "53300"
_PG_IDLE_IN_TRANSACTION_TIMEOUT = "25P03"
# admin_shutdown (pg_ctl stop/restart, pg_terminate_backend), crash_shutdown (another backend
# crashed), cannot_connect_now (starting up or shutting down): the server comes back.
_PG_SERVER_GOING_AWAY = ("57P01", "57P02", "57P03")


def idle_in_transaction_timeout_ms(busy_timeout_ms: int) -> int:
    """How long a PostgreSQL write transaction may sit idle before the server ends it.

    Half the busy timeout, and at least a second. Half: a writer that starts waiting for the
    lock at the moment its holder stops gets it after at most this long, well inside its own
    busy timeout, instead of timing out together with the kill. At least a second: the
    library's write transactions go from statement to statement in milliseconds (those that
    do file I/O under the lock call `pin_write_lock`), so only a stopped (or wedged) process
    sits idle for that long, even with a tiny busy timeout. It does not depend on the lease:
    the server's rollback undoes everything of the cut transaction, and what the stopped
    process did before it is what its lease protects, which lapses on its own, as for any
    paused writer. The bound is the holder's: each process sets it from its own busy timeout.
    """
    return max(busy_timeout_ms // 2, 1000)


def pin_write_lock(conn: Connection) -> None:
    """Keep this write transaction's lock until it ends, however long the process stops.

    Call it inside `Catalog.write` before doing file I/O that other writers rely on happening
    while this transaction holds the write lock (unlinking blobs: a save that finds a blob
    ``deleting`` writes it anew, and a stopped GC whose session the server ended would unlink
    the new file when it resumes). On PostgreSQL it lifts the idle-in-transaction bound
    (`idle_in_transaction_timeout_ms`) for the rest of the transaction, so a process stopped
    from now on blocks every writer until it resumes, as on SQLite; if the server already
    ended the session, this statement fails and the caller unlinks nothing. Elsewhere a
    no-op: SQLite never takes a lock from its holder.
    """
    if conn.dialect.name == "postgresql":
        conn.exec_driver_sql("SET LOCAL idle_in_transaction_session_timeout = 0")


def _pg_reason(exc: BaseException) -> str:
    """The server's (or libpq's) message, on one line."""
    diag = getattr(exc, "diag", None)
    primary = getattr(diag, "message_primary", None)
    text = primary or str(exc)
    return " ".join(text.split())


def _translate_postgresql_error(
    exc: BaseException, where: str, busy_timeout_ms: int, *, read_only: bool = False
) -> ArchiveError | None:
    """The `CatalogError` a raw psycopg error stands for, or None to let it through."""
    try:
        import psycopg
    except ModuleNotFoundError:  # pragma: no cover - the engine could not exist without it
        return None
    if not isinstance(exc, psycopg.Error):
        return None
    state = getattr(exc, "sqlstate", None)
    reason = _pg_reason(exc)
    if state == _PG_READ_ONLY_TRANSACTION or (read_only and state == _PG_NO_PRIVILEGE):
        return ReadOnlyPoolError(
            f"the catalog {where} is open read-only here; nothing was written ({reason})"
        )
    if state == _PG_NO_PRIVILEGE:
        return ReadOnlyPoolError(
            f"the catalog {where} refused this role a write ({reason}); nothing was "
            "committed: a role that may only read opens the pool read-only, a writer role "
            "needs the GRANTs of the README's 'Shared pools: readers and writers', and a "
            "catalog upgrade needs the catalog's owner ('archive-manager db upgrade' as it)"
        )
    if state == _PG_LOCK_NOT_AVAILABLE:
        return CatalogLockedError(
            f"the catalog {where} stayed locked by another process for longer than the busy "
            f"timeout ({busy_timeout_ms} ms); retry later, or find the process holding the "
            "write lock (pg_locks, locktype 'advisory', joined to pg_stat_activity) "
            f"({reason})"
        )
    if state == _PG_IDLE_IN_TRANSACTION_TIMEOUT:
        return CatalogUnreachableError(
            f"the catalog server of {where} ended this process's write transaction: it sat "
            "idle inside it for longer than "
            f"{idle_in_transaction_timeout_ms(busy_timeout_ms)} ms, as a process stopped by "
            "Ctrl-Z, a debugger or a suspended job does; nothing of it was committed, and "
            f"other writers went on meanwhile ({reason})"
        )
    if state in _PG_SERVER_GOING_AWAY:
        return CatalogUnreachableError(
            f"the catalog server of {where} went away (restarting or shutting down), rolling "
            f"back any transaction this process had open: {reason}"
        )
    if state in (_PG_SERIALIZATION_FAILURE, _PG_DEADLOCK):
        what = "a deadlock" if state == _PG_DEADLOCK else "a serialization failure"
        return CatalogError(
            f"the catalog {where} aborted a transaction with {what} ({reason}); archive_manager "
            "writers take one lock in turn and cannot cause this, so another program (or a "
            "catalog upgrade) is using the tables at the same time; nothing was committed, "
            "retry the operation"
        )
    if state is None and isinstance(exc, psycopg.OperationalError):
        # A failed connect carries no SQLSTATE, only libpq's text (and the server's FATAL).
        state = _connect_failure_state(reason)
        if state is None:
            # Refused, unknown host, timeout, or a connection lost mid-transaction.
            return CatalogUnreachableError(f"cannot reach the catalog server of {where}: {reason}")
    if state in _PG_BAD_AUTH:
        return CatalogError(f"the catalog server refused the login for {where}: {reason}")
    if state == _PG_NO_DATABASE:
        return CatalogError(
            f"the catalog database of {where} does not exist ({reason}); create it first "
            "(CREATE DATABASE ... OWNER ...)"
        )
    if state == _PG_TOO_MANY_CONNECTIONS:
        return CatalogError(f"the catalog server of {where} has no free connection: {reason}")
    return None


def _connect_failure_state(reason: str) -> str | None:
    """The SQLSTATE a connect failure's message stands for, or None (no server answered)."""
    if "FATAL" not in reason:
        return None
    if (
        "authentication failed" in reason
        or "no pg_hba.conf entry" in reason
        or ("role " in reason and "does not exist" in reason)
    ):
        return _PG_BAD_AUTH[1]
    if "database " in reason and "does not exist" in reason:
        return _PG_NO_DATABASE
    if "too many" in reason and "connections" in reason:
        return _PG_TOO_MANY_CONNECTIONS
    return None


def _make_postgresql_engine(
    url: URL, timeout_ms: int, check_filesystem: bool = True, read_only: bool = False
) -> Engine:
    if url.drivername == "postgresql":
        # SQLAlchemy's default driver is psycopg2; the one this library supports is psycopg 3.
        url = url.set(drivername="postgresql+psycopg")
    where = shown_url(url)
    connect_args: dict[str, Any] = {}
    if "application_name" not in url.query:
        # Shown in pg_stat_activity, so an operator can tell who holds the write lock.
        connect_args["application_name"] = "archive_manager"
    if "connect_timeout" not in url.query:
        connect_args["connect_timeout"] = max(1, min(30, -(-timeout_ms // 1000)))
    engine = _create_engine(
        url,
        pool_pre_ping=True,
        # The driver's own BEGIN is turned off (its "autocommit"): the begin event below sends
        # BEGIN together with the write lock, one round trip, as pysqlite's recipe does for
        # SQLite. psycopg's commit() and rollback() still end the transaction we began.
        isolation_level="AUTOCOMMIT",
        pool_size=5,
        max_overflow=20,
        connect_args=connect_args,
    )
    # NOTE: writers must stay at READ COMMITTED: at REPEATABLE READ the snapshot would be taken
    # by the statement that waits for the write lock, i.e. before the previous writer
    # committed, and the protocols' read-then-write steps would act on stale rows. Readers
    # get one snapshot for their whole transaction. SET LOCAL bounds only this transaction's
    # idleness (see `idle_in_transaction_timeout_ms`): readers, which block no writer, may
    # hold a snapshot open across the caller's work.
    write_begin = (
        "BEGIN ISOLATION LEVEL READ COMMITTED; "
        "SET LOCAL idle_in_transaction_session_timeout = "
        f"{idle_in_transaction_timeout_ms(timeout_ms):d}; "
        f"SELECT pg_advisory_xact_lock({PG_WRITE_LOCK:d})"
    )
    # A reader's transactions are READ ONLY as well: the server itself refuses any write that
    # got past `Catalog.write`'s gate (docs/architecture.md, Shared pools).
    read_begin = "BEGIN ISOLATION LEVEL REPEATABLE READ" + (" READ ONLY" if read_only else "")
    no_parameters = {"no_parameters": True}  # several statements: the simple query protocol

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, record: ConnectionPoolEntry) -> None:
        # The busy timeout bounds every lock wait of this session: the write lock, and row or
        # table locks held by a foreign program or a migration.
        with dbapi_connection.cursor() as cursor:
            # NOTE: 0 means "wait forever" to PostgreSQL but "never wait" to SQLite.
            cursor.execute(f"SET lock_timeout = {max(timeout_ms, 1):d}")
        dbapi_connection.commit()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        write = conn.get_execution_options().get(WRITE_OPTION)
        conn.exec_driver_sql(write_begin if write else read_begin, execution_options=no_parameters)

    @event.listens_for(engine, "handle_error")
    def _on_error(context: ExceptionContext) -> None:
        if context.is_pre_ping:
            return  # a stale pooled connection: the pool reconnects by itself
        translated = _translate_postgresql_error(
            context.original_exception, where, timeout_ms, read_only=read_only
        )
        if translated is not None:
            raise translated from context.original_exception

    _track_for_fork(engine)
    return engine


# The registry of supported catalog databases (docs/architecture.md, "Safety rules": the
# catalog serialises writers).  A database is added here with its engine set-up, or not at all.
_DIALECTS: dict[str, _Dialect] = {
    "sqlite": _Dialect("BEGIN IMMEDIATE, WAL", _make_sqlite_engine),
    "postgresql": _Dialect("an advisory write lock", _make_postgresql_engine),
}
