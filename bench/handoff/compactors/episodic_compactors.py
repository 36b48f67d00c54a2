"""episodic's two compactors, each through the code a user runs.

- ``episodic``: the worker's path. The phases are appended to a real store (a SQLite file:
  the backend does not change what is summarized, and the twin tests hold SQLite to
  PostgreSQL), each run marked completed; a compaction claims the conversation as "compact
  now" does and runs ``compact_claimed`` with the ``openai`` summarizer; the context is
  ``load_context``.
- ``episodic_inrun``: the in-run ``LlmCompactor`` (the cliver contract), over the history
  an agent loop holds, with a chat summarizer that calls the same endpoint.
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar
from uuid import UUID

from bench.handoff.compactors.base import Compactor
from episodic import EpisodicStore, Message, Usage
from episodic.compaction import CompactionConfig
from episodic.loop import CompactionContext, LlmCompactor, compact_in_run
from episodic.search import hit_text
from episodic.summarizers.openai_chat import OpenAIChatSummarizer
from episodic.worker import CompactionOptions, compact_claimed

WORKER = "bench:handoff"
#: the characters of each tool result the summarizer is shown (see ``open``)
TOOL_RESULT_HEAD_CHARS = 100


class EpisodicWorker(Compactor):
    name = "episodic"
    requires: ClassVar[dict[str, str]] = {"openai": "openai"}
    describes = "episodic's worker: store + compact_claimed + openai summarizer + load_context"
    #: append the messages the session pins as pinned (an application that pins its user's
    #: standing rules), or as plain messages
    pins: ClassVar[bool] = True

    async def open(self) -> None:
        endpoint = self.endpoint_or_fail()
        self._dir = tempfile.TemporaryDirectory(prefix="episodic-handoff-")
        url = f"sqlite+aiosqlite:///{Path(self._dir.name) / 'handoff.db'}"
        self.store = await EpisodicStore.open(url)
        await self.store.migrate()
        self.conversation: UUID = await self.store.create_conversation()
        self.summarizer = OpenAIChatSummarizer(
            endpoint.model,
            base_url=endpoint.base_url,
            api_key=endpoint.api_key,
            timeout=self.budget.timeout,
            max_output_tokens=self.budget.handoff_tokens,
            temperature=0.0,
            max_tokens_field="max_tokens",
        )
        # The same total as every compactor (the handoff budget and the verbatim budget,
        # 320 tokens), split four ways: the model's notes, the user's standing instructions,
        # the record of the tools' work, and the newest user messages (262 tokens: the fixed
        # texts, the prefix and the recall line, take the rest). The notes had 8/16 of the
        # handoff budget until the run of 5c60748, where by depth 8 they filled it with a
        # FACT line no probe needed and the context came out a token above LangChain's on
        # average; the record keeps 9/16 (at 8/16 it left out a support session's account id).
        # The model is shown the head of each tool result (the record reads all of it): with
        # the 1.5B model, the first compactions of 8 sessions lost 11 of the notes' facts
        # with results shown whole, 7 to 10 with heads of 1 to 250 characters, 12 with 400.
        handoff, keep = self.budget.handoff_tokens, self.budget.keep_tokens
        config = CompactionConfig().with_limits(
            notes_token_budget=handoff * 9 // 20,
            instructions_token_budget=keep * 8 // 16,
            worklog_token_budget=handoff * 9 // 16,
            recent_user_token_budget=keep // 8,
            tool_result_char_cap=TOOL_RESULT_HEAD_CHARS,
        )
        self.options = CompactionOptions(
            compaction=config, summarizer_timeout=self.budget.timeout, max_attempts=1
        )

    async def close(self) -> None:
        await self.summarizer.aclose()
        await self.store.close()
        self._dir.cleanup()

    async def add(self, messages: Sequence[Message]) -> None:
        if not self.pins:
            messages = [m.model_copy(update={"pinned": False}) for m in messages]
        await self.store.append(self.conversation, messages)
        await self.store.mark_run_completed(self.conversation)

    async def compact(self) -> None:
        claim = await self.store.claim_conversation(
            self.conversation, WORKER, lease_seconds=self.options.default_lease_seconds()
        )
        if claim is None:
            raise RuntimeError("the conversation could not be claimed")
        result = await compact_claimed(
            self.store, self.summarizer, claim, worker=WORKER, options=self.options
        )
        # nothing_to_compact: the handoff would not have made the context smaller, so none
        # was written and the context stays as it is (the worker does the same)
        if result.outcome not in ("succeeded", "nothing_to_compact"):
            raise RuntimeError(f"episodic's compaction ended {result.outcome}: {result.error}")

    async def context(self) -> list[Message]:
        return list((await self.store.load_context(self.conversation)).messages)

    async def search(self, query: str, limit: int) -> list[str] | None:
        hits = await self.store.search(self.conversation, query, limit=limit)
        return [hit_text(hit) for hit in hits]


class EpisodicUnpinned(EpisodicWorker):
    name = "episodic_unpinned"
    describes = "episodic's worker, the session's pins left out (rules detected only)"
    pins = False


@dataclass(frozen=True, slots=True)
class _Reply:
    """What ``LlmCompactor`` reads of a chat reply: ``.message.content`` and ``.usage``."""

    message: Any
    usage: Usage | None


@dataclass(frozen=True, slots=True)
class _Said:
    content: str


class _EndpointChat:
    """A ``ChatSummarizer``: one chat-completions call per prompt."""

    def __init__(self, client: Any, model: str, max_tokens: int) -> None:
        self.client, self.model, self.max_tokens = client, model, max_tokens

    async def chat(self, prompt: str, /) -> _Reply:
        response = await self.client.chat.completions.create(
            model=self.model,
            messages=[{"role": "user", "content": prompt}],
            max_tokens=self.max_tokens,
            temperature=0.0,
        )
        usage = response.usage
        counted = (
            Usage(input_tokens=usage.prompt_tokens, output_tokens=usage.completion_tokens)
            if usage is not None
            else None
        )
        return _Reply(_Said(response.choices[0].message.content or ""), counted)


class EpisodicInRun(Compactor):
    name = "episodic_inrun"
    requires: ClassVar[dict[str, str]] = {"openai": "openai"}
    describes = "episodic's in-run LlmCompactor (the cliver contract), keep_turns=1"

    async def open(self) -> None:
        endpoint = self.endpoint_or_fail()
        self.client = endpoint.client(self.budget.timeout)
        chat = _EndpointChat(self.client, endpoint.model, self.budget.handoff_tokens)
        # threshold 0: it compacts whenever asked (the benchmark decides when)
        self.compactor = LlmCompactor(chat, threshold_tokens=0, keep_turns=1)
        self.messages: list[Message] = []

    async def close(self) -> None:
        await self.client.close()

    async def add(self, messages: Sequence[Message]) -> None:
        self.messages.extend(messages)

    async def compact(self) -> None:
        # An agent loop compacts right before a model call, when its history ends with a
        # user message or a tool result: so here, before the call that wrote the phase's
        # last reply, which follows the compacted history as it would have.
        last = self.messages[-1:] if self.messages[-1].role == "assistant" else []
        before = self.messages[: len(self.messages) - len(last)]
        # last_usage stands for the previous model call's input: over the threshold
        context = CompactionContext.of(before, last_usage=Usage(input_tokens=1))
        self.messages = [*await compact_in_run(self.compactor, context), *last]

    async def context(self) -> list[Message]:
        return list(self.messages)
