"""Serving the viewer: werkzeug's threaded WSGI server on one address, loopback by default."""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable, Sequence

from werkzeug.serving import make_server

from ..lens.tokenizer import TokenDecoder
from ..manager import ArchiveManager
from .app import create_app
from .hosts import HostPolicy, host_policy

__all__ = ["DEFAULT_HOST", "DEFAULT_PORT", "is_loopback", "serve", "startup_line"]

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000


def is_loopback(host: str) -> bool:
    """Whether ``host`` answers this machine only (127.0.0.0/8, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _url(host: str, port: int) -> str:
    shown = f"[{host}]" if ":" in host and not host.startswith("[") else host
    return f"http://{shown}:{port}/"


def startup_line(
    pool: ArchiveManager, host: str, port: int, hosts: HostPolicy | None = None
) -> str:
    """What `serve` says when it starts: the pool, the address it binds to, who can reach
    it, and the host names it answers (``hosts``, by default those of a bind to ``host``)."""
    if is_loopback(host):
        reach = f"bound to {host}: this machine only; pass --host 0.0.0.0 to share it"
    else:
        reach = (
            f"bound to {host}: anyone who can reach this machine can read these rollouts, "
            "there is no authentication"
        )
    names = (hosts if hosts is not None else host_policy(host)).shown()
    return (
        f"serving pool {pool.root} read-only at {_url(host, port)} with werkzeug's threaded "
        f"server, {reach}; it answers requests for {names} only (--allow-host NAME adds "
        "one). Ctrl-C stops."
    )


def _listen(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host.strip("[]"), port))
        sock.listen(128)
    except BaseException:
        sock.close()
        raise
    return sock


def serve(
    pool: ArchiveManager,
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    *,
    announce: Callable[[str], None] | None = None,
    tokenizer: TokenDecoder | None = None,
    allowed_hosts: Sequence[str] = (),
) -> None:
    """Serve the viewer of ``pool`` until interrupted.

    ``port`` 0 picks a free port; ``announce`` receives the startup line, which names the
    port actually bound; ``tokenizer`` (`load_tokenizer`) shows response tokens as text.
    Requests are answered only for the host names of the bind address and
    ``allowed_hosts`` (`host_policy`), against DNS rebinding.

    Raises:
        InvalidInputError: an entry of ``allowed_hosts`` is no host name or address.
        OSError: the address cannot be bound (in use, or not an address of this machine).
    """
    hosts = host_policy(host, allowed_hosts)
    app = create_app(pool, tokenizer=tokenizer, hosts=hosts)
    # NOTE: make_server rather than run_simple: the startup line can name the real port
    # (``--port 0``), and there is no reloader or debugger.  The socket is bound here, not by
    # werkzeug, which prints to stderr and exits the process when an address is taken.
    listener = _listen(host, port)
    try:
        server = make_server(host, port, app, threaded=True, fd=listener.fileno())
    finally:
        listener.close()  # werkzeug works on its own duplicate of the socket
    if announce is not None:
        announce(startup_line(pool, host, server.port, hosts))
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
