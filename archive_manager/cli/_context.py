"""What every command shares: the lazily opened pool in ``ctx.obj``, the one-line error, and
the reusable ``--json`` / ``--yes`` / ``--dry-run`` options."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, TypeVar

import click

from .._util.constants import default_catalog_url
from ..errors import ArchiveError, PoolNotFoundError
from ._output import terminal_safe

# NOTE: the manager is imported when a command opens the pool, not when the CLI loads:
# ``--help`` and TAB completion must not import SQLAlchemy (docs/architecture/start-up.md,
# "Start-up").
if TYPE_CHECKING:
    from ..manager import ArchiveManager

__all__ = [
    "CliError",
    "PoolState",
    "confirm",
    "dry_run_option",
    "is_reportable",
    "json_option",
    "listing_options",
    "make_message_safe",
    "one_line",
    "pass_catalog_pool",
    "pass_pool",
    "pass_state",
    "yes_option",
]

F = TypeVar("F", bound=Callable[..., Any])


def one_line(exc: BaseException) -> str:
    """An exception's message on one line (a KeyError's message without its quotes)."""
    if isinstance(exc, KeyError) and len(exc.args) == 1 and isinstance(exc.args[0], str):
        text = exc.args[0]
    else:
        text = str(exc) or type(exc).__name__
    return " ".join(part.strip() for part in text.splitlines() if part.strip())


class CliError(click.ClickException):
    """A failure reported as one ``error: ...`` line on stderr, with exit code 1."""

    exit_code = 1

    def show(self, file: IO[Any] | None = None) -> None:
        """Print ``error: <message>`` (click's default would print ``Error: ...``), with
        the user's text in it made `terminal_safe`."""
        click.echo(f"error: {terminal_safe(self.format_message())}", err=True, file=file)


def make_message_safe(exc: click.ClickException) -> None:
    """Make the text click will print for ``exc`` `terminal_safe`, in place.

    Click's own usage errors echo what the user typed (``No such command``, a bad option
    value, a file name) and print it later, when the command has returned.
    """
    # click 8.5 marks ``message`` Final in its stubs; it is a plain attribute at run time.
    exc.message = terminal_safe(exc.message)  # type: ignore[misc,unused-ignore]
    shown = getattr(exc, "ui_filename", None)  # click.FileError prints it beside the message
    if isinstance(shown, str):
        exc.ui_filename = terminal_safe(shown)  # type: ignore[attr-defined]


@dataclass
class PoolState:
    """``ctx.obj``: where the pool is, and the pool once a command asked for it."""

    root: Path | str  # a str only for s3://bucket/prefix
    catalog_url: str | None = field(repr=False)  # may hold a password
    root_given: bool = False
    read_only: bool = False
    """``--read-only`` / ``$ARCHIVE_MANAGER_READ_ONLY``: open the pool read-only even where it
    could be written (otherwise read-only only when it cannot be)."""
    _pool: ArchiveManager | None = None

    @property
    def effective_catalog_url(self) -> str:
        """The catalog URL the pool uses (the SQLite file in the root unless one was given)."""
        if self.catalog_url:
            return self.catalog_url
        if isinstance(self.root, str):
            raise CliError(
                f"a pool on an object store ({self.root}) needs --catalog-url (or "
                "$ARCHIVE_MANAGER_CATALOG_URL): its catalog cannot live in the bucket"
            )
        return default_catalog_url(self.root.expanduser().resolve())

    def shown_catalog_url(self) -> str:
        """The catalog URL with any password hidden."""
        from ..catalog.engine import shown_url

        return shown_url(self.effective_catalog_url)

    def exists(self) -> bool:
        """Whether a pool is there (its catalog was set up), creating nothing; unless
        ``--read-only``, a dead writer's log is recovered to tell (`ArchiveManager.exists`):
        the commands that ask open the pool for writing next."""
        from ..manager import ArchiveManager

        return ArchiveManager.exists(self.root, self.catalog_url, recover=not self.read_only)

    def open(
        self,
        *,
        create: bool = False,
        recover: bool = False,
        rebind: bool = False,
        read_only: bool = False,
        catalog_only: bool = False,
    ) -> ArchiveManager:
        """The open pool (opened on first use, closed when the command ends); read-only when
        ``read_only`` or ``--read-only`` says so, or when it cannot be written; with
        ``catalog_only``, opened for catalog reads alone (`open_catalog`).

        Raises:
            CliError: there is no pool here and ``create`` is False: a mistyped ``--root``
                must not silently create an empty pool.
        """
        if self._pool is None:
            from ..manager import ArchiveManager

            try:
                self._pool = ArchiveManager.open(
                    self.root,
                    self.catalog_url,
                    create=create,
                    recover=recover,
                    rebind=rebind,
                    read_only=True if (read_only or self.read_only) else None,
                    catalog_only=catalog_only,
                )
            except PoolNotFoundError as exc:
                if recover or "catalog file" in str(exc):
                    # Nothing to recover, or a damaged catalog: the library's words say more.
                    raise CliError(str(exc)) from exc
                # The library's message names its API; this one names the CLI's remedies.
                raise CliError(
                    f"no pool at {self.root} (catalog {self.shown_catalog_url()}); "
                    "create one with 'archive-manager init' or pass --root"
                ) from exc
        return self._pool

    def open_catalog(self) -> ArchiveManager:
        """The pool, for a command that reads only the catalog (``ls``, ``query``, ``stats``,
        ``owners``, ...).

        On an object store it is opened without a request to the store
        (`ArchiveManager.open` with ``catalog_only``): a store that does not answer holds
        none of these commands up.  On a folder it opens as for every command: its identity
        and journal are local files, and an older catalog is migrated on the way.
        """
        return self.open(catalog_only=isinstance(self.root, str))

    def close(self) -> None:
        """Close the pool if a command opened it."""
        if self._pool is not None:
            pool, self._pool = self._pool, None
            pool.close()


pass_state = click.make_pass_decorator(PoolState)


def pass_pool(f: F) -> F:
    """Pass the opened pool (an `ArchiveManager`) as the command's first argument."""

    @pass_state
    @functools.wraps(f)
    def wrapper(pool_state: PoolState, /, *args: Any, **kwargs: Any) -> Any:
        # Positional-only: a command may have its own option named ``state``.
        return f(pool_state.open(), *args, **kwargs)

    return wrapper  # type: ignore[return-value]


def pass_catalog_pool(f: F) -> F:
    """`pass_pool` for a command that reads only the catalog (`PoolState.open_catalog`)."""

    @pass_state
    @functools.wraps(f)
    def wrapper(pool_state: PoolState, /, *args: Any, **kwargs: Any) -> Any:
        return f(pool_state.open_catalog(), *args, **kwargs)

    return wrapper  # type: ignore[return-value]


def confirm(question: str) -> None:
    """Ask ``question`` on stderr; go on only on yes.

    A no aborts (``Aborted!``, exit 1); no answer at all where stdin is not a terminal (a
    script, a cron job) is a one-line error saying to pass ``--yes``, rather than a bare
    abort that leaves the user guessing.
    """
    try:
        answer = click.confirm(terminal_safe(question), err=True)
    except click.Abort:
        if not sys.stdin.isatty():
            # The prompt left the line open: the error goes on a line of its own.
            click.echo(err=True)
            command = click.get_current_context().command
            looks = any(p.name == "dry_run" for p in command.params)
            raise CliError(
                "this command asks for confirmation, and stdin is not a terminal: pass --yes "
                "to go ahead without asking" + (" (or --dry-run to only look)" if looks else "")
            ) from None
        raise
    if not answer:
        raise click.Abort()


def json_option(f: F) -> F:
    """``--json``: machine-readable output on stdout (and no progress bar)."""
    return click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")(f)


def listing_options(f: F) -> F:
    """``--json`` and ``--format table|json|ndjson|csv`` for a listing: the command gets
    ``as_json`` and ``fmt`` (``--json`` is ``--format json``)."""
    f = click.option(
        "--format",
        "fmt",
        type=click.Choice(["table", "json", "ndjson", "csv"], case_sensitive=False),
        default="table",
        show_default=True,
        help="Output format: ndjson (a JSON object a line) and csv are for pipes and files.",
    )(f)
    return json_option(f)


def reward_key_option(f: F) -> F:
    """``--reward-key KEY``: the part of a dict reward that is the reward (slime's)."""
    return click.option(
        "--reward-key",
        metavar="KEY",
        help="Read the reward of a dict reward ({'score': 1.0, 'acc': True}) from this key "
        "instead of the key each archive was saved with (from the catalog: no payload read).",
    )(f)


def save_reward_key_option(f: F) -> F:
    """``--reward-key KEY`` of a verb that saves: kept with the new archive."""
    return click.option(
        "--reward-key",
        metavar="KEY",
        help="The key of a dict reward ({'score': 1.0, 'acc': True}) whose value is each "
        "sample's reward (slime's --reward-key); kept with the archive.",
    )(f)


def yes_option(f: F) -> F:
    """``--yes``: skip the confirmation prompt of a destructive command."""
    return click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")(f)


def dry_run_option(f: F) -> F:
    """``--dry-run``: report what would happen and change nothing."""
    return click.option(
        "--dry-run", "-n", is_flag=True, help="Show what would happen; change nothing."
    )(f)


def is_reportable(exc: BaseException) -> bool:
    """Whether ``exc`` is a user-facing failure to print as one line (not a bug to trace).

    Library errors and filesystem errors are; a broken pipe is left to click, which exits
    quietly when the reader of a pipe (``| head``) goes away.
    """
    if isinstance(exc, BrokenPipeError):
        return False
    return isinstance(exc, (ArchiveError, OSError))
