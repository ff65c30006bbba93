"""MkDocs hooks of the documentation site (mkdocs.yml, ``hooks:``).

Click 8.3 marks an option without a default with its own sentinel, which mkdocs-click prints
verbatim: the CLI reference showed ``Sentinel.UNSET`` where a user expects no default.  The
hook gives such options, in the docs build's process only, the value click hands the command
(``False`` for a flag, ``None`` otherwise), so the table shows what the verb really gets.
"""

from __future__ import annotations

from typing import Any

import click


def _unset_defaults_shown_as_values(command: click.Command) -> None:
    for param in command.params:
        if repr(param.default) == "Sentinel.UNSET":
            flag = isinstance(param, click.Option) and param.is_flag
            param.default = False if flag else None
    if isinstance(command, click.Group):
        for sub in command.commands.values():
            _unset_defaults_shown_as_values(sub)


def on_config(config: Any) -> Any:
    from archive_manager.cli import cli

    _unset_defaults_shown_as_values(cli)
    # click makes each verb's --help option when asked for it, not in ``params``.
    made = click.Command.get_help_option

    def help_option(self: click.Command, ctx: click.Context) -> click.Option | None:
        option = made(self, ctx)
        if option is not None and repr(option.default) == "Sentinel.UNSET":
            option.default = False
        return option

    click.Command.get_help_option = help_option  # type: ignore[method-assign]
    return config
