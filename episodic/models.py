"""The things episodic stores and returns: messages, tool calls, usage and log events.

Frozen pydantic v2 models, no I/O. A :class:`Message` is provider-neutral; it converts
to and from OpenAI chat-completions dicts and Responses-API items without losing what they
carried (what this model has no field for is kept in ``native`` and given back). The
conversions live in :mod:`episodic.formats`; the methods here delegate to them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Annotated, Any, Literal, Self, TypeAlias, TypeVar, get_args
from uuid import UUID

import orjson
from pydantic import BaseModel, ConfigDict, Field, JsonValue, model_validator
from pydantic import ValidationError as PydanticValidationError

from episodic.errors import ValidationError

Role: TypeAlias = Literal["user", "assistant", "tool", "system"]
ROLES: tuple[Role, ...] = ("user", "assistant", "tool", "system")

#: The ``native.protocol`` under which ``from_openai`` keeps keys it has no field for.
OPENAI_CHAT_PROTOCOL = "openai.chat"
#: The ``native.protocol`` under which ``from_responses_item`` keeps the whole item.
OPENAI_RESPONSES_PROTOCOL = "openai.responses"
#: chat-completions' newer name for the system role: read as ``system``, given back as is.
DEVELOPER_ROLE = "developer"

_FROZEN = ConfigDict(frozen=True, extra="forbid")

#: How many of pydantic's problems a refusal's message spells out; ``errors()`` has them all.
_PROBLEMS_SHOWN = 3


class EpisodicModel(BaseModel):
    """The base of episodic's models: building one from invalid data (the constructor,
    ``model_validate``, ``model_validate_json``, ``model_validate_strings``) raises
    :class:`episodic.errors.ValidationError`, never pydantic's own ``ValidationError``.
    Its message is one line; its :meth:`~episodic.errors.ValidationError.errors` are
    pydantic's details, one dict per problem.

    NaN and infinity are refused wherever a float can go (tool-call ``args``, ``metadata``,
    ``native`` data, raw blocks): JSON has neither, and the encoder would store them as null.
    """

    model_config = ConfigDict(allow_inf_nan=False)

    def __init__(self, /, **data: Any) -> None:
        # BaseModel.__init__ is this same call (plus a warning for a model validator that
        # returns another object, which episodic's never do): no extra frame on the hot path.
        try:
            self.__pydantic_validator__.validate_python(data, self_instance=self)
        except PydanticValidationError as exc:
            raise _refusal(type(self), exc) from None

    # Tells pydantic this is not a custom __init__, so validating a nested model (or
    # model_validate) fills the fields directly instead of calling it: same as BaseModel's.
    # (Through the function's __dict__: mypy knows no such attribute on a function.)
    __init__.__dict__["__pydantic_base_init__"] = True

    @classmethod
    def model_validate(
        cls,
        obj: Any,
        *,
        strict: bool | None = None,
        from_attributes: bool | None = None,
        context: Any | None = None,
        **options: Any,
    ) -> Self:
        try:
            if not options:
                # What BaseModel.model_validate does with these options, one frame less: this
                # is on the hot path of append (prepare_batch) and of every event read back.
                validated: Self = cls.__pydantic_validator__.validate_python(
                    obj, strict=strict, from_attributes=from_attributes, context=context
                )
                return validated
            return super().model_validate(
                obj, strict=strict, from_attributes=from_attributes, context=context, **options
            )
        except PydanticValidationError as exc:
            raise _refusal(cls, exc) from None

    @classmethod
    def model_validate_json(cls, json_data: str | bytes | bytearray, **options: Any) -> Self:
        try:
            return super().model_validate_json(json_data, **options)
        except PydanticValidationError as exc:
            raise _refusal(cls, exc) from None

    @classmethod
    def model_validate_strings(cls, obj: Any, **options: Any) -> Self:
        try:
            return super().model_validate_strings(obj, **options)
        except PydanticValidationError as exc:
            raise _refusal(cls, exc) from None


def _refusal(model: type[BaseModel], exc: PydanticValidationError) -> ValidationError:
    """Pydantic's refusal as episodic's: ``invalid Message: content: ... (1 problem)``."""
    problems = exc.errors(include_url=False)
    count = len(problems)
    said = "; ".join(_problem_text(problem) for problem in problems[:_PROBLEMS_SHOWN])
    if count > _PROBLEMS_SHOWN:
        said += f"; and {count - _PROBLEMS_SHOWN} more"
    noun = "problem" if count == 1 else "problems"
    fields = {problem["loc"][0] if problem["loc"] else None for problem in problems}
    field = fields.pop() if len(fields) == 1 else None
    return ValidationError(
        f"invalid {model.__name__}: {said} ({count} {noun})",
        field=field if isinstance(field, str) else None,
        details=problems,
    )


def _problem_text(problem: Mapping[str, Any]) -> str:
    """One problem as ``path: what is wrong``; a validator's own words without pydantic's
    ``Value error, `` prefix."""
    loc = problem["loc"]
    if problem["type"] == "finite_number":
        path = _location_text(_json_value_location(loc))
        value = problem.get("input")
        what = "NaN" if isinstance(value, float) and math.isnan(value) else "infinite"
        return f"{path} is {what}; JSON has no NaN or infinity"
    message = str(problem["msg"])
    error = (problem.get("ctx") or {}).get("error")
    if problem["type"] == "value_error" and error is not None:
        message = str(error)
    message = " ".join(message.split())[:200]  # one line, and short
    path = _location_text(loc)
    return f"{path}: {message}" if path else message


def _json_value_location(loc: Sequence[str | int]) -> list[str | int]:
    """The location of a float inside a ``JsonValue`` without the union's tags: pydantic
    says ``metadata.a.list[1].dict.b.float`` for ``metadata["a"][1]["b"]``. From the end,
    each key is preceded by the tag ``dict`` and each index by ``list``, down to the field."""
    parts = list(loc)
    if parts and parts[-1] == "float":
        parts.pop()
    i = len(parts) - 1
    while i >= 2 and parts[i - 1] == ("list" if isinstance(parts[i], int) else "dict"):
        del parts[i - 1]
        i -= 2
    return parts


#: A location longer than this is shortened in the message (nesting 1,000 levels deep says
#: ``metadata.d.dict.k.dict.k...``); ``errors()`` keeps the whole ``loc``.
_MAX_PATH_TEXT = 120


def _location_text(loc: Iterable[str | int]) -> str:
    """A location as a path: ``tool_calls[0].args.x``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif out and not part.startswith("["):  # pydantic's "[key]": the key was refused
            out += f".{part}"
        else:
            out += part
    if len(out) > _MAX_PATH_TEXT:
        half = _MAX_PATH_TEXT // 2
        out = f"{out[:half]}...{out[-half:]}"
    return out


