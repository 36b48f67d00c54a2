"""One adapter per store, each through the store's own public API.

An adapter appends message ``i`` of ``bench.peers.sequence`` (``append``), grows a
conversation in batches for the load workload (``grow``, untimed) and loads a conversation
whole (``load``, returning how many messages came back). The frameworks are imported inside
``open`` so a missing package skips that store alone.
"""

from __future__ import annotations

import uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

import asyncpg
import orjson

from bench import raw as core_raw
from bench.peers.sequence import ARGS, ARGS_JSON, TOOL, body, call_id, kind

GROW_BATCH = 500
#: the handoff summary of the boundaries episodic is loaded behind (~2,000 characters, as in
#: ``python -m bench``)
BOUNDARY_SUMMARY = "Handoff: " + " ".join(body(i) for i in range(5))
#: connections per store: episodic's pool default, and the same for the others' pools
POOL = 10


class Store(ABC):
    key: str
    label: str
    #: messages written by one append call
    per_call: int = 1
    #: the distributions whose versions the report lists
    packages: tuple[str, ...] = ()
    #: what one append call is and how tool calls are stored
    how: str = ""

    @abstractmethod
    async def open(self, url: str) -> None:
        """``url``: postgresql://user@host:port/db of a fresh database."""

    @abstractmethod
    async def close(self) -> None: ...

    @abstractmethod
    async def conversation(self) -> Any:
        """A new, empty conversation (its handle)."""

    @abstractmethod
    async def append(self, conv: Any, i: int) -> None:
        """Append messages ``i`` .. ``i + per_call - 1``, one call."""

    @abstractmethod
    async def grow(self, conv: Any, start: int, n: int) -> None:
        """Append messages ``start`` .. ``start + n - 1`` as fast as the API allows."""

    @abstractmethod
    async def load(self, conv: Any) -> int:
        """Load the whole conversation; the number of messages it holds."""

    async def concurrent_setup(self, tasks: int) -> None:
        """Called before the concurrent workload (e.g. to open per-task connections)."""
        return None

    def for_task(self, task: int) -> Store:
        """The adapter one concurrent task uses (``self`` unless it needs its own)."""
        return self


def _sqlalchemy_url(url: str) -> str:
    return url.replace("postgresql://", "postgresql+asyncpg://", 1)


# ---- raw asyncpg -------------------------------------------------------------------------


def _raw_payload(i: int) -> str:
    k = kind(i)
    if k == "call":
        msg: dict[str, Any] = {
            "role": "assistant",
            "tool_calls": [{"id": call_id(i), "name": TOOL, "args": ARGS}],
        }
    elif k == "result":
        msg = {"role": "tool", "tool_call_id": call_id(i), "name": TOOL, "content": body(i)}
    else:
        msg = {"role": k, "content": body(i)}
    return orjson.dumps(msg).decode()


class _RawConv:
    __slots__ = ("id",)

    def __init__(self) -> None:
        self.id = uuid.uuid4()


class Raw(Store):
    key = "raw"
    label = "raw asyncpg, one INSERT per message (the limit)"
    packages = ("asyncpg",)
    how = (
        "`INSERT` of one row `(conversation_id, seq, payload jsonb)` on one connection "
        "(8 connections for the concurrent workload); load = `SELECT ... ORDER BY seq` + "
        "orjson decode; tool call/result pairs as JSON payloads"
    )

    def __init__(self, label: str | None = None) -> None:
        if label:
            self.label = label
        self._url = ""
        self._conn: asyncpg.Connection | None = None
        self._task_conns: list[asyncpg.Connection] = []

    async def open(self, url: str) -> None:
        self._url = url
        self._conn = await asyncpg.connect(url)
        await self._conn.execute(core_raw.CREATE)

    async def close(self) -> None:
        for conn in [self._conn, *self._task_conns]:
            if conn is not None:
                await conn.close()

    async def conversation(self) -> _RawConv:
        return _RawConv()

    async def append(self, conv: _RawConv, i: int) -> None:
        assert self._conn is not None
        await self._conn.execute(core_raw.INSERT, conv.id, i + 1, _raw_payload(i))

    async def grow(self, conv: _RawConv, start: int, n: int) -> None:
        assert self._conn is not None
        await self._conn.executemany(
            core_raw.INSERT, [(conv.id, i + 1, _raw_payload(i)) for i in range(start, start + n)]
        )

    async def load(self, conv: _RawConv) -> int:
        assert self._conn is not None
        rows = await self._conn.fetch(core_raw.TAIL, conv.id, 0)
        return len([orjson.loads(r["payload"]) for r in rows])

    async def concurrent_setup(self, tasks: int) -> None:
        self._task_conns = [await asyncpg.connect(self._url) for _ in range(tasks)]

    def for_task(self, task: int) -> Store:
        view = Raw(self.label)
        view._conn = self._task_conns[task]
        return view


