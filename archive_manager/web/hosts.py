"""Which ``Host`` headers the viewer answers: a defence against DNS rebinding.

A web page on ``evil.example`` can point its own name at 127.0.0.1 and then read the answers
of whatever listens there as same-origin responses: every prompt, response and the pool's
path.  The browser still sends ``Host: evil.example``, so the viewer answers only the names
it was bound to (and those its operator lists); any other gets a 421 with no data.

An IP address as the host is always one the browser connected to itself: a page's origin can
only be that address if the page came from it, so a rebinding attack never carries one.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Iterable
from dataclasses import dataclass

from ..errors import InvalidInputError

__all__ = ["LOOPBACK", "HostPolicy", "check_allowed_host", "host_policy", "parse_host"]

#: A DNS name as a Host header holds it (lower-cased first): labels of letters, digits,
#: hyphens and underscores (some internal zones use them), joined by dots.
_NAME = re.compile(r"[a-z0-9_](?:[a-z0-9_-]{0,62})(?:\.[a-z0-9_](?:[a-z0-9_-]{0,62}))*")
_MAX_NAME = 253
_WILDCARDS = frozenset({"", "0.0.0.0", "::"})
_LOCALHOST = "localhost"


def _ip(name: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(name)
    except ValueError:
        return None


def parse_host(text: str) -> tuple[str, int | None] | None:
    """``(host, port)`` of a ``Host`` header (``name``, ``name:port``, ``1.2.3.4:80``,
    ``[::1]:80``): the name lower-cased without a trailing dot, an address in its canonical
    spelling; None for anything else (an IPv6 address without brackets, a bad port, a
    character no host name has)."""
    text = text.strip().lower()
    port_text: str | None = None
    if text.startswith("["):
        inside, sep, rest = text[1:].partition("]")
        if not sep or (rest and not rest.startswith(":")):
            return None
        address = _ip(inside)
        if address is None or address.version != 6:
            return None
        name = str(address)
        port_text = rest[1:] if rest else None
    else:
        name, sep, port_text_found = text.partition(":")
        port_text = port_text_found if sep else None
        if ":" in port_text_found:
            return None  # an IPv6 address needs its brackets in a Host header
        name = name.removesuffix(".")
        address = _ip(name)
        if address is not None:
            name = str(address)
        elif len(name) > _MAX_NAME or _NAME.fullmatch(name) is None:
            return None
    if port_text is None:
        return name, None
    if not port_text.isascii() or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        return None
    return name, int(port_text)


@dataclass(frozen=True)
class HostPolicy:
    """The hosts the viewer answers.

    ``names`` match with any port or none (a port forwarded by ``ssh -L`` or a container
    arrives as another port); ``pairs`` match that port only; with ``any_address``, every IP
    address matches (a bind to every interface).
    """

    names: frozenset[str]
    pairs: frozenset[tuple[str, int]] = frozenset()
    any_address: bool = False

    def allows(self, header: str | None) -> bool:
        """Whether a request whose ``Host`` header is ``header`` (None: none sent) is
        answered."""
        if header is None:
            return False  # every browser sends one; a request without is no browser's
        parsed = parse_host(header)
        if parsed is None:
            return False
        name, port = parsed
        if name in self.names or (port is not None and (name, port) in self.pairs):
            return True
        return self.any_address and _ip(name) is not None

    def shown(self) -> str:
        """The allowed hosts, for the startup line."""
        parts = sorted(self.names) + sorted(
            f"[{n}]:{p}" if ":" in n else f"{n}:{p}" for n, p in self.pairs
        )
        if self.any_address:
            parts.insert(0, "any IP address of this machine")
        return ", ".join(parts)


def check_allowed_host(text: str) -> tuple[str, int | None]:
    """An operator's ``--allow-host`` entry as ``(name, port)``.

    Raises:
        InvalidInputError: it is no host name or address, with an optional port.
    """
    parsed = parse_host(text) if text.strip() else None
    if parsed is None:
        raise InvalidInputError(
            f"{text[:80]!r} is not a host name or address with an optional :PORT "
            "(viewer.example.org, 10.0.0.5:8000, [fd00::5])"
        )
    return parsed


def host_policy(bind: str, allowed: Iterable[str] = ()) -> HostPolicy:
    """The hosts a viewer bound to ``bind`` answers, and the ``allowed`` entries
    (`check_allowed_host`) its operator adds.

    A loopback bind answers ``localhost`` and the loopback addresses; a bind to one address
    or name answers that; a bind to every interface (``0.0.0.0``, ``::``) answers any
    address of this machine and its host name.

    Raises:
        InvalidInputError: an ``allowed`` entry is no host.
    """
    names: set[str] = set()
    pairs: set[tuple[str, int]] = set()
    any_address = False
    bound = bind.strip().strip("[]").lower().removesuffix(".")
    address = _ip(bound)
    if bound in _WILDCARDS:
        any_address = True
        names.add(_LOCALHOST)
        names.add(socket.gethostname().lower().removesuffix("."))
    elif bound == _LOCALHOST or (address is not None and address.is_loopback):
        names.update({_LOCALHOST, "127.0.0.1", "::1"})
        names.add(str(address) if address is not None else bound)
    else:
        names.add(str(address) if address is not None else bound)
    for entry in allowed:
        name, port = check_allowed_host(entry)
        if port is None:
            names.add(name)
        else:
            pairs.add((name, port))
    return HostPolicy(frozenset(names), frozenset(pairs), any_address)


#: What `create_app` answers when its caller names no hosts: a loopback bind's.
LOOPBACK = host_policy("127.0.0.1")
