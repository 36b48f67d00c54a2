"""What a person sees of the CLI in an 80-column terminal: every command's ``--help`` read in
full, the ids ``episodic list`` prints taken by ``episodic show``, counts said in English."""

from __future__ import annotations

import re
from pathlib import Path
from uuid import UUID

import pytest
import typer

from episodic import EpisodicStore, Message
from episodic.cli import app
from episodic.settings import EpisodicSettings
from tests.acceptance.test_cli import clean_env, run_cli, run_cli_async
from tests.conftest import isolated_settings
from tests.support import FILE_LISTING

WIDTH = 80
TERMINAL = {"COLUMNS": str(WIDTH)}


def _commands(command: typer.core.TyperGroup, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """The command line of every command and group under ``command``, itself included."""
    found = [path]
    for name, sub in command.commands.items():
        if isinstance(sub, typer.core.TyperGroup):
            found += _commands(sub, (*path, name))
        else:
            found.append((*path, name))
    return found


ROOT = typer.main.get_command(app)
assert isinstance(ROOT, typer.core.TyperGroup)
COMMANDS = _commands(ROOT)


def _command(path: tuple[str, ...]) -> typer.core.TyperCommand | typer.core.TyperGroup:
    command: object = ROOT
    for name in path:
        assert isinstance(command, typer.core.TyperGroup)
        command = command.commands[name]
    assert isinstance(command, typer.core.TyperCommand | typer.core.TyperGroup)
    return command


def _default_shown(option: typer.core.TyperOption) -> str | None:
    """What ``[default: ...]`` should say for an option: its own default, else (for an option
    whose default is "not given") the default of the setting its variable names."""
    if option.is_flag:
        return None
    if option.default is not None:
        return str(option.default)
    envvar = option.envvar if isinstance(option.envvar, str) else ""
    field = EpisodicSettings.model_fields.get(envvar.removeprefix("EPISODIC_").lower())
    return None if field is None or field.default is None else str(field.default)


def test_every_command_is_covered() -> None:
    assert ("serve",) in COMMANDS
    assert ("worker",) in COMMANDS
    assert {("keys", "create"), ("keys", "list"), ("keys", "revoke")} <= set(COMMANDS)


@pytest.mark.parametrize("path", COMMANDS, ids=lambda path: " ".join(path) or "episodic")
def test_help_fits_80_columns_and_says_everything(path: tuple[str, ...], tmp_path: Path) -> None:
    result = run_cli(*path, "--help", cwd=tmp_path, env=clean_env(**TERMINAL))
    assert result.code == 0, result.output
    assert result.stderr == ""
    help_text = result.stdout
    flat = " ".join(help_text.split())  # the text, whatever the line breaks
    # every problem found, so that a failure reports them all
    problems = [
        f"wider than {WIDTH}: {line!r}" for line in help_text.splitlines() if len(line) > WIDTH
    ]
    problems += [f"cut: {cut!r}" for cut in re.findall(r"\S*…", help_text)]
    problems += ["a <bool> placeholder"] if "<bool>" in help_text else []
    problems += ["an escape sequence"] if "\x1b" in help_text else []
    for param in _command(path).params:
        if not isinstance(param, typer.core.TyperOption) or param.hidden:
            continue
        for name in [*param.opts, *param.secondary_opts]:
            # the option's name whole, not cut (by an ellipsis or a line break)
            if not re.search(rf"(?<![\w-]){re.escape(name)}(?![\w…-])", help_text):
                problems.append(f"{name} not shown whole")
        envvar = param.envvar if isinstance(param.envvar, str) and param.show_envvar else None
        if envvar and not re.search(rf"(?<!\w){envvar}(?![\w…])", help_text):
            problems.append(f"{envvar} not shown whole")
        default = _default_shown(param)
        if default is not None and f"default: {default}" not in flat:
            problems.append(f"{param.opts[0]}: no [default: {default}]")
        names = "|".join(re.escape(name) for name in param.opts)
        if param.is_flag and re.search(rf"(?<![\w-])({names}),?\s+<", help_text):
            problems.append(f"flag {param.opts[0]} shown with a value placeholder")
    assert problems == [], "\n".join([*problems, help_text])


def test_the_defaults_that_come_from_settings_are_shown(tmp_path: Path) -> None:
    serve = run_cli("serve", "--help", cwd=tmp_path, env=clean_env(**TERMINAL))
    flat = " ".join(serve.stdout.split())
    assert "default: 127.0.0.1]" in flat
    assert "default: 8080]" in flat
    worker = run_cli("worker", "--help", cwd=tmp_path, env=clean_env(**TERMINAL))
    assert "EPISODIC_WORKER_CONCURRENCY; default: 4]" in " ".join(worker.stdout.split())


def test_brackets_in_help_are_text_not_markup(tmp_path: Path) -> None:
    serve = run_cli("serve", "--help", cwd=tmp_path, env=clean_env(**TERMINAL))
    flat = " ".join(serve.stdout.split())
    assert "pip install 'episodic-store[server]'" in flat
    assert "(the episodic extra)" not in flat


def test_the_command_list_gives_each_summary_whole(tmp_path: Path) -> None:
    for group in [path for path in COMMANDS if isinstance(_command(path), typer.core.TyperGroup)]:
        result = run_cli(*group, "--help", cwd=tmp_path, env=clean_env(**TERMINAL))
        flat = " ".join(result.stdout.split())
        parent = _command(group)
        assert isinstance(parent, typer.core.TyperGroup)
        for name, command in parent.commands.items():
            first = (command.help or "").split("\n\n")[0]
            assert f"{name} {' '.join(first.split())}" in flat, name


# ---- ids and counts ---------------------------------------------------------------------------


async def test_an_id_list_prints_is_one_show_takes(database_url: str, tmp_path: Path) -> None:
    store = await EpisodicStore.open(database_url, settings=isolated_settings())
    try:
        made: list[UUID] = []
        for tenant in ("acme", "globex-corporation-european-union-division"):
            made.append(await store.create_conversation(tenant_id=tenant))
            await store.append(made[-1], [Message.user(f"hello from {tenant}")])
    finally:
        await store.close()
    url = ["--database-url", database_url]
    listed = await run_cli_async("list", *url, cwd=tmp_path, env=clean_env(**TERMINAL))
    assert listed.code == 0, listed.output
    lines = listed.stdout.splitlines()
    assert max(len(line) for line in lines) <= WIDTH
    assert lines[0].split()[:2] == ["conversation", "tenant"]
    printed = [line.split()[0] for line in lines[1:]]
    assert sorted(printed) == sorted(str(cid) for cid in made)
    for conversation in printed:
        shown = await run_cli_async("show", conversation, *url, cwd=tmp_path)
        assert shown.code == 0, shown.output
        assert shown.stdout.startswith(conversation)

    wide = await run_cli_async("list", "--wide", *url, cwd=tmp_path, env=clean_env(**TERMINAL))
    assert wide.code == 0, wide.output
    header = wide.stdout.splitlines()[0].split()
    assert header == ["conversation", "tenant", "created", "seq", "tokens", "state"]
    assert "globex-corporation-european-union-division" in wide.stdout
    assert "…" not in wide.stdout


async def test_the_worker_counts_its_attempts_in_english(database_url: str, tmp_path: Path) -> None:
    env = clean_env(EPISODIC_TRIGGER_UNFINISHED_TURNS="1")
    url = ["--database-url", database_url]

    async def make_due(count: int) -> None:
        store = await EpisodicStore.open(database_url, settings=isolated_settings())
        try:
            store.trigger = store.trigger.model_copy(update={"trigger_unfinished_turns": 1})
            for _ in range(count):
                cid = await store.create_conversation()
                listing = Message.assistant(f"the files:\n{FILE_LISTING}")
                await store.append(cid, [Message.user("hi"), listing, Message.assistant("hello")])
                await store.append(cid, [Message.user("again"), Message.assistant("hello")])
        finally:
            await store.close()

    nothing = await run_cli_async("worker", "--once", *url, cwd=tmp_path, env=env)
    assert nothing.stdout.splitlines() == ["0 attempts: nothing was due"]
    await make_due(1)
    one = await run_cli_async("worker", "--once", *url, cwd=tmp_path, env=env)
    assert one.code == 0, one.output
    assert one.stdout.splitlines() == ["1 attempt: {'succeeded': 1}"]
    await make_due(2)
    two = await run_cli_async("worker", "--once", *url, cwd=tmp_path, env=env)
    assert two.stdout.splitlines() == ["2 attempts: {'succeeded': 2}"]