_set = object.__setattr__
M = TypeVar("M", bound=BaseModel)
#: Per model class, the set of its field names: every instance construct_valid makes shares it
#: (one allocation fewer per object; frozen models never add to it, and model_copy copies it).
_ALL_FIELDS: dict[type[BaseModel], set[str]] = {}


def plain_defaults(cls: type[BaseModel]) -> dict[str, Any]:
    """The fields of ``cls`` that have a default value (not a factory), at that value: where
    a trusted construction starts from, for the fields a stored payload leaves out. Fields
    with a factory (``metadata``, ``pressure``) need a new value per instance."""
    return {
        name: field.default
        for name, field in cls.model_fields.items()
        if not field.is_required() and field.default_factory is None
    }


def construct_valid(cls: type[M], values: dict[str, Any]) -> M:
    """An instance of ``cls`` (a frozen model) from ``values`` already known valid: every
    field, as validation would leave it. What pydantic's ``model_construct`` does, without its
    per-field loop, which makes it slower than validating. For rows read back from the log,
    which holds only what validation accepted, and for values built from valid instances."""
    fields = _ALL_FIELDS.get(cls)
    if fields is None:
        fields = _ALL_FIELDS[cls] = set(cls.model_fields)
    instance = cls.__new__(cls)
    _set(instance, "__dict__", values)
    _set(instance, "__pydantic_fields_set__", fields)
    _set(instance, "__pydantic_extra__", None)
    _set(instance, "__pydantic_private__", None)
    return instance


