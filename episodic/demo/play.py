"""``episodic demo``: a long agent session played into a SQLite log, compacted, and shown.

No database server, no API key and no network (unless ``EPISODIC_SUMMARIZER=openai`` points
the summarizer at an endpoint). The session is data (``session.json``), so every run prints
the same figures, and every figure printed is read back from the store (``read_events``,
``load_context``, the boundary), never computed on the side.
"""

from __future__ import annotations

import shlex
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path
from uuid import UUID, uuid4, uuid5

import orjson
from pydantic import JsonValue
from rich.console import Console, Group
from rich.panel import Panel
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from episodic.context import Context
from episodic.demo.session import scripted_session
from episodic.errors import ConflictError, EpisodicError
from episodic.models import BoundaryEvent, Message, MessageEvent, StoredEvent, ToolCall, Usage
from episodic.settings import EpisodicSettings, load_settings
from episodic.store import EpisodicStore
from episodic.summarizers import OpenAIChatSummarizer
from episodic.worker import CompactionWorker
from episodic.worker.setup import options_from_settings, summarizer_from_settings

#: The demo's database file, inside the demo directory.
DEMO_DATABASE_FILE = "episodic-demo.db"
#: The conversation id of the first demo played into a directory (a later one gets a new id).
DEMO_CONVERSATION_ID = uuid5(UUID("8d5c2f0e-4a49-4f43-9a54-1c0d2b6f7e21"), "episodic-demo")
DEMO_TENANT = "demo"
#: The demo's trigger: compact once the context reaches this many estimated tokens (about
#: half of what the session grows to, so the trigger fires midway through it).
DEMO_TRIGGER_CONTEXT_TOKENS = 10_000
#: Recent user messages kept verbatim after the boundary (with the default estimator, the
#: session's last five requests come to exactly this, so none is cut).
DEMO_RECENT_USER_TOKENS = 200
#: What the agent sends besides the history (system prompt and tool schemas), for the
#: provider-reported usage on each assistant message.
SYSTEM_PROMPT_TOKENS = 2_150


class DemoError(EpisodicError):
    """The demo could not compact its conversation (the summarizer failed, say)."""


@dataclass(frozen=True, slots=True)
class DemoReport:
    """The figures the demo printed, all read back from the store."""

    conversation_id: UUID
    database_path: Path
    database_url: str
    #: the raw log, after compaction (``read_events``): every event, the boundary included
    log_events: int
    log_message_events: int
    log_bytes: int
    log_tokens: int
    runs_completed: int
    abandoned_tool_calls: int
    #: when the append-time trigger marked the conversation due, and the pressure then
    due_at_seq: int | None
    due_pressure_tokens: int | None
    trigger_context_tokens: int
    #: the context the next request would load, before and after the worker ran
    messages_before: int
    tokens_before: int
    bytes_before: int
    messages_after: int
    tokens_after: int
    bytes_after: int
    trigger_reason: str
    boundary_seq: int
    covers_through_seq: int
    handoff_text: str
    retained_texts: tuple[str, ...]
    summarizer: str
    summarizer_model: str | None
    seconds: float

    @property
    def figures(self) -> dict[str, object]:
        """Everything but where the database is and how long it took: the same on every run."""
        return {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if f.name not in ("database_path", "database_url", "seconds")
        }