# ---- episodic ----------------------------------------------------------------------------


class Episodic(Store):
    key = "episodic"
    label = "episodic (this repo)"
    packages = ("episodic", "asyncpg", "SQLAlchemy")
    how = (
        "`store.append(conv, [message])` (one PL/pgSQL call); load = `store.load_context(conv)` "
        "(no boundary: the whole history); tool calls as `Message.assistant(tool_calls=...)` "
        "+ `Message.tool_result`. Behind a boundary (episodic only): `store.write_boundary(conv, "
        "summary=..., covers_through_seq=<last safe cut>, retained=[<last 2 user texts>], "
        'reason="context_pressure", expected_boundary_seq=None)`, then a tail appended; '
        "load = the same `store.load_context(conv)`, which reads the boundary and the tail only"
    )

    async def open(self, url: str) -> None:
        from episodic import EpisodicStore
        from episodic.settings import EpisodicSettings

        self._store = await EpisodicStore.open(url, settings=EpisodicSettings(_env_file=None))
        await self._store.migrate()

    async def close(self) -> None:
        await self._store.close()

    @staticmethod
    def message(i: int) -> Any:
        from episodic import Message, ToolCall

        k = kind(i)
        if k == "user":
            return Message.user(body(i))
        if k == "assistant":
            return Message.assistant(body(i))
        if k == "call":
            return Message.assistant(
                None, tool_calls=[ToolCall(id=call_id(i), name=TOOL, args=ARGS)]
            )
        return Message.tool_result(call_id(i), body(i), name=TOOL)

    async def conversation(self) -> uuid.UUID:
        return await self._store.create_conversation(tenant_id="bench")

    async def append(self, conv: uuid.UUID, i: int) -> None:
        await self._store.append(conv, [self.message(i)])

    async def grow(self, conv: uuid.UUID, start: int, n: int) -> None:
        for s in range(start, start + n, GROW_BATCH):
            await self._store.append(
                conv, [self.message(i) for i in range(s, min(s + GROW_BATCH, start + n))]
            )

    async def load(self, conv: uuid.UUID) -> int:
        return len((await self._store.load_context(conv)).messages)

    async def behind_boundary(self, size: int, tail: int) -> tuple[uuid.UUID, int]:
        """A new conversation of messages 0 .. ``size - 1`` (batch appends), a boundary
        through the last safe cut, then messages ``size`` .. ``size + tail - 1``; returns the
        conversation and the boundary's ``covers_through_seq``.

        The safe cut is the seq of the last message that is not a tool call (in this sequence a
        result always follows its call at once, so no call waits across the cut); the retained
        texts are the last two user messages before it, as a worker would keep them.
        """
        conv = await self.conversation()
        seqs: dict[int, int] = {}  # message index -> seq
        for s in range(0, size, GROW_BATCH):
            indices = range(s, min(s + GROW_BATCH, size))
            stored = await self._store.append(conv, [self.message(i) for i in indices])
            seqs.update(zip(indices, (e.seq for e in stored), strict=True))
        from episodic import BoundaryRequest

        cut = max(i for i in seqs if kind(i) != "call")
        users = [i for i in range(cut, -1, -1) if kind(i) == "user"][:2]
        await self._store.write_boundary(
            conv,
            BoundaryRequest(
                summary=BOUNDARY_SUMMARY,
                covers_through_seq=seqs[cut],
                retained=[body(i) for i in reversed(users)],
                reason="context_pressure",
                expected_boundary_seq=None,
            ),
        )
        await self.grow(conv, size, tail)
        return conv, seqs[cut]