class TextBlock(EpisodicModel):
    """A run of text inside block content."""

    model_config = _FROZEN
    type: Literal["text"] = "text"
    text: str


class ImageBlock(EpisodicModel):
    """An image, by URL (``data:`` URLs included). ``alt`` is what a summarizer sees."""

    model_config = _FROZEN
    type: Literal["image"] = "image"
    url: str
    detail: str | None = None
    alt: str | None = None


class RawBlock(EpisodicModel):
    """A provider block episodic has no model for (audio, files...), kept verbatim."""

    model_config = _FROZEN
    type: Literal["raw"] = "raw"
    data: dict[str, JsonValue]


ContentBlock = Annotated[TextBlock | ImageBlock | RawBlock, Field(discriminator="type")]
Content: TypeAlias = str | tuple[ContentBlock, ...]


class ToolCall(EpisodicModel):
    """A call the assistant asked a tool to make.

    ``arguments_json`` keeps the provider's exact argument string when it is not simply the
    JSON of ``args`` (models do emit invalid JSON); conversions give it back unchanged.
    """

    model_config = _FROZEN
    id: Annotated[str, Field(min_length=1, max_length=512)]
    name: Annotated[str, Field(min_length=1, max_length=512)]
    args: dict[str, JsonValue] = Field(default_factory=dict)
    arguments_json: str | None = None

    def arguments_text(self) -> str:
        """The arguments as the provider's JSON string."""
        if self.arguments_json is not None:
            return self.arguments_json
        return orjson.dumps(self.args).decode()


#: The most tokens one count may hold: far beyond any model call, and low enough that the
#: head's sums of counts stay inside a signed 64-bit integer (PostgreSQL's bigint) and exact
#: as a JSON number (below 2**53).
MAX_TOKEN_COUNT = 10**15

TokenCount: TypeAlias = Annotated[int, Field(ge=0, le=MAX_TOKEN_COUNT)]


class Usage(EpisodicModel):
    """Token usage a provider reported for one model call; each count is at most
    :data:`MAX_TOKEN_COUNT`."""

    model_config = _FROZEN
    input_tokens: TokenCount = 0
    output_tokens: TokenCount = 0
    cache_read_tokens: TokenCount = 0
    reasoning_tokens: TokenCount = 0

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
            cache_read_tokens=self.cache_read_tokens + other.cache_read_tokens,
            reasoning_tokens=self.reasoning_tokens + other.reasoning_tokens,
        )


class NativePayload(EpisodicModel):
    """The provider's own representation of a message, tagged with its protocol. Opaque or
    signed reasoning payloads live here and are never rendered for a summarizer."""

    model_config = _FROZEN
    protocol: Annotated[str, Field(min_length=1)]
    data: dict[str, JsonValue]


