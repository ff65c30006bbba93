"""``archive-manager serve``: the read-only web viewer of a pool."""

from __future__ import annotations

from pathlib import Path

import click

from ..lens.tokenizer import load_tokenizer
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
@click.option(
    "--tokenizer",
    "tokenizer_path",
    type=click.Path(path_type=Path),
    help="A local tokenizer.json (or a folder holding one): sample pages show response "
    "tokens as text pieces. Never downloads.",
)
@pass_state
def serve(state: PoolState, host: str, port: int, tokenizer_path: Path | None) -> None:
    """Serve a read-only web viewer of the pool: archives, samples, drift charts.

    The pool is opened read-only (the viewer never writes), so an account that may only
    read the pool can run it.  Needs the web extra: pip install 'archive_manager[web]'.
    """
    # Imported here: Flask is an optional extra, and every other verb must work without it.
    from ..web import serve as run

    # Read before the pool is opened and the port bound: a bad path fails at once.
    tokenizer = load_tokenizer(tokenizer_path) if tokenizer_path is not None else None
    pool = state.open(read_only=True)
    try:
        run(pool, host, port, announce=click.echo, tokenizer=tokenizer)
    except OSError as exc:
        raise CliError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from exc