async def run_demo(
    directory: Path | None,
    *,
    console: Console,
    settings: EpisodicSettings | None = None,
) -> DemoReport:
    """Play the demo session into ``directory/episodic-demo.db`` (a new temporary directory
    when None, left in place so the commands printed at the end work), let the compaction
    worker compact it, and print the log next to the context before and after.

    The summarizer is the one ``settings`` name: the extractive one by default, or the
    OpenAI-compatible one with ``EPISODIC_SUMMARIZER=openai`` (also chosen when
    ``EPISODIC_SUMMARIZER`` is unset and both ``EPISODIC_SUMMARIZER_BASE_URL`` and
    ``EPISODIC_SUMMARIZER_MODEL`` are set). ``EPISODIC_DATABASE_URL`` and the trigger
    settings are not used: the demo has its own file and trigger.
    """
    started = time.perf_counter()
    settings = _demo_settings(settings or load_settings())
    summarizer = summarizer_from_settings(settings)
    temporary = directory is None
    folder = Path(tempfile.mkdtemp(prefix="episodic-demo-")) if directory is None else directory
    folder.mkdir(parents=True, exist_ok=True)
    path = (folder / DEMO_DATABASE_FILE).resolve()
    url = f"sqlite:///{path}"
    trigger = settings.trigger_config().model_copy(
        update={"trigger_context_tokens": DEMO_TRIGGER_CONTEXT_TOKENS}
    )

    console.print(
        Text.assemble(
            ("episodic demo", "bold"),
            ": an agent fixes a red CI pipeline; every message goes into an append-only log.",
        )
    )
    where = "a new temporary directory" if temporary else "the directory you gave"
    console.print(Text(f"SQLite database in {where}: {path}"))
    console.print(
        Text(
            f"Compaction trigger: context ≥ {DEMO_TRIGGER_CONTEXT_TOKENS:,} estimated tokens; "
            f"summarizer: {summarizer.name}."
        )
    )

    store = await EpisodicStore.open(url, settings=settings, trigger=trigger)
    try:
        await store.migrate()
        conversation_id = await _create_conversation(store, console)
        played = await _play(store, conversation_id, console)
        before = await store.load_context(conversation_id)

        worker = CompactionWorker(
            store,
            summarizer,
            concurrency=1,
            options=replace(
                options_from_settings(settings),
                compaction=settings.compaction_config().with_limits(
                    recent_user_token_budget=DEMO_RECENT_USER_TOKENS
                ),
            ),
            worker_id="episodic-demo",
        )
        with console.status(f"The worker is compacting with the {summarizer.name} summarizer…"):
            results = await worker.run_once()
        after = await store.load_context(conversation_id)
        boundary = after.boundary
        if boundary is None:
            errors = "; ".join(r.error for r in results if r.error) or "nothing was compacted"
            outcomes = ", ".join(r.outcome for r in results) or "no attempt"
            raise DemoError(f"the worker wrote no boundary ({outcomes}): {errors}")
        events = await _all_events(store, conversation_id)
    finally:
        await store.close()
        if isinstance(summarizer, OpenAIChatSummarizer):
            await summarizer.aclose()

    messages = [e for e in events if isinstance(e, MessageEvent)]
    report = DemoReport(
        conversation_id=conversation_id,
        database_path=path,
        database_url=url,
        log_events=len(events),
        log_message_events=len(messages),
        log_bytes=sum(len(orjson.dumps(e.message.stored_fields())) for e in messages),
        log_tokens=sum(e.token_estimate for e in messages),
        runs_completed=sum(1 for e in events if e.kind == "run_completed"),
        abandoned_tool_calls=sum(
            len(e.abandoned_tool_call_ids) for e in events if e.kind == "run_completed"
        ),
        due_at_seq=played.due_at_seq,
        due_pressure_tokens=played.due_pressure_tokens,
        trigger_context_tokens=DEMO_TRIGGER_CONTEXT_TOKENS,
        messages_before=len(before.messages),
        tokens_before=before.estimated_tokens,
        bytes_before=_request_bytes(before),
        messages_after=len(after.messages),
        tokens_after=after.estimated_tokens,
        bytes_after=_request_bytes(after),
        trigger_reason=boundary.reason,
        boundary_seq=boundary.seq,
        covers_through_seq=boundary.covers_through_seq,
        handoff_text=after.messages[0].text,
        retained_texts=boundary.retained,
        summarizer=summarizer.name,
        summarizer_model=boundary.model,
        seconds=time.perf_counter() - started,
    )
    _print_report(console, report, events, before, after, boundary)
    return report


# ---- playing the session ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Played:
    due_at_seq: int | None
    due_pressure_tokens: int | None


def _demo_settings(settings: EpisodicSettings) -> EpisodicSettings:
    """``settings``, with the OpenAI-compatible summarizer chosen when a base URL and a model
    are configured and EPISODIC_SUMMARIZER was left unset."""
    if (
        settings.summarizer == "extractive"
        and "summarizer" not in settings.model_fields_set
        and settings.summarizer_base_url
        and settings.summarizer_model
    ):
        return settings.model_copy(update={"summarizer": "openai"})
    return settings


async def _create_conversation(store: EpisodicStore, console: Console) -> UUID:
    metadata: dict[str, JsonValue] = {
        "agent": "ci-fixer",
        "model": "gpt-4.1",
        "repository": "acme/payments-api",
    }
    try:
        return await store.create_conversation(
            tenant_id=DEMO_TENANT, metadata=metadata, conversation_id=DEMO_CONVERSATION_ID
        )
    except ConflictError:
        console.print(
            Text("This database already holds a demo conversation; playing a new one.", "yellow")
        )
        return await store.create_conversation(
            tenant_id=DEMO_TENANT, metadata=metadata, conversation_id=uuid4()
        )