class Message(EpisodicModel):
    """One conversation message.

    Roles: ``user``, ``assistant`` (text and/or tool calls), ``tool`` (the result of one
    call, ``tool_call_id`` required) and ``system``. A system message appended to a
    conversation is kept in the log (``read_events`` and ``episodic show`` have it) but never
    loaded: ``load_context`` leaves it out, since the agent owns its system prompt, and its
    token estimate is 0, so it adds nothing to the context's pressure. ``reasoning`` is
    readable private reasoning; ``client_id`` is the caller's own id for the message, unique
    within a conversation, so a retried append cannot store it twice. ``seq``,
    ``created_at`` and ``token_estimate`` are set on messages that come back from the store.
    ``pinned`` (user messages only) makes the message a standing instruction: every later
    handoff the worker writes carries its text word for word, until
    :meth:`EpisodicStore.unpin` is called with its seq.

    Invalid fields raise :class:`episodic.errors.ValidationError` (a ``ValueError``).
    """

    model_config = _FROZEN

    role: Role
    content: Content | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: Annotated[str, Field(min_length=1, max_length=512)] | None = None
    name: str | None = None
    is_error: bool = False
    reasoning: str | None = None
    native: NativePayload | None = None
    metadata: dict[str, JsonValue] = Field(default_factory=dict)
    client_id: Annotated[str, Field(min_length=1, max_length=512)] | None = None
    pinned: bool = False

    seq: int | None = None
    created_at: datetime | None = None
    token_estimate: int | None = None

    @model_validator(mode="after")
    def _check_shape(self) -> Self:
        role = self.role
        if role != "assistant" and self.tool_calls:
            raise ValueError(f"only assistant messages carry tool_calls, not {role}")
        if role == "tool":
            if self.tool_call_id is None:
                raise ValueError("a tool result needs the tool_call_id of the call it answers")
            if self.content is None:
                raise ValueError("a tool result needs content (use '' for an empty result)")
        elif self.tool_call_id is not None:
            raise ValueError(f"only tool results carry tool_call_id, not {role}")
        elif self.is_error:
            raise ValueError("only tool results can be marked is_error")
        if self.pinned and role != "user":
            raise ValueError(f"only user messages can be pinned as instructions, not {role}")
        if role in ("user", "system") and self.content is None:
            raise ValueError(f"a {role} message needs content")
        if role == "system" and not isinstance(self.content, str):
            raise ValueError("a system message's content must be a string")
        ids = [call.id for call in self.tool_calls]
        if len(set(ids)) != len(ids):
            raise ValueError("tool call ids within one assistant message must be unique")
        return self

    # ---- constructors -------------------------------------------------------------------

    @classmethod
    def user(cls, content: Content, **fields: Any) -> Message:
        return cls(role="user", content=content, **fields)

    @classmethod
    def assistant(
        cls, content: Content | None = None, *, tool_calls: Iterable[ToolCall] = (), **fields: Any
    ) -> Message:
        return cls(role="assistant", content=content, tool_calls=tuple(tool_calls), **fields)

    @classmethod
    def tool_result(
        cls,
        tool_call_id: str,
        content: Content,
        *,
        name: str | None = None,
        is_error: bool = False,
        **fields: Any,
    ) -> Message:
        return cls(
            role="tool",
            tool_call_id=tool_call_id,
            content=content,
            name=name,
            is_error=is_error,
            **fields,
        )

    @classmethod
    def system(cls, content: str, **fields: Any) -> Message:
        """A system message. Appended, it is kept in the log and shown, but never loaded:
        ``load_context`` leaves it out (send your system prompt with each request) and it
        counts 0 tokens towards the context."""
        return cls(role="system", content=content, **fields)

    # ---- views --------------------------------------------------------------------------

    @property
    def text(self) -> str:
        """The content as plain text: blocks joined by newlines, images as their alt text (or
        ``[image]``), other blocks as their type in brackets."""
        content = self.content
        if content is None:
            return ""
        if isinstance(content, str):
            return content
        parts: list[str] = []
        for block in content:
            if isinstance(block, TextBlock):
                parts.append(block.text)
            elif isinstance(block, ImageBlock):
                parts.append(block.alt or "[image]")
            else:
                parts.append(f"[{block.data.get('type', 'attachment')}]")
        return "\n".join(parts)

    def stored_fields(self, *, mode: Literal["json", "python"] = "json") -> dict[str, Any]:
        """The fields that go into the log, without defaults and without what the store sets.

        ``mode="python"`` keeps tuples, and dict keys exactly as given: JSON mode turns a
        lone surrogate in a key into U+FFFD, so the store encodes the Python form, where such
        a key is refused instead of stored altered.
        """
        # Not exclude_defaults: it would also drop each content block's ``type``, the tag
        # that tells the block kinds apart when the payload is read back. No serializer
        # warnings: a field of the wrong type (built with model_construct) is for validation
        # to refuse, and warnings="error" would double the dump's cost.
        dumped = self.model_dump(
            mode=mode,
            exclude_none=True,
            exclude={"seq", "created_at", "token_estimate"},
            warnings=False,
        )
        for key in LEFT_OUT_WHEN_EMPTY:
            if key in dumped and not dumped[key]:
                del dumped[key]
        return dumped

    def as_stored(self, *, seq: int, created_at: datetime, token_estimate: int) -> Message:
        return self.model_copy(
            update={"seq": seq, "created_at": created_at, "token_estimate": token_estimate}
        )

    # ---- provider formats (episodic.formats holds the conversions) ----------------------

    def to_openai(self, *, include_reasoning: bool = False) -> dict[str, Any]:
        """This message as an OpenAI chat-completions message dict.

        Fields chat-completions has no place for (``metadata``, ``client_id``, ``is_error``)
        are left out; keys kept from ``from_openai`` are given back. ``include_reasoning``
        sends ``reasoning`` as ``reasoning_content`` (DeepSeek, vLLM); OpenAI refuses it.
        """
        # Imported here: the formats import this module, so it cannot import them first.
        from episodic.formats.openai_chat import message_to_openai

        return message_to_openai(self, include_reasoning=include_reasoning)

    @classmethod
    def from_openai(cls, data: Mapping[str, Any], *, tool_name: str | None = None) -> Message:
        """Build a message from an OpenAI chat-completions message dict.

        A tool message does not carry its tool's name in chat-completions; pass ``tool_name``
        or use :func:`messages_from_openai`, which finds it from the matching call. Anything
        that is not a valid message raises :class:`~episodic.errors.ValidationError`.
        """
        from episodic.formats.openai_chat import message_from_openai

        return message_from_openai(data, tool_name=tool_name)

    def to_responses(self) -> list[dict[str, Any]]:
        """This message as OpenAI Responses-API input items: a ``message`` item, then one
        ``function_call`` item per tool call; a tool result is a ``function_call_output``.

        A message built by :meth:`from_responses_item` gives back its original item, exactly,
        for as long as its fields still say what that item said. Readable ``reasoning`` is
        not sent (a reasoning item the API did not issue is refused); ``metadata``,
        ``client_id`` and ``is_error`` have no place in the format.
        """
        from episodic.formats.responses import message_to_responses

        return message_to_responses(self)

    @classmethod
    def from_responses_item(cls, item: Mapping[str, Any]) -> Message:
        """Build a message from one OpenAI Responses-API item (input or output).

        ``message`` items keep their role (``developer`` reads as ``system``);
        ``function_call`` is an assistant message with that one call; ``function_call_output``
        is its tool result; ``reasoning`` is an assistant message whose ``reasoning`` is the
        item's summary text. Any other item (web search, computer and MCP calls, references,
        types yet to come) is kept as an assistant message whose text is the item's type and
        compact JSON, so a summarizer can read it. The item itself is kept in ``native``, and
        :meth:`to_responses` gives it back. What is not an item raises
        :class:`~episodic.errors.ValidationError`.
        """
        from episodic.formats.responses import message_from_responses_item

        return message_from_responses_item(item)


