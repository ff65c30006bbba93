"""Catalog URLs: parsed, shown without their password, and told apart by the database they
reach.  Every catalog database shares these; nothing here connects."""

from __future__ import annotations

import os
from pathlib import Path

from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError

from ..errors import CatalogError

__all__ = ["catalog_identity", "parse_url", "public_url", "shown_url", "sqlite_path"]


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
