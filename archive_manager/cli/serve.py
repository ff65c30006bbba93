"""``archive-manager serve``: the read-only web viewer of a pool."""

from __future__ import annotations

import click

from ._context import CliError, PoolState, pass_state

__all__ = ["serve"]


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
@pass_state
def serve(state: PoolState, host: str, port: int) -> None:
    """Serve a read-only web viewer of the pool: archives, samples, drift charts.

    The pool is opened read-only (the viewer never writes), so an account that may only
    read the pool can run it.  Needs the web extra: pip install 'archive_manager[web]'.
    """
    # Imported here: Flask is an optional extra, and every other verb must work without it.
    from ..web import serve as run

    pool = state.open(read_only=True)
    try:
        run(pool, host, port, announce=click.echo)
    except OSError as exc:
        raise CliError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from exc
