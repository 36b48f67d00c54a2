"""A LangChain v1 agent middleware (``langchain`` 1.5): ``create_agent(model, tools,
middleware=[EpisodicMiddleware(store)])``, run with ``ainvoke`` (or ``astream``) on a
``thread_id``.

The conversation lives in the log, not in the graph's state. Before each model call the
run's messages not yet in the log (its input, the results of the tools the model called)
are appended, in one batch; then the model is sent the system prompt and
``load_context`` (:mod:`episodic.formats.langchain`): after the worker's boundary, the
handoff and the retained user messages, then every message after the cut, each tool
call followed by its results, never a result without its call. After the call, what the
model produced is appended with the call's usage (``AIMessage.usage_metadata``), which the
pressure trigger starts from. The system prompt is ``ModelRequest.system_message``, never
in the state's messages: it is sent with every call and never stored, so no summary ever
holds it. The middleware never summarizes; the worker compacts, off the request path.

Each message is stored once: its LangChain id is its ``client_id`` in the log (a retried
call sends the same batch again, which the store answers with the first result; a batch
part of which a failed run stored goes without that part), and the ids the run has stored
are kept in a private state key, so a checkpointer's older messages are never appended
again. A model output without an id is given one before it is stored, and a malformed tool
call (``invalid_tool_calls``) gets at once the error result LangChain would give it on the
next call, so no call is left waiting in the log. The state's messages stay the run's own
(and a checkpointer's): ``result["messages"]`` is what this run added. Put the middleware
first in the list, so any other middleware's ``wrap_model_call`` sees the loaded context.

The conversation: by default the run's ``thread_id`` (``config={"configurable":
{"thread_id": ...}}``), a session id; or ``conversation_id=``: a session id (any string), a
conversation's UUID (one made with ``create_conversation``), or a resolver called with the
run's ``Runtime`` that returns either. A session id names one conversation per tenant (a UUID
derived from the tenant and the id, :func:`session_conversation_id`), created by the first
write; a tenant-scoped store (``store.for_tenant``) scopes it.

Two runs on one conversation at once lose nothing and store nothing twice: each batch is
appended atomically and whole (a call's parallel results together, a model's output with its
structured-output result), each run's messages keep their order, and every request is
valid. Their batches may alternate in the log; a call of one run that waits for its tool is
sent to the other run's model with the synthetic error result ``load_context`` pairs it with.
``complete_runs=True`` marks each run's clean end (``mark_run_completed``), so the
unfinished-turns trigger counts only runs that never ended and a call a crashed run left
waiting no longer holds the cut back; leave it off when runs may overlap on a conversation,
since a completion closes every waiting call, another run's too, and refuses its result.

Async only, as the store is: ``invoke`` and ``stream`` raise
:class:`~episodic.errors.ConfigurationError` at the first model call, before anything is
stored.
"""

from __future__ import annotations

import inspect
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, NotRequired, TypeAlias, cast
from uuid import UUID

from langchain.agents.middleware import (
    AgentMiddleware,
    AgentState,
    ExtendedModelResponse,
    ModelRequest,
    ModelResponse,
)
from langchain.agents.middleware.types import PrivateStateAttr
from langchain_core.messages import (
    AIMessage,
    AnyMessage,
    BaseMessage,
    SystemMessage,
    ToolMessage,
    messages_from_dict,
    messages_to_dict,
)
from langgraph.config import get_config
from langgraph.runtime import Runtime
from langgraph.types import Command
from pydantic_core import to_jsonable_python

from episodic.errors import (
    ConfigurationError,
    ConversationDeletedError,
    IdempotencyMismatchError,
    NotFoundError,
    ValidationError,
)
from episodic.formats.langchain import (
    message_from_langchain,
    messages_to_langchain,
    usage_from_langchain,
)
from episodic.integrations.sessions import create_session_conversation, named_conversation_id
from episodic.models import Message, Usage
from episodic.store import DEFAULT_TENANT, EpisodicStore