#: Message fields a payload leaves out at their default. Empty content stays: without it a
#: user message would read back as one with no content, which is not valid.
LEFT_OUT_WHEN_EMPTY = ("tool_calls", "is_error", "metadata", "pinned")


# ---- the log ----------------------------------------------------------------------------

EventKind: TypeAlias = Literal[
    "message",
    "boundary",
    "run_completed",
    "retraction",
    "clear",
    "usage",
    "state",
    "deletion",
    "unpin",
]
#: Every kind of event, in the order above: the one list the log's CHECK constraint, the
#: export format and the loaders derive theirs from (schema.sql's CHECK is compared with it).
EVENT_KINDS: tuple[EventKind, ...] = get_args(EventKind)
#: The kinds that carry what the model sees: a message, or a boundary's handoff.
CONTEXT_KINDS: frozenset[EventKind] = frozenset({"message", "boundary"})
RetentionMode: TypeAlias = Literal["recent_user_messages", "recent_turns"]


class _EventBase(EpisodicModel):
    model_config = _FROZEN
    conversation_id: UUID
    seq: int
    created_at: datetime
    token_estimate: int


class MessageEvent(_EventBase):
    """A message in the log."""

    kind: Literal["message"] = "message"
    message: Message
    #: the provider usage passed with the batch this message begins (first message only)
    usage: Usage | None = None


