"""A read-only web viewer of a pool: ``create_app(pool)`` (a Flask app) and ``serve(pool)``.

Needs the ``web`` extra (Flask).
"""

from __future__ import annotations

from ..errors import MissingDependencyError, extra_hint

try:
    import flask  # noqa: F401
except ModuleNotFoundError as exc:
    raise MissingDependencyError(
        "the web viewer needs Flask, which is not installed; " + extra_hint("web")
    ) from exc

from .app import create_app
from .hosts import HostPolicy, host_policy
from .server import DEFAULT_HOST, DEFAULT_PORT, serve, startup_line

__all__ = [
    "DEFAULT_HOST",
    "DEFAULT_PORT",
    "HostPolicy",
    "create_app",
    "host_policy",
    "serve",
    "startup_line",
]