#: The namespace of the conversation ids session ids map to (uuid5 of tenant and id).
SESSION_NAMESPACE = uuid.UUID("c493ee24-a35c-4b2e-9885-302e5895688b")
#: The private state key holding the ids of the state's messages that are in the log.
LOGGED_KEY = "episodic_logged"
#: What ``invoke`` and ``stream`` are told.
ASYNC_ONLY_MESSAGE = (
    "EpisodicMiddleware is async, as the store is: run the agent with ainvoke(), astream() "
    "or astream_events() (invoke() and stream() call this hook with no event loop to await "
    "the store on); nothing was stored"
)

ConversationRef: TypeAlias = UUID | str
#: Called with the run's ``Runtime`` (its ``context``, its ``execution_info.thread_id``)
#: at each model call and at the run's end; returns a session id or a conversation's UUID,
#: or an awaitable of one.
ConversationResolver: TypeAlias = Callable[
    [Runtime[Any]], ConversationRef | Awaitable[ConversationRef | None] | None
]


def session_conversation_id(session_id: str, tenant_id: str = DEFAULT_TENANT) -> UUID:
    """The conversation a session id (a thread id, say) names for a tenant: the same id,
    the same conversation, in every process."""
    return named_conversation_id(SESSION_NAMESPACE, session_id, tenant_id)


def thread_id_of(runtime: Runtime[Any]) -> str | None:
    """The run's ``thread_id``: from its execution info, else from its config (LangGraph
    leaves the former unset without a checkpointer); None when the run has none."""
    info = runtime.execution_info
    if info is not None and info.thread_id:
        return str(info.thread_id)
    try:
        configurable = get_config().get("configurable") or {}
    except RuntimeError:  # not inside a run
        return None
    thread = configurable.get("thread_id")
    return str(thread) if thread is not None and str(thread) else None


class EpisodicAgentState(AgentState[Any]):
    """The agent's state with the middleware's private record of what is in the log."""

    episodic_logged: NotRequired[Annotated[list[str], PrivateStateAttr]]


@dataclass(frozen=True, slots=True)
class _Target:
    """A run's conversation, and the session id it was derived from (None for a UUID
    given: a conversation that must exist, never created here)."""

    conversation_id: UUID
    session_id: str | None