# ---- OpenAI Agents SDK -------------------------------------------------------------------


def _openai_item(i: int) -> dict[str, Any]:
    k = kind(i)
    if k == "call":
        return {
            "type": "function_call",
            "call_id": call_id(i),
            "name": TOOL,
            "arguments": ARGS_JSON,
        }
    if k == "result":
        return {"type": "function_call_output", "call_id": call_id(i), "output": body(i)}
    return {"role": k, "content": body(i)}


class OpenAIAgents(Store):
    key = "openai_agents"
    label = "OpenAI Agents SDK SQLAlchemySession"
    packages = ("openai-agents", "SQLAlchemy", "asyncpg")
    how = (
        "`SQLAlchemySession(session_id, engine=...).add_items([item])` on an async engine "
        f"(postgresql+asyncpg, pool_size={POOL}); load = `get_items()`; tool calls as "
        "`function_call` + `function_call_output` items"
    )

    async def open(self, url: str) -> None:
        from agents.extensions.memory import SQLAlchemySession
        from sqlalchemy.ext.asyncio import create_async_engine

        self._cls = SQLAlchemySession
        self._engine = create_async_engine(_sqlalchemy_url(url), pool_size=POOL)
        first = SQLAlchemySession("bench-setup", engine=self._engine, create_tables=True)
        await first.get_items()  # creates the tables

    async def close(self) -> None:
        await self._engine.dispose()

    async def conversation(self) -> Any:
        return self._cls(str(uuid.uuid4()), engine=self._engine)

    async def append(self, conv: Any, i: int) -> None:
        await conv.add_items([_openai_item(i)])

    async def grow(self, conv: Any, start: int, n: int) -> None:
        for s in range(start, start + n, GROW_BATCH):
            await conv.add_items(
                [_openai_item(i) for i in range(s, min(s + GROW_BATCH, start + n))]
            )

    async def load(self, conv: Any) -> int:
        return len(await conv.get_items())


# ---- Google ADK --------------------------------------------------------------------------


@dataclass
class _AdkConv:
    session: Any


def adk_event(i: int, timestamp: float | None = None) -> Any:
    """Message ``i`` of the sequence as a Google ADK event (stamped now, unless given)."""
    from google.adk.events import Event
    from google.genai import types as t

    k = kind(i)
    if k == "user":
        author, role, part = "user", "user", t.Part(text=body(i))
    elif k == "assistant":
        author, role, part = "bench_agent", "model", t.Part(text=body(i))
    elif k == "call":
        author, role = "bench_agent", "model"
        part = t.Part(function_call=t.FunctionCall(id=call_id(i), name=TOOL, args=ARGS))
    else:
        author, role = "bench_agent", "user"
        part = t.Part(
            function_response=t.FunctionResponse(
                id=call_id(i), name=TOOL, response={"result": body(i)}
            )
        )
    stamp = {"timestamp": timestamp} if timestamp is not None else {}
    return Event(
        invocation_id=f"inv-{i // 2}",
        author=author,
        content=t.Content(role=role, parts=[part]),
        **stamp,
    )


class GoogleADK(Store):
    key = "adk"
    label = "Google ADK DatabaseSessionService"
    packages = ("google-adk", "google-genai", "SQLAlchemy", "asyncpg")
    how = (
        "`DatabaseSessionService(db_url=postgresql+asyncpg://..., "
        f"pool_size={POOL}).append_event(session, Event(...))`, one event per message (there "
        "is no batch append, so growing is one event at a time too); load = `get_session(...)`; "
        "tool calls as `function_call` / `function_response` parts"
    )

    APP = "bench"
    USER = "bench-user"

    async def open(self, url: str) -> None:
        from google.adk.sessions import DatabaseSessionService

        self._service = DatabaseSessionService(db_url=_sqlalchemy_url(url), pool_size=POOL)

    async def close(self) -> None:
        await self._service.close()

    def event(self, i: int) -> Any:
        return adk_event(i)

    async def conversation(self) -> _AdkConv:
        return _AdkConv(await self._service.create_session(app_name=self.APP, user_id=self.USER))

    async def append(self, conv: _AdkConv, i: int) -> None:
        await self._service.append_event(conv.session, self.event(i))

    async def grow(self, conv: _AdkConv, start: int, n: int) -> None:
        for i in range(start, start + n):
            await self._service.append_event(conv.session, self.event(i))

    async def load(self, conv: _AdkConv) -> int:
        session = await self._service.get_session(
            app_name=self.APP, user_id=self.USER, session_id=conv.session.id
        )
        assert session is not None
        return len(session.events)