async def _play(store: EpisodicStore, conversation_id: UUID, console: Console) -> _Played:
    """Append the session as an agent server would: the user's request, then per model call
    the assistant message (with its usage) and the tool results, and a run completion."""
    runs = scripted_session()
    steps = sum(1 + 2 * len(run.turns) + 1 for run in runs)
    sent = 0  # the history the agent sends with its next model call, from the stored estimates
    due: tuple[int, int] | None = None
    progress = Progress(
        TextColumn("[progress.description]{task.description:<34}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
    )

    async def appended(events: Sequence[MessageEvent] = ()) -> None:
        nonlocal sent, due
        sent += sum(e.token_estimate for e in events)
        progress.advance(task)
        if due is None:
            due = await _due(store, conversation_id)

    with progress:
        task = progress.add_task("appending", total=steps)
        for number, run in enumerate(runs, 1):
            progress.update(task, description=f"run {number}/{len(runs)}: user request")
            await appended(
                await store.append(
                    conversation_id,
                    [Message.user(run.request)],
                    idempotency_key=f"demo-request-{number}",
                )
            )
            previous_input = 0
            for turn in run.turns:
                calls = [ToolCall(id=c.id, name=c.name, args=c.args) for c in turn.calls]
                names = ", ".join(c.name for c in calls) or "reply"
                progress.update(task, description=f"run {number}/{len(runs)}: {names}")
                usage = Usage(
                    input_tokens=SYSTEM_PROMPT_TOKENS + sent,
                    output_tokens=store.estimator.count(
                        (turn.text or "") + "".join(c.arguments_text() for c in calls)
                    ),
                    cache_read_tokens=previous_input,  # the provider cached the last prompt
                )
                previous_input = usage.input_tokens
                assistant = Message.assistant(turn.text, tool_calls=calls)
                await appended(await store.append(conversation_id, [assistant], usage=usage))
                # Parallel calls finish in any order; the store pairs each result with its call.
                answered = [
                    Message.tool_result(call.id, c.result, name=c.name, is_error=c.is_error)
                    for call, c in zip(calls, turn.calls, strict=True)
                    if c.result is not None
                ]
                await appended(
                    await store.append(conversation_id, answered[::-1]) if answered else ()
                )
            progress.update(task, description=f"run {number}/{len(runs)}: run completed")
            await store.mark_run_completed(conversation_id)
            await appended()
        progress.update(task, description="session played")
    return _Played(
        due_at_seq=due[0] if due is not None else None,
        due_pressure_tokens=due[1] if due is not None else None,
    )


async def _due(store: EpisodicStore, conversation_id: UUID) -> tuple[int, int] | None:
    """The last seq and the pressure, once the append-time trigger has marked the
    conversation due (checked after every append, so the seq is the append that did it)."""
    head = await store.get_conversation(conversation_id)
    if head.due_since is None:
        return None
    pressure = await store.pressure(conversation_id)
    return head.last_seq, pressure.estimated_context_tokens or 0


async def _all_events(store: EpisodicStore, conversation_id: UUID) -> list[StoredEvent]:
    events: list[StoredEvent] = []
    while page := await store.read_events(
        conversation_id, after_seq=events[-1].seq if events else 0, limit=1_000
    ):
        events += page
    return events


def _request_bytes(context: Context) -> int:
    """Bytes of the chat-completions messages the context gives the model."""
    return len(orjson.dumps(context.to_openai()))


# ---- printing -----------------------------------------------------------------------------


def _print_report(
    console: Console,
    report: DemoReport,
    events: Sequence[StoredEvent],
    before: Context,
    after: Context,
    boundary: BoundaryEvent,
) -> None:
    r = report
    calls = "call" if r.abandoned_tool_calls == 1 else "calls"
    console.print(
        Text(
            f"Played {r.log_message_events:,} messages in {r.runs_completed} agent runs "
            f"({r.abandoned_tool_calls} tool {calls} left open, closed as abandoned when the "
            "run completed)."
        )
    )
    if r.due_at_seq is not None and r.due_pressure_tokens is not None:
        console.print(
            Text(
                f"The append at seq {r.due_at_seq:,} marked the conversation due: pressure "
                f"≈{r.due_pressure_tokens:,} tokens ≥ {r.trigger_context_tokens:,} "
                f"({r.trigger_reason})."
            )
        )
    model = f", model {r.summarizer_model}" if r.summarizer_model != r.summarizer else ""
    console.print(
        Text(
            f"The worker ({r.summarizer} summarizer{model}) wrote a boundary at seq "
            f"{r.boundary_seq:,} covering seq 1-{r.covers_through_seq:,}, reason "
            f"{r.trigger_reason}."
        )
    )
    console.print()

    boundaries = sum(1 for e in events if isinstance(e, BoundaryEvent))
    console.print(
        Text(
            f"Conversation {r.conversation_id}: the log holds {r.log_events:,} events "
            f"({r.log_message_events:,} messages, {r.runs_completed} run completions, "
            f"{boundaries} boundary)."
        )
    )
    table = Table()
    table.add_column("")
    table.add_column("log\n(read_events)", justify="right")
    table.add_column("next request\nbefore", justify="right")
    table.add_column("next request\nafter", justify="right")
    log_roles = Counter(e.message.role for e in events if isinstance(e, MessageEvent))
    before_roles = Counter(m.role for m in before.messages)
    after_roles = Counter(m.role for m in after.messages)
    synthetic = sum(1 for m in before.messages if m.role == "tool" and m.seq is None)
    table.add_row(
        Text("messages", style="bold"),
        f"{r.log_message_events:,}",
        Text(f"{r.messages_before:,}", style="bold"),
        Text(f"{r.messages_after:,}", style="bold green"),
    )
    table.add_row(
        "  user",
        f"{log_roles['user']:,}",
        f"{before_roles['user']:,}",
        f"{after_roles['user']:,} (1 handoff)",
    )
    table.add_row(
        "  assistant",
        f"{log_roles['assistant']:,}",
        f"{before_roles['assistant']:,}",
        f"{after_roles['assistant']:,}",
    )
    table.add_row(
        "  tool results",
        f"{log_roles['tool']:,}",
        f"{before_roles['tool']:,}" + (f" ({synthetic} synthetic)" if synthetic else ""),
        f"{after_roles['tool']:,}",
    )
    table.add_row(
        Text("estimated tokens", style="bold"),
        f"≈{r.log_tokens:,}",
        Text(f"≈{r.tokens_before:,}", style="bold"),
        Text(f"≈{r.tokens_after:,}", style="bold green"),
    )
    table.add_row("JSON bytes", f"{r.log_bytes:,}", f"{r.bytes_before:,}", f"{r.bytes_after:,}")
    console.print(table)
    share = r.tokens_after / r.tokens_before if r.tokens_before else 0.0
    console.print(
        Text(
            f"The next request loads ≈{r.tokens_after:,} tokens instead of ≈{r.tokens_before:,} "
            f"({share:.0%}); the log still holds all {r.log_message_events:,} messages, "
            "unchanged.",
            style="bold",
        )
    )
    console.print()
    console.print(
        Panel(
            Text(r.handoff_text),
            title=f"handoff (message 1 of {r.messages_after})",
            title_align="left",
        )
    )
    lines = [Text(f"{i}. {text}") for i, text in enumerate(r.retained_texts, 1)]
    console.print(
        Panel(
            Group(*lines) if lines else Text("(none)"),
            title=f"retained user messages, verbatim (budget {DEMO_RECENT_USER_TOKENS} tokens)",
            title_align="left",
        )
    )
    _print_next_steps(console, r)
    console.print(Text(f"Done in {r.seconds:.1f} s.", style="dim"))


def _print_next_steps(console: Console, r: DemoReport) -> None:
    url = shlex.quote(r.database_url)
    cid = r.conversation_id
    steps = (
        (
            "What the next request loads, message by message:",
            f"episodic show {cid} --context --database-url {url}",
        ),
        ("The whole log, nothing rewritten:", f"episodic show {cid} --database-url {url}"),
        ("The worker's attempts:", f"episodic status --database-url {url}"),
        (
            "A model writes the handoff (pip install 'episodic-store[openai]'; any "
            "OpenAI-compatible endpoint):",
            "EPISODIC_SUMMARIZER=openai EPISODIC_SUMMARIZER_BASE_URL=https://api.openai.com/v1 "
            "EPISODIC_SUMMARIZER_MODEL=gpt-4.1-mini EPISODIC_SUMMARIZER_API_KEY=sk-... "
            "episodic demo",
        ),
    )
    console.rule("What to try next", align="left")
    for label, command in steps:
        console.print(Text(label))
        # Not wrapped by rich, so a command stays one line to copy.
        console.print(Text(f"  {command}", style="cyan"), soft_wrap=True)
    console.print(
        Text(
            "In production: PostgreSQL, `episodic migrate` on deploy, `episodic worker` as a "
            'service; see "In production" in README.md.'
        )
    )


__all__ = ["DEMO_DATABASE_FILE", "DemoError", "DemoReport", "run_demo"]