class EpisodicMiddleware(AgentMiddleware[EpisodicAgentState, Any, Any]):
    """LangChain's ``AgentMiddleware`` on an episodic conversation (see the module's
    docstring)."""

    state_schema = EpisodicAgentState

    def __init__(
        self,
        store: EpisodicStore,
        conversation_id: ConversationRef | ConversationResolver | None = None,
        *,
        complete_runs: bool = False,
    ) -> None:
        super().__init__()
        if not isinstance(store, EpisodicStore):
            raise ValidationError(
                "EpisodicMiddleware takes an episodic.EpisodicStore", field="store"
            )
        if isinstance(conversation_id, str) and not conversation_id:
            raise ValidationError(
                "conversation_id is empty: give a session id, a conversation's UUID or a "
                "resolver, or leave it out to use the run's thread_id",
                field="conversation_id",
            )
        if not (conversation_id is None or isinstance(conversation_id, UUID | str)) and not (
            callable(conversation_id)
        ):
            raise ValidationError(
                "conversation_id must be a session id (str), a conversation's UUID, or a "
                "resolver called with the run's Runtime; got "
                f"{type(conversation_id).__name__}",
                field="conversation_id",
            )
        self.store = store
        self.conversation_id = conversation_id
        self.complete_runs = complete_runs
        self._tenant = store.tenant_id or DEFAULT_TENANT

    # ---- the hooks ------------------------------------------------------------------------

    def wrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], ModelResponse[Any]],
    ) -> ModelResponse[Any] | AIMessage | ExtendedModelResponse[Any]:
        raise ConfigurationError(ASYNC_ONLY_MESSAGE)

    async def awrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], Awaitable[ModelResponse[Any]]],
    ) -> ModelResponse[Any] | AIMessage | ExtendedModelResponse[Any]:
        """Append the run's new messages, send the model the loaded context, append what it
        produced with its usage."""
        target = await self._target(request.runtime)
        state = request.state["messages"]
        logged = set(_logged(request.state))
        new = _unlogged(state, logged)
        await self._append(target, new)
        logged.update(_ids(new))
        context = await self._context(target)
        # System messages in the state are the agent's instructions, like the system prompt:
        # sent first, never stored.
        system = [m for m in state if isinstance(m, SystemMessage)]
        response = await handler(request.override(messages=[*system, *context]))
        output = _answered(_with_ids(response.result))
        await self._append(target, output, usage=_usage(output))
        kept = [m.id for m in state if m.id in logged] + [m.id for m in output]
        return ExtendedModelResponse(
            model_response=ModelResponse(
                result=output, structured_response=response.structured_response
            ),
            command=Command(update={LOGGED_KEY: kept}),
        )

    def after_agent(
        self, state: EpisodicAgentState, runtime: Runtime[Any]
    ) -> dict[str, Any] | None:
        raise ConfigurationError(ASYNC_ONLY_MESSAGE)

    async def aafter_agent(
        self, state: EpisodicAgentState, runtime: Runtime[Any]
    ) -> dict[str, Any] | None:
        """Append what the run added after its last model call (a ``return_direct`` tool's
        result, another middleware's message), and mark the run's clean end if asked."""
        target = await self._target(runtime)
        messages = state["messages"]
        logged = set(_logged(state))
        new = _unlogged(messages, logged)
        await self._append(target, new)
        if self.complete_runs:
            try:
                await self.store.mark_run_completed(target.conversation_id)
            except ConversationDeletedError:
                raise
            except NotFoundError:
                pass  # a run that stored nothing (a new session with no message) ended
        if not new:
            return None
        logged.update(_ids(new))
        return {LOGGED_KEY: [m.id for m in messages if m.id in logged]}

    # ---- the conversation -----------------------------------------------------------------

    async def _target(self, runtime: Runtime[Any]) -> _Target:
        given = self.conversation_id
        if given is None:
            name = thread_id_of(runtime)
            if name is None:
                raise ValidationError(
                    "EpisodicMiddleware found no thread_id for this run: run the agent with "
                    "config={'configurable': {'thread_id': ...}}, or pass conversation_id= "
                    "(a session id, a conversation's UUID, or a resolver)",
                    field="thread_id",
                )
            return self._session(name)
        if isinstance(given, UUID):
            return _Target(given, None)
        if isinstance(given, str):
            return self._session(given)
        resolved = given(runtime)
        if inspect.isawaitable(resolved):
            resolved = await resolved
        if isinstance(resolved, UUID):
            return _Target(resolved, None)
        if not isinstance(resolved, str) or not resolved:
            raise ValidationError(
                f"the conversation resolver {_name_of(given)} returned {resolved!r:.80} for "
                "this run: it must return a session id (a non-empty str, e.g. the run's "
                "thread_id, thread_id_of(runtime)) or a conversation's UUID",
                field="conversation_id",
            )
        return self._session(resolved)

    def _session(self, session_id: str) -> _Target:
        return _Target(session_conversation_id(session_id, self._tenant), session_id)

    async def _context(self, target: _Target) -> list[AnyMessage]:
        """``load_context`` as LangChain messages; none for a session never written."""
        try:
            context = await self.store.load_context(target.conversation_id)
        except ConversationDeletedError:
            raise
        except NotFoundError:
            if target.session_id is None:
                raise
            return []
        return cast("list[AnyMessage]", messages_from_dict(messages_to_langchain(context.messages)))

    async def _append(
        self, target: _Target, messages: Sequence[BaseMessage], *, usage: Usage | None = None
    ) -> None:
        """Store the messages, in order, in one append (a session's conversation is created
        by its first)."""
        if not messages:
            return
        batch = [_message_of(m) for m in messages]
        try:
            await self._append_once(target.conversation_id, batch, usage)
        except ConversationDeletedError:
            raise
        except NotFoundError:
            if target.session_id is None:
                raise
            await self._create(target.conversation_id, target.session_id)
            await self._append_once(target.conversation_id, batch, usage)

    async def _append_once(
        self, conversation_id: UUID, batch: list[Message], usage: Usage | None
    ) -> None:
        """Append the batch; the same batch again is the same append (keyed by its first
        client id). A batch some of whose messages are stored already is what a run that
        failed after an append and before recording it leaves (a checkpointer's state sent
        again with new input): those are left out, found in the context, where a run's own
        messages are (the worker never cuts into a run in progress)."""
        try:
            await self.store.append(conversation_id, batch, usage=usage)
        except IdempotencyMismatchError:
            context = await self.store.load_context(conversation_id)
            stored = {m.client_id for m in context.messages if m.client_id is not None}
            rest = [m for m in batch if m.client_id not in stored]
            if len(rest) == len(batch):
                raise
            if rest:
                await self.store.append(conversation_id, rest, usage=usage)

    async def _create(self, conversation_id: UUID, session_id: str) -> None:
        await create_session_conversation(
            self.store, conversation_id, metadata={"langchain_session_id": session_id}
        )