class RunCompletedEvent(_EventBase):
    """A clean end of an agent run. Tool calls still open then are closed as abandoned: the
    safe cut ignores them and loading pairs each with a synthetic error result."""

    kind: Literal["run_completed"] = "run_completed"
    abandoned_tool_call_ids: tuple[str, ...] = ()


class BoundaryEvent(_EventBase):
    """A summary boundary: from here on, the context is the handoff, the retained user
    messages, and every message after ``covers_through_seq``."""

    kind: Literal["boundary"] = "boundary"
    summary: str
    covers_through_seq: int
    retained: tuple[str, ...] = ()
    #: the estimate of each retained message; ``token_estimate`` covers them and the handoff
    retained_token_estimates: tuple[int, ...] = ()
    retention: RetentionMode = "recent_user_messages"
    reason: str
    pressure: dict[str, JsonValue] = Field(default_factory=dict)
    usage: Usage | None = None
    model: str | None = None
    prompt_version: str | None = None
    tokens_before: int | None = None
    tokens_after: int | None = None
    #: A framework's own compaction, kept as it gave it (OpenAI's ``responses.compact`` run
    #: by the Agents SDK's ``OpenAIResponsesCompactionSession``): when set, the context
    #: starts with these Responses-API items, in place of ``summary`` (then their rendering
    #: for people) and ``retained``.
    handoff_items: tuple[dict[str, JsonValue], ...] | None = None
    #: the estimate of each of ``handoff_items``; ``token_estimate`` is their sum
    handoff_token_estimates: tuple[int, ...] = ()
    #: A framework's own record of what the boundary stands for, kept as given for its
    #: integration (Google ADK: the compaction events its sessions show in the cut's place)
    native_handoff: dict[str, JsonValue] | None = None
    #: What the worker's next compaction builds on (``episodic.compaction.HandoffState``):
    #: the handoff's notes and the record of what the tools did, folded through the cut
    handoff_state: dict[str, JsonValue] | None = None


class RetractionEvent(_EventBase):
    """The message at ``retracted_seq`` taken back (the newest one in view, when it was
    appended): it stays in the log, and leaves the context, the counters and every later
    boundary's transcript. What an agent framework's "pop the last item" becomes on a log
    that is never rewritten."""

    kind: Literal["retraction"] = "retraction"
    retracted_seq: int


class ClearEvent(_EventBase):
    """The view emptied: from here on, the context is only what comes after this event. The
    log keeps everything before it (erasing it is another operation)."""

    kind: Literal["clear"] = "clear"


class UsageEvent(_EventBase):
    """A provider's usage report that came after the messages it is about (an agent
    framework reports a turn's usage once the turn is saved): from here on the pressure
    signal starts from its ``input_tokens``, as it would from a usage passed with an
    append."""

    kind: Literal["usage"] = "usage"
    usage: Usage


class UnpinEvent(_EventBase):
    """The pinned user message at ``unpinned_seq`` no longer a standing instruction: handoffs
    written after this event stop carrying it (the message itself stays where it is)."""

    kind: Literal["unpin"] = "unpin"
    unpinned_seq: int


