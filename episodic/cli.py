"""The ``episodic`` command line: thin commands over the library.

Every failure a person can fix (a bad option or setting, an unreachable database, an
unmigrated schema, an unknown conversation) is one line on stderr and a non-zero exit; the
traceback is only shown with ``--debug``. Everything printed that came from the log goes
through :mod:`episodic.display`, so stored text cannot drive the terminal (``episodic
export`` writes the log's lines as they are, so it refuses to write them to a terminal).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import stat
import sys
import tempfile
import traceback
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, BinaryIO, TypeVar
from uuid import UUID

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table
from rich.text import Text

from episodic import Erasure, ImportSummary, __version__
from episodic.cli_help import HelpTyper
from episodic.display import (
    clip,
    counted,
    describe_event,
    describe_message,
    event_kind,
    short_id,
    shown,
)
from episodic.errors import (
    ConflictError,
    EpisodicError,
    ErasedConversationError,
    ImportFormatError,
    NotFoundError,
)
from episodic.settings import EpisodicSettings, environment_of, load_settings
from episodic.store import EpisodicStore
from episodic.store.checks import parse_conversation_id
from episodic.store.erasure import check_reason

if TYPE_CHECKING:  # the server extra is imported only by the commands that need it
    from episodic.server.keys import ApiKey, KeyStore

app = HelpTyper(
    name="episodic",
    help="A durable, append-only episodic history for AI-agent conversations.",
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
console = Console(highlight=False)
errors = Console(stderr=True, highlight=False, soft_wrap=True)
T = TypeVar("T")

#: Set by ``--debug``: failures print their traceback too.
_debug = False

#: The CLI options that set a setting, for messages that name the option a person typed.
OPTION_OF_SETTING = {
    "database_url": "--database-url",
    "worker_concurrency": "--concurrency",
    "metrics_port": "--metrics-port",
    "server_host": "--host",
    "server_port": "--port",
    "server_workers": "--workers",
}


def setting_option(setting: str, help: str) -> Any:
    """The option that sets ``setting`` (its flag from :data:`OPTION_OF_SETTING`), falling
    back to the setting's ``EPISODIC_*`` variable as the settings read it."""
    return typer.Option(
        OPTION_OF_SETTING[setting],
        envvar=f"{EpisodicSettings.model_config['env_prefix']}{setting.upper()}",
        show_envvar=True,
        help=help,
    )


DatabaseUrlOption = Annotated[
    str | None,
    setting_option("database_url", "postgresql+asyncpg://... or sqlite+aiosqlite:///file.db"),
]

TenantOption = Annotated[
    str | None,
    typer.Option(
        "--tenant",
        help="Act as this tenant (store.for_tenant). Needed on PostgreSQL when your role is "
        "held to one tenant by row-level security, as the runtime roles and the owner are.",
    ),
]

ConversationIdArgument = Annotated[
    str,
    typer.Argument(
        metavar="CONVERSATION_ID", help="The conversation's id, as episodic list prints it."
    ),
]

#: erase and export take one conversation, or with --tenant a whole tenant
ConversationOrTenantArgument = Annotated[
    str | None,
    typer.Argument(
        metavar="CONVERSATION_ID",
        help="The conversation's id, as episodic list prints it (or --tenant).",
        show_default=False,
    ),
]

WideOption = Annotated[
    bool,
    typer.Option(
        "--wide", help="Print whole ids, tenants, texts and times (wider than the terminal)."
    ),
]


def _print_version(value: bool) -> None:
    if value:
        console.print(f"episodic {__version__}")
        raise typer.Exit()


@app.callback()
def _options(
    debug: Annotated[
        bool, typer.Option("--debug", help="On failure, print the traceback too.")
    ] = False,
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_print_version, is_eager=True, help="Print the version."
        ),
    ] = False,
) -> None:
    """A durable, append-only episodic history for AI-agent conversations."""
    global _debug
    _debug = debug


def _settings(**overrides: Any) -> EpisodicSettings:
    """The settings, with the options given on the command line on top (validated alike)."""
    return load_settings(overrides, flags=OPTION_OF_SETTING)


def _scoped(store: EpisodicStore, tenant: str | None) -> EpisodicStore:
    return store.for_tenant(tenant) if tenant is not None else store


def _run(work: Callable[[EpisodicStore], Awaitable[T]], settings: EpisodicSettings) -> T:
    async def main() -> T:
        store = await EpisodicStore.open(settings.database_url, settings=settings)
        try:
            return await work(store)
        finally:
            await store.close()

    return asyncio.run(main())


@app.command()
def migrate(database_url: DatabaseUrlOption = None) -> None:
    """Create or upgrade episodic's tables (alembic upgrade head).

    Safe to run from many processes at once."""
    settings = _settings(database_url=database_url)

    async def work(store: EpisodicStore) -> str:
        done = await store.migrate()
        where = store.location
        if done.before is None:
            return f"created the episodic schema at revision {done.after} in {where}"
        if done.changed:
            return f"upgraded the episodic schema from {done.before} to {done.after} in {where}"
        return f"the episodic schema in {where} is up to date (revision {done.after})"

    console.print(Text(_run(work, settings)))


