"""The ``episodic`` command line: thin commands over the library."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated, TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from episodic.demo import run_demo
from episodic.errors import EpisodicError
from episodic.models import BoundaryEvent, Message, MessageEvent, RunCompletedEvent, StoredEvent
from episodic.settings import EpisodicSettings, load_settings
from episodic.store import EpisodicStore
from episodic.worker import WorkerMetrics, compact_claimed
from episodic.worker.setup import worker_from_settings

app = typer.Typer(
    name="episodic",
    help="A durable, append-only episodic history for AI-agent conversations.",
    no_args_is_help=True,
    add_completion=False,
)
console = Console()
T = TypeVar("T")

DatabaseUrlOption = Annotated[
    str | None,
    typer.Option(
        "--database-url",
        envvar="EPISODIC_DATABASE_URL",
        show_envvar=True,
        help="postgresql+asyncpg://... or sqlite+aiosqlite:///file.db \\[default: ./episodic.db]",
    ),
]

TenantOption = Annotated[
    str | None,
    typer.Option(
        "--tenant",
        help="Act as this tenant (store.for_tenant). Needed on PostgreSQL when your role is "
        "held to one tenant by row-level security, as the runtime roles and the owner are.",
    ),
]


def _settings() -> EpisodicSettings:
    try:
        return load_settings()
    except EpisodicError as exc:
        console.print(f"[red]error:[/red] {escape(str(exc))}")
        raise typer.Exit(1) from exc


def _scoped(store: EpisodicStore, tenant: str | None) -> EpisodicStore:
    return store.for_tenant(tenant) if tenant is not None else store


def _run(
    work: Callable[[EpisodicStore], Awaitable[T]],
    database_url: str | None,
    settings: EpisodicSettings | None = None,
) -> T:
    async def main() -> T:
        config = settings or load_settings()
        store = await EpisodicStore.open(database_url or config.database_url, settings=config)
        try:
            return await work(store)
        finally:
            await store.close()

    try:
        return asyncio.run(main())
    except EpisodicError as exc:
        console.print(f"[red]error:[/red] {escape(str(exc))}")
        raise typer.Exit(1) from exc


@app.command()
def migrate(database_url: DatabaseUrlOption = None) -> None:
    """Create or upgrade episodic's tables (alembic upgrade head). Safe to run from many
    processes at once."""

    async def work(store: EpisodicStore) -> None:
        await store.migrate()

    _run(work, database_url)
    console.print("schema is up to date")


@app.command()
def show(
    conversation_id: Annotated[str, typer.Argument(help="The conversation's UUID.")],
    database_url: DatabaseUrlOption = None,
    after_seq: Annotated[int, typer.Option(help="Show events after this seq.")] = 0,
    limit: Annotated[int, typer.Option(help="Show at most this many events.")] = 200,
    width: Annotated[int, typer.Option(help="Characters of each event to show.")] = 160,
    context: Annotated[
        bool, typer.Option("--context", help="Show what the model would see: load_context().")
    ] = False,
    max_tool_result_tokens: Annotated[
        int | None, typer.Option(help="With --context: cut longer tool results, as at load.")
    ] = None,
    tenant: TenantOption = None,
) -> None:
    """Print a conversation's head counters and its events, or with --context the messages
    the next request would load, with token counts."""

    async def work(store: EpisodicStore) -> None:
        store = _scoped(store, tenant)
        if context:
            await _print_context(store, conversation_id, width, max_tool_result_tokens)
            return
        head = await store.get_conversation(conversation_id)
        events = await store.read_events(conversation_id, after_seq=after_seq, limit=limit)
        console.print(
            f"[bold]{head.conversation_id}[/bold]  tenant={escape(head.tenant_id)}  "
            f"last_seq={head.last_seq}  context≈{head.context_tokens:,} tokens  "
            f"user messages={head.total_user_messages}  "
            f"open tool calls={len(head.open_tool_calls)}"
        )
        table = Table(show_lines=False)
        for column in ("seq", "at", "kind", "tokens", "content"):
            table.add_column(column, overflow="fold")
        for event in events:
            table.add_row(
                str(event.seq),
                event.created_at.strftime("%Y-%m-%d %H:%M:%S"),
                _kind(event),
                str(event.token_estimate),
                Text(_describe(event)[:width]),
            )
        console.print(table)

    _run(work, database_url)


@app.command()
def worker(
    database_url: DatabaseUrlOption = None,
    concurrency: Annotated[
        int | None,
        typer.Option(
            envvar="EPISODIC_WORKER_CONCURRENCY",
            show_envvar=True,
            help="Compactions in flight at once in this process. [default: 4]",
        ),
    ] = None,
    once: Annotated[
        bool, typer.Option("--once", help="Compact what is due now, then exit (for cron).")
    ] = False,
    metrics_port: Annotated[
        int | None,
        typer.Option(
            envvar="EPISODIC_METRICS_PORT",
            show_envvar=True,
            help="Serve Prometheus metrics on this port.",
        ),
    ] = None,
) -> None:
    """Run the compaction worker: claim due conversations, summarize, write boundaries. Stops
    gracefully on SIGTERM/SIGINT. Run as many as you like, on as many machines."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    settings = _settings()
    if concurrency is not None:
        settings = settings.model_copy(update={"worker_concurrency": concurrency})
    metrics = WorkerMetrics()
    port = metrics_port if metrics_port is not None else settings.metrics_port
    if port is not None:
        metrics.serve(port)

    async def work(store: EpisodicStore) -> None:
        runner = worker_from_settings(store, settings, metrics=metrics)
        if once:
            results = await runner.run_once()
            outcomes = Counter(result.outcome for result in results)
            console.print(f"{len(results)} attempts: {dict(outcomes) or 'nothing was due'}")
            return
        runner.install_signal_handlers()
        await runner.run()

    _run(work, database_url, settings)