# ---- messages -------------------------------------------------------------------------


def _logged(state: AgentState[Any] | EpisodicAgentState) -> list[str]:
    logged = cast("dict[str, Any]", state).get(LOGGED_KEY)
    return [i for i in logged if isinstance(i, str)] if isinstance(logged, list) else []


def _unlogged(messages: Sequence[BaseMessage], logged: set[str]) -> list[BaseMessage]:
    """The state's messages not in the log yet, in order (system messages are never
    stored)."""
    return [m for m in messages if m.id not in logged and not isinstance(m, SystemMessage)]


def _ids(messages: Sequence[BaseMessage]) -> list[str]:
    return [m.id for m in messages if m.id is not None]


def _with_ids(messages: Sequence[BaseMessage]) -> list[BaseMessage]:
    """The model's output, each message with an id: the one it has, else a new one, so the
    message in the state is the one in the log (the state's reducer would give it another)."""
    return [m if m.id else m.model_copy(update={"id": str(uuid.uuid4())}) for m in messages]


def _answered(output: list[BaseMessage]) -> list[BaseMessage]:
    """The output, with the error result LangChain gives each malformed tool call of it
    (on the next model call, or never if the run ends first) added at once, so the log
    never holds such a call waiting; LangChain, finding it answered, adds none."""
    answered = {m.tool_call_id for m in output if isinstance(m, ToolMessage)}
    out: list[BaseMessage] = []
    for message in output:
        out.append(message)
        if not isinstance(message, AIMessage):
            continue
        for call in message.invalid_tool_calls:
            call_id = call.get("id")
            if call_id is None or call_id in answered:
                continue
            name = call.get("name") or "unknown"
            out.append(
                ToolMessage(
                    content=(
                        f"Tool call {name} with id {call_id} could not be executed - "
                        "arguments were malformed or truncated."
                    ),
                    name=name,
                    tool_call_id=call_id,
                    status="error",
                    id=str(uuid.uuid4()),
                )
            )
            answered.add(call_id)
    return out


def _usage(output: Sequence[BaseMessage]) -> Usage | None:
    """The call's usage: what its AI messages reported (one, as a rule), None if none did."""
    total: Usage | None = None
    for message in output:
        if isinstance(message, AIMessage):
            usage = usage_from_langchain(cast("Any", message.usage_metadata))
            if usage is not None:
                total = usage if total is None else total + usage
    return total


def _message_of(message: BaseMessage) -> Message:
    """The log's message for a LangChain message, its dict kept whole (made JSON: bytes as
    base64, an object JSON has no form for as its repr) and its id as the client id."""
    data = to_jsonable_python(messages_to_dict([message])[0], bytes_mode="base64", fallback=repr)
    return message_from_langchain(data, client_id=message.id)


def _name_of(resolver: Callable[..., Any]) -> str:
    return getattr(resolver, "__qualname__", None) or type(resolver).__name__


__all__ = [
    "ASYNC_ONLY_MESSAGE",
    "LOGGED_KEY",
    "SESSION_NAMESPACE",
    "ConversationRef",
    "ConversationResolver",
    "EpisodicAgentState",
    "EpisodicMiddleware",
    "session_conversation_id",
    "thread_id_of",
]