@app.command()
def show(
    conversation_id: ConversationIdArgument,
    database_url: DatabaseUrlOption = None,
    after_seq: Annotated[int, typer.Option(min=0, help="Show events after this seq.")] = 0,
    limit: Annotated[
        int, typer.Option(min=1, max=10_000, help="Show at most this many events.")
    ] = 200,
    width: Annotated[
        int, typer.Option(min=1, help="Characters of each event's content to show.")
    ] = 160,
    context: Annotated[
        bool, typer.Option("--context", help="Show what the model would see: load_context().")
    ] = False,
    max_tool_result_tokens: Annotated[
        int | None,
        typer.Option(min=1, help="With --context: cut longer tool results, as at load."),
    ] = None,
    tenant: TenantOption = None,
) -> None:
    """Print a conversation's head counters and its events.

    With --context, the messages the next request would load instead, with token counts."""
    settings = _settings(database_url=database_url)

    async def work(store: EpisodicStore) -> None:
        store = _scoped(store, tenant)
        if context:
            await _print_context(store, conversation_id, width, max_tool_result_tokens)
            return
        head = await store.get_conversation(conversation_id)
        events = await store.read_events(conversation_id, after_seq=after_seq, limit=limit)
        console.print(
            Text.assemble(
                (str(head.conversation_id), "bold"),
                f"  tenant={shown(head.tenant_id, 40)}  last_seq={head.last_seq}  "
                f"context≈{counted(head.context_tokens, 'token')}  "
                f"user messages={head.total_user_messages}  "
                f"open tool calls={len(head.open_tool_calls)}",
            )
        )
        table = Table(show_lines=False)
        for column in ("seq", "at", "kind", "tokens", "content"):
            table.add_column(column, overflow="fold")
        for event in events:
            table.add_row(
                str(event.seq),
                event.created_at.strftime("%Y-%m-%d %H:%M:%S"),
                event_kind(event),
                str(event.token_estimate),
                Text(shown(describe_event(event), width)),
            )
        console.print(table)
        shown_through = events[-1].seq if events else after_seq
        if shown_through < head.last_seq:
            console.print(
                Text(
                    f"showing {counted(len(events), 'event')} through seq {shown_through} of "
                    f"{head.last_seq}; for the next ones: episodic show {head.conversation_id} "
                    f"--after-seq {shown_through}"
                )
            )

    _run(work, settings)


@app.command(name="list")
def list_(
    database_url: DatabaseUrlOption = None,
    tenant: TenantOption = None,
    limit: Annotated[
        int, typer.Option(min=1, max=10_000, help="List at most this many conversations.")
    ] = 50,
    before: Annotated[
        str | None,
        typer.Option(help="Continue after this conversation (the last of the previous page)."),
    ] = None,
    wide: WideOption = False,
) -> None:
    """List conversations, newest first, a page at a time.

    Each conversation's id is printed whole, as show, compact, erase and export take it."""
    settings = _settings(database_url=database_url)

    async def work(store: EpisodicStore) -> None:
        store = _scoped(store, tenant)
        page = await store.list_conversations(limit=limit, before=before)
        # Ids are whole, wide or not: they are what show, compact, erase and export take (a
        # prefix would need a lookup the store does not have). To fit the terminal, the
        # tenant is what gives way, then the creation time.
        headers = ("conversation", "tenant", "created", "seq", "tokens", "state")
        rows = [
            [
                str(head.conversation_id),
                shown(head.tenant_id),
                head.created_at.strftime("%Y-%m-%d %H:%M" if wide else "%Y-%m-%d"),
                str(head.last_seq),
                f"{head.context_tokens:,}",
                _state_of(head.due_since, head.dead_since, head.lease_expires_at),
            ]
            for head in page
        ]
        if not wide:
            room = _room_for(1, headers, rows, console.width)
            for row in rows:
                row[1] = clip(row[1], room)
        table = _plain_table(*headers)
        for row in rows:
            table.add_row(*(Text(cell) for cell in row))
        _print_table(table, whole=True)
        if len(page) == limit:
            last = page[-1].conversation_id
            console.print(Text(f"more: episodic list --before {last}"))
        elif not page:
            console.print("no conversations")

    _run(work, settings)