# ---- LangGraph ---------------------------------------------------------------------------


@dataclass
class _Reply:
    """The graph's runtime context: the message its one node appends."""

    message: Any


class LangGraph(Store):
    key = "langgraph"
    label = "LangGraph AsyncPostgresSaver (MessagesState)"
    per_call = 2
    packages = (
        "langgraph",
        "langgraph-checkpoint",
        "langgraph-checkpoint-postgres",
        "langchain-core",
        "psycopg",
        "psycopg-pool",
    )
    how = (
        "a compiled `StateGraph(MessagesState)` with one node that appends a message, "
        "checkpointed by `AsyncPostgresSaver` on a psycopg `AsyncConnectionPool` "
        f"(max_size={POOL}); one `ainvoke` per turn pair: the input message plus the one the "
        "node appends (2 messages, counted as 2); load = `graph.aget_state(config)`; tool "
        "calls as `AIMessage(tool_calls=...)` + `ToolMessage`"
    )

    async def open(self, url: str) -> None:
        from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
        from langgraph.graph import END, START, MessagesState, StateGraph
        from langgraph.runtime import Runtime
        from psycopg.rows import dict_row
        from psycopg_pool import AsyncConnectionPool

        self._pool = AsyncConnectionPool(
            url,
            min_size=1,
            max_size=POOL,
            open=False,
            kwargs={"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row},
        )
        await self._pool.open(wait=True)
        saver = AsyncPostgresSaver(self._pool)  # type: ignore[arg-type]
        await saver.setup()

        def append(state: MessagesState, runtime: Runtime[_Reply]) -> dict[str, Any]:
            return {"messages": [runtime.context.message]}

        builder = StateGraph(MessagesState, context_schema=_Reply)
        builder.add_node("append", append)
        builder.add_edge(START, "append")
        builder.add_edge("append", END)
        self._graph: Any = builder.compile(checkpointer=saver)

    async def close(self) -> None:
        await self._pool.close()

    @staticmethod
    def message(i: int) -> Any:
        from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

        k = kind(i)
        if k == "user":
            return HumanMessage(content=body(i))
        if k == "assistant":
            return AIMessage(content=body(i))
        if k == "call":
            return AIMessage(
                content="", tool_calls=[{"id": call_id(i), "name": TOOL, "args": ARGS}]
            )
        return ToolMessage(content=body(i), tool_call_id=call_id(i), name=TOOL)

    async def conversation(self) -> dict[str, Any]:
        return {"configurable": {"thread_id": str(uuid.uuid4())}}

    async def append(self, conv: dict[str, Any], i: int) -> None:
        await self._graph.ainvoke(
            {"messages": [self.message(i)]}, conv, context=_Reply(self.message(i + 1))
        )

    async def grow(self, conv: dict[str, Any], start: int, n: int) -> None:
        end = start + n
        for s in range(start, end, GROW_BATCH):
            e = min(s + GROW_BATCH, end)
            await self._graph.ainvoke(
                {"messages": [self.message(i) for i in range(s, e - 1)]},
                conv,
                context=_Reply(self.message(e - 1)),
            )

    async def load(self, conv: dict[str, Any]) -> int:
        snapshot = await self._graph.aget_state(conv)
        return len(snapshot.values.get("messages", []))


def all_stores() -> list[Store]:
    return [Raw(), Episodic(), OpenAIAgents(), GoogleADK(), LangGraph()]
