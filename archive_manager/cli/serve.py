"""``archive-manager serve``: the read-only web viewer of a pool."""

from __future__ import annotations

from pathlib import Path

import click

from ..errors import InvalidInputError
from ..lens.tokenizer import load_tokenizer
from ._context import CliError, PoolState, pass_state

__all__ = ["serve"]


def _check_hosts(
    ctx: click.Context, param: click.Parameter, value: tuple[str, ...]
) -> tuple[str, ...]:
    """``--allow-host`` entries, each a host name or address with an optional port: a typo
    is a usage error before the pool is opened."""
    if not value:
        return value
    # Imported here: the web package needs Flask, which other verbs must not.
    from ..web.hosts import check_allowed_host

    for entry in value:
        try:
            check_allowed_host(entry)
        except InvalidInputError as exc:
            raise click.BadParameter(str(exc), ctx, param) from None
    return value


@click.command()
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="Address to bind; the default answers this machine only (0.0.0.0: every interface, "
    "with no authentication).",
)
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=8000,
    show_default=True,
    help="Port to listen on (0: any free port, shown when it starts).",
)
@click.option(
    "--allow-host",
    "allowed_hosts",
    multiple=True,
    metavar="NAME[:PORT]",
    callback=_check_hosts,
    help="Also answer requests sent to this host name (a DNS alias, a reverse proxy's "
    "name); repeatable. By default only the bound address's names are answered (localhost "
    "for a loopback bind), every other with 421: a web page cannot read the viewer through "
    "a name of its own (DNS rebinding).",
)
@click.option(
    "--tokenizer",
    "tokenizer_path",
    type=click.Path(path_type=Path),
    help="A local tokenizer.json (or a folder holding one): sample pages show response "
    "tokens as text pieces. Never downloads.",
)
@pass_state
def serve(
    state: PoolState,
    host: str,
    port: int,
    allowed_hosts: tuple[str, ...],
    tokenizer_path: Path | None,
) -> None:
    """Serve a read-only web viewer of the pool: archives, samples, drift charts.

    The pool is opened read-only (the viewer never writes), so an account that may only
    read the pool can run it.  Needs the web extra (Flask).
    """
    # Imported here: Flask is an optional extra, and every other verb must work without it.
    from ..web import serve as run

    # Read before the pool is opened and the port bound: a bad path fails at once.
    tokenizer = load_tokenizer(tokenizer_path) if tokenizer_path is not None else None
    pool = state.open(read_only=True)
    try:
        run(
            pool,
            host,
            port,
            announce=click.echo,
            tokenizer=tokenizer,
            allowed_hosts=allowed_hosts,
        )
    except OSError as exc:
        raise CliError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from exc
