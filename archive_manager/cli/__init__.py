"""``archive-manager``: the admin CLI of a storage pool.

Thin by design: each verb parses its arguments, calls the public API and formats the result
(tables for people, ``--json`` for scripts).  The pool is opened only by verbs that need it
and closed when the command ends.  Library errors become one ``error: ...`` line on stderr and
exit code 1; bad usage exits 2.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource

from .. import __version__
from .._util.constants import CATALOG_URL_ENV
from ._context import CliError, PoolState, is_reportable, make_message_safe, one_line
from ._params import PoolRoot
from .archives import import_pt, keys, ls, query, show
from .demo import demo
from .lens import groups, prompts
from .maintenance import gc, rebind, rebuild_catalog, verify
from .owners import forget, owners, release, release_owner, retain
from .pool import db, info, init
from .sample import sample
from .search import grep
from .serve import serve
from .stats import stats
from .straw import import_straw
from .transfer import export, import_file

__all__ = ["READ_ONLY_ENV", "ROOT_ENV", "cli", "main"]

ROOT_ENV = "ARCHIVE_MANAGER_ROOT"
READ_ONLY_ENV = "ARCHIVE_MANAGER_READ_ONLY"
DEFAULT_ROOT = "./archive-pool"

#: ``--help`` lists the verbs by task, a newcomer's first verbs first; a verb not placed here
#: is listed under "Other" (tests/cli/test_cli_text.py keeps every verb placed).
VERB_SECTIONS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("Start here", ("demo", "init", "info", "ls", "show", "sample")),
    ("Find and read", ("query", "keys", "grep", "groups", "prompts", "stats", "serve")),
    ("Keep and reclaim", ("retain", "release", "release-owner", "forget", "owners", "gc")),
    ("Check and repair", ("verify", "rebuild-catalog", "rebind", "db")),
    ("Move data in and out", ("export", "import", "import-pt", "import-straw")),
)


class _Cli(click.Group):
    """The group; turns library and filesystem errors into one line on stderr, and keeps
    control characters the user typed out of click's usage errors."""

    def make_context(
        self,
        info_name: str | None,
        args: list[str],
        parent: click.Context | None = None,
        **extra: Any,
    ) -> click.Context:
        """Parse the group's own options (``--root``); a usage error is made terminal-safe."""
        try:
            return super().make_context(info_name, args, parent, **extra)
        except click.ClickException as exc:
            make_message_safe(exc)
            raise

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The verbs in sections by task (`VERB_SECTIONS`), instead of one alphabetical list."""
        names = self.list_commands(ctx)
        placed = {verb for _, verbs in VERB_SECTIONS for verb in verbs}
        sections = [*VERB_SECTIONS, ("Other", tuple(n for n in names if n not in placed))]
        width = formatter.width - 6 - max((len(n) for n in names), default=0)
        for title, verbs in sections:
            rows = []
            for name in verbs:
                command = self.get_command(ctx, name)
                if command is not None and not command.hidden:
                    rows.append((name, command.get_short_help_str(limit=max(width, 20))))
            if rows:
                with formatter.section(title):
                    formatter.write_dl(rows)

    def invoke(self, ctx: click.Context) -> Any:
        """Run the verb; report an `ArchiveError` or `OSError` as ``error: ...``, exit 1."""
        try:
            return super().invoke(ctx)
        except click.ClickException as exc:
            make_message_safe(exc)
            raise
        except Exception as exc:
            if is_reportable(exc):
                raise CliError(one_line(exc)) from exc
            raise


@click.group(cls=_Cli, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--root",
    type=PoolRoot(),
    envvar=ROOT_ENV,
    default=DEFAULT_ROOT,
    show_default=True,
    show_envvar=True,
    help="The pool's blob root: a folder, or s3://bucket/prefix (then --catalog-url too).",
)
@click.option(
    "--catalog-url",
    envvar=CATALOG_URL_ENV,
    show_envvar=True,
    help="SQLAlchemy URL of the catalog (default: SQLite in the root).",
)
@click.option(
    "--read-only",
    is_flag=True,
    envvar=READ_ONLY_ENV,
    show_envvar=True,
    help="Only read the pool: write nothing there, refuse every write. Without it, a pool "
    "this process cannot write is opened read-only anyway.",
)
@click.option(
    "-v",
    "--verbose",
    count=True,
    help="Show the library's log (logger 'archive_manager') on stderr: -v INFO, -vv DEBUG.",
)
@click.option("-q", "--quiet", is_flag=True, help="Log errors only (no warnings).")
@click.option(
    "--version",
    "-V",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=lambda ctx, _param, value: _print_version(ctx, value),
    help="Show the version and exit.",
)
@click.pass_context
def cli(
    ctx: click.Context,
    root: Path | str,
    catalog_url: str | None,
    read_only: bool,
    verbose: int,
    quiet: bool,
) -> None:
    """Immutable, indexed archives of RL rollouts: inspect and maintain a storage pool."""
    _set_up_logging(verbose, quiet)
    state = PoolState(
        root=root,
        catalog_url=catalog_url or None,
        root_given=ctx.get_parameter_source("root") is not ParameterSource.DEFAULT,
        read_only=read_only,
    )
    ctx.obj = state
    ctx.call_on_close(state.close)


for _command in (
    init,
    db,
    info,
    ls,
    show,
    keys,
    query,
    stats,
    sample,
    groups,
    prompts,
    grep,
    export,
    import_file,
    import_pt,
    import_straw,
    release,
    forget,
    retain,
    release_owner,
    owners,
    gc,
    verify,
    rebuild_catalog,
    rebind,
    serve,
    demo,
):
    cli.add_command(_command)


#: The distribution's name before issue 39, and the unrelated PyPI project of that name: either
#: one installs the same ``archive_manager/`` files and ``archive-manager`` script.
_OTHER_DISTRIBUTION = "archive_manager"
_DISTRIBUTION = "rollout-archive-manager"


def _print_version(ctx: click.Context, value: bool) -> None:
    if not value or ctx.resilient_parsing:
        return
    click.echo(f"archive-manager, version {__version__}")
    clash = installed_twice()
    if clash:
        click.echo(f"warning: {clash}", err=True)
    ctx.exit()


def installed_twice() -> str | None:
    """Why this environment's install is fragile, when two distributions own its files.

    Installing ``rollout-archive-manager`` over a checkout installed under the old name leaves
    both recorded as owners of ``archive_manager/`` and ``bin/archive-manager``: uninstalling
    either deletes the other's files, and pip then calls the other "already satisfied".  Asked
    by ``--version`` only (the metadata scan walks sys.path; no other verb pays it).
    """
    from importlib import metadata

    found = []
    for name in (_DISTRIBUTION, _OTHER_DISTRIBUTION):
        try:
            metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        found.append(name)
    if len(found) < 2:
        return None
    return (
        f"both {_DISTRIBUTION} and {_OTHER_DISTRIBUTION} are installed here and own the same "
        f"files: pip uninstall -y {_OTHER_DISTRIBUTION}, then pip install --force-reinstall "
        "--no-deps -e . in the checkout (or the wheel)"
    )


_LOG_HANDLER: logging.Handler | None = None


def _set_up_logging(verbose: int, quiet: bool) -> None:
    """Route the library's logger to stderr at the level ``-v``/``-q`` asked for (warnings
    by default): one handler, whatever the number of invocations in one process."""
    global _LOG_HANDLER
    if quiet and verbose:
        raise click.UsageError("-q and -v contradict each other: give one")
    level = (
        logging.ERROR
        if quiet
        else {0: logging.WARNING, 1: logging.INFO}.get(verbose, logging.DEBUG)
    )
    log = logging.getLogger("archive_manager")
    if _LOG_HANDLER is None:
        _LOG_HANDLER = logging.StreamHandler()
        _LOG_HANDLER.setFormatter(logging.Formatter("%(levelname)s: %(message)s"))
        log.addHandler(_LOG_HANDLER)
    # A handler on sys.stderr as it is now (a test runner swaps it per invocation).
    _LOG_HANDLER.setStream(sys.stderr)  # type: ignore[attr-defined]
    _LOG_HANDLER.setLevel(level)
    log.setLevel(level)


def main(argv: list[str] | None = None) -> None:
    """The console script's entry point."""
    import warnings

    from ..errors import UnregisteredClassWarning

    # NOTE: an operator's CLI shows samples as data: a class the CLI's process never
    # registers (slime's Sample, a user's dataclass) is shown as its fields, which is what
    # the verbs print anyway; the library's notice would be three stack lines per class.
    warnings.filterwarnings("ignore", category=UnregisteredClassWarning)
    cli.main(args=argv, prog_name="archive-manager")