@app.command()
def worker(
    database_url: DatabaseUrlOption = None,
    concurrency: Annotated[
        int | None,
        setting_option("worker_concurrency", "Compactions in flight at once in this process."),
    ] = None,
    once: Annotated[
        bool, typer.Option("--once", help="Compact what is due now, then exit (for cron).")
    ] = False,
    metrics_port: Annotated[
        int | None,
        setting_option("metrics_port", "Serve Prometheus metrics on this port (none unless set)."),
    ] = None,
) -> None:
    """Run the compaction worker: compact conversations as they fall due.

    It claims due conversations, summarizes them and writes boundaries, until SIGTERM or
    SIGINT stops it gracefully. Run as many as you like, on as many machines."""
    from episodic.worker import WorkerMetrics
    from episodic.worker.setup import worker_from_settings

    settings = _settings(
        database_url=database_url, worker_concurrency=concurrency, metrics_port=metrics_port
    )
    _log_with_timestamps()
    metrics = WorkerMetrics()
    if settings.metrics_port is not None:
        metrics.serve(settings.metrics_port)

    async def work(store: EpisodicStore) -> None:
        runner = worker_from_settings(store, settings, metrics=metrics)
        if once:
            results = await runner.run_once()
            outcomes = Counter(result.outcome for result in results)
            console.print(
                f"{counted(len(results), 'attempt')}: {dict(outcomes) or 'nothing was due'}"
            )
            return
        runner.install_signal_handlers()
        await runner.run()

    _run(work, settings)


@app.command()
def status(
    database_url: DatabaseUrlOption = None,
    recent: Annotated[
        int, typer.Option(min=0, max=10_000, help="How many recent attempts to list.")
    ] = 10,
    limit: Annotated[
        int, typer.Option(min=0, max=10_000, help="How many queued conversations to list.")
    ] = 20,
    tenant: TenantOption = None,
    wide: WideOption = False,
) -> None:
    """Show compaction status: what is queued, and the latest attempts.

    The due, leased, failing and dead conversations (dead first) with their errors, and the
    latest attempts."""
    settings = _settings(database_url=database_url)

    async def work(store: EpisodicStore) -> None:
        state = await _scoped(store, tenant).compaction_status(recent=recent, limit=limit)
        console.print(f"store: {state.layout.describe()}")
        console.print(
            f"due={state.due}  leased={state.leased}  failing={state.failing}  dead={state.dead}"
        )
        narrow = None if wide else 16
        if state.conversations:
            queue = _plain_table("conversation", "tenant", "state", "reason", "tries", "next")
            for entry in state.conversations:
                queue.add_row(
                    short_id(entry.conversation_id, wide=wide),
                    Text(shown(entry.tenant_id, None if wide else 12)),
                    entry.state,
                    Text(shown(entry.reason, narrow)),
                    str(entry.attempts),
                    _when(entry.next_attempt_at if entry.state != "leased" else None, wide),
                )
            console.print()
            _print_table(queue, whole=wide)
            failed = [entry for entry in state.conversations if entry.last_error]
            if failed:
                console.print()
                console.print("last errors")
                for entry in failed:
                    line = f"{short_id(entry.conversation_id, wide=wide)}  "
                    room = None if wide else max(console.width - len(line), 20)
                    console.print(Text(line + shown(entry.last_error, room)), soft_wrap=wide)
            shown_count = len(state.conversations)
            if shown_count == limit and shown_count < state.due + state.dead:
                console.print(f"first {limit} listed; --limit N lists more")
        if state.recent_attempts:
            columns = ["finished", "conversation", "reason", "outcome", "tokens"]
            attempts = _plain_table(*columns, *(["error"] if wide else []))
            for row in state.recent_attempts:
                before, after = row["tokens_before"], row["tokens_after"]
                tokens = f"{before}→{after}" if after is not None else str(before or "")
                cells: list[str | Text] = [
                    _when(row["finished_at"], wide),
                    short_id(row["conversation_id"], wide=wide),
                    Text(shown(str(row["reason"]), narrow)),
                    Text(shown(str(row["outcome"]))),
                    tokens,
                ]
                if wide:
                    cells.append(Text(shown(row["error"])))
                attempts.add_row(*cells)
            console.print()
            console.print("recent attempts")
            _print_table(attempts, whole=wide)

    _run(work, settings)


@app.command()
def compact(
    conversation_id: ConversationIdArgument,
    database_url: DatabaseUrlOption = None,
    tenant: TenantOption = None,
) -> None:
    """Compact one conversation now, due or not.

    Writes a boundary with reason manual_recovery, with the summarizer the settings name."""
    from episodic.worker import compact_claimed
    from episodic.worker.setup import worker_from_settings

    settings = _settings(database_url=database_url)

    async def work(store: EpisodicStore) -> bool:
        store = _scoped(store, tenant)
        runner = worker_from_settings(store, settings)
        owner = f"cli:{runner.worker_id}"
        claim = await store.claim_conversation(
            conversation_id, owner, lease_seconds=runner.lease_seconds
        )
        if claim is None:
            errors.print("error: a worker is compacting this conversation right now; try later")
            return False
        result = await compact_claimed(
            store, runner.summarizer, claim, worker=owner, options=runner.options
        )
        after = result.tokens_after
        console.print(
            Text(
                f"{result.outcome}: ≈{result.tokens_before or 0:,} → "
                + ("≈? tokens" if after is None else f"≈{counted(after, 'token')}")
                + (f" ({shown(result.error, 200)})" if result.error else "")
            )
        )
        return result.outcome in ("succeeded", "fallback", "nothing_to_compact")

    if not _run(work, settings):
        raise typer.Exit(1)