@app.command()
def status(
    database_url: DatabaseUrlOption = None,
    recent: Annotated[int, typer.Option(help="How many recent attempts to list.")] = 10,
) -> None:
    """Compaction status: due, leased, failing and dead conversations, and recent attempts."""

    async def work(store: EpisodicStore) -> None:
        state = await store.compaction_status(recent=recent)
        console.print(
            f"due={state.due}  leased={state.leased}  failing={state.failing}  dead={state.dead}"
        )
        table = Table()
        for column in ("finished", "conversation", "reason", "outcome", "tokens", "error"):
            table.add_column(column, overflow="fold")
        for row in state.recent_attempts:
            before, after = row["tokens_before"], row["tokens_after"]
            tokens = f"{before} → {after}" if after is not None else str(before or "")
            table.add_row(
                row["finished_at"].strftime("%Y-%m-%d %H:%M:%S"),
                str(row["conversation_id"]),
                Text(str(row["reason"])),
                Text(str(row["outcome"])),
                tokens,
                Text(str(row["error"] or "")),
            )
        console.print(table)

    _run(work, database_url)


@app.command()
def compact(
    conversation_id: Annotated[str, typer.Argument(help="The conversation's UUID.")],
    database_url: DatabaseUrlOption = None,
    tenant: TenantOption = None,
) -> None:
    """Compact one conversation now, due or not (a boundary with reason manual_recovery),
    with the summarizer the settings name."""
    settings = _settings()

    async def work(store: EpisodicStore) -> None:
        store = _scoped(store, tenant)
        runner = worker_from_settings(store, settings)
        owner = f"cli:{runner.worker_id}"
        claim = await store.claim_conversation(
            conversation_id, owner, lease_seconds=runner.lease_seconds
        )
        if claim is None:
            console.print("a worker is compacting this conversation right now; try again later")
            raise typer.Exit(1)
        result = await compact_claimed(
            store, runner.summarizer, claim, worker=owner, options=runner.options
        )
        console.print(
            f"{result.outcome}: ≈{result.tokens_before or 0:,} → "
            f"≈{result.tokens_after if result.tokens_after is not None else '?'} tokens"
            + (f" ({escape(result.error)})" if result.error else "")
        )
        if result.outcome not in ("succeeded", "fallback", "nothing_to_compact"):
            raise typer.Exit(1)

    _run(work, database_url, settings)


@app.command()
def demo(
    directory: Annotated[
        Path | None,
        typer.Option(
            "--directory",
            file_okay=False,
            help="Where to create episodic-demo.db \\[default: a new temporary directory]",
        ),
    ] = None,
) -> None:
    """Play a long agent session into a SQLite file, let the worker compact it, and show the
    raw log beside the context the next request would load. No server, no API key."""
    try:
        asyncio.run(run_demo(directory, console=console, settings=_settings()))
    except EpisodicError as exc:
        console.print(f"[red]error:[/red] {escape(str(exc))}")
        raise typer.Exit(1) from exc


async def _print_context(
    store: EpisodicStore, conversation_id: str, width: int, max_tool_result_tokens: int | None
) -> None:
    ctx = await store.load_context(conversation_id, max_tool_result_tokens=max_tool_result_tokens)
    pressure = await store.pressure(conversation_id)
    if ctx.boundary is not None:
        b = ctx.boundary
        console.print(
            f"boundary at seq {b.seq} covers through seq {b.covers_through_seq} "
            f"(reason {escape(b.reason)}, {b.retention}, {len(b.retained)} retained)"
        )
    else:
        console.print("no boundary: the context is the whole history")
    console.print(
        f"{len(ctx.messages)} messages, ≈{ctx.estimated_tokens:,} tokens; log at seq "
        f"{ctx.last_seq}; pressure estimate ≈{pressure.estimated_context_tokens or 0:,} tokens"
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
            Text(_describe_message(message)[:width]),
        )
    console.print(table)


def _kind(event: StoredEvent) -> str:
    if isinstance(event, MessageEvent):
        return event.message.role
    return event.kind


def _describe(event: StoredEvent) -> str:
    if isinstance(event, MessageEvent):
        return _describe_message(event.message)
    if isinstance(event, RunCompletedEvent):
        abandoned = ", ".join(event.abandoned_tool_call_ids) or "none"
        return f"run completed; abandoned calls: {abandoned}"
    if isinstance(event, BoundaryEvent):
        return f"boundary through seq {event.covers_through_seq} ({event.reason}): {event.summary}"
    return ""


def _describe_message(message: Message) -> str:
    parts = [message.text] if message.text else []
    if message.tool_calls:
        calls = ", ".join(f"{c.name}#{c.id}({c.arguments_text()})" for c in message.tool_calls)
        parts.append(f"calls {calls}")
    if message.role == "tool":
        status = "error" if message.is_error else "ok"
        parts.insert(0, f"result #{message.tool_call_id} {message.name or ''} {status}:")
    return " ".join(parts).replace("\n", " ")


def main() -> None:
    app()


__all__ = ["app", "main"]
