"""How ``episodic ... --help`` lays itself out, the same way for every command.

Typer's rich help draws each option as a row of a seven-column table squeezed into the
terminal: at 80 columns it cut option and variable names with an ellipsis, showed a ``<bool>``
value flags do not take, kept the docstrings' hard line breaks in the command list and read
``[server]`` in a docstring as markup. Click's formatter (what typer uses without a rich markup
mode) lays out a two-column list that wraps at word boundaries to the terminal (80 columns at
most) and never cuts a name. On top of it, the command list shows each command's summary whole
(click cuts it to the first sentence, or with "..."), and an option that sets a setting shows
the setting's default (the option's own default is None, so that a setting from a ``.env`` file
is not overridden by a default nobody typed).
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Callable
from typing import Any

import typer

# typer's own copy of click: the classes its commands and their help are made of
from typer import _click
from typer.core import TyperCommand, TyperGroup, TyperOption
from typer.models import CommandFunctionType

from episodic.settings import ENV_PREFIX, EpisodicSettings


def setting_default(envvar: object) -> object | None:
    """The default of the setting an ``EPISODIC_*`` variable names; None when it names none
    or the setting has no default."""
    if not isinstance(envvar, str) or not envvar.startswith(ENV_PREFIX):
        return None
    field = EpisodicSettings.model_fields.get(envvar.removeprefix(ENV_PREFIX).lower())
    return None if field is None else field.get_default(call_default_factory=True)


def summary(command: _click.Command) -> str:
    """A command's short help, else its help's first paragraph, as one line."""
    text = command.short_help or command.help or ""
    return " ".join(inspect.cleandoc(text).split("\n\n")[0].split())


def _help_record(param: _click.Parameter, ctx: _click.Context) -> tuple[str, str] | None:
    default = setting_default(getattr(param, "envvar", None))
    if isinstance(param, TyperOption) and param.default is None and default is not None:
        # a copy shows the setting's default: the option itself keeps None ("not given")
        param = copy.copy(param)
        param.default, param.show_default = default, True
    return param.get_help_record(ctx)


def _format_parameters(
    command: _click.Command, ctx: _click.Context, formatter: _click.HelpFormatter
) -> None:
    sections: dict[str, list[tuple[str, str]]] = {"Arguments": [], "Options": []}
    for param in command.get_params(ctx):
        record = _help_record(param, ctx)
        if record is not None:
            kind = "Arguments" if param.param_type_name == "argument" else "Options"
            sections[kind].append(record)
    for title, rows in sections.items():
        if rows:
            with formatter.section(title):
                formatter.write_dl(rows)


class HelpCommand(TyperCommand):
    """A command whose options show the defaults of the settings they set."""

    def format_options(self, ctx: _click.Context, formatter: _click.HelpFormatter) -> None:
        _format_parameters(self, ctx, formatter)


class HelpGroup(TyperGroup):
    """A group of commands: its options as a command's, each command's summary whole."""

    def format_options(self, ctx: _click.Context, formatter: _click.HelpFormatter) -> None:
        _format_parameters(self, ctx, formatter)
        self.format_commands(ctx, formatter)

    def format_commands(self, ctx: _click.Context, formatter: _click.HelpFormatter) -> None:
        rows = []
        for name in self.list_commands(ctx):
            command = self.get_command(ctx, name)
            if command is not None and not command.hidden:
                rows.append((name, summary(command)))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


class HelpTyper(typer.Typer):
    """A Typer app whose groups and commands lay out their help as above."""

    def __init__(self, **settings: Any) -> None:
        super().__init__(cls=HelpGroup, rich_markup_mode=None, **settings)

    def command(
        self, name: str | None = None, **settings: Any
    ) -> Callable[[CommandFunctionType], CommandFunctionType]:
        settings.setdefault("cls", HelpCommand)
        return super().command(name, **settings)


__all__ = ["HelpCommand", "HelpGroup", "HelpTyper", "setting_default", "summary"]