@app.command()
def erase(
    ctx: typer.Context,
    reason: Annotated[
        str,
        typer.Option(
            "--reason",
            help="Why it is erased, kept in the tombstone (a ticket, a request number); "
            "1 to 2,000 characters.",
        ),
    ],
    conversation_id: ConversationOrTenantArgument = None,
    tenant: Annotated[
        str | None,
        typer.Option(
            "--tenant", help="Erase every conversation of this tenant, and its shared state."
        ),
    ] = None,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False,
    database_url: DatabaseUrlOption = None,
) -> None:
    """Erase a conversation, or a whole tenant, leaving only a tombstone.

    Every event, compaction attempt and head of the conversation goes (with --tenant, of
    every conversation of the tenant, and its shared state); the tombstone keeps counts,
    reason, when and by which role, no content. It cannot be undone: asks first, unless
    --yes. On PostgreSQL it needs a role in episodic_eraser (or the tables' owner)."""
    _one_of(ctx, conversation_id, tenant)
    settings = _settings(database_url=database_url)
    why = check_reason(reason)
    cid = parse_conversation_id(conversation_id) if conversation_id is not None else None
    if cid is not None and not yes:
        _confirm(f"Erase conversation {cid} completely? Its log cannot be recovered")

    async def work(store: EpisodicStore) -> Erasure:
        if tenant is None:
            assert cid is not None
            return await store.erase_conversation(cid, reason=why)
        scoped = store.for_tenant(tenant)
        if not yes:
            count = await scoped.count_conversations(tenant)
            _confirm(
                f"Erase tenant {shown(tenant)} completely, its {counted(count, 'conversation')} "
                "and its shared state? They cannot be recovered"
            )
        return await scoped.erase_tenant(tenant, reason=why)

    _print_erasure(_run(work, settings))