class StateChange(EpisodicModel):
    """What a write changes in the state kept beside the log (an agent framework's session
    state): each key given replaces the stored value, whatever it was (a dict is not merged
    into a dict), and a ``None`` is stored, not a deletion.

    ``conversation`` is the conversation's own state; ``shared`` maps a scope name (any
    string: Google ADK's app and user scopes, say) to the keys it changes in that scope,
    which every conversation of the tenant may read (:meth:`EpisodicStore.read_state`).
    Both are projections of the log: the change is appended as a :class:`StateEvent` in the
    same transaction that applies it."""

    model_config = _FROZEN
    conversation: dict[str, JsonValue] = Field(default_factory=dict)
    shared: dict[str, dict[str, JsonValue]] = Field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.conversation) or any(self.shared.values())


class StateEvent(_EventBase):
    """A state change (:class:`StateChange`), after the messages appended with it."""

    kind: Literal["state"] = "state"
    change: StateChange


class DeletionEvent(_EventBase):
    """The conversation deleted: it is hidden (not listed, not loaded, closed to writes)
    and its log kept, for an audit or an erasure."""

    kind: Literal["deletion"] = "deletion"


StoredEvent = Annotated[
    MessageEvent
    | RunCompletedEvent
    | BoundaryEvent
    | RetractionEvent
    | ClearEvent
    | UsageEvent
    | StateEvent
    | DeletionEvent
    | UnpinEvent,
    Field(discriminator="kind"),
]


class Conversation(EpisodicModel):
    """A conversation's head: who owns it and the counters that keep requests O(1)."""

    model_config = _FROZEN
    conversation_id: UUID
    tenant_id: str
    created_at: datetime
    metadata: dict[str, JsonValue]
    last_seq: int
    boundary_seq: int | None
    covers_through_seq: int
    total_user_messages: int
    user_messages_since_boundary: int
    run_completed_since_boundary: int
    user_messages_since_run_completed: int
    context_tokens: int
    usage_input_tokens: int | None
    tokens_since_usage: int
    open_tool_calls: dict[str, int]
    boundary_at: datetime | None = None
    #: compaction state: due since when and why, the worker's lease, failures so far
    due_since: datetime | None = None
    due_reason: str | None = None
    lease_owner: str | None = None
    lease_expires_at: datetime | None = None
    compaction_attempts: int = 0
    next_attempt_at: datetime | None = None
    last_error: str | None = None
    dead_since: datetime | None = None
    #: who the conversation is listed under (:meth:`EpisodicStore.list_by_user`): an app
    #: and a user of it, given at creation
    app_name: str | None = None
    user_id: str | None = None
    #: the caller's time of its latest write, in seconds since the epoch (an agent
    #: framework's event timestamp, kept exact); None until one is given
    touched_at: float | None = None
    #: when it was deleted (:meth:`EpisodicStore.delete_conversation`)
    deleted_at: datetime | None = None
    #: its own state (:class:`StateChange`), as of this read
    state: dict[str, JsonValue] = Field(default_factory=dict)


__all__ = [
    "CONTEXT_KINDS",
    "DEVELOPER_ROLE",
    "EVENT_KINDS",
    "LEFT_OUT_WHEN_EMPTY",
    "MAX_TOKEN_COUNT",
    "OPENAI_CHAT_PROTOCOL",
    "OPENAI_RESPONSES_PROTOCOL",
    "ROLES",
    "BoundaryEvent",
    "ClearEvent",
    "Content",
    "ContentBlock",
    "Conversation",
    "DeletionEvent",
    "EpisodicModel",
    "EventKind",
    "ImageBlock",
    "Message",
    "MessageEvent",
    "NativePayload",
    "RawBlock",
    "RetentionMode",
    "RetractionEvent",
    "Role",
    "RunCompletedEvent",
    "StateChange",
    "StateEvent",
    "StoredEvent",
    "TextBlock",
    "ToolCall",
    "UnpinEvent",
    "Usage",
    "UsageEvent",
    "construct_valid",
    "plain_defaults",
]