@app.command()
def export(
    ctx: typer.Context,
    conversation_id: ConversationOrTenantArgument = None,
    tenant: Annotated[
        str | None,
        typer.Option(
            "--tenant",
            help="Export every conversation of this tenant (deleted ones too), then its "
            "shared state.",
        ),
    ] = None,
    output: Annotated[
        Path | None,
        typer.Option(
            "--output",
            "-o",
            dir_okay=False,
            help="Write to this file, replaced only once the export is whole.  [default: stdout]",
        ),
    ] = None,
    database_url: DatabaseUrlOption = None,
) -> None:
    """Write a conversation's whole log, or a tenant's, as JSON lines.

    With --tenant, every conversation of the tenant, then its shared state. episodic import
    recreates them anywhere (either backend): every event with its seq, timestamps and
    idempotency keys, the compaction attempts, a checksum. Export the import again and the
    bytes are the same."""
    _one_of(ctx, conversation_id, tenant)
    settings = _settings(database_url=database_url)
    if output is None and sys.stdout.isatty():
        raise _refused(
            "the export is JSON lines for a file or a program, not a terminal (the stored "
            "text in it could drive one): give -o FILE, or redirect or pipe it",
            2,
        )

    async def work(store: EpisodicStore) -> tuple[int, int]:
        if tenant is None:
            assert conversation_id is not None
            lines = await _write_lines(store.export_conversation(conversation_id), output)
            return 1, lines
        scoped = store.for_tenant(tenant)
        done = 0
        if output is None:

            def count(conversations: int) -> None:
                nonlocal done
                done = conversations

            lines = await _write_lines(scoped.export_tenant(tenant, progress=count), None)
            return done, lines
        total = await scoped.count_conversations(tenant)
        with Progress(
            TextColumn("exporting"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("conversations"),
            TimeRemainingColumn(),
            console=errors,
            transient=True,
            disable=not errors.is_terminal,
        ) as bar:
            task = bar.add_task("export", total=total)

            def advance(conversations: int) -> None:
                nonlocal done
                done = conversations
                bar.update(task, completed=conversations)

            lines = await _write_lines(scoped.export_tenant(tenant, progress=advance), output)
        return done, lines

    conversations, lines = _run(work, settings)
    if output is not None:
        what = (
            f"conversation {conversation_id}"
            if tenant is None
            else f"{counted(conversations, 'conversation')} of tenant {shown(tenant, 40)}"
        )
        errors.print(Text(f"exported {what} to {shown(str(output))} ({counted(lines, 'line')})"))


@app.command(name="import")
def import_(
    file: Annotated[
        Path,
        typer.Argument(
            exists=True,
            dir_okay=False,
            readable=True,
            help="A file episodic export wrote.",
            show_default=False,
        ),
    ],
    tenant: Annotated[
        str | None,
        typer.Option(
            "--tenant", help="Import into this tenant.  [default: each conversation's own]"
        ),
    ] = None,
    reuse_erased_ids: Annotated[
        bool,
        typer.Option(
            "--reuse-erased-ids",
            help="Import a conversation whose id was erased in this database under that id "
            "(refused otherwise).",
        ),
    ] = False,
    database_url: DatabaseUrlOption = None,
) -> None:
    """Recreate the conversations of an export file, and its shared state.

    The whole file is checked first (nothing is written if a line is wrong); then each
    conversation is imported all or nothing, in file order. An id that exists here is
    refused."""
    settings = _settings(database_url=database_url)

    async def work(store: EpisodicStore) -> ImportSummary:
        target = _scoped(store, tenant)
        with file.open("rb") as handle:
            try:
                checked = await target.import_conversations(
                    _text_lines(handle),
                    tenant_id=tenant,
                    reuse_erased_ids=reuse_erased_ids,
                    check_only=True,
                )
            except (ImportFormatError, ConflictError) as exc:
                # a bad line, an id twice in the file or one that exists here already
                raise typer.Exit(_fail(f"{exc}; nothing was imported", exc, 1)) from None
        ids = [entry.conversation_id for entry in checked.conversations]
        with file.open("rb") as handle:
            try:
                return await target.import_conversations(
                    _text_lines(handle), tenant_id=tenant, reuse_erased_ids=reuse_erased_ids
                )
            except EpisodicError as exc:
                before = await _imported_before(target, ids, exc)
                raise typer.Exit(_fail(_import_failure(exc, before, len(ids)), exc, 1)) from None

    summary = _run(work, settings)
    imported = summary.conversations
    if len(imported) == 1:
        one = imported[0]
        what = (
            f"conversation {one.conversation_id} (tenant {shown(one.tenant_id, 40)}, "
            f"{counted(one.events, 'event')}, "
            f"{counted(one.compaction_attempts, 'compaction attempt')})"
        )
    else:
        events = sum(entry.events for entry in imported)
        attempts = sum(entry.compaction_attempts for entry in imported)
        what = (
            f"{counted(len(imported), 'conversation')} ({counted(events, 'event')}, "
            f"{counted(attempts, 'compaction attempt')})"
        )
    if summary.shared_states:
        what += f" and {counted(summary.shared_states, 'shared-state scope')}"
    console.print(Text(f"imported {what} from {shown(str(file))}"))


@app.command()
def demo(
    directory: Annotated[
        Path | None,
        typer.Option(
            "--directory",
            file_okay=False,
            help="Where to create episodic-demo.db.  [default: a new temporary directory]",
        ),
    ] = None,
) -> None:
    """See compaction at work on a demo session, in a SQLite file.

    Plays a long agent session into a SQLite file, lets the worker compact it, and shows the
    raw log beside the context the next request would load. No server, no API key."""
    from episodic.demo import run_demo

    asyncio.run(run_demo(directory, console=console, settings=_settings()))


@app.command()
def serve(
    database_url: DatabaseUrlOption = None,
    host: Annotated[str | None, setting_option("server_host", "The address to bind.")] = None,
    port: Annotated[int | None, setting_option("server_port", "The TCP port to listen on.")] = None,
    workers: Annotated[
        int | None,
        setting_option(
            "server_workers",
            "Processes serving the port, each with its own connection pool.",
        ),
    ] = None,
) -> None:
    """Serve the store over HTTP (needs the server extra).

    /v1 for API-key holders (keys from `episodic keys create`), /docs and /openapi.json.
    Each process works on at most EPISODIC_SERVER_MAX_INFLIGHT /v1 requests at once (4 per
    pooled connection by default); more wait up to EPISODIC_SERVER_QUEUE_TIMEOUT seconds
    for a slot, then get 503 with Retry-After. Stops gracefully on SIGTERM, every worker.
    Install the server extra with:

    \b
      pip install 'episodic-store[server]'
    """
    try:
        import uvicorn
        from uvicorn.config import STARTUP_FAILURE
        from uvicorn.supervisors import Multiprocess

        from episodic.server.serving import APP_FACTORY, LOG_CONFIG, ServedApp, fastest
    except ImportError as exc:
        raise _refused(
            f"episodic serve needs the server extra: pip install 'episodic-store[server]' ({exc})"
        ) from exc
    settings = _settings(
        database_url=database_url, server_host=host, server_port=port, server_workers=workers
    )
    _log_with_timestamps()
    # the database reachable and migrated, said once here rather than by each process
    _run(lambda store: store.list_conversations(limit=1), settings)
    several = settings.server_workers > 1
    config = uvicorn.Config(
        APP_FACTORY if several else ServedApp(settings),
        factory=several,
        workers=settings.server_workers,
        host=settings.server_host,
        port=settings.server_port,
        loop=fastest("uvloop", "asyncio"),
        http=fastest("httptools", "h11"),
        timeout_graceful_shutdown=int(settings.shutdown_grace_seconds),
        lifespan="on",  # the app is made at its startup: a failed one stops the process
        log_config=LOG_CONFIG,
        access_log=False,  # episodic.access logs each request, as JSON
    )
    if several:
        # each worker reads its settings from the environment: the options' values too
        os.environ.update(environment_of(settings))
        # the supervisor SIGTERMs the workers on SIGTERM, waits for them, and returns
        supervisor = Multiprocess(config, sockets=[config.bind_socket()])
        supervisor.run()
        if any(process.exitcode == STARTUP_FAILURE for process in supervisor.processes):
            raise _refused("a worker did not start (its log above says why)")
        return
    server = uvicorn.Server(config)
    # uvicorn raises the signal again once it has shut down: exit 0 after a SIGTERM
    signal.signal(signal.SIGTERM, lambda *_: None)
    server.run()
    if not server.started:
        raise _refused("the server did not start (its log above says why)")


keys_app = HelpTyper(help="API keys of `episodic serve`: each is a tenant's.")
app.add_typer(keys_app, name="keys")


def _keys(work: Callable[[KeyStore], Awaitable[T]], database_url: str | None) -> T:
    # imported when a keys command runs: the server extra need not be installed for the rest
    from episodic.server.keys import KeyStore

    settings = _settings(database_url=database_url)

    async def main() -> T:
        store = await EpisodicStore.open(settings.database_url, settings=settings)
        try:
            await store.list_conversations(limit=1)  # migrated? a clear error if not
        finally:
            await store.close()
        keys = KeyStore.open(settings.database_url)
        try:
            return await work(keys)
        finally:
            await keys.close()

    return asyncio.run(main())


@keys_app.command("create")
def keys_create(
    tenant: Annotated[str, typer.Option("--tenant", help="The tenant the key acts as.")],
    operator: Annotated[
        bool, typer.Option("--operator", help="May also see every tenant's compaction status.")
    ] = False,
    label: Annotated[str | None, typer.Option(help="A note on what it is for.")] = None,
    database_url: DatabaseUrlOption = None,
) -> None:
    """Make a key. It is printed once: only its hash is kept."""

    async def work(keys: KeyStore) -> tuple[ApiKey, str]:
        return await keys.create(tenant, operator=operator, label=label)

    key, secret = _keys(work, database_url)
    kind = "operator key" if key.operator else "key"
    errors.print(Text(f"{kind} {key.key_id} for tenant {key.tenant_id} (shown once):"))
    console.print(Text(secret))


@keys_app.command("list")
def keys_list(database_url: DatabaseUrlOption = None) -> None:
    """The keys (never their secrets)."""

    async def work(keys: KeyStore) -> list[ApiKey]:
        return await keys.list()

    table = _plain_table("key", "tenant", "operator", "label", "created", "revoked")
    for key in _keys(work, database_url):
        table.add_row(
            key.key_id,
            Text(shown(key.tenant_id, None)),
            "yes" if key.operator else "",
            Text(shown(key.label or "", None)),
            key.created_at.strftime("%Y-%m-%d %H:%M"),
            key.revoked_at.strftime("%Y-%m-%d %H:%M") if key.revoked_at else "",
        )
    console.print(table)


@keys_app.command("revoke")
def keys_revoke(
    key_id: Annotated[str, typer.Argument(help="The key's id (episodic keys list).")],
    database_url: DatabaseUrlOption = None,
) -> None:
    """Revoke a key: requests with it get 401 from then on."""

    async def work(keys: KeyStore) -> ApiKey:
        return await keys.revoke(key_id)

    key = _keys(work, database_url)
    console.print(Text(f"revoked key {key.key_id} of tenant {key.tenant_id}"))


async def _print_context(
    store: EpisodicStore, conversation_id: str, width: int, max_tool_result_tokens: int | None
) -> None:
    ctx = await store.load_context(conversation_id, max_tool_result_tokens=max_tool_result_tokens)
    pressure = await store.pressure(conversation_id)
    if ctx.boundary is not None:
        b = ctx.boundary
        console.print(
            Text(
                f"boundary at seq {b.seq} covers through seq {b.covers_through_seq} "
                f"(reason {shown(b.reason, 40)}, {b.retention}, {len(b.retained)} retained)"
            )
        )
    else:
        console.print("no boundary: the context is the whole history")
    console.print(
        f"{counted(len(ctx.messages), 'message')}, ≈{counted(ctx.estimated_tokens, 'token')}; "
        f"log at seq {ctx.last_seq}; pressure estimate "
        f"≈{counted(pressure.estimated_context_tokens or 0, 'token')}"
    )
    table = Table()
    for column in ("#", "seq", "role", "tokens", "content"):
        table.add_column(column, overflow="fold")
    for index, message in enumerate(ctx.messages):
        seq = "synthetic" if message.seq is None else str(message.seq)
        if ctx.boundary is not None and index <= len(ctx.boundary.retained):
            seq = "handoff" if index == 0 else "retained"
        table.add_row(
            str(index),
            seq,
            message.role,
            str(message.token_estimate or 0),
            Text(shown(describe_message(message), width)),
        )
    console.print(table)


def _one_of(ctx: typer.Context, conversation_id: str | None, tenant: str | None) -> None:
    """Refuse a command line that names both a conversation and --tenant, or neither."""
    if (conversation_id is None) == (tenant is None):
        raise typer.BadParameter(
            "give a conversation id or --tenant, not both"
            if tenant is not None
            else "give a conversation id, or --tenant",
            ctx=ctx,
            param_hint="'CONVERSATION_ID' / '--tenant'",
        )


def _confirm(question: str) -> None:
    """Ask on stderr, read the answer from stdin; anything but y or yes ends the command.
    (Not typer.confirm: it writes the prompt's last character to stdout, into the output.)"""
    errors.print(Text(f"{question} [y/N]: "), end="")
    answer = sys.stdin.readline()
    if not sys.stdin.isatty():
        errors.print()  # no echoed Enter ends the prompt's line
    if answer.strip().lower() not in ("y", "yes"):
        raise _refused("not confirmed: nothing was erased")


def _print_erasure(erasure: Erasure) -> None:
    """The tombstone an erasure left, a field a line."""
    rows = [
        ("erasure", str(erasure.erasure_id)),
        ("tenant", shown(erasure.tenant_id)),
        (
            "conversation",
            str(erasure.conversation_id)
            if erasure.conversation_id is not None
            else "tenant (all its conversations, and its shared state)",
        ),
        ("conversations", f"{erasure.conversations:,}"),
        ("events", f"{erasure.events:,}"),
        ("compaction attempts", f"{erasure.compaction_attempts:,}"),
        ("shared states", f"{erasure.shared_states:,}"),
        ("erased at", erasure.erased_at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")),
        ("by", shown(erasure.erased_by)),
        ("reason", shown(erasure.reason)),
    ]
    for name, value in rows:
        console.print(Text(f"{name + ':':<21}{value}"))


async def _write_lines(lines: AsyncIterator[str], output: Path | None) -> int:
    """Write an export's lines as UTF-8, to stdout or to ``output`` through a temporary file
    beside it, renamed over it once whole (a failed export leaves ``output`` as it was).
    Returns how many lines."""
    written = 0
    if output is None:
        stdout = typer.get_binary_stream("stdout")
        async for line in lines:
            stdout.write(line.encode())
            written += 1
        stdout.flush()
        return written
    try:
        handle, partial = tempfile.mkstemp(
            dir=output.parent, prefix=f".{output.name}.", suffix=".partial"
        )
    except OSError as exc:
        raise typer.Exit(_fail(f"cannot write {output}: {exc.strerror or exc}", exc, 1)) from None
    try:
        # the mode a plain open would give (mkstemp's is 0600), or the replaced file's
        os.chmod(partial, _mode_for(output))
        with os.fdopen(handle, "wb") as file:
            async for line in lines:
                file.write(line.encode())
                written += 1
            file.flush()
            os.fsync(file.fileno())
        os.replace(partial, output)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(partial)
        if isinstance(exc, OSError):
            raise typer.Exit(
                _fail(f"cannot write {output}: {exc.strerror or exc}", exc, 1)
            ) from None
        raise
    return written


def _mode_for(path: Path) -> int:
    try:
        return stat.S_IMODE(path.stat().st_mode)
    except FileNotFoundError:
        mask = os.umask(0)
        os.umask(mask)
        return 0o666 & ~mask


def _text_lines(handle: BinaryIO) -> Iterator[str]:
    """A file's lines as text, read one at a time (split at newlines only)."""
    for number, raw in enumerate(handle, 1):
        try:
            yield raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ImportFormatError(
                f"not UTF-8 text (byte {exc.start + 1} of the line); the file is not an "
                "episodic export, or it was damaged",
                line=number,
            ) from None


async def _imported_before(
    store: EpisodicStore, ids: list[UUID], failure: EpisodicError
) -> int | None:
    """How many of the file's conversations (``ids``, in file order) an import that failed
    with ``failure`` had imported; None when that cannot be told. The import goes in order
    and stops at the first failure, so it is the position of the one that failed: the one
    whose id was taken, else the first the database does not hold."""
    if isinstance(failure, ConflictError) and failure.conversation_id in ids:
        return ids.index(failure.conversation_id)
    for index, cid in enumerate(ids):
        try:
            await store.read_events(cid, limit=1)
        except NotFoundError:
            return index
        except EpisodicError:
            return None
    return len(ids)


def _import_failure(failure: EpisodicError, before: int | None, total: int) -> str:
    """The one line for an import that failed part way: what failed, and what was imported."""
    if isinstance(failure, ErasedConversationError):
        problem = (
            f"conversation {failure.conversation_id} was erased in this database, and an "
            "erased id is not re-created unless you say so (--reuse-erased-ids)"
        )
    else:
        problem = str(failure)
    if isinstance(failure, ImportFormatError):
        problem += " (the file changed after it was checked)"
    if before is None:
        return (
            f"{problem}; nothing was written for that conversation; the ones before it in "
            "the file may have been imported (episodic list shows them)"
        )
    if before == total:
        return f"{problem}; all {counted(total, 'conversation')} of the file were imported first"
    if before == 0:
        done = "no conversation before it was imported"
    else:
        done = f"the {counted(before, 'conversation')} before it {_was(before)} imported"
    return (
        f"{problem}; nothing was written for it (conversation {before + 1} of {total} in "
        f"the file); {done}"
    )


def _was(count: int) -> str:
    return "was" if count == 1 else "were"


def _state_of(
    due_since: datetime | None, dead_since: datetime | None, lease_expires_at: datetime | None
) -> str:
    if dead_since is not None:
        return "dead"
    if lease_expires_at is not None and lease_expires_at > datetime.now(lease_expires_at.tzinfo):
        return "leased"
    return "due" if due_since is not None else ""


def _plain_table(*columns: str) -> Table:
    """A borderless table whose cells never wrap: rows stay one line each (what a cut
    dropped is marked with an ellipsis)."""
    table = Table(box=None, pad_edge=False, header_style="bold")
    for column in columns:
        table.add_column(column, no_wrap=True, overflow="ellipsis")
    return table


def _room_for(flexible: int, headers: tuple[str, ...], rows: list[list[str]], width: int) -> int:
    """How wide column ``flexible`` may be for the table to fit ``width`` (never narrower
    than its header), the other columns whole and two spaces apart."""
    widths = [
        max([len(header), *(len(row[i]) for row in rows)]) for i, header in enumerate(headers)
    ]
    others = sum(widths) - widths[flexible] + 2 * (len(headers) - 1)
    return max(width - others, len(headers[flexible]))


def _print_table(table: Table, *, whole: bool) -> None:
    """Print a table; ``whole``: at its natural width, wider than the terminal if it must be
    (rich would squeeze every column to fit, cutting ids and even headers, to "s…")."""
    if whole:
        table.width = console.measure(table, options=console.options.update_width(10**6)).maximum
    console.print(table, crop=not whole)


def _when(moment: datetime | None, wide: bool) -> str:
    if moment is None:
        return ""
    return moment.strftime("%Y-%m-%d %H:%M:%S" if wide else "%m-%d %H:%M")


class _LowercaseLevel(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return f"{record.levelname.lower()}: {shown(record.getMessage())}"


def _log_one_line() -> None:
    """Warnings and errors of the library (a setting nobody knows, ...) as one line each."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_LowercaseLevel())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.WARNING)


def _log_with_timestamps() -> None:
    """The worker's log: every line timestamped, INFO and up."""
    root = logging.getLogger()
    for handler in root.handlers:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    root.setLevel(logging.INFO)


def _fail(message: str, exc: BaseException, code: int) -> int:
    errors.print(Text(f"error: {shown(message)}"))
    if _debug:
        errors.print(Text("".join(traceback.format_exception(exc))))
    return code


def _refused(message: str, code: int = 1) -> typer.Exit:
    """A refusal that is no exception: its one line, and the exit to raise."""
    errors.print(Text(f"error: {shown(message)}"))
    return typer.Exit(code)


def main() -> None:
    """The console script: run the command, turn every failure into one line and an exit
    code (1 for a failed operation, 2 for a bad command line, 130 when interrupted)."""
    _log_one_line()
    try:
        outcome = app(args=sys.argv[1:] or ["--help"], prog_name="episodic", standalone_mode=False)
    except EpisodicError as exc:
        code = _fail(str(exc), exc, 1)
    except typer.TyperException as exc:  # a bad command line (click's usage errors)
        context = getattr(exc, "ctx", None)
        hint = f"; see {context.command_path} --help" if context is not None else ""
        code = _fail(exc.format_message().rstrip(".") + hint, exc, exc.exit_code)
    except typer.Abort as exc:
        code = _fail("aborted", exc, 1)
    except Exception as exc:
        code = _fail(
            f"unexpected {type(exc).__name__}: {exc} (run with --debug for the traceback)",
            exc,
            1,
        )
    else:
        code = outcome if isinstance(outcome, int) else 0
    sys.exit(code)


__all__ = ["app", "main"]
